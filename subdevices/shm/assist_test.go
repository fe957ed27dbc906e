package shm

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// fakeAt is a ring cursor no real record of the tests below sits at.
const fakeAt = 1 << 40

// assistRig is a connected pair of ranks in this process with a payload
// of rank 0's registered as a descriptor in flight towards rank 1 at
// cursor fakeAt, as Send would, without a record in the ring.
type assistRig struct {
	tx      *peer // rank 0's connection to rank 1
	back    *peer // rank 1's connection to rank 0
	rx      *device
	payload []byte

	// For one run: the process the receiver takes for the sender's and
	// how to make it exit, the stalls counted before, and a channel
	// closed once the receiver returned.
	proc     *peerProc
	die      func()
	stalls   int64
	returned chan struct{}
}

func newAssistRig(t *testing.T, n int) *assistRig {
	t.Helper()
	requireSingleCopy(t)
	j := openJob(t, 2, jobOpts{config: []byte(`{"ring_bytes": 16777216}`)})
	g := &assistRig{tx: j.sds[0].(*device).peers[1].Load(), back: j.sds[1].(*device).peers[0].Load(), rx: j.sds[1].(*device), payload: pattern(7, n)}
	if !g.tx.canWrite.Load() {
		t.Fatal("rank 0 may read rank 1's memory but was not allowed to write into it")
	}
	g.proc, g.die = g.rx.srcProc[0].Load(), func() {}
	inFlight(t, g.tx, g.payload)
	return g
}

// inFlight registers payload as a descriptor of p's in flight at cursor
// fakeAt, as Send would, until the test ends.
func inFlight(t *testing.T, p *peer, payload []byte) {
	p.mu.Lock()
	p.inflight = append(p.inflight, inflight{token: 99, at: fakeAt, payload: payload})
	p.mu.Unlock()
	t.Cleanup(func() {
		p.mu.Lock()
		p.inflight = nil
		p.mu.Unlock()
	})
}

// request publishes a request as a receiver would, for epoch e.
func (g *assistRig) request(e uint32, at uint64, dst []byte, n int) {
	aw := g.tx.ring.assist
	aw.done.Store(0)
	aw.at.Store(at)
	aw.dst.Store(uint64(uintptr(unsafe.Pointer(unsafe.SliceData(dst)))))
	aw.n.Store(uint64(n))
	aw.claim.Store(uint64(e) << 32)
}

// awaitOpen waits until the receiver opened an epoch (the first is 1).
func (g *assistRig) awaitOpen() {
	for g.tx.ring.assist.claim.Load()>>32 == 0 {
	}
}

// take claims a chunk of the open epoch as a sender would and returns
// its index, or -1 if the receiver took them all first.
func (g *assistRig) take() int {
	g.awaitOpen()
	aw := g.tx.ring.assist
	for {
		w := aw.claim.Load()
		if uint64(uint32(w)) >= uint64(chunks(len(g.payload))) {
			return -1
		}
		if aw.claim.CompareAndSwap(w, w+1) {
			return int(uint32(w))
		}
	}
}

// TestAssistOne checks the sender's side: it copies a chunk only of a
// payload of its own in flight, of the length it has, within the open
// epoch, and reports a write that fails instead of claiming success.
func TestAssistOne(t *testing.T) {
	const n = 3*assistChunk + 100
	tests := []struct {
		name   string
		at     uint64
		n      int
		claim  func(e uint64) uint64 // the claim word after the request; nil: as opened
		badDst bool
		copies bool
		failed bool
	}{
		{name: "takes the next chunk", at: fakeAt, n: n, copies: true},
		{name: "last chunk", at: fakeAt, n: n, claim: func(e uint64) uint64 { return e | 3 }, copies: true},
		{name: "past the end", at: fakeAt, n: n, claim: func(e uint64) uint64 { return e | 4 }},
		{name: "closed epoch", at: fakeAt, n: n, claim: func(e uint64) uint64 { return e | assistClosed }},
		{name: "cursor of no descriptor", at: fakeAt + recAlign, n: n},
		{name: "other length", at: fakeAt, n: n - 1},
		{name: "unmapped destination", at: fakeAt, n: n, badDst: true, failed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newAssistRig(t, n)
			dst := make([]byte, n)
			g.request(5, tt.at, dst, tt.n)
			aw := g.tx.ring.assist
			if tt.badDst {
				aw.dst.Store(4096) // never mapped in a Go process
			}
			if tt.claim != nil {
				aw.claim.Store(tt.claim(5 << 32))
			}
			before := aw.claim.Load()
			checked := false
			did := g.tx.assistOne(&checked)
			k := int(uint32(before))
			switch {
			case did != tt.copies:
				t.Fatalf("assistOne = %v, want %v", did, tt.copies)
			case tt.copies && aw.claim.Load() != before+1:
				t.Fatalf("claim word %#x after taking a chunk from %#x", aw.claim.Load(), before)
			case !tt.copies && !tt.failed && aw.claim.Load() != before:
				t.Fatalf("claim word moved from %#x to %#x without a copy", before, aw.claim.Load())
			case tt.failed && (aw.done.Load() != assistFailed || g.tx.canWrite.Load()):
				t.Fatalf("done word %#x and canWrite %v after a failed write, want %#x and false", aw.done.Load(), g.tx.canWrite.Load(), uint64(assistFailed))
			case tt.copies && aw.done.Load() != 1:
				t.Fatalf("done word %d after one chunk", aw.done.Load())
			}
			for i := range dst {
				inChunk := tt.copies && i/assistChunk == k
				if want := map[bool]byte{true: g.payload[i], false: 0}[inChunk]; dst[i] != want {
					t.Fatalf("byte %d is %#x, want %#x (chunk %d copied: %v)", i, dst[i], want, k, tt.copies)
				}
			}
		})
	}
}

// TestReadAssisted checks the receiver's side against a sender that takes
// chunks and finishes them late, fails them, or never finishes them: the
// receiver returns only when every byte is in place, reads everything
// itself after a failure, and waits for a chunk the sender took for as
// long as the sender's process runs, however long (a process_vm_writev
// under way in the sender cannot be called back, and the place must get
// no byte after the receiver gave it up), returning without delivering
// once it exited.
func TestReadAssisted(t *testing.T) {
	const n = 256 * assistChunk // 16 MiB: the helper has time to join in
	tests := []struct {
		name string
		// proc, if set, gives the process the receiver watches as the
		// sender's, and the function that makes it exit.
		proc    func(t *testing.T) (*peerProc, func())
		helper  func(g *assistRig, dst []byte) bool // reports whether it took part
		wantErr error
	}{
		{name: "sender finishes late", helper: func(g *assistRig, dst []byte) bool {
			k := g.take()
			if k < 0 {
				return false
			}
			time.Sleep(20 * time.Millisecond)
			g.write(k, dst)
			return true
		}},
		{name: "real sender", helper: func(g *assistRig, _ []byte) bool {
			g.awaitOpen()
			return g.tx.assist() > 0
		}},
		{name: "sender fails", helper: func(g *assistRig, _ []byte) bool {
			if g.take() < 0 {
				return false
			}
			g.tx.ring.assist.done.Add(assistFailed)
			return true
		}},
		// A sender stopped mid-copy (SIGSTOP, a debugger) and resumed
		// after the patience: the receiver used to give up at the
		// patience, report it down, and get the chunk written into the
		// place afterwards.
		{name: "sender finishes after the patience", helper: func(g *assistRig, dst []byte) bool {
			k := g.take()
			if k < 0 {
				return false
			}
			g.stalledOrReturned()
			g.write(k, dst)
			return true
		}},
		// A reconnect releases the previous connection's process; the
		// receiver waiting on it must still know whether it runs.
		{name: "process released meanwhile", proc: func(t *testing.T) (*peerProc, func()) {
			pr, unavail, err := openPeerProc(os.Getpid(), unix.PidfdOpen)
			if err != nil {
				t.Fatal(err)
			}
			if unavail != nil {
				t.Skipf("pidfd_open is unavailable here: %v", unavail)
			}
			return pr, func() {}
		}, helper: func(g *assistRig, dst []byte) bool {
			k := g.take()
			if k < 0 {
				return false
			}
			_ = g.proc.release()
			g.stalledOrReturned()
			g.write(k, dst)
			return true
		}},
		{name: "sender dies holding a chunk", proc: liveProc, wantErr: sdi.ErrPeerUnreachable, helper: func(g *assistRig, _ []byte) bool {
			if g.take() < 0 {
				return false
			}
			g.stalledOrReturned()
			g.die()
			return true
		}},
		{name: "garbled claim word", proc: liveProc, wantErr: sdi.ErrPeerUnreachable, helper: func(g *assistRig, _ []byte) bool {
			g.awaitOpen()
			aw := g.tx.ring.assist
			for {
				w := aw.claim.Load()
				if uint64(uint32(w)) >= uint64(chunks(len(g.payload))) {
					return false
				}
				if aw.claim.CompareAndSwap(w, w|1000) {
					break
				}
			}
			g.stalledOrReturned()
			g.die()
			return true
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newAssistRig(t, n)
			g.rx.assistPatience = 50 * time.Millisecond
			// The receiver may take every chunk before the helper runs;
			// then the case did not happen, and it goes again.
			for attempt := 0; ; attempt++ {
				if attempt == 20 {
					if runtime.GOMAXPROCS(0) == 1 {
						// The helper runs only when the receiver lets go of
						// the one processor, after its reading is done.
						t.Skip("the helper never got a chunk in 20 attempts, on one processor")
					}
					t.Fatal("the helper never got a chunk in 20 attempts")
				}
				g.proc, g.die = g.rx.srcProc[0].Load(), func() {}
				if tt.proc != nil {
					g.proc, g.die = tt.proc(t)
				}
				dst := make([]byte, n)
				in, got, err := g.run(tt.helper, dst)
				if !in {
					continue
				}
				if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
					t.Fatalf("readAssisted: %v, want %v", err, tt.wantErr)
				}
				if err == nil && !bytes.Equal(got, g.payload) {
					t.Fatal("payload differs")
				}
				return
			}
		})
	}
}

// TestParkedSince checks that a read parked on a sender's chunk dates its
// wait, which assistPatience bounds, from when it was parked: the stall
// warning used to count from the first checkParked, up to a liveness
// check later.
func TestParkedSince(t *testing.T) {
	const n = 256 * assistChunk // 16 MiB: the helper has time to join in
	g := newAssistRig(t, n)
	rc := g.rx.rx
	// Hold the receive lock: the test is the receiver's owner.
	g.rx.rxMu.Lock()
	defer g.rx.rxMu.Unlock()
	for attempt := 0; ; attempt++ {
		if attempt == 20 {
			if runtime.GOMAXPROCS(0) == 1 {
				t.Skip("the helper never got a chunk in 20 attempts, on one processor")
			}
			t.Fatal("the helper never got a chunk in 20 attempts")
		}
		dst := make([]byte, n)
		took := make(chan int)
		go func() { took <- g.take() }()
		before := time.Now()
		parked, err := rc.startAssisted(0, g.proc, dst, descriptorOf(g.payload).addr, fakeAt)
		after := time.Now()
		k := <-took
		if err != nil {
			t.Fatal(err)
		}
		if k < 0 {
			continue // the receiver took every chunk first
		}
		if !parked {
			t.Fatalf("the read returned while the helper holds chunk %d", k)
		}
		pk := rc.parked[0]
		g.write(k, dst)
		err = rc.finishParked(0, true)
		rc.parked[0] = parkedRead{}
		if err != nil {
			t.Fatal(err)
		}
		if pk.since.Before(before) || pk.since.After(after) {
			t.Fatalf("parked read dated %v, want within the call that parked it (%v to %v)", pk.since, before, after)
		}
		if !pk.looked.Equal(pk.since) {
			t.Fatalf("sender's process last checked at %v, want when the read was parked (%v)", pk.looked, pk.since)
		}
		return
	}
}

// liveProc returns, as the sender's process, one that runs until the
// function returned with it kills it. Its memory is not read: the reads
// go to the pid, which is this process's.
func liveProc(t *testing.T) (*peerProc, func()) {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skipf("no sleep command to stand for the sender's process: %v", err)
	}
	cmd := exec.Command(sleep, "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	kill := func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	t.Cleanup(kill)
	fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Skipf("pidfd_open is unavailable here: %v", err)
	}
	pr := &peerProc{pid: os.Getpid(), fd: fd, refs: 1}
	t.Cleanup(func() { _ = pr.release() })
	return pr, kill
}

// write copies chunk k of the payload into dst and counts it done, as the
// sender does: through the kernel, since the race detector does not see
// atomics on shared mappings order a Go copy.
func (g *assistRig) write(k int, dst []byte) {
	off := k * assistChunk
	end := min(off+assistChunk, len(g.payload))
	if err := g.tx.writeChunk(g.payload[off:end], descriptorOf(dst).addr+uint64(off)); err != nil {
		panic(err)
	}
	g.tx.ring.assist.done.Add(1)
}

// stalledOrReturned waits until the receiver has waited for the helper's
// chunk past its patience, or gave up waiting and returned.
func (g *assistRig) stalledOrReturned() {
	for g.rx.assistStalls.Load() == g.stalls {
		select {
		case <-g.returned:
			return
		case <-time.After(time.Millisecond):
		}
	}
}

// run reads the rig's payload into dst as rank 1's receiver, with helper
// running beside it as rank 0, and reports whether the helper took part
// and what dst held when the read returned.
func (g *assistRig) run(helper func(g *assistRig, dst []byte) bool, dst []byte) (bool, []byte, error) {
	// Hold the receive lock: the test is the receiver's owner.
	g.rx.rxMu.Lock()
	defer g.rx.rxMu.Unlock()
	g.returned, g.stalls = make(chan struct{}), g.rx.assistStalls.Load()
	in := make(chan bool)
	go func() { in <- helper(g, dst) }()
	err := g.rx.rx.readAssisted(0, g.proc, dst, descriptorOf(g.payload).addr, fakeAt)
	// What dst holds when the read returns is what would be delivered:
	// a chunk the helper writes later must not be missing from it.
	got := bytes.Clone(dst)
	close(g.returned)
	return <-in, got, err
}

// TestAssistOnlyOneWay checks when a receiver asks for help: with a
// payload of its own in flight towards the sender (a two-way exchange) it
// reads alone and opens no epoch; otherwise it opens one.
func TestAssistOnlyOneWay(t *testing.T) {
	const n = 4 * assistChunk
	for _, tt := range []struct {
		name      string
		sending   bool // rank 1 has a descriptor in flight towards rank 0
		wantEpoch bool
	}{
		{name: "one way: asks for help", wantEpoch: true},
		{name: "both ways: reads alone", sending: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := newAssistRig(t, n)
			if tt.sending {
				inFlight(t, g.back, pattern(8, n))
			}
			dst := make([]byte, n)
			_, got, err := g.run(func(*assistRig, []byte) bool { return false }, dst)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, g.payload) {
				t.Fatal("payload differs")
			}
			if epoch := g.tx.ring.assist.claim.Load() >> 32; (epoch != 0) != tt.wantEpoch {
				t.Fatalf("epoch %d after the read; want one opened: %v", epoch, tt.wantEpoch)
			}
		})
	}
}

// TestAssistedFrames sends frames large enough to be copied by both sides
// through a ring and checks that they arrive intact and that later small
// frames still follow.
func TestAssistedFrames(t *testing.T) {
	requireSingleCopy(t)
	j := openJob(t, 2, jobOpts{config: []byte(`{"ring_bytes": 16777216}`)})
	sizes := []int{2 * assistChunk, 2*assistChunk + 1, 1 << 20, 4<<20 - 3, 100}
	for i, size := range sizes {
		payload := pattern(uint64(i), size)
		done, err := j.sds[0].Send(&sdi.Frame{Peer: 1, Header: []byte{byte(i)}, Payload: payload, Token: uint64(i)})
		if err != nil {
			t.Fatal(err)
		}
		if m := j.hs[1].next(t); m.header[0] != byte(i) || !bytes.Equal(m.payload, payload) {
			t.Fatalf("frame %d of %d bytes differs", i, size)
		}
		if !done {
			if d := j.hs[0].nextDone(t); d.err != nil || d.token != uint64(i) {
				t.Fatalf("SendDone(%d, %v), want %d, nil", d.token, d.err, i)
			}
		}
	}
}
