package tcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// pollSize varies frame sizes across the read buffer's limit, so frames
// are batched, split across reads and read past the buffer.
func pollSize(i int) int { return i * 7919 % (readBufSize + 5000) }

// TestPollKeepsOrder has goroutines poll rank 0 while three ranks stream
// to it, so pollers and reader goroutines take turns. Every frame must
// arrive once, intact and in order per sender, Deliver calls for one rank
// must never overlap, and some frames must come through Poll. Poll reads
// its three connections one by one, or asks the poll set which have
// something first: with one poller the set alone delivers, with two the
// one that finds the set in use reads every connection. Without peeking
// ahead (kernels before 6.10) frames a drain left in the read buffer are
// gone from the socket, and the set no longer reports them.
func TestPollKeepsOrder(t *testing.T) {
	for _, tt := range []struct {
		name             string
		scanMax, pollers int
		peek             bool
	}{
		{"read each", pollScanMax, 2, true},
		{"poll set", 0, 1, true},
		{"poll set, two pollers", 0, 2, true},
		{"poll set, no peeking", 0, 1, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// Restored after the job's instances closed (cleanups run
			// last first): their goroutines read both.
			scanMax, peek := pollScanMax, peekAhead
			t.Cleanup(func() { pollScanMax, peekAhead = scanMax, peek })
			pollScanMax, peekAhead = tt.scanMax, tt.peek
			testPollKeepsOrder(t, tt.pollers)
		})
	}
}

func testPollKeepsOrder(t *testing.T, pollers int) {
	const n, frames = 4, 600
	nodes := newJob(t, n, jobOpts{config: `{"listen": "127.0.0.1:0", "queue_bytes": 262144}`})
	if !nodes[0].local.Caps.Flags.Has(sdi.FlagPoll) {
		t.Fatal("caps lack FlagPoll")
	}
	poller, ok := nodes[0].sd.(sdi.Poller)
	if !ok {
		t.Fatal("tcp does not implement sdi.Poller")
	}
	stop := make(chan struct{})
	var polled atomic.Int64
	var polling sync.WaitGroup
	for range pollers {
		polling.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				polled.Add(int64(poller.Poll()))
				runtime.Gosched()
			}
		})
	}
	var senders sync.WaitGroup
	for _, a := range nodes[1:] {
		senders.Go(func() {
			for i := range frames {
				hdr := binary.LittleEndian.AppendUint32(nil, uint32(i))
				send(t, a, &sdi.Frame{Peer: 0, Header: hdr, Payload: pattern(pollSize(i), byte(i)), Token: uint64(i)})
			}
		})
	}
	senders.Wait()
	b := nodes[0]
	for _, a := range nodes[1:] {
		b.rec.waitFor(t, fmt.Sprintf("%d frames from rank %d", frames, a.rank), func() bool { return len(b.rec.delivered[a.rank]) >= frames })
	}
	close(stop)
	polling.Wait()
	for _, a := range nodes[1:] {
		got := b.rec.frames(a.rank)
		if len(got) != frames {
			t.Fatalf("from rank %d: %d frames, want %d", a.rank, len(got), frames)
		}
		for i, d := range got {
			if seq := binary.LittleEndian.Uint32(d.header); seq != uint32(i) {
				t.Fatalf("from rank %d: frame %d has sequence %d", a.rank, i, seq)
			}
			if !bytes.Equal(d.payload, pattern(pollSize(i), byte(i))) {
				t.Fatalf("from rank %d: frame %d payload corrupted", a.rank, i)
			}
		}
	}
	b.rec.mu.Lock()
	overlaps := b.rec.overlaps
	b.rec.mu.Unlock()
	if overlaps != 0 {
		t.Errorf("%d Deliver calls overlapped for one rank", overlaps)
	}
	if polled.Load() == 0 {
		t.Fatal("no frame was delivered through Poll")
	}
	t.Logf("%d of %d frames delivered through Poll", polled.Load(), (n-1)*frames)
}

// readersParkedIn counts reader goroutines parked (not running) in fn.
func readersParkedIn(fn string) int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		first, _, _ := strings.Cut(g, "\n")
		if strings.Contains(first, "[select") && strings.Contains(g, fn) {
			n++
		}
	}
	return n
}

// readersWaiting counts readers waiting for their socket while nobody
// polls; readersStandingBy those standing by for pollers.
func readersWaiting() int    { return readersParkedIn("tcp.(*subDevice).awaitReadable") }
func readersStandingBy() int { return readersParkedIn("tcp.(*subDevice).standBy") }

// awaitReaders waits until want reader goroutines wait for their sockets.
func awaitReaders(t *testing.T, want int, why string) {
	t.Helper()
	deadline := time.Now().Add(watchdog)
	for readersWaiting() != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d readers waiting for their sockets, want %d", why, readersWaiting(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPollStandsReadersBy checks the hand-over both ways: while both ranks
// poll, a ping-pong runs on the polling goroutines and the reader
// goroutines stand by rather than wait for their sockets (where every frame
// would wake them); once polling stops, the readers wait for their sockets
// again and deliver without anybody polling.
func TestPollStandsReadersBy(t *testing.T) {
	if runtime.GOMAXPROCS(0) == 1 {
		// Both ranks live in this process: with one processor a poller
		// gets it back only when the runtime preempts the other, every
		// 10 ms, longer than the stand-by nap, so the premise fails.
		t.Skip("needs two processors: the two ranks' pollers must run at once")
	}
	nodes := newJob(t, 2, jobOpts{})
	a, b := nodes[0], nodes[1]
	awaitReaders(t, 2, "before polling")

	// Each side polls until the other's next frame arrives, then answers,
	// until stop; polling stops only with the ping-pong. A reader that is
	// waiting for its socket when polling starts leaves at the next frame.
	stop := make(chan struct{})
	var polled [2]atomic.Int64
	var rounds atomic.Int64
	pingPong := func(i int, me *node, peer sdi.Rank, first bool) {
		p := me.sd.(sdi.Poller)
		for r := 0; ; r++ {
			want := r + 1 // the peer's frame this round answers
			if first {
				want = r
			}
			for me.rec.count(peer) < want {
				polled[i].Add(int64(p.Poll()))
				select {
				case <-stop:
					return
				default:
				}
			}
			send(t, me, &sdi.Frame{Peer: peer, Payload: pattern(8, byte(r)), Token: uint64(r)})
			rounds.Add(1)
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { pingPong(0, a, b.rank, true) })
	wg.Go(func() { pingPong(1, b, a.rank, false) })
	// Both readers park on stand-by, neither waiting for their sockets
	// nor spinning. Scheduling on a loaded machine can pause a poller long
	// enough to end stand-by for a moment, so look for a few samples in a
	// row.
	deadline := time.Now().Add(watchdog)
	for good := 0; good < 5; {
		if time.Now().After(deadline) {
			close(stop)
			wg.Wait()
			t.Fatalf("while both ranks poll: %d readers on stand-by, %d waiting for their sockets after %d frames; want 2 and 0",
				readersStandingBy(), readersWaiting(), rounds.Load())
		}
		if readersStandingBy() == 2 {
			good++
		} else {
			good = 0
		}
		time.Sleep(2 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if polled[0].Load() == 0 || polled[1].Load() == 0 {
		t.Fatalf("frames delivered through Poll: %d and %d, want some at both ranks", polled[0].Load(), polled[1].Load())
	}
	t.Logf("%d and %d of %d frames delivered through Poll", polled[0].Load(), polled[1].Load(), rounds.Load())

	awaitReaders(t, 2, "after polling stopped")
	before := b.rec.count(a.rank)
	send(t, a, &sdi.Frame{Peer: b.rank, Payload: []byte("unpolled"), Token: 1 << 40})
	b.rec.waitFor(t, "a frame nobody polls for", func() bool { return len(b.rec.delivered[a.rank]) == before+1 })
}

// TestPollBeforeOpenAndAfterClose checks that Poll is harmless on an
// instance that is not open.
func TestPollBeforeOpenAndAfterClose(t *testing.T) {
	if got := New(nil).(sdi.Poller).Poll(); got != 0 {
		t.Fatalf("Poll before Open = %d", got)
	}
	nodes := newJob(t, 2, jobOpts{})
	a, b := nodes[0], nodes[1]
	if err := a.sd.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	a.rec.mu.Lock()
	a.rec.closed = true
	a.rec.mu.Unlock()
	b.sd.Send(&sdi.Frame{Peer: a.rank, Payload: []byte("late")})
	if got := a.sd.(sdi.Poller).Poll(); got != 0 {
		t.Fatalf("Poll after Close = %d", got)
	}
	a.rec.mu.Lock()
	late := a.rec.late
	a.rec.mu.Unlock()
	if late != 0 {
		t.Fatalf("%d Handler calls after Close", late)
	}
}

// TestSendHandOver has Send write frames inline to a peer that stops
// reading until the socket fills, so one frame is written in part and the
// writer finishes it behind the caller's back, with more frames queued
// behind it. Every frame must arrive intact and complete exactly once,
// either at once (done=true) or through SendDone.
func TestSendHandOver(t *testing.T) {
	nodes := newJob(t, 2, jobOpts{config: `{"listen": "127.0.0.1:0", "max_connections": 1}`})
	a, b := nodes[0], nodes[1]
	gate := make(chan struct{})
	b.rec.mu.Lock()
	b.rec.gate = gate
	b.rec.mu.Unlock()

	var inline, partial int
	tok := uint64(0)
	// The kernel buffers a few MB; 256 MB without a partial write means
	// Send never hands over.
	for ; partial == 0 && tok < 256; tok++ {
		f := tokenFrame(b.rank, tok, maxFrame)
		done, err := a.sd.Send(f)
		if err != nil {
			t.Fatalf("Send %d: %v", tok, err)
		}
		if done {
			inline++
			a.rec.completedInline(tok)
		} else {
			partial++
		}
	}
	if partial == 0 {
		t.Fatalf("%d frames of 1 MiB written at once to a peer that does not read", tok)
	}
	// Frames queued behind the partial one.
	for range 3 {
		send(t, a, tokenFrame(b.rank, tok, 1000+int(tok)))
		tok++
	}
	close(gate)
	ctx, cancel := context.WithTimeout(context.Background(), watchdog)
	defer cancel()
	if err := a.sd.Flush(ctx, b.rank); err != nil {
		t.Fatal(err)
	}
	b.rec.waitFor(t, "every frame", func() bool { return len(b.rec.delivered[a.rank]) == int(tok) })
	for i, d := range b.rec.frames(a.rank) {
		want := tokenFrame(b.rank, uint64(i), maxFrame)
		if i >= int(tok)-3 {
			want = tokenFrame(b.rank, uint64(i), 1000+i)
		}
		if !bytes.Equal(d.header, want.Header) || !bytes.Equal(d.payload, want.Payload) {
			t.Fatalf("frame %d arrived with %d+%d bytes or different content", i, len(d.header), len(d.payload))
		}
	}
	for i := range tok {
		if errs := a.rec.doneErrs(i); len(errs) != 1 || errs[0] != nil {
			t.Errorf("token %d: completions %v, want exactly one without error", i, errs)
		}
	}
	t.Logf("%d frames written at once, then one in part", inline)
}

// fillSocket has a send 1 MiB frames to b, which does not read, until one
// is left queued; it returns how many it sent. Frames written at once are
// recorded as completed.
func fillSocket(t *testing.T, a, b *node) uint64 {
	t.Helper()
	for tok := uint64(0); tok < 256; tok++ {
		done, err := a.sd.Send(tokenFrame(b.rank, tok, maxFrame))
		if err != nil {
			t.Fatalf("Send %d: %v", tok, err)
		}
		if !done {
			return tok + 1
		}
		a.rec.completedInline(tok)
	}
	t.Fatal("256 frames of 1 MiB written at once to a peer that does not read")
	return 0
}

// TestIdleEndsStandBy checks that Idle hands the connections back to the
// reader and writer goroutines at once. Stand-by otherwise lasts an hour
// here, so without Idle the frames below would wait that long: b's reader
// stands by since b polled, and a's writer holds the frames that a queued
// after it polled.
func TestIdleEndsStandBy(t *testing.T) {
	nodes := newJob(t, 2, jobOpts{config: `{"listen": "127.0.0.1:0", "max_connections": 1}`, nap: time.Hour})
	a, b := nodes[0], nodes[1]
	pa, pb := a.sd.(sdi.Poller), b.sd.(sdi.Poller)
	if !a.local.Caps.Flags.Has(sdi.FlagIdle) {
		t.Fatal("caps lack FlagIdle")
	}
	ia, ib := a.sd.(sdi.Idler), b.sd.(sdi.Idler)

	// Once b polled, its reader leaves frames to pollers: if it waits
	// for its socket, the first frame wakes it and it stands by.
	pa.Poll()
	pb.Poll()
	// a's writer stands by too: what the socket did not take stays queued.
	n := fillSocket(t, a, b)

	ia.Idle()
	ib.Idle()
	b.rec.waitFor(t, "every frame, with nobody polling", func() bool { return len(b.rec.delivered[a.rank]) == int(n) })
	ctx, cancel := context.WithTimeout(context.Background(), watchdog)
	defer cancel()
	if err := a.sd.Flush(ctx, b.rank); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if errs := a.rec.doneErrs(i); len(errs) != 1 || errs[0] != nil {
			t.Errorf("token %d: completions %v, want exactly one without error", i, errs)
		}
	}
}

// TestPollPushes checks that a polling rank writes what its peers' sockets
// did not take, on the polling goroutine: a's writer stands by for an hour
// after a polled, so only Poll can finish the frames, and Poll's count
// includes them.
func TestPollPushes(t *testing.T) {
	nodes := newJob(t, 2, jobOpts{config: `{"listen": "127.0.0.1:0", "max_connections": 1}`, nap: time.Hour})
	a, b := nodes[0], nodes[1]
	pa := a.sd.(sdi.Poller)
	pa.Poll()
	// b never polls, so its reader delivers; it waits while the socket
	// fills, then reads on.
	gate := make(chan struct{})
	b.rec.mu.Lock()
	b.rec.gate = gate
	b.rec.mu.Unlock()
	n := fillSocket(t, a, b)
	close(gate)
	completed := 0
	deadline := time.Now().Add(watchdog)
	for i := range n {
		for len(a.rec.doneErrs(i)) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("token %d of %d not completed while a polls", i, n)
			}
			completed += pa.Poll()
		}
	}
	if completed == 0 {
		t.Fatal("Poll completed no frame")
	}
	b.rec.waitFor(t, "every frame", func() bool { return len(b.rec.delivered[a.rank]) == int(n) })
	for i := range n {
		if errs := a.rec.doneErrs(i); len(errs) != 1 || errs[0] != nil {
			t.Errorf("token %d: completions %v, want exactly one without error", i, errs)
		}
	}
}

// A drain that stops at the poll budget leaves whole frames in the frame
// reader. Without peeking ahead they are gone from the socket, so the poll
// set no longer reports the connection; only the note in inbound.more
// brings the next Poll back to it. Without the note, a waiter polling for
// the last frames of a burst waited until it stopped polling.
func TestPollSetDrainsWhatTheBudgetLeft(t *testing.T) {
	scanMax, peek := pollScanMax, peekAhead
	t.Cleanup(func() { pollScanMax, peekAhead = scanMax, peek })
	pollScanMax, peekAhead = 0, false
	nodes := newJob(t, 2, jobOpts{})
	poller, idler := nodes[0].sd.(sdi.Poller), nodes[0].sd.(sdi.Idler)
	// A poller that has called Idle once keeps stand-by for hintedNap
	// after its last Poll: the burst arrives while rank 0's reader stands
	// by, and only Poll reads it.
	poller.Poll()
	idler.Idle()
	poller.Poll()
	start := time.Now()
	const frames = 2 * pollBudget
	for i := range frames {
		send(t, nodes[1], &sdi.Frame{Peer: 0, Header: binary.LittleEndian.AppendUint32(nil, uint32(i)), Payload: pattern(8, byte(i)), Token: uint64(i)})
	}
	time.Sleep(time.Millisecond) // the burst reaches rank 0's socket
	polled := 0
	for deadline := time.Now().Add(5 * time.Second); polled < frames && time.Now().Before(deadline); {
		polled += poller.Poll()
	}
	got := len(nodes[0].rec.frames(1))
	if got != frames {
		t.Fatalf("%d of %d frames arrived while rank 0 polled (%d through Poll)", got, frames, polled)
	}
	if polled != frames {
		// Stand-by ended before the polling loop (a slow machine) and the
		// reader took some: the budget's leftovers were not Poll's to find.
		t.Skipf("the reader delivered %d frames: the burst took %v to send, stand-by lasts %v", frames-polled, time.Since(start), hintedNap)
	}
}
