package multidevice

import (
	"testing"
	"time"
)

// fakePoller is a pollable subdevice for the poll schedule: each Poll
// costs about cost (busy, as a system call would) and handles a frame
// once arrive reaches 0 (counted down by polls); it counts its polls.
type fakePoller struct {
	cost   time.Duration
	arrive int // polls until the next frame; < 0: none coming
	polls  int
}

func (f *fakePoller) Poll() int {
	f.polls++
	if f.cost > 0 {
		for t := time.Now(); time.Since(t) < f.cost; {
		}
	}
	if f.arrive < 0 {
		return 0
	}
	if f.arrive--; f.arrive < 0 {
		return 1
	}
	return 0
}

// waitFor runs one wait, the way Request.Wait does, that ends when the
// subdevice f delivers. Where Wait would park after the spin budget (a
// slow machine), it spins again instead.
func waitFor(d *Device, pollers []*polled, f *fakePoller) {
	for !d.spin(pollers, func() bool { return f.arrive < 0 }) {
	}
}

// Waits whose frames come through a cheap subdevice poll a dear quiet one
// rarely, but never stop polling it; its first frame makes it busy, and it
// is then polled every round. All of it comes through the waiter's real
// polling loop (spin), with subdevices whose Poll costs what shm's and
// tcp's do, roughly.
func TestPollSchedule(t *testing.T) {
	d := loopJob(t, 2, smallCaps)[0]
	d.prog.crowded = false // two ranks in one process on one CPU (taskset) would be
	cheap := &fakePoller{arrive: -1}
	dear := &fakePoller{cost: 2 * time.Microsecond, arrive: -1}
	// dear first: without a schedule it is polled every round, even the
	// round in which cheap's frame arrives.
	pollers := []*polled{{p: dear}, {p: cheap}}

	const waits, rounds = 2000, 10
	var early int
	for w := range waits {
		if w == waits/2 {
			early = dear.polls
		}
		cheap.arrive = rounds - 1
		waitFor(d, pollers, cheap)
	}
	late := dear.polls - early
	t.Logf("dear polled %d times in the first %d waits, %d in the last %d (%d rounds each); costs %d and %d ns",
		early, waits/2, late, waits/2, rounds, pollers[0].cost, pollers[1].cost)
	if late > waits/2*rounds/4 {
		t.Errorf("a quiet subdevice 50 times dearer than the one the frames come through was polled in %d of %d rounds", late, waits/2*rounds)
	}
	if late == 0 {
		t.Error("a quiet subdevice was never polled: it starves")
	}

	// A frame through dear: it is busy again, polled every round.
	dear.arrive = 0
	waitFor(d, pollers, dear)
	before := dear.polls
	cheap.arrive = rounds - 1
	waitFor(d, pollers, cheap)
	if got := dear.polls - before; got != rounds {
		t.Errorf("a subdevice that just delivered was polled in %d of %d rounds", got, rounds)
	}

	// A long wait in which nothing comes through either until dear's
	// frame: dear delivered last, so it stays polled every round although
	// quiet (a tcp peer's slow reply), and the cheap one with it. The
	// round in which dear delivers ends before cheap's poll.
	dear.arrive = 0
	waitFor(d, pollers, dear)
	before, cheapBefore := dear.polls, cheap.polls
	const long = 2 * quietMax
	dear.arrive = long - 1
	waitFor(d, pollers, dear)
	if got, c := dear.polls-before, cheap.polls-cheapBefore; got != long || c != long-1 {
		t.Errorf("in a wait of %d rounds for the subdevice that delivered last, it was polled %d times and the cheap one %d times, want %d and %d", long, got, c, long, long-1)
	}
}

// A round stops at the first subdevice whose frame completes the wait:
// the waiter does not poll the rest first.
func TestPollRoundEndsWhenDone(t *testing.T) {
	d := loopJob(t, 2, smallCaps)[0]
	first := &fakePoller{arrive: 0}
	second := &fakePoller{arrive: -1}
	waitFor(d, []*polled{{p: first}, {p: second}}, first)
	if second.polls != 0 {
		t.Errorf("the second subdevice was polled %d times after the first completed the wait", second.polls)
	}
}

// A waiter that yields between polls (a crowded host) polls every
// subdevice every round: the yield costs more than any poll.
func TestPollScheduleCrowded(t *testing.T) {
	d := loopJob(t, 2, smallCaps)[0]
	d.prog.crowded = true
	cheap := &fakePoller{arrive: -1}
	dear := &fakePoller{cost: 2 * time.Microsecond, arrive: -1}
	pollers := []*polled{{p: dear}, {p: cheap}}
	const waits, rounds = 200, 10
	for range waits {
		cheap.arrive = rounds - 1
		waitFor(d, pollers, cheap)
	}
	if want := waits * rounds; dear.polls != want {
		t.Errorf("a crowded waiter polled the dear subdevice %d times in %d rounds", dear.polls, want)
	}
}
