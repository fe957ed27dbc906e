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

// pollNap is how long Poll calls may pause before the readers take over
// again. It is shorter than the multidevice's spin budget (2 ms), so the
// hand-over to the netpoller is rarely on a message's path, and long
// enough that watching for it costs a negligible share of a core.
const pollNap = 500 * time.Microsecond

// pollBudget bounds the frames one Poll delivers from one connection, so a
// peer that streams cannot keep a poller from returning to its caller.
const pollBudget = 64

// standby keeps the reader goroutines out of the netpoller while pollers
// work, so that a frame wakes no goroutine while somebody polls for it. It
// is safe for concurrent use.
type standby struct {
	polls  atomic.Uint64 // Poll calls so far
	active atomic.Bool   // somebody polled within the last pollNap

	mu   sync.Mutex
	idle chan struct{} // closed when polling stops; nil while nobody polls
	kick chan struct{} // capacity 1: polling started, wake the watcher
}

func newStandby() *standby {
	return &standby{kick: make(chan struct{}, 1)}
}

// polled notes a Poll call; the first after a pause sends the readers to
// stand by.
func (s *standby) polled() {
	s.polls.Add(1)
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

// waiting returns a channel closed when polling stops, or nil when nobody
// polls and the caller should read the connection itself.
func (s *standby) waiting() <-chan struct{} {
	if !s.active.Load() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.idle
}

// watch ends stand-by once a whole nap passes without a Poll call. It runs
// on its own goroutine until ctx is done and sleeps on a channel while
// nobody polls.
func (s *standby) watch(ctx context.Context) {
	t := time.NewTimer(pollNap)
	t.Stop()
	for {
		select {
		case <-s.kick:
		case <-ctx.Done():
			return
		}
		for {
			seen := s.polls.Load()
			t.Reset(pollNap)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
			if s.polls.Load() == seen {
				break
			}
		}
		s.mu.Lock()
		s.active.Store(false)
		close(s.idle)
		s.idle = nil
		s.mu.Unlock()
	}
}

// Poll delivers the frames that have arrived on every inbound connection,
// on the calling goroutine, and returns how many it delivered. It never
// waits for the network: a connection whose reader or another poller is at
// work is skipped. It implements [sdi.Poller].
func (sd *subDevice) Poll() int {
	list := sd.pollList.Load()
	if list == nil || sd.closed.Load() {
		return 0
	}
	sd.standby.polled()
	n := 0
	for _, in := range *list {
		if !in.mu.TryLock() {
			continue
		}
		n += sd.drain(in, pollBudget)
		in.mu.Unlock()
	}
	return n
}

// addPolled and removePolled change the connections Poll reads. The list
// is replaced, never changed in place, so Poll reads it without a lock.
func (sd *subDevice) addPolled(in *inbound) bool {
	sd.mu.Lock()
	defer sd.mu.Unlock()
	if sd.closed.Load() {
		return false
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
