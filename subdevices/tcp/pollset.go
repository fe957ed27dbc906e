package tcp

import (
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// pollScanMax is the most inbound connections Poll reads one by one; with
// more, it asks the poll set which have something first. A read of an
// idle socket costs about as much as the epoll_wait that would skip it, so
// a few connections are cheaper read; each idle one beyond that added
// about 1 µs to a round trip (BenchmarkPollIdlePeers). A variable for the
// tests, which run both ways.
var pollScanMax = 4

// pollSet is an epoll set, level-triggered, of every connection Poll
// reads, keyed by the connection's id with the idle waiter. Poll asks it
// which connections have something and reads only those, plus those whose
// frame reader still holds bytes the socket no longer signals (more).
// A descriptor leaves the set when it is closed.
type pollSet struct {
	fd int
	// mu is held by the Poll call using evs; a concurrent Poll reads every
	// connection instead.
	mu  sync.Mutex
	evs [64]unix.EpollEvent
	// byID maps the ids in the set to their connections; replaced whole
	// under the subdevice's mu, like pollList.
	byID atomic.Pointer[map[int32]*inbound]
}

func newPollSet() (*pollSet, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	return &pollSet{fd: fd}, nil
}

// add puts in's socket into the set, and in into byID. The subdevice's mu
// must be held.
func (ps *pollSet) add(in *inbound) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: in.wid}
	if err := unix.EpollCtl(ps.fd, unix.EPOLL_CTL_ADD, in.rx.fd, &ev); err != nil {
		return fmt.Errorf("epoll_ctl add: %w", err)
	}
	m := map[int32]*inbound{in.wid: in}
	if old := ps.byID.Load(); old != nil {
		for id, x := range *old {
			m[id] = x
		}
	}
	ps.byID.Store(&m)
	return nil
}

// forget drops in from byID. Its descriptor leaves the set when closed; an
// event for it meanwhile finds no connection. The subdevice's mu must be
// held.
func (ps *pollSet) forget(in *inbound) {
	old := ps.byID.Load()
	if old == nil {
		return
	}
	m := make(map[int32]*inbound, len(*old))
	for id, x := range *old {
		if x != in {
			m[id] = x
		}
	}
	ps.byID.Store(&m)
}

// drainReady delivers from the connections of list that have something,
// each only if nobody else reads it, and returns the frames delivered.
// ps.mu must be held.
func (sd *subDevice) drainReady(ps *pollSet, list []*inbound) int {
	n := 0
	if ps.fd < 0 { // closed
		return 0
	}
	k, err := unix.EpollWait(ps.fd, ps.evs[:], 0)
	if err != nil { // EINTR: the next Poll asks again
		k = 0
	}
	if k > 0 {
		byID := *ps.byID.Load()
		for _, ev := range ps.evs[:k] {
			if in := byID[ev.Fd]; in != nil && in.mu.TryLock() {
				n += sd.drain(in, pollBudget)
				in.mu.Unlock()
			}
		}
	}
	for _, in := range list {
		if (in.unsignalled || in.more.Load()) && in.mu.TryLock() {
			n += sd.drain(in, pollBudget)
			in.mu.Unlock()
		}
	}
	return n
}

// close closes the set once no Poll uses it.
func (ps *pollSet) close() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.fd >= 0 {
		unix.Close(ps.fd)
		ps.fd = -1
	}
}
