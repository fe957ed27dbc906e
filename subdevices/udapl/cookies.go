package udapl

import (
	"sync"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
)

// wrTable gives every posted work request a DTO cookie and turns the cookie
// of a completion back into the engine's endpoint id, work request id and
// op. DAT's cookie has 64 bits, as the engine's work request id does, so
// the id cannot travel in it; and the ep_handle of a completion cannot name
// the endpoint safely either, since a freed handle's memory may come back
// as a new endpoint's while completions of the old one are still queued.
//
// A cookie is a slot index (low 32 bits) and the slot's generation (high 32
// bits). Freeing a slot bumps its generation, so a completion that arrives
// for a slot already completed, or already flushed by the provider itself
// (flushOwner), no longer matches and is dropped: every work request
// completes exactly once.
//
// wrTable is safe for concurrent use: posts on any goroutine add, the
// polling goroutine takes, and the goroutine that frees endpoints flushes.
type wrTable struct {
	mu    sync.Mutex
	slots []wrSlot
	free  []uint32 // indexes of slots not in use
}

type wrSlot struct {
	gen   uint32
	live  bool
	owner uint64 // the endpoint's serial number, unique over the provider's life
	c     rdma.Completion
}

// add records a work request about to be posted and returns its cookie.
func (t *wrTable) add(owner uint64, ep uint32, wr uint64, op rdma.Op) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var i uint32
	if n := len(t.free); n > 0 {
		i = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		i = uint32(len(t.slots))
		t.slots = append(t.slots, wrSlot{gen: 1})
	}
	s := &t.slots[i]
	s.live, s.owner = true, owner
	s.c = rdma.Completion{Endpoint: ep, WR: wr, Op: op}
	return uint64(s.gen)<<32 | uint64(i)
}

// take ends the work request behind cookie and returns its completion and
// the endpoint's serial number, or false if the cookie is stale or was
// never issued.
func (t *wrTable) take(cookie uint64) (rdma.Completion, uint64, bool) {
	i, gen := uint32(cookie), uint32(cookie>>32)
	t.mu.Lock()
	defer t.mu.Unlock()
	if int(i) >= len(t.slots) {
		return rdma.Completion{}, 0, false
	}
	s := &t.slots[i]
	if !s.live || s.gen != gen {
		return rdma.Completion{}, 0, false
	}
	c, owner := s.c, s.owner
	t.releaseLocked(i)
	return c, owner, true
}

// flushOwner ends every work request still open on the endpoint owner and
// appends a completion with err for each to out.
func (t *wrTable) flushOwner(owner uint64, err error, out []rdma.Completion) []rdma.Completion {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.slots {
		s := &t.slots[i]
		if s.live && s.owner == owner {
			c := s.c
			c.Err = err
			out = append(out, c)
			t.releaseLocked(uint32(i))
		}
	}
	return out
}

func (t *wrTable) releaseLocked(i uint32) {
	s := &t.slots[i]
	s.live = false
	s.gen++
	if s.gen == 0 { // never issue generation 0, so cookie 0 is never valid
		s.gen = 1
	}
	t.free = append(t.free, i)
}
