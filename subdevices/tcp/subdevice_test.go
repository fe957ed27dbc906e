package tcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/hpc-multidevice/multidevice/sdi"
)

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

func TestRegistered(t *testing.T) {
	f, err := sdi.Lookup("tcp")
	if err != nil {
		t.Fatal(err)
	}
	info, err := f(nil).Info(context.Background())
	if err != nil || info.Name != "tcp" {
		t.Fatalf("Info() = %+v, %v; want name tcp", info, err)
	}
}

func TestSizes(t *testing.T) {
	nodes := newJob(t, 2, jobOpts{})
	a, b := nodes[0], nodes[1]
	tests := []struct {
		name    string
		header  int
		payload int
		wantErr error
	}{
		{"empty", 0, 0, nil},
		{"one byte", 1, 1, nil},
		{"max header", maxHeader, 0, nil},
		{"max eager", 16, a.local.Caps.MaxEager, nil},
		{"max frame", maxHeader, a.local.Caps.MaxFrame, nil},
		{"frame too large", 0, a.local.Caps.MaxFrame + 1, sdi.ErrTooLarge},
		{"header too large", a.local.Caps.MaxHeader + 1, 0, sdi.ErrTooLarge},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &sdi.Frame{Peer: b.rank, Header: pattern(tt.header, 1), Payload: pattern(tt.payload, byte(i)), Token: uint64(i)}
			before := b.rec.count(a.rank)
			done, err := a.sd.Send(f)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Send() error = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Send() = %v, %v; want no error", done, err)
			}
			if done {
				a.rec.completedInline(f.Token)
			}
			b.rec.waitFor(t, "delivery", func() bool { return len(b.rec.delivered[a.rank]) > before })
			got := b.rec.frames(a.rank)[before]
			if !bytes.Equal(got.header, f.Header) || !bytes.Equal(got.payload, f.Payload) {
				t.Fatalf("delivered header %d bytes, payload %d bytes; want %d, %d with the same content",
					len(got.header), len(got.payload), len(f.Header), len(f.Payload))
			}
			if err := a.sd.Flush(context.Background(), b.rank); err != nil {
				t.Fatal(err)
			}
			if errs := a.rec.doneErrs(f.Token); len(errs) != 1 || errs[0] != nil {
				t.Fatalf("SendDone calls for token %d: %v; want exactly one nil", f.Token, errs)
			}
		})
	}
}

func TestSendErrors(t *testing.T) {
	nodes := newJob(t, 2, jobOpts{size: 3})
	tests := []struct {
		name string
		peer sdi.Rank
		want error
	}{
		{"rank in job but not connected", 2, sdi.ErrNotConnected},
		{"negative rank", -1, sdi.ErrNotConnected},
		{"rank beyond job", 3, sdi.ErrNotConnected},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := nodes[0].sd.Send(&sdi.Frame{Peer: tt.peer})
			if !errors.Is(err, tt.want) {
				t.Fatalf("Send() error = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestPingPong(t *testing.T) {
	nodes := newJob(t, 2, jobOpts{})
	a, b := nodes[0], nodes[1]
	const rounds = 1000
	for i := range rounds {
		msg := binary.LittleEndian.AppendUint32(nil, uint32(i))
		send(t, a, &sdi.Frame{Peer: b.rank, Header: msg, Payload: msg, Token: uint64(i)})
		b.rec.waitFor(t, "ping", func() bool { return len(b.rec.delivered[a.rank]) == i+1 })
		send(t, b, &sdi.Frame{Peer: a.rank, Payload: b.rec.frames(a.rank)[i].payload, Token: uint64(i)})
		a.rec.waitFor(t, "pong", func() bool { return len(a.rec.delivered[b.rank]) == i+1 })
		if got := a.rec.frames(b.rank)[i].payload; !bytes.Equal(got, msg) {
			t.Fatalf("round %d: pong %x, want %x", i, got, msg)
		}
	}
}

// TestFIFO has every rank of a 4-rank job stream numbered frames to every
// other rank at once and checks each stream arrives complete and in order.
func TestFIFO(t *testing.T) {
	const perPeer = 300
	nodes := newJob(t, 4, jobOpts{})
	var wg sync.WaitGroup
	for _, a := range nodes {
		for _, b := range nodes {
			if a == b {
				continue
			}
			wg.Go(func() {
				for i := range perPeer {
					// Varying sizes make writes split and batch differently.
					p := pattern(i*37%5000, byte(i))
					hdr := binary.LittleEndian.AppendUint32(nil, uint32(i))
					send(t, a, &sdi.Frame{Peer: b.rank, Header: hdr, Payload: p, Token: uint64(b.rank)<<32 | uint64(i)})
				}
			})
		}
	}
	wg.Wait()
	for _, b := range nodes {
		for _, a := range nodes {
			if a == b {
				continue
			}
			b.rec.waitFor(t, fmt.Sprintf("%d frames %d->%d", perPeer, a.rank, b.rank), func() bool {
				return len(b.rec.delivered[a.rank]) >= perPeer
			})
			got := b.rec.frames(a.rank)
			if len(got) != perPeer {
				t.Fatalf("%d->%d: %d frames, want %d", a.rank, b.rank, len(got), perPeer)
			}
			for i, d := range got {
				if seq := binary.LittleEndian.Uint32(d.header); seq != uint32(i) {
					t.Fatalf("%d->%d: frame %d has sequence %d", a.rank, b.rank, i, seq)
				}
				if !bytes.Equal(d.payload, pattern(i*37%5000, byte(i))) {
					t.Fatalf("%d->%d: frame %d payload corrupted", a.rank, b.rank, i)
				}
			}
		}
	}
}

// TestConcurrentSenders has many goroutines send to one peer; each
// goroutine's frames must arrive in its own order, none lost or doubled.
func TestConcurrentSenders(t *testing.T) {
	const senders, each = 8, 200
	nodes := newJob(t, 2, jobOpts{config: `{"listen": "127.0.0.1:0", "queue_bytes": 65536}`})
	a, b := nodes[0], nodes[1]
	var wg sync.WaitGroup
	for g := range senders {
		wg.Go(func() {
			for i := range each {
				hdr := binary.LittleEndian.AppendUint32([]byte{byte(g)}, uint32(i))
				send(t, a, &sdi.Frame{Peer: b.rank, Header: hdr, Payload: pattern(i%3000, byte(g)), Token: uint64(g*each + i)})
			}
		})
	}
	wg.Wait()
	if err := a.sd.Flush(context.Background(), b.rank); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	for tok := range uint64(senders * each) {
		if errs := a.rec.doneErrs(tok); len(errs) != 1 || errs[0] != nil {
			t.Errorf("token %d: SendDone calls %v, want exactly one nil", tok, errs)
		}
	}
	b.rec.waitFor(t, "all frames", func() bool { return len(b.rec.delivered[a.rank]) >= senders*each })
	next := make([]uint32, senders)
	for _, d := range b.rec.frames(a.rank) {
		g, seq := d.header[0], binary.LittleEndian.Uint32(d.header[1:])
		if seq != next[g] {
			t.Fatalf("sender %d: got sequence %d, want %d", g, seq, next[g])
		}
		next[g]++
	}
	if n := len(b.rec.frames(a.rank)); n != senders*each {
		t.Fatalf("delivered %d frames, want %d", n, senders*each)
	}
}

// TestBackpressure fills the queue towards a peer that stops reading until
// Send refuses, then lets the peer read and checks everything drains.
func TestBackpressure(t *testing.T) {
	nodes := newJob(t, 2, jobOpts{config: `{"listen": "127.0.0.1:0", "queue_bytes": 65536}`})
	a, b := nodes[0], nodes[1]
	gate := make(chan struct{})
	b.rec.mu.Lock()
	b.rec.gate = gate
	b.rec.mu.Unlock()

	payload := pattern(16<<10, 3)
	accepted := 0
	// The kernel's socket buffers absorb a few MB before the writer blocks;
	// 1 GB without a refusal means there is no bound.
	for accepted < 1<<16 {
		_, err := a.sd.Send(&sdi.Frame{Peer: b.rank, Payload: payload, Token: uint64(accepted)})
		if errors.Is(err, sdi.ErrWouldBlock) {
			break
		}
		if err != nil {
			t.Fatalf("Send %d: %v", accepted, err)
		}
		accepted++
	}
	if accepted == 1<<16 {
		t.Fatalf("accepted %d frames to a peer that does not read; want ErrWouldBlock", accepted)
	}
	close(gate)
	flushCtx, cancel := context.WithTimeout(context.Background(), watchdog)
	defer cancel()
	if err := a.sd.Flush(flushCtx, b.rank); err != nil {
		t.Fatalf("Flush after the peer resumed reading: %v", err)
	}
	b.rec.waitFor(t, "all frames", func() bool { return len(b.rec.delivered[a.rank]) == accepted })
	if _, err := a.sd.Send(&sdi.Frame{Peer: b.rank, Payload: payload, Token: 1 << 40}); err != nil {
		t.Fatalf("Send after draining: %v", err)
	}
}

func ipv6Loopback(t *testing.T) bool {
	t.Helper()
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

func TestListenConfigs(t *testing.T) {
	tests := []struct {
		name      string
		config    string
		needIPv6  bool
		wantAddrs []string // exact card addresses, when known
		wantFirst string   // the first card address
	}{
		{name: "ipv4 loopback", config: `{"listen": "127.0.0.1:0"}`, wantAddrs: []string{"127.0.0.1/8"}},
		{name: "ipv6 loopback", config: `{"listen": "[::1]:0"}`, needIPv6: true, wantAddrs: []string{"::1/128"}},
		{name: "ipv4 wildcard", config: `{"listen": "0.0.0.0:0"}`, wantFirst: "127.0.0.1/8"},
		{name: "default", config: `{}`, wantFirst: "127.0.0.1/8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.needIPv6 && !ipv6Loopback(t) {
				t.Skip("no IPv6 loopback on this host")
			}
			nodes := newJob(t, 2, jobOpts{config: tt.config})
			c, err := decodeCard(nodes[0].local.Addr)
			if err != nil {
				t.Fatalf("own card does not decode: %v", err)
			}
			var got []string
			for _, f := range c.Ifaces {
				for _, p := range f.Addrs {
					got = append(got, p.String())
					if tt.name == "ipv4 wildcard" && p.Addr().Is6() {
						t.Errorf("IPv4-only listener publishes %v", p)
					}
				}
			}
			if tt.wantAddrs != nil && fmt.Sprint(got) != fmt.Sprint(tt.wantAddrs) {
				t.Errorf("card addresses %v, want %v", got, tt.wantAddrs)
			}
			if tt.wantFirst != "" && (len(got) == 0 || got[0] != tt.wantFirst) {
				t.Errorf("card addresses %v, want %v first", got, tt.wantFirst)
			}
			for i, n := range nodes {
				peer := nodes[1-i]
				send(t, n, &sdi.Frame{Peer: peer.rank, Payload: []byte(tt.name)})
				peer.rec.waitFor(t, "delivery", func() bool { return len(peer.rec.delivered[n.rank]) == 1 })
			}
		})
	}
}

func TestFlushAndDisconnect(t *testing.T) {
	nodes := newJob(t, 2, jobOpts{})
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	for i := range 50 {
		send(t, a, &sdi.Frame{Peer: b.rank, Payload: pattern(1000, byte(i)), Token: uint64(i)})
	}
	if err := a.sd.Flush(ctx, b.rank); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	a.rec.mu.Lock()
	n := len(a.rec.done)
	a.rec.mu.Unlock()
	if n != 50 {
		t.Fatalf("after Flush %d frames completed, want 50", n)
	}
	if err := a.sd.Disconnect(ctx, b.rank); err != nil {
		t.Fatalf("Disconnect: %v", err)
	}
	if _, err := a.sd.Send(&sdi.Frame{Peer: b.rank}); !errors.Is(err, sdi.ErrNotConnected) {
		t.Fatalf("Send after Disconnect: %v, want ErrNotConnected", err)
	}
	if err := a.sd.Disconnect(ctx, b.rank); !errors.Is(err, sdi.ErrNotConnected) {
		t.Fatalf("second Disconnect: %v, want ErrNotConnected", err)
	}
	if err := a.sd.Connect(ctx, b.rank, b.local.Addr); err != nil {
		t.Fatalf("reconnect: %v", err)
	}
	send(t, a, &sdi.Frame{Peer: b.rank, Payload: []byte("after reconnect"), Token: 99})
	b.rec.waitFor(t, "all frames", func() bool { return len(b.rec.delivered[a.rank]) == 51 })
	if got := b.rec.frames(a.rank)[50].payload; string(got) != "after reconnect" {
		t.Fatalf("last frame %q, want %q", got, "after reconnect")
	}
	a.rec.mu.Lock()
	downs := len(a.rec.downs)
	a.rec.mu.Unlock()
	if downs != 0 {
		t.Fatalf("Disconnect reported PeerDown")
	}
}

func TestPeerDown(t *testing.T) {
	nodes := newJob(t, 2, jobOpts{})
	a, b := nodes[0], nodes[1]
	b.close(t)
	a.rec.waitFor(t, "PeerDown", func() bool { return a.rec.downs[b.rank] != nil })
	if err := a.rec.down(b.rank); !errors.Is(err, sdi.ErrPeerUnreachable) {
		t.Errorf("PeerDown error %v, want ErrPeerUnreachable", err)
	}
	if _, err := a.sd.Send(&sdi.Frame{Peer: b.rank}); !errors.Is(err, sdi.ErrPeerUnreachable) {
		t.Fatalf("Send to a down peer: %v, want ErrPeerUnreachable", err)
	}
	if err := a.sd.Flush(context.Background(), b.rank); err != nil {
		t.Fatalf("Flush to a down peer with nothing queued: %v", err)
	}
}

// stuckPeer installs one end of a pipe as a's connection to rank; nobody
// reads the other end, so the writer blocks on its first write for as long
// as the test wants. It returns the other end.
func stuckPeer(t *testing.T, a *node, rank sdi.Rank) net.Conn {
	t.Helper()
	ours, theirs := net.Pipe()
	t.Cleanup(func() { theirs.Close() })
	if err := a.sd.(*subDevice).install(rank, []net.Conn{ours}, []Link{{}}); err != nil {
		t.Fatal(err)
	}
	return theirs
}

// fill sends to rank until Send refuses, and returns how many it accepted.
func fill(t *testing.T, a *node, rank sdi.Rank, firstToken uint64) int {
	t.Helper()
	for n := 0; n < 1<<16; n++ {
		_, err := a.sd.Send(&sdi.Frame{Peer: rank, Payload: pattern(16<<10, 1), Token: firstToken + uint64(n)})
		if errors.Is(err, sdi.ErrWouldBlock) {
			return n
		}
		if err != nil {
			t.Fatalf("Send %d: %v", n, err)
		}
	}
	t.Fatalf("a peer that never reads accepted %d frames; want ErrWouldBlock", 1<<16)
	return 0
}

// TestWriteErrorFailsQueued checks that a connection failing under queued
// frames fails each of them once and reports the peer down once.
func TestWriteErrorFailsQueued(t *testing.T) {
	nodes := newJob(t, 1, jobOpts{size: 2, config: `{"listen": "127.0.0.1:0", "queue_bytes": 65536}`})
	a := nodes[0]
	theirs := stuckPeer(t, a, 1)
	accepted := fill(t, a, 1, 0)
	theirs.Close()
	a.rec.waitFor(t, "PeerDown", func() bool { return a.rec.downs[1] != nil })
	for tok := range uint64(accepted) {
		if errs := a.rec.doneErrs(tok); len(errs) != 1 || !errors.Is(errs[0], sdi.ErrPeerUnreachable) {
			t.Errorf("token %d: SendDone calls %v, want one ErrPeerUnreachable", tok, errs)
		}
	}
}

// TestClose checks that Close fails what is queued exactly once, that it is
// idempotent, that every call after it says ErrClosed, that no Handler call
// follows it and that no goroutine survives it.
func TestClose(t *testing.T) {
	nodes := newJob(t, 2, jobOpts{size: 3, config: `{"listen": "127.0.0.1:0", "queue_bytes": 65536}`})
	a, b := nodes[0], nodes[1]
	stuckPeer(t, a, 2)
	accepted := fill(t, a, 2, 0)
	ctx := context.Background()
	for i := range 3 {
		if err := a.sd.Close(ctx); err != nil {
			t.Fatalf("Close #%d: %v", i+1, err)
		}
	}
	a.rec.mu.Lock()
	a.rec.closed = true
	downs := len(a.rec.downs)
	a.rec.mu.Unlock()
	if downs != 0 {
		t.Errorf("Close reported %d peers down", downs)
	}
	for tok := range uint64(accepted) {
		if errs := a.rec.doneErrs(tok); len(errs) != 1 || !errors.Is(errs[0], sdi.ErrClosed) {
			t.Errorf("token %d: SendDone calls %v, want one ErrClosed", tok, errs)
		}
	}

	calls := []struct {
		name string
		call func() error
	}{
		{"Send", func() error { _, err := a.sd.Send(&sdi.Frame{Peer: b.rank}); return err }},
		{"Connect", func() error { return a.sd.Connect(ctx, b.rank, b.local.Addr) }},
		{"Flush", func() error { return a.sd.Flush(ctx, b.rank) }},
		{"Disconnect", func() error { return a.sd.Disconnect(ctx, b.rank) }},
	}
	for _, c := range calls {
		if err := c.call(); !errors.Is(err, sdi.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", c.name, err)
		}
	}
	// Traffic from b keeps arriving at a's closed listener side until b
	// notices; none of it may reach a's handler.
	for i := range 10 {
		b.sd.Send(&sdi.Frame{Peer: a.rank, Token: uint64(i)})
	}
	b.rec.waitFor(t, "b sees a down", func() bool { return b.rec.downs[a.rank] != nil })
	a.rec.mu.Lock()
	late := a.rec.late
	a.rec.mu.Unlock()
	if late != 0 {
		t.Errorf("%d Handler calls after Close returned", late)
	}
	// Tests run one at a time, so once b is closed too no goroutine of this
	// package may be left.
	b.close(t)
	if leaked := leakedGoroutines(); leaked != "" {
		t.Errorf("goroutines still running after Close:\n%s", leaked)
	}
}

// TestStuckPeerFlushDisconnect checks that Flush and Disconnect give up at
// their context on a peer that never reads, and that Disconnect then fails
// what was queued instead of leaving it pending.
func TestStuckPeerFlushDisconnect(t *testing.T) {
	nodes := newJob(t, 1, jobOpts{size: 2, config: `{"listen": "127.0.0.1:0", "queue_bytes": 65536}`})
	a := nodes[0]
	stuckPeer(t, a, 1)
	accepted := fill(t, a, 1, 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := a.sd.Flush(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("Flush on a stuck peer with a cancelled context: %v, want context.Canceled", err)
	}
	if err := a.sd.Disconnect(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("Disconnect on a stuck peer with a cancelled context: %v, want context.Canceled", err)
	}
	for tok := range uint64(accepted) {
		if errs := a.rec.doneErrs(tok); len(errs) != 1 || !errors.Is(errs[0], sdi.ErrNotConnected) {
			t.Errorf("token %d: SendDone calls %v, want one ErrNotConnected", tok, errs)
		}
	}
	if _, err := a.sd.Send(&sdi.Frame{Peer: 1}); !errors.Is(err, sdi.ErrNotConnected) {
		t.Fatalf("Send after Disconnect: %v, want ErrNotConnected", err)
	}
	if err := a.rec.down(1); err != nil {
		t.Fatalf("Disconnect reported the peer down: %v", err)
	}
}

// TestPlaceFailedAfterDown: an inbound stream that ends inside a frame it
// was placing, after the peer was reported down for its own connection's
// failure, reports the peer down again. The Placer gives the place up only
// on such a report; one swallowed left a rendezvous receive waiting for
// ever.
func TestPlaceFailedAfterDown(t *testing.T) {
	nodes := newJob(t, 2, jobOpts{})
	a, b := nodes[0], nodes[1]
	sd := a.sd.(*subDevice)
	p := sd.peers[b.rank].Load()
	if !p.laneDown(errors.New("test: our connection broke"), nil) {
		t.Fatal("the first failure was not reported")
	}
	// The place was given while that connection was current.
	sd.placeFailed(&inbound{rank: b.rank, placeGen: p.gen}, io.ErrUnexpectedEOF)
	a.rec.waitFor(t, "a second PeerDown", func() bool { return a.rec.downCount[b.rank] == 2 })
}
