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
	// sent counts the bytes of the frame (wire header included) that Send
	// already wrote before the socket filled up.
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

// lane is one outbound connection to a peer: frames queued on it leave in
// the order Send accepted them. It is safe for concurrent use. A writer
// goroutine owns the connection's write side and a watcher goroutine its
// read side.
type lane struct {
	owner *peer
	rank  sdi.Rank
	conn  net.Conn
	// sock writes without blocking from Send; nil when conn has no socket
	// (tests), and then every frame goes through the writer.
	sock  *sock
	wbuf  [sdi.WireHeaderSize]byte // the wire header of the frame Send writes
	h     sdi.Handler
	log   hclog.Logger
	limit int  // queue_bytes
	link  Link // what address selection chose; Bytes is kept in written
	// written counts bytes handed to the kernel, wire headers included.
	written atomic.Uint64

	wake      chan struct{} // capacity 1: frames were queued
	halted    chan struct{} // closed by halt
	watchDone chan struct{} // closed when the watcher returned
	done      chan struct{} // closed when writer and watcher returned

	mu    sync.Mutex
	queue []outFrame
	// busy is set while a goroutine writes to the socket: a Send writing
	// inline, or the writer with a batch. Send writes inline only when
	// nothing is busy or queued, so bytes reach the stream in accept
	// order.
	busy     bool
	queued   int    // bytes of queued frames not yet written
	accepted uint64 // frames Send accepted, or is writing inline
	finished uint64 // frames whose SendDone has returned; they finish in accept order
	flushers []*flusher
	err      error // why the peer stopped; Send refuses with it
	report   bool  // the connection failed (not us): report PeerDown
}

// flusher is a Flush waiting for the frames accepted before it to finish.
type flusher struct {
	target uint64
	ch     chan struct{}
}

func newLane(owner *peer, conn net.Conn, link Link, limit int) *lane {
	return &lane{
		owner:     owner,
		link:      link,
		rank:      owner.rank,
		conn:      conn,
		sock:      newSock(conn),
		h:         owner.h,
		log:       owner.log,
		limit:     limit,
		wake:      make(chan struct{}, 1),
		halted:    make(chan struct{}),
		watchDone: make(chan struct{}),
		done:      make(chan struct{}),
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
	if p.sock != nil && !p.busy && len(p.queue) == 0 {
		p.busy = true
		p.mu.Unlock()
		return p.sendInline(of)
	}
	p.queue = append(p.queue, of)
	p.queued += cost
	p.mu.Unlock()
	p.kick()
	return false, nil
}

// sendInline writes of on the sending goroutine, header and payload in one
// writev from the caller's buffers, and hands what the socket did not take
// to the writer. The caller set busy.
func (p *lane) sendInline(of outFrame) (bool, error) {
	n, err := p.sock.writev(of.wire(p.wbuf[:]), of.header, of.payload)
	if n > 0 {
		p.written.Add(uint64(n))
	}
	cost := of.cost()
	p.mu.Lock()
	p.busy = false
	switch {
	case err == nil && n == cost:
		// Frames may have queued behind this one while it was written,
		// or halt may be waiting for us.
		more := len(p.queue) > 0 || p.err != nil
		p.mu.Unlock()
		p.completed(1)
		if more {
			p.kick()
		}
		return true, nil
	case err != nil || p.err != nil:
		// The connection failed, or halt closed it under us: the frame
		// is not accepted, and the writer reports the rest.
		if p.err == nil {
			p.mu.Unlock()
			p.halt(fmt.Errorf("tcp: rank %d down: %w: write: %w", p.rank, sdi.ErrPeerUnreachable, err), true)
			p.mu.Lock()
		}
		herr := p.err
		p.mu.Unlock()
		p.completed(1)
		p.kick()
		return false, herr
	}
	// The socket is full: the rest goes first, before anything queued
	// meanwhile.
	of.sent = n
	p.queue = slices.Insert(p.queue, 0, of)
	p.queued += cost - n
	p.mu.Unlock()
	p.kick()
	return false, nil
}

// kick wakes the writer.
func (p *lane) kick() {
	select {
	case p.wake <- struct{}{}:
	default: // the writer has a wake-up pending and will see the frame
	}
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

// writeLoop writes queued frames in batches, one writev per batch, and
// completes them. It is the only goroutine that calls the handler for this
// lane.
func (p *lane) writeLoop() {
	defer close(p.done)
	defer func() { <-p.watchDone }()
	var (
		batch []outFrame
		wire  []byte
		bufs  net.Buffers
	)
	for {
		p.mu.Lock()
		busy, halted, empty := p.busy, p.err != nil, len(p.queue) == 0
		switch {
		case busy && (halted || !empty):
			// A Send is writing inline. It kicks us when it is done, as it
			// will find frames queued behind it or the lane halted.
			p.mu.Unlock()
			<-p.wake
			continue
		case halted:
			p.mu.Unlock()
			p.fail(nil)
			return
		case busy || empty:
			p.mu.Unlock()
			select {
			case <-p.wake:
			case <-p.halted:
			}
			continue
		}
		batch, p.queue = p.queue, batch[:0]
		p.busy = true
		p.mu.Unlock()

		if need := len(batch) * sdi.WireHeaderSize; cap(wire) < need {
			wire = make([]byte, need)
		}
		bufs = bufs[:0]
		n := 0
		for i, f := range batch {
			bufs = f.appendUnsent(bufs, f.wire(wire[i*sdi.WireHeaderSize:]))
			n += f.cost() - f.sent
		}
		if p.log.IsTrace() {
			p.log.Trace("writing frames", "peer", p.rank, "frames", len(batch), "bytes", n)
		}
		// WriteTo consumes its receiver; writing through a copy keeps bufs'
		// backing array for the next batch.
		w := bufs
		_, err := w.WriteTo(p.conn)
		clear(bufs) // drop references to caller buffers we no longer own
		if err != nil {
			p.halt(fmt.Errorf("tcp: rank %d down: %w: write: %w", p.rank, sdi.ErrPeerUnreachable, err), true)
			p.mu.Lock()
			p.busy = false
			p.mu.Unlock()
			p.fail(batch)
			return
		}
		p.written.Add(uint64(n))
		p.mu.Lock()
		p.queued -= n
		p.busy = false
		p.mu.Unlock()
		for _, f := range batch {
			p.h.SendDone(f.token, nil)
		}
		p.completed(len(batch))
		clear(batch)
	}
}

// fail completes the frames of a batch that was being written and every
// queued frame with the halt reason, then has the peer reported down if the
// connection (not Close or Disconnect) ended it.
func (p *lane) fail(batch []outFrame) {
	p.mu.Lock()
	err, report := p.err, p.report
	rest := p.queue
	p.queue, p.queued = nil, 0
	p.mu.Unlock()
	for _, f := range batch {
		p.h.SendDone(f.token, err)
	}
	for _, f := range rest {
		p.h.SendDone(f.token, err)
	}
	p.completed(len(batch) + len(rest))
	if report {
		p.log.Info("lost connection to peer", "peer", p.rank, "remote_addr", p.conn.RemoteAddr(), "failed_frames", len(batch)+len(rest), "error", err)
		p.owner.laneDown(err)
	}
}

func (p *lane) completed(n int) {
	if n == 0 {
		return
	}
	p.mu.Lock()
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
	p.mu.Unlock()
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
