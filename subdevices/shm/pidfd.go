package shm

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Pid reuse.
//
// A peer's pid comes from its segment header. If the peer's process dies
// and the pid goes to an unrelated process of the same user before the
// death is noticed, process_vm_writev would corrupt that stranger and
// process_vm_readv would deliver its bytes as a message. kill(pid, 0)
// cannot tell, a pidfd can: it names the process, not the number. Connect
// opens it before the probe, so once the probe succeeded and the pidfd
// still shows the process running, it names the process that answered the
// probe: a process that has not exited keeps its pid. A payload copy is
// preceded by that check unless one found the process running less than
// guardFresh ago: for the pid to name another process sooner, the kernel
// would have to hand out the whole pid range in between (pid_max is at
// least 32768, and a fork takes tens of microseconds). A poll of the
// pidfd costs about 0.5 us, a sixth of a single_copy_min read; polling
// before every copy made 64 KiB messages 11 % slower.
//
// Without pidfd_open (Linux before 5.3 says ENOSYS, a seccomp filter
// EPERM) it is as before pidfds: liveness is checked with kill(pid, 0),
// and copies are not guarded beyond the ESRCH of the copy itself.

// peerProc is a peer's process, named by a pidfd where the kernel gives
// one and by its pid otherwise. It is safe for concurrent use: the outbound
// connection and the receiver share it, each holding a reference, and
// the pidfd is closed when the last one is released.
type peerProc struct {
	pid int
	// seen is when a poll of the pidfd last found the process running,
	// in nanoseconds of procClock; 0 before the first.
	seen atomic.Int64
	// mu is read-held while fd is in use and write-held to release, so
	// that the number is never closed (and perhaps reused) under a check.
	mu   sync.RWMutex
	fd   int // the pidfd; -1 without one
	refs int // holders; 0 once released
}

// pidfdOpener is unix.PidfdOpen, or what a test puts in its place to see
// the kernel refuse.
type pidfdOpener func(pid, flags int) (int, error)

// openPeerProc names process pid, opening its pidfd with open. It returns
// an error wrapping [sdi.ErrPeerUnreachable] when there is no such
// process; otherwise unavail says why the result holds no pidfd, nil if
// it holds one.
func openPeerProc(pid int, open pidfdOpener) (pr *peerProc, unavail, err error) {
	pr = &peerProc{pid: pid, fd: -1, refs: 1}
	if pid <= 0 {
		return pr, nil, nil // a garbled header; the probe fails and says so
	}
	fd, err := open(pid, 0) // a pidfd is always close-on-exec
	switch {
	case err == nil:
		pr.fd = fd
		return pr, nil, nil
	case errors.Is(err, unix.ESRCH):
		return nil, nil, fmt.Errorf("process %d exited: %w", pid, sdi.ErrPeerUnreachable)
	}
	return pr, fmt.Errorf("pidfd_open of process %d: %w", pid, err), nil
}

// acquire adds a holder and returns pr.
func (pr *peerProc) acquire() *peerProc {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pr.refs++
	return pr
}

// hold adds a holder unless pr was released already, and reports
// whether it did: a receiver waiting on pr's process needs it not to be
// released under it (a reconnect releases the previous one), since a
// released one cannot tell whether the process still runs.
func (pr *peerProc) hold() bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.refs == 0 {
		return false
	}
	pr.refs++
	return true
}

// release drops a holder, and closes the pidfd with the last one.
func (pr *peerProc) release() error {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.refs == 0 {
		return nil
	}
	pr.refs--
	if pr.refs > 0 || pr.fd < 0 {
		return nil
	}
	fd := pr.fd
	pr.fd = -1
	if err := unix.Close(fd); err != nil {
		return fmt.Errorf("close pidfd of process %d: %w", pr.pid, err)
	}
	return nil
}

// check returns nil while the process runs, and an error wrapping
// [sdi.ErrPeerUnreachable] once it exited (a zombie too: its memory is
// gone) or pr was released. Without a pidfd it can tell only that no
// process has the pid.
func (pr *peerProc) check() error { return pr.verify(true) }

// guard is check before a copy of a payload, except that it trusts a poll
// that found the process running less than guardFresh ago. Without a
// pidfd it does not ask: kill(pid, 0) would tell no more than the copy's
// own ESRCH.
func (pr *peerProc) guard() error { return pr.verify(false) }

// verify is check when strict, guard otherwise.
func (pr *peerProc) verify(strict bool) error {
	pr.mu.RLock()
	defer pr.mu.RUnlock()
	if !strict && pr.refs > 0 && pr.fd >= 0 && procClock()-pr.seen.Load() < int64(guardFresh) {
		return nil
	}
	switch {
	case pr.refs == 0:
		return fmt.Errorf("connection to process %d released: %w", pr.pid, sdi.ErrPeerUnreachable)
	case pr.fd < 0:
		if strict && pr.pid > 0 && errors.Is(unix.Kill(pr.pid, 0), unix.ESRCH) {
			return fmt.Errorf("process %d exited: %w", pr.pid, sdi.ErrPeerUnreachable)
		}
		return nil
	}
	// A pidfd polls readable once its process exited.
	fds := [1]unix.PollFd{{Fd: int32(pr.fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds[:], 0)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			// Not knowing whether the process lives is reason enough
			// not to copy to or from it.
			return fmt.Errorf("poll pidfd of process %d: %w: %w", pr.pid, sdi.ErrPeerUnreachable, err)
		case n > 0:
			return fmt.Errorf("process %d exited: %w", pr.pid, sdi.ErrPeerUnreachable)
		}
		pr.seen.Store(procClock())
		return nil
	}
}

// guardFresh is how long a pidfd poll that found a peer's process running
// vouches for its pid (see the top of this file).
const guardFresh = time.Millisecond

// procEpoch and procClock give monotonic nanoseconds, never 0 after the
// first call, for peerProc.seen.
var procEpoch = time.Now()

func procClock() int64 { return int64(time.Since(procEpoch)) + 1 }
