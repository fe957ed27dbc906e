package multidevice

import (
	"sync/atomic"
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
// quietMaxGap. Beside shm, a quiet tcp is polled about every 70 rounds,
// every ~8 µs here, and an 8-byte message over shm takes 0.19 µs (1.1
// times shm alone). If all are quiet, the one that delivered last is
// polled every round. Any frame a quiet subdevice delivers makes it busy
// again at once, so a peer that moves its traffic onto it (a failover
// route switching trunks, a large message after small ones) pays the gap
// once. Each subdevice's poll cost is sampled once per sampleEvery rounds,
// from a poll that handled nothing. The counts persist across waits, so a quiet
// subdevice comes due after its number of rounds however short each wait
// is, and a stream of waits that end at once does not starve it.
// Skipping applies only while the waiter polls back to back; once it
// yields between polls (after spinFor, or from the start on a crowded
// host) the yield costs more than any poll, and every subdevice is polled
// every round.
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
	// maxScheduled is how many subdevices a waiter schedules; one that
	// polls more polls them all every round.
	maxScheduled = 8
)

// polled is a pollable subdevice and what waiters learned of it. Its
// counters are shared by all waiters; each loads them when it starts and
// stores them when it stops, so concurrent waiters may overwrite each
// other's counts, which only moves a poll by a few rounds.
type polled struct {
	p     sdi.Poller
	idler sdi.Idler // nil unless the subdevice sets FlagIdle
	// cost estimates an empty Poll in ns: a moving average of samples,
	// 0 until the first one.
	cost atomic.Int64
	// quiet counts consecutive polls that handled nothing, up to
	// quietMax.
	quiet atomic.Int32
	// owed counts the rounds it was skipped since its last poll.
	owed atomic.Int32
	// hit is the round of its last poll that handled something; 0 if none
	// did yet.
	hit atomic.Uint32
	// sampleAt is the round from which its next poll is timed.
	sampleAt atomic.Uint32
}

// sample folds one empty poll's duration into the cost estimate. A poll
// the scheduler interrupted would count as hundreds of µs; a sample is
// taken as at most twice the estimate plus 2 µs.
func (pp *polled) sample(ns int64) {
	c := pp.cost.Load()
	if c == 0 {
		pp.cost.Store(max(ns, 1))
		return
	}
	ns = min(ns, 2*c+2000)
	pp.cost.Store(max(c+(ns-c)/4, 1))
}

// schedule is one waiter's plan for its pollers; it lives on the waiter's
// stack. Only a waiter with 2 to maxScheduled pollers skips any (on).
type schedule struct {
	on bool
	// noskip: the waiter yields between polls, and polls every
	// subdevice every round.
	noskip bool
	rounds uint32 // rounds polled so far, this waiter's and earlier ones'
	every  [maxScheduled]int32
	owed   [maxScheduled]int32
	quiet  [maxScheduled]int32
	hit    [maxScheduled]uint32
	sample [maxScheduled]uint32 // sampleAt
}

// load starts a schedule for pollers from what earlier waiters left;
// rounds counts all waiters' rounds, for the sampling phase. A waiter
// that yields from the start skips nothing.
func (s *schedule) load(pollers []*polled, rounds *atomic.Uint32, yield bool) {
	if len(pollers) < 2 || len(pollers) > maxScheduled {
		return
	}
	s.on, s.noskip = true, yield
	s.rounds = rounds.Load()
	for i, pp := range pollers {
		s.owed[i] = pp.owed.Load()
		s.hit[i] = pp.hit.Load()
		s.sample[i] = pp.sampleAt.Load()
		s.quiet[i] = pp.quiet.Load()
	}
	s.plan(pollers)
}

// save leaves the counts for the next waiter.
func (s *schedule) save(pollers []*polled, rounds *atomic.Uint32) {
	if !s.on {
		return
	}
	rounds.Store(s.rounds)
	for i, pp := range pollers {
		pp.owed.Store(s.owed[i])
		pp.hit.Store(s.hit[i])
		pp.sampleAt.Store(s.sample[i])
		pp.quiet.Store(s.quiet[i])
	}
}

// yielding tells the schedule whether the waiter yields between polls
// from now on, and so polls every subdevice every round.
func (s *schedule) yielding(pollers []*polled, yield bool) {
	if s.on && s.noskip != yield {
		s.noskip = yield
		s.plan(pollers)
	}
}

// plan sets every poller's interval: 1 for busy ones, and for quiet ones
// dearer than a round of the busy ones as many rounds as make their polls
// take their share of the time, the rest going to the pollers polled every
// round (skipping a cheaper one would save little). If all are quiet (a wait
// longer than quietAfter polls), the one that delivered last is polled
// every round, as the one the traffic is on: a tcp peer's reply that takes
// 30 µs must not wait for tcp's turn behind an idle shm. A poller never
// sampled costs 0 and is polled every round until it is.
func (s *schedule) plan(pollers []*polled) {
	var base int64
	lead := -1 // the most recent to deliver, else the cheapest
	for i, pp := range pollers {
		c := max(pp.cost.Load(), 1)
		if s.quiet[i] < quietAfter {
			base += c
		}
		if lead < 0 || s.later(i, lead) || s.hit[i] == s.hit[lead] && c < max(pollers[lead].cost.Load(), 1) {
			lead = i
		}
	}
	allQuiet := base == 0
	if allQuiet {
		base = max(pollers[lead].cost.Load(), 1)
	}
	for i, pp := range pollers {
		c := pp.cost.Load()
		if s.noskip || s.quiet[i] < quietAfter || allQuiet && i == lead || c <= base {
			s.every[i] = 1
			continue
		}
		share := int64(quietShare)
		for q := s.quiet[i]; q >= 2*quietAfter; q /= 2 {
			share *= 2
		}
		every := (share*c + base - 1) / base
		every = min(every, quietMaxGap/base+1, 1<<20)
		s.every[i] = int32(max(every, 1))
	}
}

// later reports whether poller i delivered more recently than poller j.
// Round numbers wrap; hits 2^31 rounds apart compare wrongly, which only
// misplaces one plan.
func (s *schedule) later(i, j int) bool {
	hi, hj := s.hit[i], s.hit[j]
	switch {
	case hi == 0:
		return false
	case hj == 0:
		return true
	}
	return int32(hi-hj) > 0
}

// due reports whether poller i is polled this round, and counts the
// round as owed if not.
func (s *schedule) due(i int) bool {
	if s.every[i] <= 1 {
		return true
	}
	if s.owed[i]+1 < s.every[i] {
		s.owed[i]++
		return false
	}
	s.owed[i] = 0
	return true
}

// poll polls pollers[i], sampling its cost in the sampling rounds, and
// notes whether it handled something.
func (s *schedule) poll(pollers []*polled, i int) int {
	pp := pollers[i]
	if !s.on {
		return pp.p.Poll()
	}
	var n int
	if int32(s.rounds-s.sample[i]) >= 0 {
		t := time.Now()
		n = pp.p.Poll()
		if n == 0 {
			pp.sample(time.Since(t).Nanoseconds())
			s.sample[i] = s.rounds + sampleEvery
		}
	} else {
		n = pp.p.Poll()
	}
	q := s.quiet[i]
	switch {
	case n > 0 && q != 0:
		s.quiet[i] = 0
		s.hit[i] = s.rounds
		if q >= quietAfter {
			s.plan(pollers)
		}
	case n == 0 && q < quietMax:
		s.quiet[i] = q + 1
		if q+1 == quietAfter || q+1 == 2*quietAfter || q+1 == quietMax {
			s.plan(pollers)
		}
	}
	return n
}
