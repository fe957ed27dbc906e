package sditest

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Checks of the progress interfaces, sdi.Poller and sdi.Idler: a waiting
// rank calls Poll from its own goroutines, several at once, while the
// subdevice's goroutines deliver too, and Idle when it stops.

func testPollCaps(t testing.TB, e *env) {
	f := e.caps.Flags
	if f.Has(sdi.FlagIdle) && !f.Has(sdi.FlagPoll) {
		t.Errorf("Caps.Flags %#x has FlagIdle without FlagPoll", f)
	}
	for i, sd := range e.sds {
		if _, ok := sd.(sdi.Poller); f.Has(sdi.FlagPoll) && !ok {
			t.Errorf("rank %d: Caps.Flags has FlagPoll, but %T does not implement sdi.Poller", i, sd)
		}
		if _, ok := sd.(sdi.Idler); f.Has(sdi.FlagIdle) && !ok {
			t.Errorf("rank %d: Caps.Flags has FlagIdle, but %T does not implement sdi.Idler", i, sd)
		}
	}
}

// pollers keeps k goroutines per rank calling Poll until stop, as ranks
// waiting for messages do.
type pollers struct {
	quit  atomic.Bool
	wg    sync.WaitGroup
	calls atomic.Int64
	inAt  []atomic.Int64 // per goroutine, UnixNano when its Poll call began; 0 outside one
}

func startPollers(e *env, ranks []int, k int) *pollers {
	p := &pollers{inAt: make([]atomic.Int64, len(ranks)*k)}
	for i, r := range ranks {
		pl := e.sds[r].(sdi.Poller)
		for j := range k {
			slot := &p.inAt[i*k+j]
			p.wg.Go(func() {
				for !p.quit.Load() {
					slot.Store(time.Now().UnixNano())
					pl.Poll()
					slot.Store(0)
					p.calls.Add(1)
					runtime.Gosched() // two CPUs: let the senders in
				}
			})
		}
	}
	return p
}

// stop ends the pollers; one that does not come back is in a Poll call
// that blocks, which the contract forbids.
func (p *pollers) stop(e *env) error {
	p.quit.Store(true)
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(e.tm.patience):
		for i := range p.inAt {
			if at := p.inAt[i].Load(); at != 0 {
				return fmt.Errorf("a Poll call has not returned after %v; Poll must never block", time.Since(time.Unix(0, at)).Round(time.Millisecond))
			}
		}
		return fmt.Errorf("pollers did not stop within %v", e.tm.patience)
	}
}

// more waits until the pollers made n more Poll calls, or the patience
// ran out (then a Poll call blocks, which stop reports).
func (p *pollers) more(e *env, n int) error {
	want := p.calls.Load() + int64(n)
	for deadline := time.Now().Add(e.tm.patience); p.calls.Load() < want; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return p.stop(e)
		}
	}
	return nil
}

func (e *env) requirePoll(t testing.TB) {
	if !e.caps.Flags.Has(sdi.FlagPoll) {
		t.Skipf("Caps.Flags %#x lacks FlagPoll: no Poller to drive", e.caps.Flags)
	}
	if _, ok := e.sds[0].(sdi.Poller); !ok {
		t.Skipf("%T sets FlagPoll without implementing sdi.Poller (Poll/Caps reports it)", e.sds[0])
	}
}

func testPollConcurrent(t testing.TB, e *env) {
	e.requirePoll(t)
	n := count(300) // the race detector's runs of every subdevice pay for each
	peers := len(e.sds)
	ranks := make([]int, peers)
	for i := range ranks {
		ranks[i] = i
	}
	p := startPollers(e, ranks, 2)
	defer p.stop(e) // after a failure too; a second stop returns at once
	// Every rank sends a stream to every peer from one goroutine while
	// two goroutines per rank poll, beside its own progress: Deliver
	// must stay serialized per peer (the recorder reports overlaps),
	// each frame must come once and, with FlagOrdered, in order.
	parallel(t, peers, func(i int) error { return e.sendToAll(i, n) })
	for i := range peers {
		for j := range peers {
			if i != j {
				e.awaitStream(t, j, i, 1, n)
				e.checkStream(t, j, i, 1, n, e.ordered())
			}
		}
	}
	e.awaitCompletions(t)
	// Every poller polls a few more times with everything delivered, so
	// that a Poll that delivers what it should not shows on one CPU too,
	// where the pollers may not have run while frames flowed.
	if err := p.more(e, 4*len(ranks)); err != nil {
		t.Fatal(err)
	}
	if err := p.stop(e); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d Poll calls", p.calls.Load())
}

// testPollHandsBack: a rank that stops polling, with Idle where the
// subdevice has it and without where it has not, still receives: the
// subdevice's own progress takes over from pollers that stood in for it.
func testPollHandsBack(t testing.TB, e *env) {
	e.requirePoll(t)
	idler, _ := e.sds[1].(sdi.Idler)
	n := count(200)
	for round, idle := range []bool{false, true} {
		if idle && (idler == nil || !e.caps.Flags.Has(sdi.FlagIdle)) {
			t.Logf("no FlagIdle: the round with Idle is skipped")
			continue
		}
		stream := uint16(round + 1)
		// Poll long enough for a subdevice to stand its own progress by,
		// with frames coming in meanwhile, then stop.
		p := startPollers(e, []int{1}, 1)
		for seq := range n / 2 {
			e.mustSend(t, 0, e.frame(msg{from: 0, to: 1, stream: stream, seq: uint64(seq), size: e.mixedSize(seq)}))
		}
		e.awaitStream(t, 1, 0, stream, n/2)
		if err := p.stop(e); err != nil {
			t.Fatal(err)
		}
		if idle {
			idler.Idle()
		}
		// Nobody polls rank 1 now.
		for seq := n / 2; seq < n; seq++ {
			e.mustSend(t, 0, e.frame(msg{from: 0, to: 1, stream: stream, seq: uint64(seq), size: e.mixedSize(seq)}))
		}
		e.awaitStream(t, 1, 0, stream, n)
		e.checkStream(t, 1, 0, stream, n, e.ordered())
	}
	e.awaitCompletions(t)
}
