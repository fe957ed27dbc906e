package rdma

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// connState is where a peer's connection stands.
type connState uint8

const (
	stateIdle      connState = iota // never connected
	stateDialing                    // this rank's request is out
	stateAwaiting                   // refused by the lower rank, whose own request is due
	stateAccepting                  // the peer's request is being accepted
	stateUp
	stateDown // failed; Connect may dial again
	stateGone // closed by either end
)

func (s connState) String() string {
	return [...]string{"idle", "dialing", "awaiting", "accepting", "up", "down", "gone"}[s]
}

// peer is the state for one rank.
type peer struct {
	rank sdi.Rank

	mu      sync.Mutex // guards the fields below and the send side of c
	state   connState
	settled chan struct{} // closed when a dial or accept settles
	c       *conn         // the connection frames go on, or the last one until it has finished
	downErr error         // why the last connection failed
}

// conn is one endpoint to a peer with its slots. A peer has one current
// conn; others are dialed ones that lost or failed ones still flushing.
type conn struct {
	id   uint32
	p    *peer
	ep   Endpoint
	rbuf []byte // receive slots, nData+ctlSlots of them
	sbuf []byte // send slots, as many
	rreg Region
	sreg Region
	cq   int           // completion queue entries reserved for the conn; guarded by s.mu
	gone chan struct{} // closed when finish is done with the conn

	// Guarded by p.mu.
	freeSend    []int
	outstanding int  // work requests posted and not yet completed
	failing     bool // no more work is posted; finish runs when outstanding is 0
	epClosed    bool
	byeSlot     int           // the send slot of the goodbye, whose completion closes the endpoint; -1 before one
	byeDue      bool          // a goodbye waits behind fins; sendOwedLocked says it after the last
	byeSaid     chan struct{} // closed when the goodbye that was due is said, for Disconnect
	quiet       bool          // the end was a goodbye: finish reports no failure
	up          bool          // upLocked made it the peer's connection
	spoke       bool          // a frame of the peer's arrived on it, before or after up
	finished    bool          // finish has taken it out; p.c is not to become it
	err         error
	large       map[uint64]Region // by token: frames the peer is to read
	// credits are the data slots the peer has posted for this rank and
	// ctlCredits its control slots; owed and ctlOwed the slots this rank
	// reposted and has not yet told the peer of. They belong to the
	// connection: a peer's frames may arrive on it before it becomes the
	// peer's current one, and their slots must still be counted.
	credits, ctlCredits int
	owed, ctlOwed       int
	fins                []uint64      // reads done whose fin waits for a credit
	unfinished          int           // frames of large whose SendDone has not returned
	drained             chan struct{} // closed when unfinished drops to 0, for Flush

	// Owned by the progress lock holder.
	queue   []*inbound          // frames not yet delivered, in order, while a read is ahead
	reads   map[uint64]*inbound // by read id
	readSeq uint64
}

// inbound is a frame held back behind a read, or one being read.
type inbound struct {
	header  []byte
	payload []byte // an eager frame's copy, or the read's destination
	isRead  bool
	rts     rts
	reg     Region // the destination's registration, while reading
	next    int    // bytes of the payload asked for so far
	pending int    // reads posted and not completed
}

// Work request ids carry what the work was and which slot or read.
const (
	wrRecv uint64 = iota + 1
	wrSend
	wrRead
)

func wrID(kind uint64, idx int) uint64 { return kind<<56 | uint64(idx) }

func splitWR(id uint64) (kind uint64, idx int) { return id >> 56, int(id & (1<<56 - 1)) }

func putUint64(b []byte, v uint64) { binary.LittleEndian.PutUint64(b, v) }

var errBye = errors.New("the peer closed the connection")

// newConn makes a conn for p and files it under its id.
func (s *SubDevice) newConn(p *peer) *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextID++
	c := &conn{id: s.nextID, p: p, byeSlot: -1, gone: make(chan struct{}), large: make(map[uint64]Region), reads: make(map[uint64]*inbound)}
	s.conns[c.id] = c
	return c
}

// setupConn registers the conn's slots and posts its receives, before the
// connection carries anything.
func (s *SubDevice) setupConn(c *conn, ep Endpoint) error {
	slots := s.nData + ctlSlots
	// Every connection may have this much work out at once; the shared
	// completion queue must hold all of it, or completions are lost.
	need := 2*slots + maxReads
	s.mu.Lock()
	if s.cqUsed+need > s.cqSize {
		s.mu.Unlock()
		return fmt.Errorf("the completion queue holds %d entries, too few for one more connection of %d slots (%d connections now); lower recv_slots", s.cqSize, slots, s.cqUsed/need)
	}
	s.cqUsed += need
	c.cq = need
	s.mu.Unlock()
	c.rbuf = make([]byte, slots*s.slot)
	c.sbuf = make([]byte, slots*s.slot)
	var err error
	if c.rreg, err = s.prov.Register(c.rbuf); err != nil {
		return fmt.Errorf("register receive slots: %w", err)
	}
	if c.sreg, err = s.prov.Register(c.sbuf); err != nil {
		return fmt.Errorf("register send slots: %w", err)
	}
	p := c.p
	p.mu.Lock()
	defer p.mu.Unlock()
	c.ep = ep
	c.credits, c.ctlCredits = s.nData, ctlSlots
	c.freeSend = make([]int, slots)
	for i := range c.freeSend {
		c.freeSend[i] = i
	}
	for i := range slots {
		if err := ep.PostRecv(wrID(wrRecv, i), c.rreg, i*s.slot, s.slot); err != nil {
			return fmt.Errorf("post receive %d: %w", i, err)
		}
		c.outstanding++
	}
	return nil
}

// failLocked stops posting on c and closes its endpoint, so its work
// flushes; finish follows when the last of it completes. The peer's
// failure is reported then, not now: until every read into a place has
// completed or flushed, the place is not free.
func (s *SubDevice) failLocked(p *peer, c *conn, err error) {
	if !c.failing {
		c.failing = true
		c.err = err
		if p.c == c && p.state == stateUp {
			p.state = stateDown
			p.downErr = err
		}
	}
	c.closeEPLocked()
}

// closeEPLocked closes c's endpoint once; its work then flushes.
func (c *conn) closeEPLocked() {
	if c.ep != nil && !c.epClosed {
		c.epClosed = true
		c.ep.Close()
	}
}

// retire ends a conn that never came up or was replaced. One the peer's
// frames arrived on is a loss like any failed connection, reported once
// its work has flushed; one that carried nothing ends quietly.
func (s *SubDevice) retire(c *conn) {
	p := c.p
	p.mu.Lock()
	if !c.spoke {
		c.quiet = true
	}
	s.failLocked(p, c, errors.New("connection not used"))
	s.unlockFinishing(p, c)
}

// finish releases a conn whose work has all completed: its regions, the
// frames the peer was to read (failed), the frames it was reading (dropped,
// their places no longer written). It reports the peer down if c was the
// peer's connection and did not end in a goodbye, and whenever a place was
// being filled: the report is what ends a place. A conn that failed before
// it came up is reported too if the peer's frames arrived on it: the
// handler has heard from the peer there and may wait for what follows.
func (s *SubDevice) finish(c *conn) {
	s.mu.Lock()
	if _, ok := s.conns[c.id]; !ok {
		s.mu.Unlock()
		return
	}
	delete(s.conns, c.id)
	s.cqUsed -= c.cq
	closing := s.closed.Load()
	s.mu.Unlock()

	// No completion of c is left to come, so nothing else touches the
	// state the progress lock holder owns.
	placing := false
	for _, in := range c.queue {
		if in.reg != nil {
			in.reg.Close()
			placing = true
		}
	}
	c.queue, c.reads = nil, nil
	for _, r := range []Region{c.rreg, c.sreg} {
		if r != nil {
			r.Close()
		}
	}

	p := c.p
	p.mu.Lock()
	large := c.large
	c.large = nil
	c.finished = true
	if p.c == c && p.state == stateUp {
		p.state = stateDown
	}
	err, quiet := c.err, c.quiet
	report := !closing && ((c.up || c.spoke) && !quiet || placing)
	p.mu.Unlock()

	switch {
	case closing:
		err = sdi.ErrClosed
	case err == nil || quiet:
		err = fmt.Errorf("%s: connection to rank %d closed: %w", s.info.Name, p.rank, sdi.ErrPeerUnreachable)
	default:
		err = fmt.Errorf("%s: connection to rank %d: %w: %w", s.info.Name, p.rank, sdi.ErrPeerUnreachable, err)
	}
	for token, reg := range large {
		reg.Close()
		s.h.SendDone(token, err)
	}
	if report {
		s.log.Debug("peer down", "peer", p.rank, "error", err)
		s.h.PeerDown(p.rank, err)
	}
	p.mu.Lock()
	c.unfinished -= len(large)
	if c.drained != nil { // after the SendDones, as Flush promises
		close(c.drained)
		c.drained = nil
	}
	// The peer keeps c until now: a Flush finds the frames above
	// unfinished until their SendDones are over, and a new connection
	// waits for the report.
	if p.c == c {
		p.c = nil
	}
	close(c.gone)
	p.mu.Unlock()
}

// unlockFinishing releases p.mu and finishes c if it failed and none of
// its work is left outstanding.
func (s *SubDevice) unlockFinishing(p *peer, c *conn) {
	done := c.failing && c.outstanding == 0
	p.mu.Unlock()
	if done {
		s.finish(c)
	}
}
