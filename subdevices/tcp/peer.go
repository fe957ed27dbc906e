package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// outFrame is an accepted frame waiting for the writer. It copies the
// slices out of the caller's sdi.Frame, which the caller may reuse at once.
type outFrame struct {
	header, payload []byte
	token           uint64
	// sent counts the bytes of the frame (wire header included) already
	// written before the socket filled up.
	sent int
}

func (f outFrame) cost() int { return sdi.WireHeaderSize + len(f.header) + len(f.payload) }

// wire returns the frame's wire header in b.
func (f outFrame) wire(b []byte) []byte {
	sdi.WireHeader{HeaderLen: uint16(len(f.header)), PayloadLen: uint32(len(f.payload))}.Put(b)
	return b[:sdi.WireHeaderSize]
}

// appendUnsent appends the parts of f not written yet to bufs, with w as
// its wire header.
func (f outFrame) appendUnsent(bufs [][]byte, w []byte) [][]byte {
	skip := f.sent
	for _, b := range [3][]byte{w, f.header, f.payload} {
		if skip >= len(b) {
			skip -= len(b)
			continue
		}
		bufs = append(bufs, b[skip:])
		skip = 0
	}
	return bufs
}

// pushFrames bounds the frames one writev takes from a queue: three
// iovecs each stay well under the kernel's IOV_MAX (1024), and 64 frames of
// any size fill a socket buffer.
const pushFrames = 64

// lane is one outbound connection to a peer: frames queued on it leave in
// the order Send accepted them. It is safe for concurrent use.
//
// Whoever holds the write turn (busy) writes: Send inline when the lane is
// idle, a poller pushing the queue (Poll), or the writer goroutine while
// nobody polls; all of them write without blocking, and only the writer
// waits, in Go's netpoller, for a full socket to take more. The holder of
// the turn also reports SendDone for what it wrote, so completions come in
// accept order. A watcher goroutine owns the connection's read side.
type lane struct {
	owner *peer
	rank  sdi.Rank
	conn  net.Conn
	// sock writes without blocking; nil when conn has no socket (tests),
	// and then every frame goes through the writer's blocking writes.
	sock    *sock
	h       sdi.Handler
	log     hclog.Logger
	limit   int  // queue_bytes
	link    Link // what address selection chose; Bytes is kept in written
	standby *standby
	// backlog counts the subdevice's lanes with frames queued, so Poll
	// looks for queues to push only when there are some.
	backlog *atomic.Int32
	// written counts bytes handed to the kernel, wire headers included.
	written atomic.Uint64
	// pending is set while frames are queued (under mu), for Poll to read
	// without the lock.
	pending atomic.Bool

	wake      chan struct{} // capacity 1: frames were queued, or the turn came free
	halted    chan struct{} // closed by halt
	watchDone chan struct{} // closed when the watcher returned
	done      chan struct{} // closed when writer and watcher returned

	mu sync.Mutex
	// queue[head:] are the frames accepted and not completely written, in
	// accept order; the first may be written in part.
	queue []outFrame
	head  int
	// busy is the write turn: set while a goroutine writes to the socket
	// and reports what it wrote. Send writes inline only when nothing is
	// busy or queued, so bytes reach the stream in accept order.
	busy     bool
	queued   int    // bytes of queued frames not yet written
	accepted uint64 // frames Send accepted, or is writing inline
	finished uint64 // frames whose SendDone has returned; they finish in accept order
	flushers []*flusher
	err      error // why the peer stopped; Send refuses with it
	report   bool  // the connection failed (not us): report PeerDown

	// Used only by the holder of the write turn.
	wbuf   [sdi.WireHeaderSize]byte              // the wire header of the frame Send writes inline
	inline [3][]byte                             // what Send writes inline
	wires  [pushFrames * sdi.WireHeaderSize]byte // wire headers of the frames a push writes
	bufs   [][]byte                              // what a push writes
	tokens []uint64                              // frames a push completed
}

// flusher is a Flush waiting for the frames accepted before it to finish.
type flusher struct {
	target uint64
	ch     chan struct{}
}

func newLane(owner *peer, conn net.Conn, link Link, limit int) *lane {
	st, backlog := owner.standby, owner.backlog
	if st == nil {
		// A peer without a subdevice (tests): nobody polls.
		st, backlog = newStandby(pollNap, hintedNap), new(atomic.Int32)
	}
	return &lane{
		owner:     owner,
		link:      link,
		rank:      owner.rank,
		conn:      conn,
		sock:      newSock(conn),
		h:         owner.h,
		log:       owner.log,
		limit:     limit,
		standby:   st,
		backlog:   backlog,
		wake:      make(chan struct{}, 1),
		halted:    make(chan struct{}),
		watchDone: make(chan struct{}),
		done:      make(chan struct{}),
		bufs:      make([][]byte, 0, 3*pushFrames),
	}
}

// start runs the writer and the watcher, both counted in wg.
func (p *lane) start(wg *sync.WaitGroup) {
	wg.Add(2)
	go func() {
		defer wg.Done()
		p.watch()
	}()
	go func() {
		defer wg.Done()
		p.writeLoop()
	}()
}

// send writes f at once when the lane is idle, or queues it, or refuses
// it. It returns done=true when the socket took the whole frame. It never
// blocks and never calls the handler.
func (p *lane) send(f *sdi.Frame) (bool, error) {
	of := outFrame{header: f.Header, payload: f.Payload, token: f.Token}
	cost := of.cost()
	p.mu.Lock()
	if p.err != nil {
		err := p.err
		p.mu.Unlock()
		return false, err
	}
	// Refuse only once the queue is at its bound, whatever the frame's size:
	// requiring room for the whole frame would let a stream of small frames
	// starve a large one forever. The queue thus holds at most queue_bytes
	// plus one frame.
	if p.queued >= p.limit {
		p.mu.Unlock()
		return false, sdi.ErrWouldBlock
	}
	p.accepted++
	if p.sock != nil && !p.busy && p.head == len(p.queue) {
		p.busy = true
		p.mu.Unlock()
		return p.sendInline(of)
	}
	p.enqueue(of, cost, false)
	p.mu.Unlock()
	p.kick()
	return false, nil
}

// enqueue adds of (cost bytes of it unwritten) to the queue, at its end or
// at its front. The caller holds mu.
func (p *lane) enqueue(of outFrame, cost int, front bool) {
	switch {
	case p.head == len(p.queue):
		p.queue, p.head = append(p.queue[:0], of), 0
	case !front:
		p.queue = append(p.queue, of)
	case p.head > 0:
		p.head--
		p.queue[p.head] = of
	default:
		p.queue = slices.Insert(p.queue, 0, of)
	}
	p.queued += cost
	if !p.pending.Load() {
		p.pending.Store(true)
		p.backlog.Add(1)
	}
}

// sendInline writes of on the sending goroutine, header and payload in one
// writev from the caller's buffers, and queues what the socket did not take
// in front of anything queued meanwhile. The caller took the write turn.
func (p *lane) sendInline(of outFrame) (bool, error) {
	p.inline = [3][]byte{of.wire(p.wbuf[:]), of.header, of.payload}
	n, err := p.sock.writev(p.inline[:])
	clear(p.inline[:])
	if n > 0 {
		p.written.Add(uint64(n))
	}
	cost := of.cost()
	p.mu.Lock()
	switch {
	case err == nil && n == cost:
		p.finish(1)
		p.release()
		p.mu.Unlock()
		return true, nil
	case err != nil || p.err != nil:
		// The connection failed, or halt closed it under us: the frame
		// is not accepted, and the writer reports the rest.
		p.finish(1)
		if p.err == nil {
			p.busy = false
			p.mu.Unlock()
			p.halt(fmt.Errorf("tcp: rank %d down: %w: write: %w", p.rank, sdi.ErrPeerUnreachable, err), true)
			p.mu.Lock()
			herr := p.err
			p.mu.Unlock()
			p.kick()
			return false, herr
		}
		herr := p.err
		p.release()
		p.mu.Unlock()
		return false, herr
	}
	// The socket is full: the rest goes first, before anything queued
	// meanwhile. Pollers push it, or the writer when nobody polls.
	of.sent = n
	p.enqueue(of, cost-n, true)
	p.release()
	p.mu.Unlock()
	return false, nil
}

// release gives up the write turn. If frames are left or the lane halted,
// it wakes the writer, which may be waiting for the turn. The caller holds
// mu.
func (p *lane) release() {
	p.busy = false
	if p.head < len(p.queue) || p.err != nil {
		p.kick()
	}
}

// kick wakes the writer.
func (p *lane) kick() {
	select {
	case p.wake <- struct{}{}:
	default: // the writer has a wake-up pending and will see the frame
	}
}

// push writes queued frames for as long as the socket takes them, with
// write, and reports SendDone for each frame it completes. It returns how
// many it completed, whether the socket filled up with frames still
// queued, and the error the lane must be halted with when a write failed;
// the caller halts it, since closing the connection waits for a
// RawConn.Write that push may run in. It does nothing when another
// goroutine holds the write turn, or nothing is queued. write writes what
// it can of bufs without blocking (a short count means the socket is
// full), or all of it when it may block.
func (p *lane) push(write func(bufs [][]byte) (int, error)) (completed int, full bool, err error) {
	p.mu.Lock()
	if p.busy || p.head == len(p.queue) || p.err != nil {
		p.mu.Unlock()
		return 0, false, nil
	}
	p.busy = true
	for !full && p.head < len(p.queue) && p.err == nil {
		frames := p.queue[p.head:min(len(p.queue), p.head+pushFrames)]
		bufs := p.bufs[:0]
		want := 0
		for i, f := range frames {
			bufs = f.appendUnsent(bufs, f.wire(p.wires[i*sdi.WireHeaderSize:]))
			want += f.cost() - f.sent
		}
		p.mu.Unlock()
		if p.log.IsTrace() {
			p.log.Trace("writing frames", "peer", p.rank, "frames", len(frames), "bytes", want)
		}
		n, err := write(bufs)
		clear(bufs) // keep no reference to caller buffers we may no longer own
		if n > 0 {
			p.written.Add(uint64(n))
		}
		// A short count means the socket is full: asking again now would
		// only fail with EAGAIN.
		full = n < want
		p.mu.Lock()
		p.queued -= n
		// Frames written whole leave the queue; the turn keeps them in
		// accept order until their SendDone returned.
		p.tokens = p.tokens[:0]
		for n > 0 {
			f := &p.queue[p.head]
			if left := f.cost() - f.sent; n < left {
				f.sent += n
				break
			} else {
				n -= left
			}
			p.tokens = append(p.tokens, f.token)
			p.queue[p.head] = outFrame{}
			p.head++
		}
		if p.head == len(p.queue) {
			p.queue, p.head = p.queue[:0], 0
			p.pending.Store(false)
			p.backlog.Add(-1)
		}
		if err != nil {
			p.mu.Unlock()
			p.complete(p.tokens)
			p.mu.Lock()
			p.release() // the writer fails what is left once halted
			p.mu.Unlock()
			return completed + len(p.tokens), false, fmt.Errorf("tcp: rank %d down: %w: write: %w", p.rank, sdi.ErrPeerUnreachable, err)
		}
		if len(p.tokens) > 0 {
			p.mu.Unlock()
			p.complete(p.tokens)
			completed += len(p.tokens)
			p.mu.Lock()
		}
	}
	p.release()
	p.mu.Unlock()
	return completed, full, nil
}

// complete reports SendDone for the frames a push wrote and counts them
// finished. The caller holds the write turn, not mu.
func (p *lane) complete(tokens []uint64) {
	if len(tokens) == 0 {
		return
	}
	for _, t := range tokens {
		p.h.SendDone(t, nil)
	}
	p.mu.Lock()
	p.finish(len(tokens))
	p.mu.Unlock()
}

// pushNow is push from a poller: it writes what the socket takes now.
func (p *lane) pushNow() int {
	if p.sock == nil {
		return 0 // the writer does the blocking writes
	}
	n, _, err := p.push(p.sock.writev)
	if err != nil {
		p.halt(err, true)
	}
	return n
}

func (p *lane) alive() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err == nil
}

// halt stops the peer for reason err; the first call wins. Closing the
// connection unblocks a writer stuck on a peer that stopped reading.
func (p *lane) halt(err error, report bool) {
	p.mu.Lock()
	first := p.err == nil
	if first {
		p.err = err
		p.report = report
		close(p.halted)
	}
	p.mu.Unlock()
	if first {
		p.conn.Close()
	}
}

// watch detects a peer that went away while we have nothing to send. The
// acceptor never writes after the handshake, so any return from Read means
// the connection is over.
func (p *lane) watch() {
	defer close(p.watchDone)
	var b [1]byte
	_, err := p.conn.Read(b[:])
	switch {
	case err == nil:
		err = errors.New("peer wrote on a send-only connection")
	case errors.Is(err, io.EOF):
		err = errors.New("peer closed the connection")
	}
	p.halt(fmt.Errorf("tcp: rank %d down: %w: %w", p.rank, sdi.ErrPeerUnreachable, err), true)
}

// writeLoop writes what is queued while nobody polls, and fails what is
// left when the lane halts. While pollers work it stands by: they push the
// queue, and a socket that drains wakes nobody.
func (p *lane) writeLoop() {
	defer close(p.done)
	defer func() { <-p.watchDone }()
	var blocking func([][]byte) (int, error)
	if p.sock == nil {
		blocking = func(bufs [][]byte) (int, error) {
			// WriteTo consumes its receiver; bufs stays the caller's.
			w := net.Buffers(bufs)
			n, err := w.WriteTo(p.conn)
			return int(n), err
		}
	}
	for {
		if ch := p.standby.waiting(); ch != nil {
			select {
			case <-ch:
			case <-p.halted:
			}
		}
		p.mu.Lock()
		busy, halted, empty := p.busy, p.err != nil, p.head == len(p.queue)
		p.mu.Unlock()
		switch {
		case halted && !busy:
			p.fail()
			return
		case halted:
			// The holder of the turn gives it up after the halt, so it
			// sees the lane halted and kicks us.
			<-p.wake
			continue
		case busy || empty:
			// The holder of the turn kicks us when it leaves frames;
			// Send kicks us when it queues.
			select {
			case <-p.wake:
			case <-p.halted:
			}
			continue
		}
		if blocking != nil {
			if _, _, err := p.push(blocking); err != nil {
				p.halt(err, true)
			}
			continue
		}
		// Write until the queue is empty, waiting in the netpoller while
		// the socket is full, unless pollers come back to do it.
		var werr error
		err := p.sock.raw.Write(func(fd uintptr) bool {
			if p.standby.active.Load() {
				return true
			}
			var full bool
			_, full, werr = p.push(func(bufs [][]byte) (int, error) { return p.sock.writevFD(fd, bufs) })
			return !full || werr != nil
		})
		switch {
		case werr != nil:
			p.halt(werr, true)
		case err != nil:
			p.halt(fmt.Errorf("tcp: rank %d down: %w: write: %w", p.rank, sdi.ErrPeerUnreachable, err), true)
		}
	}
}

// fail completes every queued frame with the halt reason, then has the
// peer reported down if the connection (not Close or Disconnect) ended it.
func (p *lane) fail() {
	p.mu.Lock()
	err, report := p.err, p.report
	rest := p.queue[p.head:]
	p.queue, p.head, p.queued = nil, 0, 0
	if p.pending.Load() {
		p.pending.Store(false)
		p.backlog.Add(-1)
	}
	p.mu.Unlock()
	for _, f := range rest {
		p.h.SendDone(f.token, err)
	}
	p.mu.Lock()
	p.finish(len(rest))
	p.mu.Unlock()
	if report {
		p.log.Info("lost connection to peer", "peer", p.rank, "session", p.owner.gen, "remote_addr", p.conn.RemoteAddr(), "failed_frames", len(rest), "error", err)
		p.owner.laneDown(err, nil)
	}
}

// finish counts n frames finished and releases the flushes waiting for
// them. The caller holds mu.
func (p *lane) finish(n int) {
	if n == 0 {
		return
	}
	p.finished += uint64(n)
	keep := p.flushers[:0]
	for _, f := range p.flushers {
		if f.target <= p.finished {
			close(f.ch)
		} else {
			keep = append(keep, f)
		}
	}
	clear(p.flushers[len(keep):])
	p.flushers = keep
}

// flushTarget returns how many frames a flush started now waits for.
func (p *lane) flushTarget() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// waitFinished waits until target frames have had their SendDone.
func (p *lane) waitFinished(ctx context.Context, target uint64) error {
	p.mu.Lock()
	if p.finished >= target {
		p.mu.Unlock()
		return nil
	}
	f := &flusher{target: target, ch: make(chan struct{})}
	p.flushers = append(p.flushers, f)
	p.mu.Unlock()
	select {
	case <-f.ch:
		return nil
	case <-ctx.Done():
		p.mu.Lock()
		if i := slices.Index(p.flushers, f); i >= 0 {
			p.flushers = slices.Delete(p.flushers, i, i+1)
		}
		p.mu.Unlock()
		return ctx.Err()
	}
}
