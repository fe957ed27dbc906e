package shm

import (
	"bytes"
	"encoding/binary"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// TestPollKeepsOrder has two goroutines poll rank 0 while the progress
// goroutine may deliver too, with three senders wrapping small rings many
// times. Per-sender order must hold and some frames must arrive through
// Poll itself, on the polling goroutines.
func TestPollKeepsOrder(t *testing.T) {
	const n, frames = 4, 4000
	j := openJob(t, n, jobOpts{config: []byte(`{"ring_bytes": 65536}`)})
	if !j.local[0].Caps.Flags.Has(sdi.FlagPoll) {
		t.Fatal("caps lack FlagPoll")
	}
	poller, ok := j.sds[0].(sdi.Poller)
	if !ok {
		t.Fatal("shm does not implement sdi.Poller")
	}
	var wg sync.WaitGroup
	for a := 1; a < n; a++ {
		wg.Go(func() {
			for i := range uint64(frames) {
				if err := sendRetry(j.sds[a], &sdi.Frame{Peer: 0, Header: u64(i), Payload: pattern(i, int(i*53%2000))}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	stop := make(chan struct{})
	var polled atomic.Int64
	var pollers sync.WaitGroup
	for range 2 {
		pollers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				polled.Add(int64(poller.Poll()))
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
		if !bytes.Equal(m.payload, pattern(i, int(i*53%2000))) {
			t.Fatalf("from rank %d: frame %d payload differs", m.from, i)
		}
		next[m.from]++
	}
	close(stop)
	pollers.Wait()
	wg.Wait()
	if polled.Load() == 0 {
		t.Fatal("no frame was delivered through Poll")
	}
	t.Logf("%d of %d frames delivered through Poll", polled.Load(), (n-1)*frames)
}

// TestPollAfterCloseAndBeforeOpen checks that Poll is harmless on a device
// that is not open.
func TestPollAfterCloseAndBeforeOpen(t *testing.T) {
	if got := New(nil).(sdi.Poller).Poll(); got != 0 {
		t.Fatalf("Poll before Open = %d", got)
	}
	j := openJob(t, 2, jobOpts{})
	mustSend(t, j.sds[1], &sdi.Frame{Peer: 0, Header: u64(1)})
	j.hs[0].next(t)
	if err := j.sds[0].Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := j.sds[0].(sdi.Poller).Poll(); got != 0 {
		t.Fatalf("Poll after Close = %d", got)
	}
}

// TestPollWhileProgressSleeps checks the hand-over both ways: a poller
// takes frames from a receiver whose progress goroutine sleeps on the
// doorbell, and once polling stops the progress goroutine delivers again
// and eventually sleeps. Doorbell sleeps are unbounded, so a lost wake-up
// hangs and the watchdog fails the test.
func TestPollWhileProgressSleeps(t *testing.T) {
	j := openJob(t, 2, jobOpts{noSleepBound: true})
	sd := j.sds[1].(*device)
	mem := sd.seg.Bytes()
	waitSleeping := func() {
		for word32(mem, offSleeping).Load() == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	for round := range uint64(20) {
		waitSleeping()
		mustSend(t, j.sds[0], &sdi.Frame{Peer: 1, Header: u64(2 * round)})
		for sd.Poll() == 0 && len(j.hs[1].msgs) == 0 {
		}
		if m := j.hs[1].next(t); binary.LittleEndian.Uint64(m.header) != 2*round {
			t.Fatalf("frame %d arrived as %x", 2*round, m.header)
		}
		// No more polls: the progress goroutine must take over.
		mustSend(t, j.sds[0], &sdi.Frame{Peer: 1, Header: u64(2*round + 1)})
		if m := j.hs[1].next(t); binary.LittleEndian.Uint64(m.header) != 2*round+1 {
			t.Fatalf("frame %d arrived as %x", 2*round+1, m.header)
		}
	}
}

// TestDrainPassIsBounded fills a ring with twice drainBudget of payload
// and drains it: one pass delivers drainBudget's worth and stops, so that
// whoever holds the rings lets go of them even while a sender keeps
// refilling the ring; the next pass delivers the rest, in order.
func TestDrainPassIsBounded(t *testing.T) {
	j := openJob(t, 2, jobOpts{config: []byte(`{"ring_bytes": 16777216}`)})
	rx := j.sds[1].(*device)
	const size = 64 << 10
	const frames = 2 * drainBudget / size
	rx.rxMu.Lock() // neither the progress goroutine nor a poller drains meanwhile
	for i := range uint64(frames) {
		mustSend(t, j.sds[0], &sdi.Frame{Peer: 1, Header: u64(i), Payload: pattern(i, size)})
	}
	first := rx.rx.drain(0)
	rest := rx.rx.drain(0)
	rx.rxMu.Unlock()
	if first != drainBudget/size || first+rest != frames {
		t.Fatalf("passes delivered %d and %d frames of %d bytes, want %d and %d", first, rest, size, drainBudget/size, frames-drainBudget/size)
	}
	for i := range uint64(frames) {
		m := j.hs[1].next(t)
		if binary.LittleEndian.Uint64(m.header) != i || !bytes.Equal(m.payload, pattern(i, size)) {
			t.Fatalf("frame %d: got header %x and %d bytes, want frame %d intact", i, m.header, len(m.payload), i)
		}
	}
}

// TestNoSleepBesideRunnable runs a goroutine that computes without a
// break beside an idle instance, on one processor, as on a rank bound to
// one CPU. The progress goroutine must not sleep on the doorbell while
// that goroutine waits for the processor: a goroutine blocked in a system
// call keeps its processor for up to 10 ms or more. It naps instead, and
// sleeps again once nothing else wants to run.
//
// The goroutine computes until the progress goroutine has come to the
// choice between napping and sleeping twice (after its doorbell sleep and
// after a nap), not for a fixed time: each of the 64 yields before the
// choice lets it run until the runtime preempts it, which takes 10 to
// 20 ms (the runtime's monitor preempts after 10 ms and looks every 10 ms
// when it has nothing else to do), so one round lasts ~1.3 s on an idle
// machine and 2 s or more on a loaded one. A fixed 1.5 s failed there
// for want of a round, not for a sleep.
func TestNoSleepBesideRunnable(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	j := openJob(t, 1, jobOpts{sleepFor: 20 * time.Millisecond})
	sd := j.sds[0].(*device)
	for sd.sleeps.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	sleeps, naps := sd.sleeps.Load(), sd.naps.Load()
	// The progress goroutine's choices since then: its naps beside the
	// computing goroutine and its sleeps. A sleep is counted before the
	// futex wait, so the first wrong choice ends the computation. The
	// computing goroutine reads them itself, while the processor is its
	// own: once it stops, the progress goroutine may rightly sleep.
	type counts struct {
		sleeps, choices int64
		x               uint64 // the computation's result, so that it is kept
	}
	look := func() counts {
		s := sd.sleeps.Load() - sleeps
		return counts{sleeps: s, choices: s + sd.naps.Load() - naps}
	}
	const watchdog = 60 * time.Second // a hang, not a performance assertion
	done := make(chan counts)
	go func() {
		x := uint64(1)
		c := look()
		for t0 := time.Now(); c.sleeps == 0 && c.choices < 2 && time.Since(t0) < watchdog; c = look() {
			for range 1000 {
				x = x*6364136223846793005 + 1442695040888963407
			}
		}
		c.x = x
		done <- c
	}()
	c := <-done
	if c.sleeps != 0 {
		t.Fatalf("the progress goroutine went to sleep on the doorbell beside a runnable goroutine, at its choice %d", c.choices)
	}
	if c.choices < 2 {
		t.Fatalf("the progress goroutine came to the choice between napping and sleeping %d time(s) within the watchdog, want 2", c.choices)
	}
	for sd.sleeps.Load() == sleeps {
		time.Sleep(time.Millisecond) // idle again: it must sleep (the test timeout catches it if not)
	}
}
