package shm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/internal/shmem"
	"github.com/hpc-multidevice/multidevice/sdi"
)

func TestRegistered(t *testing.T) {
	f, err := sdi.Lookup("shm")
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	info, err := f(nil).Info(context.Background())
	if err != nil || info.Name != "shm" {
		t.Fatalf("Info = %+v, %v", info, err)
	}
}

func TestCaps(t *testing.T) {
	j := openJob(t, 1, jobOpts{})
	c := j.local[0].Caps
	if c.Reach != sdi.ReachHost || !c.Flags.Has(sdi.FlagReliable|sdi.FlagOrdered) || c.Exclusivity != exclusivity ||
		c.MaxHeader != maxHeader || c.MaxEager != maxEager || c.MaxFrame != defaultRingBytes/4 {
		t.Fatalf("caps = %+v", c)
	}
}

func TestSizes(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			j := openJob(t, n, jobOpts{})
			caps := j.local[0].Caps
			sizes := []int{0, 1, caps.MaxEager, caps.MaxFrame}
			for a := range n {
				for b := range n {
					for _, size := range sizes {
						seed := uint64(a*1000 + b*100 + size)
						hdr := pattern(seed+1, min(size, caps.MaxHeader))
						mustSend(t, j.sds[a], &sdi.Frame{Peer: sdi.Rank(b), Header: hdr, Payload: pattern(seed, size)})
						m := j.hs[b].next(t)
						if m.from != sdi.Rank(a) || !bytes.Equal(m.header, hdr) || !bytes.Equal(m.payload, pattern(seed, size)) {
							t.Fatalf("%d -> %d size %d: got from %d, %d header and %d payload bytes (content differs)",
								a, b, size, m.from, len(m.header), len(m.payload))
						}
					}
				}
			}
			tooLarge := []sdi.Frame{
				{Peer: 1, Payload: make([]byte, caps.MaxFrame+1)},
				{Peer: 1, Header: make([]byte, caps.MaxHeader+1)},
			}
			for _, f := range tooLarge {
				if _, err := j.sds[0].Send(&f); !errors.Is(err, sdi.ErrTooLarge) {
					t.Errorf("Send header %d payload %d = %v, want ErrTooLarge", len(f.Header), len(f.Payload), err)
				}
			}
		})
	}
}

func TestPingPong(t *testing.T) {
	j := openJob(t, 2, jobOpts{noSleepBound: true})
	const rounds = 1000
	done := make(chan struct{})
	go func() { // rank 1 echoes; Deliver must not send, so a goroutine does
		defer close(done)
		for range rounds {
			m, err := j.hs[1].await()
			if err == nil {
				err = sendRetry(j.sds[1], &sdi.Frame{Peer: 0, Header: m.header, Payload: m.payload})
			}
			if err != nil {
				t.Errorf("echo: %v", err)
				return
			}
		}
	}()
	for i := range uint64(rounds) {
		mustSend(t, j.sds[0], &sdi.Frame{Peer: 1, Header: u64(i), Payload: pattern(i, int(i%512))})
		m := j.hs[0].next(t)
		if binary.LittleEndian.Uint64(m.header) != i || !bytes.Equal(m.payload, pattern(i, int(i%512))) {
			t.Fatalf("round %d: echo has header %x and %d payload bytes", i, m.header, len(m.payload))
		}
	}
	<-done
}

// TestFIFO sends many frames of varied sizes (so records wrap the ring many
// times) from every rank to rank 0 and checks per-sender order.
func TestFIFO(t *testing.T) {
	const n, frames = 4, 3000
	j := openJob(t, n, jobOpts{config: []byte(`{"ring_bytes": 65536}`)})
	var wg sync.WaitGroup
	for a := 1; a < n; a++ {
		wg.Go(func() {
			for i := range uint64(frames) {
				if err := sendRetry(j.sds[a], &sdi.Frame{Peer: 0, Header: u64(i), Payload: pattern(i, int(i*37%3000))}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	next := make([]uint64, n)
	for range (n - 1) * frames {
		m := j.hs[0].next(t)
		i := binary.LittleEndian.Uint64(m.header)
		if i != next[m.from] {
			t.Fatalf("from rank %d: frame %d arrived, expected %d", m.from, i, next[m.from])
		}
		if !bytes.Equal(m.payload, pattern(i, int(i*37%3000))) {
			t.Fatalf("from rank %d: frame %d payload differs", m.from, i)
		}
		next[m.from]++
	}
	wg.Wait()
}

// TestConcurrentSenders has many goroutines of one rank share a ring; run it
// with -race. Each goroutine's frames must arrive whole and in its order.
func TestConcurrentSenders(t *testing.T) {
	const senders, frames = 8, 500
	j := openJob(t, 2, jobOpts{config: []byte(`{"ring_bytes": 65536}`)})
	var wg sync.WaitGroup
	for g := range uint64(senders) {
		wg.Go(func() {
			for i := range uint64(frames) {
				hdr := append(u64(g), u64(i)...)
				if err := sendRetry(j.sds[0], &sdi.Frame{Peer: 1, Header: hdr, Payload: pattern(g<<32|i, int(i%700))}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	next := make([]uint64, senders)
	for range senders * frames {
		m := j.hs[1].next(t)
		g, i := binary.LittleEndian.Uint64(m.header), binary.LittleEndian.Uint64(m.header[8:])
		if g >= senders || i != next[g] || !bytes.Equal(m.payload, pattern(g<<32|i, int(i%700))) {
			t.Fatalf("goroutine %d frame %d: out of order or corrupt (expected frame %d)", g, i, next[min(g, senders-1)])
		}
		next[g]++
	}
	wg.Wait()
}

func TestBackpressure(t *testing.T) {
	j := openJob(t, 2, jobOpts{config: []byte(`{"ring_bytes": 65536}`)})
	j.hs[1].gate.Lock() // rank 1's first Deliver blocks, so its ring fills
	payload := make([]byte, 1000)
	sent := 0
	for ; ; sent++ {
		if sent > 1000 {
			j.hs[1].gate.Unlock()
			t.Fatal("a 64 KiB ring accepted 1000 frames of 1000 bytes without ErrWouldBlock")
		}
		done, err := j.sds[0].Send(&sdi.Frame{Peer: 1, Header: u64(uint64(sent)), Payload: payload})
		if errors.Is(err, sdi.ErrWouldBlock) {
			break
		}
		if err != nil || !done {
			j.hs[1].gate.Unlock()
			t.Fatalf("Send %d = %v, %v", sent, done, err)
		}
	}
	if sent == 0 {
		j.hs[1].gate.Unlock()
		t.Fatal("the first Send already would block")
	}
	j.hs[1].gate.Unlock()
	const more = 200
	for i := sent; i < sent+more; i++ {
		mustSend(t, j.sds[0], &sdi.Frame{Peer: 1, Header: u64(uint64(i)), Payload: payload})
	}
	for i := range uint64(sent + more) {
		if m := j.hs[1].next(t); binary.LittleEndian.Uint64(m.header) != i {
			t.Fatalf("frame %d arrived as %d", i, binary.LittleEndian.Uint64(m.header))
		}
	}
}

func TestCloseIdempotentAndNoLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		h := newRecorder(t)
		sd := New(testLogger(t))
		l, err := sd.Open(context.Background(), sdi.OpenParams{Rank: 0, Size: 2, Host: "h", JobID: t.Name(), Handler: h, Logger: testLogger(t)})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		if err := sd.Connect(context.Background(), 0, l.Addr); err != nil {
			t.Fatalf("Connect self: %v", err)
		}
		c, _ := decodeCard(l.Addr)
		path := filepath.Join(shmem.Dir, c.Segment)
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("segment file missing while open: %v", err)
		}
		for i := range 3 {
			if err := sd.Close(context.Background()); err != nil {
				t.Fatalf("Close #%d: %v", i+1, err)
			}
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("segment file still there after Close: %v", err)
		}
		calls := map[string]error{}
		_, calls["Send"] = sd.Send(&sdi.Frame{Peer: 0})
		calls["Connect"] = sd.Connect(context.Background(), 0, l.Addr)
		calls["Flush"] = sd.Flush(context.Background(), 0)
		calls["Disconnect"] = sd.Disconnect(context.Background(), 0)
		_, calls["Open"] = sd.Open(context.Background(), sdi.OpenParams{Size: 1, Handler: h})
		for name, err := range calls {
			if !errors.Is(err, sdi.ErrClosed) {
				t.Errorf("%s after Close = %v, want ErrClosed", name, err)
			}
		}
	}()
	if after := waitGoroutines(before); after > before {
		t.Fatalf("%d goroutines before, %d after Close", before, after)
	}
}

func TestCloseUnopened(t *testing.T) {
	sd := New(nil)
	if err := sd.Close(context.Background()); err != nil {
		t.Fatalf("Close before Open: %v", err)
	}
	if _, err := sd.Send(&sdi.Frame{}); !errors.Is(err, sdi.ErrClosed) {
		t.Fatalf("Send after Close = %v, want ErrClosed", err)
	}
}

func TestSendErrors(t *testing.T) {
	j := openJob(t, 3, jobOpts{})
	if err := j.sds[0].Disconnect(context.Background(), 2); err != nil {
		t.Fatalf("Disconnect: %v", err)
	}
	tests := []struct {
		name string
		peer sdi.Rank
		want error
	}{
		{"disconnected", 2, sdi.ErrNotConnected},
		{"negative rank", -1, sdi.ErrNotConnected},
		{"rank beyond job", 3, sdi.ErrNotConnected},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := j.sds[0].Send(&sdi.Frame{Peer: tt.peer}); !errors.Is(err, tt.want) {
				t.Fatalf("Send = %v, want %v", err, tt.want)
			}
		})
	}
	unopened := New(nil)
	if _, err := unopened.Send(&sdi.Frame{}); !errors.Is(err, errNotOpen) {
		t.Fatalf("Send before Open = %v, want errNotOpen", err)
	}
}

func TestConnectUnreachable(t *testing.T) {
	j := openJob(t, 2, jobOpts{})
	other := openJob(t, 2, jobOpts{})
	otherHost := openJob(t, 2, jobOpts{host: func(int) string { return "host-b" }})
	bigRing := openJob(t, 2, jobOpts{config: []byte(`{"ring_bytes": 131072}`)})
	own, _ := decodeCard(j.local[1].Addr)
	forged := func(c card) []byte {
		b, err := c.encode()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name string
		peer sdi.Rank
		addr []byte
	}{
		{"other host", 1, otherHost.local[1].Addr},
		{"other job", 1, other.local[1].Addr},
		{"card of another rank", 1, j.local[0].Addr},
		{"rank outside job", 5, j.local[1].Addr},
		{"empty card", 1, nil},
		{"garbage card", 1, []byte("not a card at all")},
		{"truncated card", 1, j.local[1].Addr[:len(j.local[1].Addr)-1]},
		{"missing segment", 1, forged(card{Host: own.Host, JobID: own.JobID, Rank: 1, Segment: "mdshm.nothing.here"})},
		{"segment of other job under our job id", 1, forged(card{Host: own.Host, JobID: own.JobID, Rank: 1,
			Segment: mustCard(t, other.local[1].Addr).Segment})},
		{"ring size differs", 1, forged(card{Host: own.Host, JobID: own.JobID, Rank: 1,
			Segment: mustCard(t, bigRing.local[1].Addr).Segment})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := j.sds[0].Connect(context.Background(), tt.peer, tt.addr)
			if !errors.Is(err, sdi.ErrPeerUnreachable) {
				t.Fatalf("Connect = %v, want ErrPeerUnreachable", err)
			}
			t.Log(err)
		})
	}
}

func mustCard(t *testing.T, b []byte) card {
	t.Helper()
	c, err := decodeCard(b)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestBadConfig(t *testing.T) {
	tests := []struct {
		name   string
		config string
		ok     bool
	}{
		{"empty", ``, true},
		{"empty object", `{}`, true},
		{"explicit", `{"ring_bytes": 262144}`, true},
		{"not a power of two", `{"ring_bytes": 100000}`, false},
		{"too small", `{"ring_bytes": 4096}`, false},
		{"too large", `{"ring_bytes": 4294967296}`, false},
		{"negative", `{"ring_bytes": -1}`, false},
		{"string", `{"ring_bytes": "1M"}`, false},
		{"unknown key", `{"ring_size": 65536}`, false},
		{"not json", `ring_bytes = 1`, false},
		{"trailing data", `{} {}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sd := New(testLogger(t))
			defer sd.Close(context.Background())
			_, err := sd.Open(context.Background(), sdi.OpenParams{Size: 1, JobID: t.Name(), Config: []byte(tt.config), Handler: newRecorder(t)})
			if (err == nil) != tt.ok {
				t.Fatalf("Open with %q = %v, want ok=%v", tt.config, err, tt.ok)
			}
			if err != nil {
				t.Log(err)
			}
		})
	}
}

func TestBadOpenParams(t *testing.T) {
	tests := []struct {
		name string
		p    sdi.OpenParams
	}{
		{"nil handler", sdi.OpenParams{Size: 1}},
		{"rank beyond size", sdi.OpenParams{Rank: 2, Size: 2}},
		{"negative rank", sdi.OpenParams{Rank: -1, Size: 2}},
		{"zero size", sdi.OpenParams{}},
		{"huge host", sdi.OpenParams{Size: 1, Host: string(make([]byte, 300))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.p.Handler == nil && tt.name != "nil handler" {
				tt.p.Handler = newRecorder(t)
			}
			sd := New(nil)
			defer sd.Close(context.Background())
			if _, err := sd.Open(context.Background(), tt.p); err == nil {
				t.Fatal("Open succeeded")
			}
		})
	}
}

func TestPeerDownOnClose(t *testing.T) {
	j := openJob(t, 2, jobOpts{})
	mustSend(t, j.sds[1], &sdi.Frame{Peer: 0, Payload: []byte("last words")})
	if err := j.sds[1].Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// The frame sent before Close arrives before the PeerDown.
	if m := j.hs[0].next(t); string(m.payload) != "last words" {
		t.Fatalf("got %q", m.payload)
	}
	d := j.hs[0].nextDown(t)
	if d.peer != 1 || !errors.Is(d.err, sdi.ErrPeerUnreachable) {
		t.Fatalf("PeerDown(%d, %v), want rank 1 and ErrPeerUnreachable", d.peer, d.err)
	}
	if _, err := j.sds[0].Send(&sdi.Frame{Peer: 1}); !errors.Is(err, sdi.ErrPeerUnreachable) {
		t.Fatalf("Send to closed peer = %v, want ErrPeerUnreachable", err)
	}
}

// TestIdleSleepsAndWakes checks that an idle receiver ends up parked on its
// doorbell (no CPU burnt) and that a frame still wakes it. Sleeps have no
// time bound here, so a lost wake-up hangs and the watchdog fails the test.
func TestIdleSleepsAndWakes(t *testing.T) {
	j := openJob(t, 2, jobOpts{noSleepBound: true})
	mem := j.sds[1].(*device).seg.Bytes()
	for i := range uint64(50) {
		for word32(mem, offSleeping).Load() == 0 {
			time.Sleep(time.Millisecond) // the test timeout catches a receiver that never sleeps
		}
		mustSend(t, j.sds[0], &sdi.Frame{Peer: 1, Header: u64(i)})
		if m := j.hs[1].next(t); binary.LittleEndian.Uint64(m.header) != i {
			t.Fatalf("frame %d arrived as %x", i, m.header)
		}
	}
}

func TestReconnectResumesRing(t *testing.T) {
	j := openJob(t, 2, jobOpts{config: []byte(`{"ring_bytes": 65536}`)})
	ctx := context.Background()
	for i := range uint64(300) {
		if i%50 == 0 {
			if err := j.sds[0].Disconnect(ctx, 1); err != nil {
				t.Fatalf("Disconnect: %v", err)
			}
			if err := j.sds[0].Connect(ctx, 1, j.local[1].Addr); err != nil {
				t.Fatalf("Connect: %v", err)
			}
		}
		mustSend(t, j.sds[0], &sdi.Frame{Peer: 1, Header: u64(i), Payload: make([]byte, 1000)})
		if m := j.hs[1].next(t); binary.LittleEndian.Uint64(m.header) != i {
			t.Fatalf("frame %d arrived as %d", i, binary.LittleEndian.Uint64(m.header))
		}
	}
}

// TestAttachWhileReceiverSleeps connects a sender only after the receiver has
// gone to sleep with no ring to poll; the first frame must still wake it and
// be found (sleeps are unbounded here, so a miss hangs).
func TestAttachWhileReceiverSleeps(t *testing.T) {
	j := openJob(t, 3, jobOpts{noSleepBound: true, host: func(int) string { return "host-a" }})
	mem := j.sds[1].(*device).seg.Bytes()
	for _, from := range []sdi.Rank{2, 0} {
		for word32(mem, offSleeping).Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		if err := j.sds[from].Connect(context.Background(), 1, j.local[1].Addr); err != nil {
			t.Fatalf("Connect: %v", err)
		}
		mustSend(t, j.sds[from], &sdi.Frame{Peer: 1, Payload: []byte("first")})
		if m := j.hs[1].next(t); m.from != from || string(m.payload) != "first" {
			t.Fatalf("got %q from %d, want \"first\" from %d", m.payload, m.from, from)
		}
	}
}

// TestConnectAfterPeerDown: rank 1 closed and rank 0 reported it down. A
// new Connect with rank 1's card (what the multidevice does to put a
// route back) once returned nil, a no-op since the segment name is
// unchanged, although the connection was dead: the Send right after it
// failed.
func TestConnectAfterPeerDown(t *testing.T) {
	j := openJob(t, 2, jobOpts{})
	if err := j.sds[1].Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := j.hs[0].nextDown(t); d.peer != 1 {
		t.Fatalf("PeerDown(%d)", d.peer)
	}
	err := j.sds[0].Connect(context.Background(), 1, j.local[1].Addr)
	if !errors.Is(err, sdi.ErrPeerUnreachable) {
		_, serr := j.sds[0].Send(&sdi.Frame{Peer: 1, Payload: []byte("x")})
		t.Fatalf("Connect to a rank reported down (its segment closed) = %v, want ErrPeerUnreachable; the Send after it = %v", err, serr)
	}
}
