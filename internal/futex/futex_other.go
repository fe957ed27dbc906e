//go:build !linux

package futex

import (
	"sync/atomic"
	"time"
)

// pollInterval bounds how late the polling fallback notices a change.
const pollInterval = time.Millisecond

// Wait blocks while *addr holds val, until timeout elapses (timeout <= 0
// waits without limit). Without futexes it polls the word, so it notices a
// change at most pollInterval late. It always returns nil.
func Wait(addr *uint32, val uint32, timeout time.Duration) error {
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	for atomic.LoadUint32(addr) == val {
		if !deadline.IsZero() && time.Now().After(deadline) {
			return nil
		}
		time.Sleep(pollInterval)
	}
	return nil
}

// Wake is a no-op in the polling fallback: waiters notice the changed word on
// their next poll. It reports no woken waiters.
func Wake(addr *uint32, n int) (int, error) { return 0, nil }
