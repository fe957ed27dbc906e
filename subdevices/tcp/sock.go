package tcp

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sock does non-blocking reads and writes on a connection's socket from
// any goroutine, without Go's netpoller. It goes through
// [syscall.RawConn.Control], which holds a reference to the descriptor for
// the call, so a concurrent Close cannot hand the number to another file
// while we use it, and which, unlike RawConn.Read and Write, does not queue
// behind a goroutine parked in the netpoller on the same connection.
//
// A sock is not safe for concurrent use; its owner's lock guards it.
type sock struct {
	raw syscall.RawConn
	// yield, when set, ends waitReadable early while it reports true
	// (pollers are at work and read the socket themselves).
	yield *atomic.Bool

	// Arguments and results of the calls, kept here so that the closures
	// handed to Control are made once and calls allocate nothing.
	p      []byte
	iov    [3]unix.Iovec
	niov   int
	n      int
	errno  syscall.Errno
	readFn func(fd uintptr)
	wrFn   func(fd uintptr)
	peekFn func(fd uintptr) bool
}

// newSock returns a sock for c, or nil when c has no socket underneath (a
// net.Pipe in tests), which callers treat as "use the blocking calls".
func newSock(c net.Conn) *sock {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	s := &sock{raw: raw}
	s.readFn = func(fd uintptr) {
		for {
			n, _, e := unix.Syscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(s.p))), uintptr(len(s.p)))
			if e != unix.EINTR {
				s.n, s.errno = int(n), e
				return
			}
		}
	}
	s.wrFn = func(fd uintptr) {
		for {
			n, _, e := unix.Syscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&s.iov[0])), uintptr(s.niov))
			if e != unix.EINTR {
				s.n, s.errno = int(n), e
				return
			}
		}
	}
	// peekFn reports whether a read would not block: data, end of stream
	// or an error is there. It consumes nothing.
	s.peekFn = func(fd uintptr) bool {
		if s.yield != nil && s.yield.Load() {
			return true
		}
		var b [1]byte
		_, _, e := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1, unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
		return e != unix.EAGAIN && e != unix.EINTR
	}
	return s
}

// read reads what the socket holds into p without blocking: n > 0, or
// errAgain when nothing is there, io.EOF at the end of the stream, or the
// error.
func (s *sock) read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.p = p
	err := s.raw.Control(s.readFn)
	s.p = nil
	switch {
	case err != nil:
		return 0, err // closed
	case s.errno == unix.EAGAIN:
		return 0, errAgain
	case s.errno != 0:
		return 0, fmt.Errorf("read: %w", s.errno)
	case s.n == 0:
		return 0, io.EOF
	}
	return s.n, nil
}

// writev writes as much of the buffers as the socket takes now, without
// blocking, and returns how many bytes that was: 0 with a nil error when
// the socket is full.
func (s *sock) writev(bufs ...[]byte) (int, error) {
	s.niov = 0
	for _, b := range bufs {
		if len(b) > 0 {
			s.iov[s.niov].Base = unsafe.SliceData(b)
			s.iov[s.niov].SetLen(len(b))
			s.niov++
		}
	}
	if s.niov == 0 {
		return 0, nil
	}
	err := s.raw.Control(s.wrFn)
	clear(s.iov[:]) // keep no reference to the caller's buffers
	switch {
	case err != nil:
		return 0, err
	case s.errno == unix.EAGAIN:
		return 0, nil
	case s.errno != 0:
		return 0, fmt.Errorf("write: %w", s.errno)
	}
	return s.n, nil
}

// waitReadable parks the calling goroutine in Go's netpoller until a read
// would not block, without reading anything, so that the parse state stays
// free for pollers while it waits. It also returns when it wakes to find
// yield set: a poller took the data that woke it, and will take what
// follows. It returns an error once the connection is closed.
func (s *sock) waitReadable() error {
	return s.raw.Read(s.peekFn)
}

// isClosed reports whether err says the connection was closed under us.
func isClosed(err error) bool { return errors.Is(err, net.ErrClosed) }
