package tcp

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// inbound is a connection a peer opened to us; we only read from it.
type inbound struct {
	conn net.Conn
	rank sdi.Rank      // valid after the handshake
	sess *session      // valid after the handshake
	done chan struct{} // closed when its reader has returned

	// mu is held by whoever reads and parses the stream: the reader
	// goroutine, or a poller that got it with TryLock. It guards what
	// follows.
	mu    sync.Mutex
	rx    *rxfd // the socket, once taken from conn
	wid   int32 // rx's id with the subdevice's idleWaiter
	fr    *frameReader
	err   error         // why the stream ended; nothing is read after it is set
	ended chan struct{} // closed when err is set, to wake a reader on stand-by
	// unacked counts the frames delivered since rx.delayAcks last ran.
	unacked int
	// placeGen is the gen of our connection (outbound session) to the
	// rank when the handler last gave a place, 0 if there was none: a
	// failure of the frame being placed is not one of a session
	// connected after it (placeFailed).
	placeGen uint64

	// more is set when the last drain left bytes in the frame reader that
	// the socket no longer signals, or stopped at its budget: the poll set
	// would not report the connection, so Poll drains it anyway.
	more atomic.Bool
	// unsignalled: the connection is not in the poll set (adding it
	// failed) and is drained on every Poll. Set before Poll sees it.
	unsignalled bool
}

// session is the set of inbound lanes one Connect of a peer opened. Its
// lanes deliver side by side (serialized per rank by deliverMu); a newer
// session of the same rank delivers only once every lane of the one before
// has ended, which keeps a reconnect from overtaking the old stream.
//
// A lane joins its session while any lane of it is open, whatever sessions
// of the rank began since: lanes of two Connects that cross arrive
// interleaved, and a lane taken for a session of its own would wait behind
// the other Connect's session, whose later lanes would wait behind it in
// turn (see register in serveInbound).
//
// A session whose lanes all end before its turn (the losing Connect of two
// that crossed closes its connections at once) carried nothing, so it
// need not wait to be let go; but a session begun after it must still wait
// for the ones begun before it (see sessionIdle).
//
// The fields other than key are guarded by subDevice.mu.
type session struct {
	key  sessionKey
	prev *session // the rank's session before this one; nil once it ended
	next *session // the rank's session begun right after this one, if any
	refs int      // lanes open
	// ended is set when done is closed: every lane of this session and
	// of the sessions before it has ended.
	ended bool
	done  chan struct{}
}

// sessionKey names a session: the rank that connected and the id its
// Connect drew.
type sessionKey struct {
	rank sdi.Rank
	id   uint64
}

// acceptLoop accepts connections until the listener closes and hands each to
// its own reader goroutine.
func (sd *subDevice) acceptLoop() {
	defer sd.wg.Done()
	var backoff time.Duration
	for {
		c, err := sd.ln.Accept()
		if err != nil {
			if sd.closed.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: back off rather than
			// spin, and keep serving the connections we have.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			sd.log.Warn("accept failed, retrying", "error", err, "retry_in", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-sd.life.Done():
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		backoff = 0
		if err := limitLink(c, sd.cfg.linkTimeout); err != nil {
			sd.log.Warn("cannot bound the link timeout of an accepted connection; a dead link goes unnoticed for longer", "remote_addr", c.RemoteAddr(), "error", err)
		}
		select {
		case sd.handshakes <- struct{}{}:
		default:
			sd.log.Warn("dropping connection: too many handshakes in progress", "remote_addr", c.RemoteAddr(), "limit", maxHandshakes)
			c.Close()
			continue
		}
		// ended is made here, not with the socket: a report of the
		// peer down waits on it without in.mu (lockUnlessEnded), even
		// for a stream still in its handshake.
		in := &inbound{conn: c, rank: -1, done: make(chan struct{}), ended: make(chan struct{})}
		if !sd.track(in) {
			<-sd.handshakes
			c.Close()
			return
		}
		sd.wg.Add(1)
		go sd.serveInbound(in)
	}
}

// track registers in so Close can close it; it fails once Close started.
func (sd *subDevice) track(in *inbound) bool {
	sd.mu.Lock()
	defer sd.mu.Unlock()
	if sd.closed.Load() {
		return false
	}
	sd.inbound[in] = struct{}{}
	return true
}

func (sd *subDevice) untrack(in *inbound) {
	// A poller may be delivering from this connection: wait for it, and
	// keep later ones out, before the session can count it as ended.
	in.mu.Lock()
	if in.err == nil {
		in.err = net.ErrClosed
	}
	if in.rx != nil {
		sd.idle.remove(in.rx.fd, in.wid)
		in.rx.close()
	}
	in.mu.Unlock()
	sd.mu.Lock()
	delete(sd.inbound, in)
	if s := in.sess; s != nil {
		s.refs--
		if s.refs == 0 {
			sd.sessionIdle(s)
		}
	}
	sd.mu.Unlock()
	in.conn.Close()
	close(in.done)
}

// sessionIdle settles s, whose last open lane ended, and whatever that
// settles in turn. The caller holds sd.mu.
//
// A session whose predecessor has ended ends: done is closed, so the
// session after it may deliver, and that one, if its lanes all ended
// while they waited for s, ends too. A session whose predecessor has not
// ended carried nothing (its lanes ended waiting for their turn), yet the
// session after it waits for that predecessor through it:
//
//	W (reading) <- L (lanes ended, waiting) <- N (waiting)
//
// If nobody waits for it (it is the rank's newest), it is dropped, and the
// next session of the rank waits for W directly, as it would have through
// L; otherwise it stays, ended only when W ends, so N never overtakes W.
func (sd *subDevice) sessionIdle(s *session) {
	for s != nil && s.refs == 0 && !s.ended {
		rank := s.key.rank
		if p := s.prev; p != nil && !p.ended {
			if sd.latest[rank] != s {
				return // s.next waits for p through s
			}
			if sd.sessions[s.key] == s {
				delete(sd.sessions, s.key)
			}
			sd.latest[rank] = p
			p.next, s.prev = nil, nil
			s = p // it may be one that carried nothing as well
			continue
		}
		s.ended = true
		close(s.done)
		if sd.sessions[s.key] == s {
			delete(sd.sessions, s.key)
		}
		if sd.latest[rank] == s {
			delete(sd.latest, rank)
		}
		next := s.next
		s.next = nil
		s = next
	}
}

// serveInbound authenticates one accepted connection and delivers its
// frames until it ends. Whatever goes wrong is confined to this connection.
func (sd *subDevice) serveInbound(in *inbound) {
	defer sd.wg.Done()
	defer sd.untrack(in)
	remote := in.conn.RemoteAddr().String()

	// The deadline is what stops a silent stranger from holding this
	// goroutine and a handshake slot.
	in.conn.SetDeadline(time.Now().Add(sd.cfg.connectTimeout))
	// Lanes of one session join it while it has a lane open, even when a
	// newer session began meanwhile (the lanes of two crossing Connects
	// interleave); the first lane of a new session (a reconnect after
	// Disconnect, or after the old connections failed on the peer's
	// side) starts one that waits for the rank's newest session. Lanes
	// thus only ever wait for lanes of sessions begun before theirs, and
	// never for one of their own session's lanes through another session.
	register := func(rank sdi.Rank, lid laneID) {
		sd.mu.Lock()
		defer sd.mu.Unlock()
		in.rank = rank
		key := sessionKey{rank: rank, id: lid.session}
		s := sd.sessions[key]
		if s == nil {
			s = &session{key: key, prev: sd.latest[rank], done: make(chan struct{})}
			if s.prev != nil {
				s.prev.next = s
			}
			sd.sessions[key] = s
			sd.latest[rank] = s
		}
		s.refs++
		in.sess = s
	}
	rank, lid, err := sd.auth.accept(in.conn, register)
	<-sd.handshakes
	if err != nil {
		if !sd.closed.Load() {
			sd.log.Warn("dropping connection: handshake failed", "remote_addr", remote, "error", err)
		}
		return
	}
	in.conn.SetDeadline(time.Time{})
	sd.log.Debug("accepted connection", "peer", rank, "remote_addr", remote, "local_addr", in.conn.LocalAddr(), "lane", lid.lane, "lanes", lid.lanes)
	readable, err := sd.takeSocket(in)
	if err != nil {
		sd.log.Warn("dropping connection", "peer", in.rank, "remote_addr", remote, "error", err)
		return
	}
	sd.mu.Lock()
	s := in.sess
	prev := s.prev
	sd.mu.Unlock()
	if prev != nil {
		switch err := sd.awaitTurn(in, prev, readable); {
		case errors.Is(err, sdi.ErrClosed):
			return
		case errors.Is(err, io.EOF):
			sd.log.Debug("connection closed before its session's turn; it carried nothing", "peer", rank, "remote_addr", remote, "lane", lid.lane)
			return
		case err != nil:
			sd.inboundEnded(rank, remote, err)
			return
		}
		sd.mu.Lock()
		s.prev = nil // let the ended session go
		sd.mu.Unlock()
	}

	sd.read(in, remote, readable)
}

// takeSocket takes in's socket out of Go's netpoller (see rxfd) and
// registers it, unarmed, with the idle waiter; it returns the channel
// that tells in's reader the socket is readable once armed.
func (sd *subDevice) takeSocket(in *inbound) (<-chan struct{}, error) {
	rx, err := takeFD(in.conn)
	if err != nil {
		return nil, err
	}
	id, readable, err := sd.idle.add(rx.fd)
	if err != nil {
		rx.close()
		return nil, err
	}
	in.mu.Lock()
	in.rx, in.wid = rx, id
	in.mu.Unlock()
	return readable, nil
}

// awaitTurn waits until prev, the session begun before in's, has ended. It
// reads nothing of in's stream meanwhile (that would deliver it ahead of
// prev's), but it watches the socket: a connection that ends before it
// carried a byte, as every connection of the loser of two crossing
// Connects does, has nothing to deliver, and awaitTurn returns io.EOF (or
// the error that ended it) at once, so that its socket is closed now and
// not when prev ends, which may be at the end of the job. Once the stream
// has bytes, it is a session with frames to deliver in its turn, and only
// prev's end is awaited. It returns ErrClosed on Close.
func (sd *subDevice) awaitTurn(in *inbound, prev *session, readable <-chan struct{}) error {
	watch := readable
	for {
		if watch != nil {
			in.mu.Lock()
			err := sd.idle.arm(in.rx.fd, in.wid)
			in.mu.Unlock()
			if err != nil {
				// Not fatal: the connection then waits for its turn
				// unwatched, as one with bytes to deliver does.
				sd.log.Debug("cannot watch a connection waiting for its session's turn", "peer", in.rank, "error", err)
				watch = nil
			}
		}
		select {
		case <-prev.done:
			return nil
		case <-sd.life.Done():
			return sdi.ErrClosed
		case <-watch:
		}
		in.mu.Lock()
		err := in.rx.peerEnded()
		in.mu.Unlock()
		switch {
		case err == errAgain:
		case err == nil:
			watch = nil
		default:
			return err
		}
	}
}

// readerBudget bounds the frames the reader goroutine delivers before it
// looks again whether pollers have come to take over.
const readerBudget = 256

// read delivers in's frames until its stream ends or Close. While nobody
// polls, it waits for data (see awaitReadable) and parses it; while
// pollers work, it stands by and leaves the connection to them.
func (sd *subDevice) read(in *inbound, remote string, readable <-chan struct{}) {
	in.mu.Lock()
	rx := in.rx
	rx.startPeeking()
	in.fr = newFrameReader(rx.read, maxHeader, maxFrame)
	in.fr.peek = rx.peek
	if pl, ok := sd.h.(sdi.Placer); ok {
		// Place is called where Deliver would be, so under the same
		// per-rank lock; the Deliver of the placed frame follows in
		// drain, from this connection, in stream order.
		mu, rank := &sd.deliverMu[in.rank], in.rank
		in.fr.place = func(header []byte, n int) []byte {
			// Called from drain, under in.mu.
			in.placeGen = 0
			if p := sd.peers[rank].Load(); p != nil {
				in.placeGen = p.gen
			}
			mu.Lock()
			defer mu.Unlock()
			if sd.reporting[rank] > 0 {
				// A report of rank under way would end this place
				// too, and this stream may be past the report's
				// abandon or not in its list at all: read the frame
				// into our own buffer and deliver it from there.
				return nil
			}
			return pl.Place(rank, header, n)
		}
	}
	in.mu.Unlock()
	if !sd.addPolled(in) {
		return
	}
	defer sd.removePolled(in)
	for {
		if !sd.standBy(in) {
			return
		}
		// Drain before waiting: a poller may have left frames in the
		// read buffer that the socket no longer signals.
		in.mu.Lock()
		n := sd.drain(in, readerBudget)
		err := in.err
		in.mu.Unlock()
		if err != nil {
			// The stream ended, seen by a poller or by us.
			sd.inboundEnded(in.rank, remote, err)
			return
		}
		if n == readerBudget || sd.standby.waiting() != nil {
			continue
		}
		if err := sd.awaitReadable(in, readable); err != nil {
			if !errors.Is(err, sdi.ErrClosed) {
				// The stream ends here as if a read had failed: a
				// frame being placed must be reported.
				in.mu.Lock()
				if in.err == nil {
					sd.streamEnded(in, err)
				}
				in.mu.Unlock()
				sd.inboundEnded(in.rank, remote, err)
			}
			return
		}
	}
}

// standBy waits while pollers work, and reports false once Close started.
func (sd *subDevice) standBy(in *inbound) bool {
	ch := sd.standby.waiting()
	if ch == nil {
		return true
	}
	select {
	case <-ch:
	case <-in.ended:
	case <-sd.life.Done():
		return false
	}
	return true
}

// awaitReadable waits until in's socket has something to read or has
// ended, or a poller found the stream over (a malformed frame leaves the
// socket quiet), or until Close (it returns ErrClosed then). A wake-up
// while pollers work is the one per polling phase: the socket stays
// unarmed afterwards, so further traffic wakes nobody.
func (sd *subDevice) awaitReadable(in *inbound, readable <-chan struct{}) error {
	in.mu.Lock()
	// Peeked bytes left in the socket would make it readable at once.
	err := in.rx.consume()
	if err == nil {
		err = sd.idle.arm(in.rx.fd, in.wid)
	}
	in.mu.Unlock()
	if err != nil {
		return err
	}
	select {
	case <-readable:
	case <-in.ended:
	case <-sd.life.Done():
		return sdi.ErrClosed
	}
	return nil
}

// drain delivers the complete frames in reach, at most budget of them (no
// limit when budget < 0), and returns how many. The caller holds in.mu.
// When the stream ends or turns out malformed it records why and wakes the
// reader, which reports it; a blocking read function makes drain read
// until then.
func (sd *subDevice) drain(in *inbound, budget int) int {
	n := sd.drainFrames(in, budget)
	if more := n == budget || in.fr.buffered(); more || in.more.Load() {
		in.more.Store(more)
	}
	return n
}

// drainFrames is drain without the note for the poll set.
func (sd *subDevice) drainFrames(in *inbound, budget int) int {
	in.fr.rearm()
	n := 0
	// What the last drain peeked is discarded now, after the handler
	// had those frames: see rxfd.peek.
	if in.err == nil {
		if err := in.rx.consume(); err != nil {
			sd.streamEnded(in, err)
			return 0
		}
	}
	for in.err == nil && n != budget {
		if sd.closed.Load() {
			// Close waits for this lock before it returns, so no
			// Deliver follows it.
			return n
		}
		hdr, payload, err := in.fr.next()
		if err == errAgain { // never wrapped; errors.Is costs on every poll
			return n
		}
		if err != nil {
			sd.streamEnded(in, err)
			return n
		}
		if sd.log.IsTrace() {
			sd.log.Trace("delivering frame", "peer", in.rank, "header_bytes", len(hdr), "payload_bytes", len(payload))
		}
		// Several lanes from one rank are read side by side; the Handler
		// wants one Deliver at a time per rank.
		mu := &sd.deliverMu[in.rank]
		mu.Lock()
		sd.h.Deliver(in.rank, hdr, payload)
		mu.Unlock()
		n++
		if in.unacked++; in.unacked == ackEvery {
			in.unacked = 0
			in.rx.delayAcks()
		}
	}
	return n
}

// streamEnded records why in's stream ended and wakes its reader, which
// reports it. The caller holds in.mu.
func (sd *subDevice) streamEnded(in *inbound, err error) {
	in.err = err
	close(in.ended)
	if in.fr.placing() {
		// The handler waits for a Deliver into the place it gave;
		// Placer wants the peer reported down instead.
		sd.placeFailed(in, err)
	}
}

// placeFailed reports rank down because a frame whose payload was being
// read into the handler's place cannot be completed: the Placer contract
// wants that report, and it is what makes the handler give the place up.
// Through the peer's lanes when our connection to it is the session that
// was current when the place was given, so that the peer is reported down
// once and our connection ends with it; if those lanes reported the peer
// down already (an earlier failure of our own connection, while this
// inbound stream went on and placed a frame), or are reporting it now (a
// link that died both ways), the report is made again, or the handler
// would keep the place for a Deliver that never comes. A
// session connected after the place was given (a reconnect after
// Disconnect, or after its predecessor failed without a report, see
// retire) postdates the failed frame: the report is made straight to the
// handler and leaves that session working.
// The caller holds in.mu.
func (sd *subDevice) placeFailed(in *inbound, err error) {
	if sd.closed.Load() {
		return
	}
	rank := in.rank
	err = fmt.Errorf("tcp: rank %d down: %w: its stream ended inside a frame being placed: %w", rank, sdi.ErrPeerUnreachable, err)
	if p := sd.peers[rank].Load(); p != nil && p.gen == in.placeGen && p.laneDown(err, in) {
		return
	}
	sd.reportDown(rank, err, in)
}

// reportDown reports rank down to the handler, after every inbound stream
// from rank gave up the place it was filling, if any (abandon): the
// handler may reuse a place once the peer is reported down (the
// multidevice completes or fails the receive it belongs to, and the
// application reuses its buffer), while our own connection's failure
// does not end the streams the peer opened to us, which go on reading.
// except is a stream whose lock the caller holds; its place is being
// given up anyway.
//
// The report ends places given up to its very end, yet abandon leaves a
// stream free to place its next frame as soon as its lock is let go, and
// a lane that registers after the snapshot is not visited at all: so no
// place is given for rank from before the snapshot until PeerDown has
// returned (see reporting), and such frames are read into our own
// buffers. deliverMu is never held here while a stream's lock is awaited,
// which keeps the order Place and Deliver follow: in.mu, then deliverMu.
func (sd *subDevice) reportDown(rank sdi.Rank, err error, except *inbound) {
	mu := &sd.deliverMu[rank]
	mu.Lock()
	sd.reporting[rank]++
	mu.Unlock()
	defer func() {
		mu.Lock()
		sd.reporting[rank]--
		mu.Unlock()
	}()
	sd.mu.Lock()
	var streams []*inbound
	for in := range sd.inbound {
		if in != except && in.rank == rank {
			streams = append(streams, in)
		}
	}
	sd.mu.Unlock()
	for _, in := range streams {
		if !lockUnlessEnded(in) {
			continue
		}
		if in.fr != nil {
			in.fr.abandon()
		}
		in.mu.Unlock()
	}
	sd.h.PeerDown(rank, err)
}

// lockUnlessEnded locks in.mu, unless in's stream has ended: then it
// reads nothing more into its place, and its reader may hold in.mu while
// it reports the end of a frame it was placing, and so waits for the lock
// of this caller's stream (two lanes of a peer that died while each
// placed a frame). Waiting for in.mu there would deadlock both readers.
func lockUnlessEnded(in *inbound) bool {
	for !in.mu.TryLock() {
		select {
		case <-in.ended:
			return false
		default:
			// Rare (a peer lost while another reader holds the lock),
			// and short: a drain of at most readerBudget frames.
			time.Sleep(20 * time.Microsecond)
		}
	}
	return true
}

func (sd *subDevice) inboundEnded(rank sdi.Rank, remote string, err error) {
	switch {
	case sd.closed.Load():
	case errors.Is(err, io.EOF):
		sd.log.Debug("peer closed its connection", "peer", rank, "remote_addr", remote)
	case errors.Is(err, sdi.ErrBadFrame):
		sd.log.Warn("dropping connection: malformed frame", "peer", rank, "remote_addr", remote, "error", err)
	default:
		sd.log.Warn("inbound connection lost", "peer", rank, "remote_addr", remote, "error", err)
	}
}
