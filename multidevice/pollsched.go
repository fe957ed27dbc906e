package multidevice

import (
	"sync"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// The poll schedule. A waiter whose peer is reached over several pollable
// subdevices used to poll each of them every round, so every round cost
// the dearest poll: shm's Poll reads a cache line (tens of ns), tcp's makes
// a recv system call per connection (~0.5 µs here). With shm for small
// messages and tcp for large ones to the same peer, an 8-byte message over
// shm mostly arrived during tcp's recv, and its waiter, once shm had
// delivered it, still made tcp's recv before looking at the request: 0.94
// µs against 0.17 with shm alone. MPICH's nemesis skips its tcp poll() in
// blocking progress for the same reason (MPID_nem_tcp_skip_polls); here
// what a poll costs is measured, so that the skipping follows the
// subdevices actually loaded, and a round also ends at the first poll
// that completes the wait (Device.round).
//
// A subdevice is quiet once quietAfter of its polls in a row handled
// nothing. A quiet subdevice dearer than a round of the others is polled
// only every so many rounds: as many as make its polls take a fifth of
// the spinning time (quietShare), a ninth after twice as many empty polls
// and a seventeenth after four times as many, but at least once per
// quietMaxGap. Beside shm, a long quiet tcp is polled about every 280
// rounds, every ~8 µs here, and an 8-byte message over shm takes 0.17 µs
// (1.1 times shm alone). If all are quiet, the one that delivered last is
// polled every round. Any frame a quiet subdevice delivers makes it busy
// again at once, so a peer that moves its traffic onto it (a failover
// route switching trunks, a large message after small ones) pays the gap
// once. Each subdevice's poll cost is sampled once per sampleEvery rounds,
// from a poll that handled nothing. The counts persist across waits, so a
// quiet subdevice comes due after its number of rounds however short each
// wait is, and a stream of waits that end at once does not starve it.
// Skipping applies only while the waiter polls back to back; once it
// yields between polls (after spinFor, or from the start on a crowded
// host) the yield costs more than any poll, and every subdevice is polled
// every round.
//
// The schedule belongs to one waiter at a time (schedState.mu, taken with
// TryLock): it keeps its counts in the subdevices' polled structs, without
// atomics, and its plan across waits. A waiter that finds it taken (two
// goroutines waiting at once) polls every subdevice every round. Copying
// the counts in and out of each wait with atomic stores cost ~10% of a
// failover route's spinning over shm.
const (
	quietAfter = 32
	quietMax   = 4 * quietAfter
	// quietShare: a quiet subdevice's polls take about 1/(quietShare+1)
	// of the spinning time.
	quietShare = 4
	// quietMaxGap bounds the time between two polls of a quiet subdevice,
	// in ns of the other subdevices' polls. tcp's stand-by ends after a
	// pause of 500 µs, far longer.
	quietMaxGap = 20_000
	// sampleEvery is how many rounds pass between two samples of one
	// subdevice's poll cost; a sample costs two clock reads, ~25 ns each
	// here and more than a shm poll under a profiler (every 32 rounds,
	// they took 9% of a failover route's spinning over shm).
	sampleEvery = 256
)

// polled is a pollable subdevice and what the scheduling waiter learned of
// it. The counts are guarded by schedState.mu.
type polled struct {
	p     sdi.Poller
	idler sdi.Idler // nil unless the subdevice sets FlagIdle

	// cost estimates an empty Poll in ns: a moving average of samples,
	// 0 until the first one.
	cost int64
	// quiet counts consecutive polls that handled nothing, up to
	// quietMax.
	quiet int32
	// every is how many rounds pass between its polls under the plan
	// (0 or 1: each round); owed counts the rounds skipped since its
	// last poll.
	every, owed int32
	// hit is the round of its last poll that handled something; 0 if none
	// did yet.
	hit uint32
	// sampleAt is the round from which its next poll is timed.
	sampleAt uint32
}

// sample folds one empty poll's duration into the cost estimate. A poll
// the scheduler interrupted would count as hundreds of µs; a sample is
// taken as at most twice the estimate plus 2 µs.
func (pp *polled) sample(ns int64) {
	if pp.cost == 0 {
		pp.cost = max(ns, 1)
		return
	}
	ns = min(ns, 2*pp.cost+2000)
	pp.cost = max(pp.cost+(ns-pp.cost)/4, 1)
}

// schedState is the Device's poll schedule, owned by one waiter at a time.
type schedState struct {
	mu sync.Mutex
	// Guarded by mu:
	rounds uint32    // rounds polled by scheduling waiters
	plan   []*polled // the pollers the plan in their every fields is for
	noskip bool      // the plan skips nothing (its waiter yielded)
}

// schedule is one waiter's handle on the schedule; it lives on the
// waiter's stack. It schedules (st non-nil) only for a waiter with
// several subdevices to poll that got the schedule.
type schedule struct {
	st      *schedState
	pollers []*polled // the waiter's
	noskip  bool      // the waiter yields between polls
}

// load takes the schedule for pollers if they are several and nobody else
// has it. A waiter that yields from the start skips nothing.
func (s *schedule) load(st *schedState, pollers []*polled, yield bool) {
	s.pollers = pollers
	if len(pollers) < 2 || !st.mu.TryLock() {
		return
	}
	s.st, s.noskip = st, yield
	if st.noskip != yield || len(st.plan) != len(pollers) || &st.plan[0] != &pollers[0] {
		s.plan()
	}
}

// save gives the schedule back.
func (s *schedule) save() {
	if s.st != nil {
		s.st.mu.Unlock()
		s.st = nil
	}
}

// tick counts a round.
func (s *schedule) tick() {
	if s.st != nil {
		s.st.rounds++
	}
}

// yielding tells the schedule whether the waiter yields between polls
// from now on, and so polls every subdevice every round.
func (s *schedule) yielding(yield bool) {
	if s.st != nil && s.noskip != yield {
		s.noskip = yield
		s.plan()
	}
}

// plan sets every poller's interval: 1 for busy ones, and for quiet ones
// dearer than a round of the busy ones as many rounds as make their polls
// take their share of the time, the rest going to the pollers polled every
// round (skipping a cheaper one would save little). If all are quiet (a
// wait longer than quietAfter polls), the one that delivered last is
// polled every round, as the one the traffic is on: a tcp peer's reply
// that takes 30 µs must not wait for tcp's turn behind an idle shm. A
// poller never sampled costs 0 and is polled every round until it is.
func (s *schedule) plan() {
	s.st.plan, s.st.noskip = s.pollers, s.noskip
	var base int64
	var lead *polled // the most recent to deliver, else the cheapest
	for _, pp := range s.pollers {
		c := max(pp.cost, 1)
		if pp.quiet < quietAfter {
			base += c
		}
		if lead == nil || later(pp, lead) || pp.hit == lead.hit && c < max(lead.cost, 1) {
			lead = pp
		}
	}
	allQuiet := base == 0
	if allQuiet {
		base = max(lead.cost, 1)
	}
	for _, pp := range s.pollers {
		if s.noskip || pp.quiet < quietAfter || allQuiet && pp == lead || pp.cost <= base {
			pp.every = 1
			continue
		}
		share := int64(quietShare)
		for q := pp.quiet; q >= 2*quietAfter; q /= 2 {
			share *= 2
		}
		every := (share*pp.cost + base - 1) / base
		every = min(every, quietMaxGap/base+1, 1<<20)
		pp.every = int32(max(every, 1))
	}
}

// later reports whether a delivered more recently than b. Round numbers
// wrap; hits 2^31 rounds apart compare wrongly, which only misplaces one
// plan.
func later(a, b *polled) bool {
	switch {
	case a.hit == 0:
		return false
	case b.hit == 0:
		return true
	}
	return int32(a.hit-b.hit) > 0
}

// due reports whether poller i is polled this round, and counts the
// round as owed if not.
func (s *schedule) due(i int) bool {
	if s.st == nil {
		return true
	}
	pp := s.pollers[i]
	if pp.every <= 1 {
		return true
	}
	if pp.owed+1 < pp.every {
		pp.owed++
		return false
	}
	pp.owed = 0
	return true
}

// poll polls poller i, timing it when its sample is due, and notes
// whether it handled something.
func (s *schedule) poll(i int) int {
	pp := s.pollers[i]
	if s.st == nil {
		return pp.p.Poll()
	}
	rounds := s.st.rounds
	var n int
	if int32(rounds-pp.sampleAt) >= 0 {
		t := time.Now()
		n = pp.p.Poll()
		if n == 0 {
			pp.sample(time.Since(t).Nanoseconds())
			pp.sampleAt = rounds + sampleEvery
		}
	} else {
		n = pp.p.Poll()
	}
	q := pp.quiet
	switch {
	case n > 0 && q != 0:
		pp.quiet, pp.hit = 0, rounds
		if q >= quietAfter {
			s.plan()
		}
	case n > 0:
		pp.hit = rounds
	case q < quietMax:
		pp.quiet = q + 1
		if q+1 == quietAfter || q+1 == 2*quietAfter || q+1 == quietMax {
			s.plan()
		}
	}
	return n
}
