//go:build linux

package futex

import (
	"errors"
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Futex operations without FUTEX_PRIVATE_FLAG, so they work on shared mappings.
const (
	futexWait = 0
	futexWake = 1
)

// Wait blocks while *addr holds val, until a Wake on addr, until timeout
// elapses (timeout <= 0 waits without limit), or spuriously. It returns nil
// in all those cases, including when *addr already differed from val: the
// caller re-checks its own condition either way. It returns an error only
// when the kernel refuses the call (a bad address, for instance).
//
// Wait is safe for concurrent use.
func Wait(addr *uint32, val uint32, timeout time.Duration) error {
	var ts *unix.Timespec
	if timeout > 0 {
		t := unix.NsecToTimespec(int64(timeout))
		ts = &t
	}
	_, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWait,
		uintptr(val), uintptr(unsafe.Pointer(ts)), 0, 0)
	switch {
	case errno == 0,
		// The word changed before the kernel queued us: the wake-up we
		// were waiting for has already happened.
		errors.Is(errno, unix.EAGAIN),
		// A signal interrupted the wait; the caller re-checks and waits again.
		errors.Is(errno, unix.EINTR),
		errors.Is(errno, unix.ETIMEDOUT):
		return nil
	}
	return fmt.Errorf("futex: wait: %w", errno)
}

// Wake wakes at most n waiters blocked in Wait on addr and returns how many
// it woke. It is safe for concurrent use.
func Wake(addr *uint32, n int) (int, error) {
	woken, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWake,
		uintptr(n), 0, 0, 0)
	if errno != 0 {
		return 0, fmt.Errorf("futex: wake: %w", errno)
	}
	return int(woken), nil
}
