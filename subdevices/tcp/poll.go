package tcp

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Progress: who reads an inbound connection (see "Progress" in the package
// doc). A goroutine in Poll reads every inbound connection whose lock it
// gets, without blocking; each connection's reader goroutine waits in Go's
// netpoller only while nobody polls. standby tells the readers which case
// holds.

// pollNap is how long Poll calls may pause before the readers and writers
// take over again, as long as no poller has called Idle. It is shorter than
// the multidevice's spin budget (2 ms), so the hand-over is rarely on a
// message's path, and long enough that watching for it costs a negligible
// share of a core.
const pollNap = 500 * time.Microsecond

// hintedNap replaces pollNap once a poller has called Idle: such pollers
// say when they stop, so the pause is only a safety net (for a second
// poller that does not call Idle, or an application that computes between
// two Poll calls), and a long one spares the watcher a wake-up every
// 500 µs while ranks poll. It is still short enough that frames arriving
// in such a pause wait at most a few milliseconds for a reader.
const hintedNap = 5 * time.Millisecond

// pollBudget bounds the frames one Poll delivers from one connection, so a
// peer that streams cannot keep a poller from returning to its caller.
const pollBudget = 64

// standby keeps the reader and writer goroutines out of the way while
// pollers work, so that a frame wakes no goroutine while somebody polls for
// it. Stand-by ends when a poller calls Idle, or when a nap passes without a
// Poll call. It is safe for concurrent use.
type standby struct {
	// polled is set by every Poll call and cleared by the watcher once
	// per nap; a plain load first keeps the store (and the cache line's
	// transfer) to one per nap, not one per Poll.
	polledFlag atomic.Bool
	active     atomic.Bool // pollers work: readers and writers stand by
	hinted     atomic.Bool // a poller called Idle; the nap is hintedNap
	// nap and hintNap are pollNap and hintedNap, changed by tests only.
	nap, hintNap time.Duration

	mu   sync.Mutex
	idle chan struct{} // closed when stand-by ends; nil while nobody polls
	kick chan struct{} // capacity 1: polling started, wake the watcher
}

func newStandby(nap, hintNap time.Duration) *standby {
	return &standby{kick: make(chan struct{}, 1), nap: nap, hintNap: hintNap}
}

// polled notes a Poll call; the first after stand-by ended starts it again.
func (s *standby) polled() {
	if !s.polledFlag.Load() {
		s.polledFlag.Store(true)
	}
	if s.active.Load() {
		return
	}
	s.mu.Lock()
	if !s.active.Load() {
		s.idle = make(chan struct{})
		s.active.Store(true)
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	s.mu.Unlock()
}

// idled ends stand-by at once: a poller stops polling.
func (s *standby) idled() {
	if !s.hinted.Load() {
		s.hinted.Store(true)
	}
	if !s.active.Load() {
		return
	}
	s.mu.Lock()
	s.end()
	s.mu.Unlock()
}

// end ends stand-by if it is on; the caller holds mu.
func (s *standby) end() {
	if s.active.Load() {
		s.active.Store(false)
		close(s.idle)
		s.idle = nil
	}
}

// waiting returns a channel closed when stand-by ends, or nil when nobody
// polls and the caller should do its work itself.
func (s *standby) waiting() <-chan struct{} {
	if !s.active.Load() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.idle
}

// watch ends stand-by once a whole nap passes without a Poll call, for
// pollers that stop without calling Idle. It runs on its own goroutine
// until ctx is done and sleeps on a channel while nobody polls.
func (s *standby) watch(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		select {
		case <-s.kick:
		case <-ctx.Done():
			return
		}
		for s.active.Load() {
			s.polledFlag.Store(false)
			nap := s.nap
			if s.hinted.Load() {
				nap = s.hintNap
			}
			t.Reset(nap)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
			// A stand-by that Idle ended, and any started after it, saw
			// Poll calls since the flag was cleared; so no call means
			// this one is over.
			if !s.polledFlag.Load() {
				s.mu.Lock()
				s.end()
				s.mu.Unlock()
			}
		}
	}
}

// Idle ends the stand-by of the reader and writer goroutines at once: the
// calling poller is about to park, so they take over the connections now
// rather than after a nap. The next Poll call starts the stand-by again. It
// implements [sdi.Idler].
func (sd *subDevice) Idle() {
	if st := sd.standby; st != nil {
		st.idled()
	}
}

// Poll writes what is queued for the peers while their sockets take it,
// delivers the frames that have arrived on every inbound connection, all on
// the calling goroutine, and returns how many frames it completed and
// delivered. It never waits for the network: a connection somebody else
// reads or writes is skipped. It implements [sdi.Poller].
func (sd *subDevice) Poll() int {
	if sd.closed.Load() {
		return 0
	}
	sd.standby.polled()
	n := 0
	if sd.backlog.Load() > 0 {
		if lanes := sd.pushList.Load(); lanes != nil {
			for _, l := range *lanes {
				if l.pending.Load() {
					n += l.pushNow()
				}
			}
		}
	}
	list := sd.pollList.Load()
	if list == nil {
		return n
	}
	if ps := sd.pset; len(*list) > pollScanMax && ps.mu.TryLock() {
		n += sd.drainReady(ps, *list)
		ps.mu.Unlock()
		return n
	}
	for _, in := range *list {
		if !in.mu.TryLock() {
			continue
		}
		n += sd.drain(in, pollBudget)
		in.mu.Unlock()
	}
	return n
}

// listLanes replaces the list of lanes Poll pushes with those of the
// connected peers. The caller holds mu.
func (sd *subDevice) listLanes() {
	var list []*lane
	for i := range sd.peers {
		if p := sd.peers[i].Load(); p != nil {
			list = append(list, p.lanes...)
		}
	}
	sd.pushList.Store(&list)
}

// addPolled and removePolled change the connections Poll reads. The list
// is replaced, never changed in place, so Poll reads it without a lock.
func (sd *subDevice) addPolled(in *inbound) bool {
	sd.mu.Lock()
	defer sd.mu.Unlock()
	if sd.closed.Load() {
		return false
	}
	if err := sd.pset.add(in); err != nil {
		// Poll reads the connection every time instead of asking the
		// set first: slower, not wrong.
		sd.log.Warn("polling a connection without asking whether it has something", "peer", in.rank, "error", err)
		in.unsignalled = true
	}
	var list []*inbound
	if old := sd.pollList.Load(); old != nil {
		list = append(list, *old...)
	}
	list = append(list, in)
	sd.pollList.Store(&list)
	return true
}

func (sd *subDevice) removePolled(in *inbound) {
	sd.mu.Lock()
	defer sd.mu.Unlock()
	sd.pset.forget(in)
	old := sd.pollList.Load()
	if old == nil {
		return
	}
	list := make([]*inbound, 0, len(*old))
	for _, x := range *old {
		if x != in {
			list = append(list, x)
		}
	}
	sd.pollList.Store(&list)
}
