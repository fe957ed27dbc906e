package sditest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

type setup uint8

const (
	setupConnected setup = iota // Peers instances opened and every pair connected
	setupOpened                 // opened, not connected
	setupNone                   // the check opens what it needs
)

// check is one entry of the catalogue. fn runs on the test goroutine and
// may call t.Fatal.
type check struct {
	name  string
	setup setup
	fn    func(t testing.TB, e *env)
}

// catalogue lists the checks in the order Run runs them.
var catalogue = []check{
	// Info is static and has no side effects: repeated calls agree, before and after Open.
	{"Info/NoSideEffects", setupNone, testInfoNoSideEffects},
	// Open publishes valid caps with room for the multidevice's header, a business card per rank, and the same limits on every rank.
	{"Open/CapsSane", setupOpened, testOpenCapsSane},
	// Unusable cards fail Connect with ErrPeerUnreachable, and a failed Connect harms nothing.
	{"Connect/BadAddr", setupOpened, testConnectBadAddr},
	// Frames of every legal size arrive intact; oversized payloads and headers get ErrTooLarge.
	{"Send/Sizes", setupConnected, testSendSizes},
	// Every accepted frame completes exactly once: done=true or one SendDone, never both.
	{"Send/CompletionExactlyOnce", setupConnected, testCompletionExactlyOnce},
	// A buffer overwritten right after completion does not change what the receiver sees.
	{"Send/BufferReuseAfterDone", setupConnected, testBufferReuseAfterDone},
	// Flooding a peer ends in ErrWouldBlock or succeeds; then everything arrives.
	{"Backpressure/WouldBlockThenDrains", setupConnected, testWouldBlockThenDrains},
	// Strict alternation between two ranks: nothing is held back waiting for more traffic.
	{"PingPong/1000", setupConnected, testPingPong},
	// With FlagOrdered, frames to one peer arrive in the order Send accepted them.
	{"Ordering/PerPeerFIFO", setupConnected, testPerPeerFIFO},
	// All ranks sending to rank 0 at once: nothing lost, per-sender order kept.
	{"ManyToOne", setupConnected, testManyToOne},
	// Eight goroutines per rank sending to every peer at once: each frame arrives exactly once.
	{"Concurrent/Sends", setupConnected, testConcurrentSends},
	// With a Handler that implements sdi.Placer, frames from every rank to every rank arrive intact, each placed one in its place.
	{"Place/Delivers", setupNone, testPlaceDelivers},
	// A place for a frame of a peer that goes is filled and delivered or ended by PeerDown; nothing is written into it after PeerDown or Close.
	{"Place/EndedByPeerDown", setupNone, testPlaceEndedByPeerDown},
	// FlagPoll comes with sdi.Poller, FlagIdle with FlagPoll and sdi.Idler.
	{"Poll/Caps", setupOpened, testPollCaps},
	// Goroutines of every rank polling while all ranks send to all: each frame once, Deliver serialized per peer, no Poll blocks.
	{"Poll/Concurrent", setupConnected, testPollConcurrent},
	// A rank that stops polling (with Idle where there is one, and without) still receives.
	{"Poll/HandsBack", setupConnected, testPollHandsBack},
	// When Flush returns, SendDone has been called for every frame accepted for that peer.
	{"Flush/CompletesAll", setupConnected, testFlushCompletesAll},
	// Close completes or fails every accepted frame before it returns, then the Handler stays silent.
	{"Close/FailsPendingOrCompletes", setupConnected, testCloseFailsPending},
	// Close may be called again, and concurrently, without error or panic.
	{"Close/Idempotent", setupConnected, testCloseIdempotent},
	// Closing every instance ends every goroutine the subdevice started.
	{"Close/NoLeakedGoroutines", setupNone, testNoLeakedGoroutines},
	// After Close, Send, Connect, Flush and Disconnect return ErrClosed.
	{"Close/SendAfterClose", setupConnected, testSendAfterClose},
	// A closed peer is reported by the right rank if at all, and sends to it never hang.
	{"PeerDown/OnPeerClose", setupConnected, testPeerDownOnPeerClose},
}

func testInfoNoSideEffects(t testing.TB, e *env) {
	sd := e.h.New(t)
	e.extra = append(e.extra, sd)
	first, err := sd.Info(e.ctx)
	if err != nil {
		t.Fatalf("Info before Open: %v", err)
	}
	if first.Name == "" {
		t.Error("Info.Name is empty")
	}
	if !slices.Contains(first.APIVersions, sdi.APIVersion) {
		t.Errorf("Info.APIVersions %q lacks %q, the version this suite checks", first.APIVersions, sdi.APIVersion)
	}
	for range 3 {
		if again, err := sd.Info(e.ctx); err != nil || !reflect.DeepEqual(again, first) {
			t.Errorf("Info again = %+v, %v; first call gave %+v", again, err, first)
		}
	}
	if _, err := sd.Open(e.ctx, e.params(0, 1, Host, e.jobID, e.secret, newRecorder(e, 0))); err != nil {
		t.Fatalf("Open after Info: %v", err)
	}
	if after, err := sd.Info(e.ctx); err != nil || !reflect.DeepEqual(after, first) {
		t.Errorf("Info after Open = %+v, %v; before Open it gave %+v", after, err, first)
	}
}

func testOpenCapsSane(t testing.TB, e *env) {
	t.Logf("caps: %+v", e.caps)
	if e.caps.MaxHeader < sdi.MinHeader {
		t.Errorf("Caps.MaxHeader is %d, below sdi.MinHeader = %d: the multidevice puts headers of up to %d bytes in frames and refuses this subdevice at Open, so it would never carry a message", e.caps.MaxHeader, sdi.MinHeader, sdi.MinHeader)
	}
	for i, l := range e.locals {
		if len(l.Addr) == 0 {
			t.Errorf("rank %d published an empty business card", i)
		}
		if l.Caps != e.caps {
			t.Errorf("rank %d caps %+v differ from rank 0 caps %+v; one subdevice with one config must publish the same limits everywhere", i, l.Caps, e.caps)
		}
		for j := range i {
			if bytes.Equal(l.Addr, e.locals[j].Addr) {
				t.Errorf("ranks %d and %d published the same business card %s", j, i, cardString(l.Addr))
			}
		}
	}
}

func testConnectBadAddr(t testing.TB, e *env) {
	garbage := map[string][]byte{
		"empty":  nil,
		"random": []byte(randomHex(24)),
		"binary": {0xff, 0x00, 0xfe, 0x01, 0xfd, 0x02, 0xfc},
	}
	for name, card := range garbage {
		err := e.sds[0].Connect(e.ctx, 1, card)
		if !errors.Is(err, sdi.ErrPeerUnreachable) {
			t.Errorf("Connect with %s card %s = %v, want an error wrapping sdi.ErrPeerUnreachable", name, cardString(card), err)
		}
	}

	// A card of another job: refused, or, for a subdevice that connects
	// lazily, never a path for frames between the jobs.
	foreignRec := newRecorder(e, 1)
	foreign := e.openExtra(t, e.params(1, e.h.Peers, Host, "sditest-"+randomHex(6), []byte(randomHex(16)), foreignRec))
	switch err := e.sds[0].Connect(e.ctx, 1, foreign.Addr); {
	case err == nil:
		t.Log("Connect accepted a card of another job; checking that no frame crosses")
		e.mu.Lock()
		e.lenient = true // the frame to a stranger may fail
		e.mu.Unlock()
		e.send(0, e.frame(msg{from: 0, to: 1, stream: 9, size: 1}))
		time.Sleep(e.tm.quiet)
		e.mu.Lock()
		crossed := len(foreignRec.arrivals)
		e.mu.Unlock()
		if crossed > 0 {
			t.Error("a frame crossed from one job to another")
		}
	case !errors.Is(err, sdi.ErrPeerUnreachable):
		t.Errorf("Connect with another job's card = %v, want nil or an error wrapping sdi.ErrPeerUnreachable", err)
	}

	// An instance of this job's id that lacks the job's secret (OpenParams.Secret:
	// "peers that cannot show it are refused") gets no frame to rank 0.
	e.openExtra(t, e.params(1, e.h.Peers, Host, e.jobID, []byte(randomHex(16)), newRecorder(e, 1)))
	impostor := e.extra[len(e.extra)-1]
	switch err := impostor.Connect(e.ctx, 0, e.locals[0].Addr); {
	case err == nil:
		e.mu.Lock()
		e.lenient = true // the impostor's frame may fail
		e.mu.Unlock()
		f := e.frame(msg{from: 1, to: 0, stream: 10, size: 1})
		for range 100 {
			if _, err := e.sendOnce(1, impostor, f); !errors.Is(err, sdi.ErrWouldBlock) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(e.tm.quiet)
		e.mu.Lock()
		crossed := len(e.recs[0].arrivals[streamKey{1, 10}])
		e.mu.Unlock()
		if crossed > 0 {
			t.Error("rank 0 took a frame from an instance of its job id that does not know the job's secret")
		}
	case !errors.Is(err, sdi.ErrPeerUnreachable):
		t.Errorf("Connect of an instance without the job's secret = %v, want nil or an error wrapping sdi.ErrPeerUnreachable", err)
	}

	// The card of another rank of this job, given for rank 1 (a launcher
	// that mixed up its key-value store): refused, or, where Connect
	// does not look, no frame for rank 1 reaches that rank.
	owner := len(e.sds) - 1
	if owner == 1 {
		owner = 0
	}
	switch err := e.sds[0].Connect(e.ctx, 1, e.locals[owner].Addr); {
	case err == nil:
		e.mu.Lock()
		e.lenient = true // the frame to the wrong rank may fail
		e.mu.Unlock()
		e.send(0, e.frame(msg{from: 0, to: 1, stream: 11, size: 1}))
		time.Sleep(e.tm.quiet)
		e.mu.Lock()
		crossed := len(e.recs[owner].arrivals[streamKey{0, 11}])
		e.mu.Unlock()
		if crossed > 0 {
			t.Errorf("Connect(1) with rank %d's card: a frame for rank 1 reached rank %d", owner, owner)
		}
	case !errors.Is(err, sdi.ErrPeerUnreachable):
		t.Errorf("Connect(1) with rank %d's card = %v, want nil or an error wrapping sdi.ErrPeerUnreachable", owner, err)
	}

	if e.caps.Reach == sdi.ReachHost {
		other := e.openExtra(t, e.params(1, e.h.Peers, "sditest-other-host", e.jobID, e.secret, newRecorder(e, 1)))
		if err := e.sds[0].Connect(e.ctx, 1, other.Addr); !errors.Is(err, sdi.ErrPeerUnreachable) {
			t.Errorf("Reach is host, and Connect with a card from another host = %v, want an error wrapping sdi.ErrPeerUnreachable", err)
		}
	}

	// Failed attempts leave the instances usable with the right cards.
	e.connectAll(t)
	e.mustSend(t, 0, e.frame(msg{from: 0, to: 1, stream: 1, size: 1}))
	e.mustSend(t, 1, e.frame(msg{from: 1, to: 0, stream: 1, size: 1}))
	e.awaitStream(t, 1, 0, 1, 1)
	e.awaitStream(t, 0, 1, 1, 1)
}

func testSendSizes(t testing.TB, e *env) {
	c := e.caps
	var sizes []int
	for _, s := range []int{0, 1, c.MaxEager, c.MaxFrame} {
		if !slices.Contains(sizes, s) {
			sizes = append(sizes, s)
		}
	}
	for i, size := range sizes {
		e.mustSend(t, 0, e.frame(msg{from: 0, to: 1, stream: 1, seq: uint64(i), size: size, hdr: c.MaxHeader}))
	}
	e.awaitStream(t, 1, 0, 1, len(sizes))
	e.checkStream(t, 1, 0, 1, len(sizes), e.ordered())

	tooLarge := []struct {
		what string
		m    msg
	}{
		{fmt.Sprintf("payload MaxFrame+1 = %d bytes", c.MaxFrame+1), msg{from: 0, to: 1, stream: 2, seq: 0, size: c.MaxFrame + 1}},
		{fmt.Sprintf("header MaxHeader+1 = %d bytes", c.MaxHeader+1), msg{from: 0, to: 1, stream: 2, seq: 1, size: 1, hdr: c.MaxHeader + 1}},
	}
	for _, tc := range tooLarge {
		if done, err := e.send(0, e.frame(tc.m)); !errors.Is(err, sdi.ErrTooLarge) {
			t.Errorf("Send with %s = done %v, %v; want sdi.ErrTooLarge", tc.what, done, err)
		}
	}
	// A marker sent after the rejected frames; once it is in, they would be too.
	e.mustSend(t, 0, e.frame(msg{from: 0, to: 1, stream: 3, size: 1}))
	e.awaitStream(t, 1, 0, 3, 1)
	time.Sleep(e.tm.quiet)
	e.mu.Lock()
	n := len(e.recs[1].arrivals[streamKey{0, 2}])
	e.mu.Unlock()
	if n > 0 {
		t.Errorf("%d frames rejected with ErrTooLarge were delivered", n)
	}
	e.awaitCompletions(t)
}

// mixedSize cycles through sizes that hit both completion paths of common
// designs: empty, tiny, eager, now and then a large frame and rarely the
// largest (which Send/Sizes covers; at 1 MiB it would dominate the run).
func (e *env) mixedSize(seq int) int {
	switch {
	case seq%200 == 199:
		return e.caps.MaxFrame
	case seq%50 == 49:
		return min(e.caps.MaxFrame, 32<<10)
	case seq%4 == 0:
		return 0
	case seq%4 == 1:
		return 1 + seq%64
	case seq%4 == 2:
		return e.caps.MaxEager
	}
	return min(e.caps.MaxFrame, 1+seq%1000)
}

func testCompletionExactlyOnce(t testing.TB, e *env) {
	n := count(500)
	// Every rank sends to its successor at once, so completions race with
	// sends, deliveries and one another.
	parallel(t, len(e.sds), func(i int) error {
		return e.sendStream(i, (i+1)%len(e.sds), 1, n, e.mixedSize)
	})
	for i := range e.sds {
		e.awaitStream(t, (i+1)%len(e.sds), i, 1, n)
	}
	e.awaitCompletions(t)
	time.Sleep(e.tm.quiet) // late duplicates are reported as violations
	e.mu.Lock()
	var pending, done int
	for _, st := range e.tokens {
		switch st.outcome {
		case outcomePending:
			pending++
		case outcomeDone:
			done++
		}
	}
	e.mu.Unlock()
	t.Logf("%d frames completed at Send, %d through SendDone", done, pending)
}

func testBufferReuseAfterDone(t testing.TB, e *env) {
	n := count(200)
	size := e.caps.MaxEager
	if size == 0 {
		size = min(e.caps.MaxFrame, 1024)
	}
	// One header and one payload buffer for every frame, as a caller with a
	// send buffer pool would do.
	hdr, payload := make([]byte, headerSize), make([]byte, size)
	for i := range n {
		m := msg{from: 0, to: 1, stream: 1, seq: uint64(i)}
		m.fill(hdr, payload)
		f := &sdi.Frame{Peer: 1, Header: hdr, Payload: payload, Token: e.nextToken.Add(1)}
		if !e.mustSend(t, 0, f) {
			e.awaitToken(t, f.Token)
		}
		for j := range hdr {
			hdr[j] = 0xa5
		}
		for j := range payload {
			payload[j] = 0xa5
		}
	}
	e.awaitStream(t, 1, 0, 1, n)
	e.checkStream(t, 1, 0, 1, n, e.ordered())
}

// awaitToken waits for the SendDone of one frame accepted with done=false.
func (e *env) awaitToken(t testing.TB, token uint64) {
	t.Helper()
	e.await(t, func() (bool, string) {
		return e.tokens[token].sendDones > 0, fmt.Sprintf("SendDone for token %d", token)
	})
}

func testWouldBlockThenDrains(t testing.TB, e *env) {
	n := count(20000)
	size := min(e.caps.MaxEager, 256)
	blockedAt := -1
	for i := range n {
		f := e.frame(msg{from: 0, to: 1, stream: 1, seq: uint64(i), size: size})
		_, err := e.sendOnce(0, e.sds[0], f)
		if errors.Is(err, sdi.ErrWouldBlock) {
			blockedAt = i
			// The same frame again, now waiting for room as callers do.
			e.mustSend(t, 0, f)
			break
		}
		if err != nil {
			t.Fatalf("Send of frame %d: %v", i, err)
		}
	}
	if blockedAt < 0 {
		t.Logf("%d frames accepted without ErrWouldBlock", n)
	} else {
		t.Logf("ErrWouldBlock after %d frames; sending the rest with retries", blockedAt)
		if err := e.sendStreamFrom(0, 1, 1, blockedAt+1, n, size); err != nil {
			t.Fatal(err)
		}
	}
	e.awaitStream(t, 1, 0, 1, n)
	e.checkStream(t, 1, 0, 1, n, e.ordered())
	e.awaitCompletions(t)
}

// sendStreamFrom sends seq first..n-1 of a stream with retries.
func (e *env) sendStreamFrom(from, to int, stream uint16, first, n, size int) error {
	for i := first; i < n; i++ {
		if _, err := e.send(from, e.frame(msg{from: from, to: to, stream: stream, seq: uint64(i), size: size})); err != nil {
			return err
		}
	}
	return nil
}

func testPingPong(t testing.TB, e *env) {
	n := count(1000)
	for i := range n {
		e.mustSend(t, 0, e.frame(msg{from: 0, to: 1, stream: 1, seq: uint64(i), size: i % 128}))
		e.awaitStream(t, 1, 0, 1, i+1)
		e.mustSend(t, 1, e.frame(msg{from: 1, to: 0, stream: 1, seq: uint64(i), size: i % 128}))
		e.awaitStream(t, 0, 1, 1, i+1)
	}
	e.checkStream(t, 1, 0, 1, n, e.ordered())
	e.checkStream(t, 0, 1, 1, n, e.ordered())
	e.awaitCompletions(t)
}

func testPerPeerFIFO(t testing.TB, e *env) {
	if !e.ordered() {
		t.Skipf("Caps.Flags %#x lacks FlagOrdered: per-peer order is not promised", e.caps.Flags)
	}
	n := count(2000)
	peers := len(e.sds)
	// Each rank interleaves its frames to all peers from one goroutine.
	parallel(t, peers, func(i int) error { return e.sendToAll(i, n) })
	for i := range peers {
		for j := range peers {
			if i != j {
				e.awaitStream(t, j, i, 1, n)
				e.checkStream(t, j, i, 1, n, true)
			}
		}
	}
	e.awaitCompletions(t)
}

// sendToAll sends n frames of stream 1 from rank from to every other
// rank, interleaved, from the calling goroutine.
func (e *env) sendToAll(from, n int) error {
	for seq := range n {
		for to := range len(e.sds) {
			if to == from {
				continue
			}
			m := msg{from: from, to: to, stream: 1, seq: uint64(seq), size: e.mixedSize(seq)}
			if _, err := e.send(from, e.frame(m)); err != nil {
				return err
			}
		}
	}
	return nil
}

func testManyToOne(t testing.TB, e *env) {
	n := count(1000)
	senders := len(e.sds) - 1
	parallel(t, senders, func(i int) error {
		return e.sendStream(i+1, 0, 1, n, func(seq int) int { return min(e.caps.MaxEager, seq%512) })
	})
	for i := 1; i <= senders; i++ {
		e.awaitStream(t, 0, i, 1, n)
		e.checkStream(t, 0, i, 1, n, e.ordered())
	}
	e.awaitCompletions(t)
}

func testConcurrentSends(t testing.TB, e *env) {
	e.allToAllStreams(t, 8, count(250))
	e.awaitCompletions(t)
}

// allToAllStreams has goroutine g of every rank send stream g+1, n
// frames, to every peer in turn, and checks what each peer received; each
// stream is sequential, so FlagOrdered applies to it.
func (e *env) allToAllStreams(t testing.TB, goroutines, n int) {
	peers := len(e.sds)
	parallel(t, peers*goroutines, func(k int) error {
		from, g := k/goroutines, k%goroutines
		for seq := range n {
			for to := range peers {
				if to == from {
					continue
				}
				m := msg{from: from, to: to, stream: uint16(g + 1), seq: uint64(seq), size: e.mixedSize(seq + g)}
				if _, err := e.send(from, e.frame(m)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	for from := range peers {
		for to := range peers {
			for g := range goroutines {
				if from != to {
					e.awaitStream(t, to, from, uint16(g+1), n)
					e.checkStream(t, to, from, uint16(g+1), n, e.ordered())
				}
			}
		}
	}
}

func testFlushCompletesAll(t testing.TB, e *env) {
	if err := e.sds[0].Flush(e.ctx, 1); err != nil {
		t.Fatalf("Flush with nothing sent: %v", err)
	}
	n := count(500)
	if err := e.sendStream(0, 1, 1, n, func(seq int) int { return 1 + e.mixedSize(seq)%e.caps.MaxFrame }); err != nil {
		t.Fatal(err)
	}
	if err := e.sds[0].Flush(e.ctx, 1); err != nil {
		t.Fatalf("Flush after %d frames: %v", n, err)
	}
	e.mu.Lock()
	owed, example := e.owedLocked([]int{0})
	e.mu.Unlock()
	if owed > 0 {
		t.Errorf("Flush returned while %d accepted frames still lacked SendDone (e.g. token %d)", owed, example)
	}
	// Frames of the largest size from several goroutines at once, so that
	// some queue behind others, each followed by a Flush from its sender:
	// frames are surely in flight when Flush is called sometimes, so a Flush
	// that does not wait is caught.
	var inFlight atomic.Int64
	parallel(t, 4, func(g int) error {
		for i := range count(16) {
			f := e.frame(msg{from: 0, to: 1, stream: uint16(10 + g), seq: uint64(i), size: e.caps.MaxFrame})
			done, err := e.send(0, f)
			if err != nil || done {
				if err != nil {
					return err
				}
				continue
			}
			e.mu.Lock()
			if e.tokens[f.Token].sendDones == 0 {
				inFlight.Add(1)
			}
			e.mu.Unlock()
			if err := e.sds[0].Flush(e.ctx, 1); err != nil {
				return fmt.Errorf("Flush after a frame of MaxFrame bytes: %w", err)
			}
			e.mu.Lock()
			lacks := e.tokens[f.Token].sendDones == 0
			e.mu.Unlock()
			if lacks {
				return fmt.Errorf("Flush returned before SendDone for token %d, accepted before it was called", f.Token)
			}
		}
		return nil
	})
	t.Logf("%d frames of MaxFrame bytes were in flight when Flush was called", inFlight.Load())
	e.awaitStream(t, 1, 0, 1, n)
	e.checkStream(t, 1, 0, 1, n, e.ordered())
}

// floodBytes bounds what testCloseFailsPending sends without waiting for
// room: far beyond what a subdevice queues at once by default (tcp's
// queue_bytes is 4 MiB), so frames are still queued when it closes.
const floodBytes = 64 << 20

func testCloseFailsPending(t testing.TB, e *env) {
	n := count(1000)
	// Both directions busy, so rank 0 closes with frames in flight both ways.
	parallel(t, 2, func(i int) error {
		return e.sendStream(i, 1-i, 1, n, e.mixedSize)
	})
	// Then rank 0 floods rank 1 without waiting for room and closes the
	// moment it runs out of it, so frames are still queued when it closes.
	// A subdevice with deep queues may take all of it: floodBytes bounds
	// the flood, whose frames the suite fills byte by byte (under the
	// race detector, 20000 frames of a plugin's MaxFrame took the check
	// past its watchdog).
	sent := 0
	for i := range count(20000) {
		m := msg{from: 0, to: 1, stream: 2, seq: uint64(i), size: 1 + e.mixedSize(i)%e.caps.MaxFrame}
		if _, err := e.sendOnce(0, e.sds[0], e.frame(m)); errors.Is(err, sdi.ErrWouldBlock) {
			break
		} else if err != nil {
			t.Fatalf("rank 0: Send of frame %d: %v", i, err)
		}
		if sent += m.size; sent > floodBytes {
			break
		}
	}
	if err := e.closeRank(0); err != nil {
		t.Fatalf("rank 0: Close: %v", err)
	}
	e.mu.Lock()
	var ok, failed, atSend, owed int
	for tok, st := range e.tokens {
		if st.from != 0 {
			continue
		}
		switch {
		case st.outcome == outcomeDone:
			atSend++
		case st.outcome != outcomePending:
		case st.sendDones == 0:
			owed++
			if owed == 1 {
				t.Errorf("Close returned before SendDone for accepted token %d", tok)
			}
		case st.err == nil:
			ok++
		case errors.Is(st.err, sdi.ErrClosed):
			failed++
		default:
			t.Errorf("token %d failed at Close with %v, want an error wrapping sdi.ErrClosed", tok, st.err)
		}
	}
	e.mu.Unlock()
	if owed > 0 {
		t.Errorf("Close returned with %d accepted frames lacking SendDone", owed)
	}
	t.Logf("rank 0 closed: %d frames completed at Send, %d by SendDone, %d failed with ErrClosed", atSend, ok, failed)
	// Rank 1's frames to the closed rank must still complete, one way or another.
	e.awaitCompletions(t, 1)
	time.Sleep(e.tm.quiet) // Handler calls after Close are reported as violations
}

func testCloseIdempotent(t testing.TB, e *env) {
	if err := e.closeRank(0); err != nil {
		t.Errorf("first Close: %v", err)
	}
	if err := e.closeRank(0); err != nil && !errors.Is(err, sdi.ErrClosed) {
		t.Errorf("second Close = %v, want nil or sdi.ErrClosed", err)
	}
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { errs[i] = e.sds[1].Close(e.ctx) })
	}
	wg.Wait()
	e.recs[1].markClosed()
	for _, err := range errs {
		if err != nil && !errors.Is(err, sdi.ErrClosed) {
			t.Errorf("concurrent Close = %v, want nil or sdi.ErrClosed", err)
		}
	}
}

func testNoLeakedGoroutines(t testing.TB, e *env) {
	base := settledGoroutines(e.tm.quiet)
	e.open(t)
	// Failed Connects too: a garbage card, and the card of an instance
	// that has closed (a refused connection).
	stale := e.h.New(t)
	local, err := stale.Open(e.ctx, e.params(1, e.h.Peers, Host, e.jobID, e.secret, newRecorder(e, 1)))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if err := stale.Close(e.ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, card := range [][]byte{[]byte(randomHex(24)), local.Addr} {
		ctx, cancel := context.WithTimeout(e.ctx, e.tm.patience)
		e.sds[0].Connect(ctx, 1, card)
		cancel()
	}
	e.connectAll(t)
	// Leave frames in flight, so Close has something to tear down.
	parallel(t, len(e.sds), func(i int) error {
		return e.sendStream(i, (i+1)%len(e.sds), 1, count(200), e.mixedSize)
	})
	for i := range e.sds {
		if err := e.closeRank(i); err != nil {
			t.Errorf("rank %d: Close: %v", i, err)
		}
	}
	deadline := time.Now().Add(e.tm.patience)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines before Open, %d still running %v after closing every instance:\n%s",
				base, runtime.NumGoroutine(), e.tm.patience, stacks())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// settledGoroutines counts the goroutines once no more are ending, waiting
// at most quiet: those of an earlier check (instances closed, a test's
// cleanup) may still be on their way out, and counted in the base they
// would hide as many leaked by this one.
func settledGoroutines(quiet time.Duration) int {
	n := runtime.NumGoroutine()
	deadline := time.Now().Add(quiet)
	for steady := 0; steady < 5 && time.Now().Before(deadline); {
		time.Sleep(2 * time.Millisecond)
		if m := runtime.NumGoroutine(); m < n {
			n, steady = m, 0
		} else {
			steady++
		}
	}
	return n
}

func testSendAfterClose(t testing.TB, e *env) {
	if err := e.closeRank(0); err != nil {
		t.Fatalf("Close: %v", err)
	}
	f := e.frame(msg{from: 0, to: 1, stream: 1, size: 1})
	if done, err := e.sendOnce(0, e.sds[0], f); done || !errors.Is(err, sdi.ErrClosed) {
		t.Errorf("Send after Close = done %v, %v; want sdi.ErrClosed", done, err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, e.tm.patience)
	defer cancel()
	calls := map[string]func() error{
		"Connect":    func() error { return e.sds[0].Connect(ctx, 1, e.locals[1].Addr) },
		"Flush":      func() error { return e.sds[0].Flush(ctx, 1) },
		"Disconnect": func() error { return e.sds[0].Disconnect(ctx, 1) },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, sdi.ErrClosed) {
			t.Errorf("%s after Close = %v, want sdi.ErrClosed", name, err)
		}
	}
}

func testPeerDownOnPeerClose(t testing.TB, e *env) {
	// One exchange first, so lazy connections exist when the peer goes.
	e.mustSend(t, 0, e.frame(msg{from: 0, to: 1, stream: 1, size: 1}))
	e.awaitStream(t, 1, 0, 1, 1)
	e.mustSend(t, 1, e.frame(msg{from: 1, to: 0, stream: 1, size: 1}))
	e.awaitStream(t, 0, 1, 1, 1)

	if err := e.closeRank(1); err != nil {
		t.Fatalf("rank 1: Close: %v", err)
	}
	err := e.awaitFor(min(e.tm.patience, 2*time.Second), func() (bool, string) {
		return len(e.recs[0].peerDowns) > 0, "PeerDown on rank 0"
	})
	if err != nil {
		t.Log("no PeerDown reported for the closed peer (allowed)")
	}
	e.mu.Lock()
	for _, r := range e.recs {
		for _, pd := range r.peerDowns {
			if pd.peer != 1 {
				t.Errorf("rank %d: PeerDown(%d, %v) after only rank 1 closed", r.rank, pd.peer, pd.err)
			}
		}
	}
	e.mu.Unlock()

	// Sends to the closed peer fail or complete; they never hang.
	var completed int // accepted and completed without an error
	for i := range 5 {
		f := e.frame(msg{from: 0, to: 1, stream: 2, seq: uint64(i), size: 1})
		done, err := e.send(0, f)
		switch {
		case err != nil:
			if i == 0 {
				t.Logf("Send to the closed peer: %v", err)
			}
		case done:
			completed++
		default:
			e.awaitToken(t, f.Token)
			e.mu.Lock()
			if e.tokens[f.Token].err == nil {
				completed++
			}
			e.mu.Unlock()
		}
	}
	// FlagReliable: every accepted frame arrives once, or the peer is
	// reported down. Frames to a closed peer cannot arrive.
	if completed > 0 && e.caps.Flags.Has(sdi.FlagReliable) {
		err := e.awaitFor(e.tm.patience, func() (bool, string) {
			return len(e.recs[0].peerDowns) > 0, "PeerDown on rank 0"
		})
		if err != nil {
			t.Errorf("FlagReliable, yet %d frames sent to the closed rank 1 completed without error and rank 1 was never reported down: they vanished", completed)
		}
	}
	ctx, cancel := context.WithTimeout(e.ctx, e.tm.patience)
	defer cancel()
	if err := e.sds[0].Flush(ctx, 1); errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Flush to the closed peer did not return within %v", e.tm.patience)
	}
}
