package tcp

import (
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sock writes to a connection's socket without blocking and without Go's
// netpoller, from whichever goroutine holds the lane's write turn. writev
// goes through [syscall.RawConn.Control], which holds a reference to the
// descriptor for the call, so a concurrent Close cannot hand the number to
// another file while we use it, and which, unlike RawConn.Write, does not
// queue behind the writer goroutine waiting in the netpoller for the same
// socket. The writer itself calls writevFD inside RawConn.Write.
//
// A sock is not safe for concurrent use; its lane's write turn guards it.
type sock struct {
	raw syscall.RawConn

	// Arguments and results of the call, kept here so that the closure
	// handed to Control is made once and calls allocate nothing.
	iov   [3 * pushFrames]unix.Iovec
	niov  int
	bytes int // what the iovecs hold
	n     int
	errno syscall.Errno
	wrFn  func(fd uintptr)
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
	s.wrFn = s.call
	return s
}

// rawMax is the most bytes a call on a non-blocking socket moves through
// RawSyscall. The call cannot block, so it skips the scheduler's
// bookkeeping around system calls (entersyscall and exitsyscall, about
// 0.1 µs each, on every poll); a larger copy may take long enough that
// the processor should be free for others meanwhile.
const rawMax = 64 << 10

func (s *sock) call(fd uintptr) {
	sys := unix.Syscall
	if s.bytes <= rawMax {
		sys = unix.RawSyscall
	}
	for {
		n, _, e := sys(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&s.iov[0])), uintptr(s.niov))
		if e != unix.EINTR {
			s.n, s.errno = int(n), e
			return
		}
	}
}

// writev writes as much of bufs (at most 3*pushFrames of them) as the
// socket takes now, without blocking, and returns how many bytes that was:
// 0 with a nil error when the socket is full.
func (s *sock) writev(bufs [][]byte) (int, error) {
	if !s.load(bufs) {
		return 0, nil
	}
	if err := s.raw.Control(s.wrFn); err != nil {
		clear(s.iov[:s.niov])
		return 0, err
	}
	return s.result()
}

// writevFD is writev on fd, for a caller that holds the descriptor already
// (inside RawConn.Write).
func (s *sock) writevFD(fd uintptr, bufs [][]byte) (int, error) {
	if !s.load(bufs) {
		return 0, nil
	}
	s.call(fd)
	return s.result()
}

// load fills the iovecs from bufs and reports whether there is anything to
// write.
func (s *sock) load(bufs [][]byte) bool {
	s.niov, s.bytes = 0, 0
	for _, b := range bufs {
		if len(b) > 0 {
			s.iov[s.niov].Base = unsafe.SliceData(b)
			s.iov[s.niov].SetLen(len(b))
			s.niov++
			s.bytes += len(b)
		}
	}
	return s.niov > 0
}

func (s *sock) result() (int, error) {
	clear(s.iov[:s.niov]) // keep no reference to the caller's buffers
	switch {
	case s.errno == unix.EAGAIN:
		return 0, nil
	case s.errno != 0:
		return 0, s.errno // its callers say what failed: "write"
	}
	return s.n, nil
}

// rxfd is the receive side of an inbound connection, taken out of Go's
// netpoller: a duplicate of the socket's descriptor that this package owns,
// after the net.Conn was closed. Go's netpoller keeps one epoll set for
// every socket of the process and an idle thread blocked in it; any data
// arriving on a socket in that set wakes that thread, even when no
// goroutine waits for it, and on a small machine that wake-up costs a
// polling rank its core for a while on every message. Outside the set,
// data wakes nobody while ranks poll, and the descriptor is put in the
// subdevice's own epoll set (one-shot) only while its reader waits.
//
// It is not safe for concurrent use: the inbound connection's lock guards
// it, and close must hold that lock too, so a read never meets a number
// that was closed and reused.
type rxfd struct {
	fd int // -1 once closed
	// peekOff is set when the socket has SO_PEEK_OFF (Linux 6.10 on), so
	// peek can read ahead without consuming; peeked counts the bytes
	// peek read that the socket still holds.
	peekOff bool
	peeked  int
}

// takeFD duplicates c's socket descriptor (non-blocking, close-on-exec)
// and closes c, which takes the socket out of Go's netpoller; the socket
// lives on through the duplicate.
func takeFD(c net.Conn) (*rxfd, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("%T has no socket descriptor", c)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	nfd := -1
	var derr error
	if err := raw.Control(func(fd uintptr) { nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, fmt.Errorf("duplicate the socket descriptor: %w", derr)
	}
	c.Close()
	return &rxfd{fd: nfd}, nil
}

// startPeeking lets peek read ahead where the kernel allows it (see
// peekOff). It comes after the socket waited for its session's turn:
// with SO_PEEK_OFF set, the one-byte peek of peerEnded would move the
// offset the frame reader's peeks start from.
func (r *rxfd) startPeeking() {
	r.peekOff = peekAhead && r.fd >= 0 && unix.SetsockoptInt(r.fd, unix.SOL_SOCKET, unix.SO_PEEK_OFF, 0) == nil
}

// peerEnded tells, without taking a byte from the socket, whether the
// stream has something to read (nil), nothing yet (errAgain), or ended
// before carrying anything more: io.EOF when the peer closed it, or the
// error that ended it. It is for a socket nobody reads yet, before
// startPeeking.
func (r *rxfd) peerEnded() error {
	var b [1]byte
	_, err := r.recv(b[:], unix.MSG_PEEK)
	return err
}

// peekAhead lets sockets peek ahead where the kernel allows it; the tests
// turn it off to run as on kernels before Linux 6.10.
var peekAhead = true

// Small frames are read in two steps: peek copies them out of the socket
// and leaves them there, and consume, at the start of the next poll,
// discards them without a copy. The kernel acknowledges data when a read
// empties the socket (on a connection it takes for one-way traffic, such
// as ours, at once after every second small segment, or every one), and
// on loopback that ACK is a whole transmit plus the peer's processing of
// it, inside our read and before the message reaches the handler. A peek
// leaves the socket holding data, so no ACK goes out until consume, by
// when the handler has answered. A C ping-pong over two one-way loopback
// sockets here: 8.1 µs half round trip with plain reads, 4.6 µs with peek
// and a deferred consume (4.9 µs over one two-way socket).

// peekBacklog is how many peeked bytes the socket may hold before peek
// consumes them first: they count against the receive buffer, so a
// stream of frames must not fill it with data we have already read.
const peekBacklog = 16 << 10

// peek reads like read but leaves the bytes in the socket for consume to
// discard; without SO_PEEK_OFF it is read.
func (r *rxfd) peek(p []byte) (int, error) {
	if !r.peekOff {
		return r.read(p)
	}
	if r.peeked >= peekBacklog {
		if err := r.consume(); err != nil {
			return 0, err
		}
	}
	n, err := r.recv(p, unix.MSG_PEEK)
	r.peeked += n
	return n, err
}

// consume discards the bytes peek read from the socket, without copying
// them, which lets the kernel acknowledge them.
func (r *rxfd) consume() error {
	for r.peeked > 0 {
		if r.fd < 0 {
			return net.ErrClosed
		}
		n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(r.fd), 0, uintptr(r.peeked), unix.MSG_TRUNC|unix.MSG_DONTWAIT, 0, 0)
		switch {
		case e == unix.EINTR:
		case e != 0:
			return fmt.Errorf("discard peeked bytes: %w", e)
		case n == 0:
			return fmt.Errorf("discard peeked bytes: %w", io.ErrUnexpectedEOF)
		default:
			r.peeked -= int(n)
		}
	}
	return nil
}

// read reads what the socket holds into p without blocking, after
// discarding what peek left there: n > 0, or errAgain when nothing is
// there, io.EOF at the end of the stream, or the error.
func (r *rxfd) read(p []byte) (int, error) {
	if err := r.consume(); err != nil {
		return 0, err
	}
	return r.recv(p, 0)
}

// recv is read with recv(2) flags.
func (r *rxfd) recv(p []byte, flags int) (int, error) {
	if r.fd < 0 {
		return 0, net.ErrClosed
	}
	if len(p) == 0 {
		return 0, nil
	}
	sys := unix.Syscall6
	if len(p) <= rawMax {
		sys = unix.RawSyscall6
	}
	for {
		n, _, e := sys(unix.SYS_RECVFROM, uintptr(r.fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)), uintptr(flags|unix.MSG_DONTWAIT), 0, 0)
		switch e {
		case 0:
			if n == 0 {
				return 0, io.EOF
			}
			return int(n), nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, errAgain
		}
		return 0, fmt.Errorf("read: %w", e)
	}
}

// ackEvery is how many frames an inbound connection delivers between two
// calls of delayAcks: often enough that a lapse back to quick
// acknowledgements costs little, rarely enough that the system call is a
// negligible share of a frame's cost.
const ackEvery = 64

// delayAcks asks the kernel to stop acknowledging every small segment at
// once (TCP_QUICKACK off, the "ping-pong" mode an interactive connection
// gets). We only ever read from an inbound connection, so the kernel takes
// it for one-way traffic and, on every read that empties the socket after
// a small segment, sends a bare ACK from inside the read: on loopback that
// is a whole transmit, and the peer's processing of it, before our read
// returns with the message; about 1.5 µs of an 8-byte half round trip.
// In ping-pong mode the kernel acknowledges every second small segment,
// and every full segment as before, so the sender's window still opens.
// The mode is not sticky: the kernel leaves it when a delayed ACK's timer
// fires (an idle gap after an odd number of segments), hence the repeats
// every ackEvery frames. Failure only costs speed, so it is not reported.
func (r *rxfd) delayAcks() {
	if r.fd >= 0 {
		unix.SetsockoptInt(r.fd, unix.IPPROTO_TCP, unix.TCP_QUICKACK, 0)
	}
}

func (r *rxfd) close() {
	if r.fd >= 0 {
		unix.Close(r.fd)
		r.fd = -1
	}
}

// idleWaiter lets reader goroutines wait for their sockets to become
// readable: one epoll set for the subdevice, one goroutine waiting on it,
// which hands each event to the reader that armed it. Sockets are armed
// one-shot, so an event fires once per wait: while pollers work, a socket
// that fired is left unarmed and its traffic wakes nobody. It is safe for
// concurrent use.
//
// The goroutine waits for the set in Go's netpoller (the set itself is
// pollable), not in a blocking epoll_wait: a goroutine blocked in a
// system call keeps its processor until the runtime's monitor takes it
// back, 20 us to 10 ms later. A rank bound to one CPU has one processor,
// so every time this goroutine went back to its wait after handing out
// an event, the rank's polling goroutine, runnable beside it, stood still
// that long: a ping-pong over TCP stalled for 8-15 ms now and then, a
// fifth more on its mean latency.
type idleWaiter struct {
	epfd, evfd int // the epoll set, and an eventfd in it that stops run
	set        *os.File
	rc         syscall.RawConn // set's, to wait in the netpoller

	mu      sync.Mutex
	waiters map[int32]chan struct{} // by the id in the epoll data
	next    int32
}

func newIdleWaiter() (*idleWaiter, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	// Non-blocking, so that os.NewFile hands it to the netpoller.
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("epoll set non-blocking: %w", err)
	}
	set := os.NewFile(uintptr(epfd), "tcp idle epoll")
	rc, err := set.SyscallConn()
	if err != nil {
		set.Close()
		return nil, fmt.Errorf("epoll set: %w", err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		set.Close()
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: 0} // id 0 is the eventfd
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, evfd, &ev); err != nil {
		set.Close()
		unix.Close(evfd)
		return nil, fmt.Errorf("epoll_ctl: %w", err)
	}
	return &idleWaiter{epfd: epfd, evfd: evfd, set: set, rc: rc, waiters: make(map[int32]chan struct{})}, nil
}

// add registers a socket, unarmed, and returns its id and the channel its
// reader waits on after arm.
func (w *idleWaiter) add(fd int) (int32, <-chan struct{}, error) {
	w.mu.Lock()
	for w.next++; w.next <= 0 || w.waiters[w.next] != nil; w.next++ {
		if w.next <= 0 {
			w.next = 0 // wrapped; 0 is the eventfd's
		}
	}
	id := w.next
	ch := make(chan struct{}, 1)
	w.waiters[id] = ch
	w.mu.Unlock()
	ev := unix.EpollEvent{Events: unix.EPOLLONESHOT, Fd: id}
	if err := unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		w.forget(id)
		return 0, nil, fmt.Errorf("epoll_ctl add: %w", err)
	}
	return id, ch, nil
}

// arm asks for one wake-up on the channel when fd has something to read
// (or has ended); if it has already, the wake-up comes at once.
func (w *idleWaiter) arm(fd int, id int32) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT, Fd: id}
	if err := unix.EpollCtl(w.epfd, unix.EPOLL_CTL_MOD, fd, &ev); err != nil {
		return fmt.Errorf("epoll_ctl mod: %w", err)
	}
	return nil
}

// remove unregisters fd before it is closed.
func (w *idleWaiter) remove(fd int, id int32) {
	unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, fd, nil)
	w.forget(id)
}

func (w *idleWaiter) forget(id int32) {
	w.mu.Lock()
	delete(w.waiters, id)
	w.mu.Unlock()
}

// run hands events to their readers until stop.
func (w *idleWaiter) run() {
	var evs [64]unix.EpollEvent
	for {
		n, err := w.wait(evs[:])
		if err != nil {
			continue // EINTR
		}
		for _, ev := range evs[:n] {
			id := ev.Fd // our id, not a descriptor
			if id == 0 {
				return
			}
			w.mu.Lock()
			ch := w.waiters[id]
			w.mu.Unlock()
			if ch != nil {
				select {
				case ch <- struct{}{}:
				default:
				}
			}
		}
	}
}

// wait fills evs with the set's next events. It parks in the netpoller
// until the set has some; where the netpoller refuses an epoll set (it
// has accepted them since Linux 2.6), it blocks in epoll_wait instead.
func (w *idleWaiter) wait(evs []unix.EpollEvent) (int, error) {
	var n int
	var werr error
	err := w.rc.Read(func(fd uintptr) bool {
		n, werr = unix.EpollWait(int(fd), evs, 0)
		return n > 0 || (werr != nil && werr != unix.EAGAIN)
	})
	if err != nil {
		return unix.EpollWait(w.epfd, evs, -1)
	}
	return n, werr
}

// stop makes run return; close releases the descriptors after it did.
func (w *idleWaiter) stop() {
	var one = [8]byte{1}
	unix.Write(w.evfd, one[:])
}

func (w *idleWaiter) close() {
	w.set.Close()
	unix.Close(w.evfd)
}
