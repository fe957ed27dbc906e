package rdma

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// ctlSlots is how many receive slots of every connection are kept for credit
// and bye messages, beyond the data slots the peer's credits count: a rank
// out of credits must still be able to hear that it has some again.
const ctlSlots = 4

// maxReads bounds the reads one connection has posted at once.
const maxReads = 8

// MaxFrame is the largest frame payload; a frame above the eager size is
// read by the receiver in pieces of the provider's largest message.
const MaxFrame = 4 << 20

// Defaults for the Caps a provider's Settings leave zero.
const (
	defaultExclusivity = 20
	defaultLatency     = 2 * time.Microsecond
	defaultBandwidth   = 10_000_000_000
)

// SubDevice runs the SDI over a [Provider]: frames up to the eager size are
// sent into receive slots the peer posted, counted by credits so a send
// never finds none; larger frames wait in the sender's registered memory
// and the receiver reads them, straight into the place the multidevice
// gives ([sdi.Placer]) where it gives one. Connections come up on demand
// from Connect, the lower rank's request winning when two cross.
type SubDevice struct {
	info sdi.Info
	open OpenFunc
	log  hclog.Logger

	// Set by Open, read-only after.
	prov     Provider
	h        sdi.Handler
	placer   sdi.Placer
	me       sdi.Rank
	size     int
	secret   []byte
	job      string
	eager    int // payload bytes of an eager frame
	slot     int // bytes of one slot
	nData    int // data slots per connection
	chunk    int // bytes of one read
	progress sync.Mutex
	cs       []Completion // owned by the progress lock holder
	dead     bool         // the provider is closed; owned by the progress lock holder
	stop     context.CancelFunc
	wg       sync.WaitGroup

	// closed and peers are read without a lock on every Send; closed is
	// set, and peers stored once, under mu.
	closed atomic.Bool
	peers  atomic.Pointer[[]*peer]

	mu     sync.Mutex // guards the fields below
	opened bool
	conns  map[uint32]*conn
	nextID uint32
	cqSize int // entries of the provider's completion queue
	cqUsed int // entries the conns may fill at once
}

// New returns an unopened subdevice named by info whose Open opens its
// provider with open.
func New(info sdi.Info, open OpenFunc, logger hclog.Logger) *SubDevice {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &SubDevice{info: info, open: open, log: logger}
}

var (
	_ sdi.SubDevice = (*SubDevice)(nil)
	_ sdi.Poller    = (*SubDevice)(nil)
)

// Info returns the static identity.
func (s *SubDevice) Info(context.Context) (sdi.Info, error) { return s.info, nil }

// Open opens the provider and starts the goroutines that accept connections
// and drive progress while nobody polls.
func (s *SubDevice) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	name := s.info.Name
	s.mu.Lock()
	if s.opened || s.closed.Load() {
		s.mu.Unlock()
		if s.closed.Load() {
			return sdi.Local{}, fmt.Errorf("%s: open: %w", name, sdi.ErrClosed)
		}
		return sdi.Local{}, fmt.Errorf("%s: open called twice", name)
	}
	s.opened = true
	s.mu.Unlock()
	if p.Handler == nil {
		return sdi.Local{}, fmt.Errorf("%s: open: no handler", name)
	}
	if p.Logger != nil {
		s.log = p.Logger
	}
	prov, set, err := s.open(ctx, p)
	if err != nil {
		return sdi.Local{}, err
	}
	if err := set.Validate(); err != nil {
		prov.Close()
		return sdi.Local{}, fmt.Errorf("%s: config: %w", name, err)
	}
	lim := prov.Limits()
	s.eager = cmp0(set.EagerBytes, DefaultEagerBytes)
	s.nData = cmp0(set.RecvSlots, DefaultRecvSlots)
	s.slot = (baseLen + rtsLen + MaxHeader + s.eager + 63) &^ 63
	s.chunk = min(lim.MaxMsg, MaxFrame)
	switch {
	case s.slot > lim.MaxMsg:
		prov.Close()
		return sdi.Local{}, fmt.Errorf("%s: eager_bytes %d needs messages of %d bytes, the device's largest is %d", name, s.eager, s.slot, lim.MaxMsg)
	case s.nData+ctlSlots > lim.MaxRecvWR:
		prov.Close()
		return sdi.Local{}, fmt.Errorf("%s: recv_slots %d needs %d receives per connection, the device takes %d", name, s.nData, s.nData+ctlSlots, lim.MaxRecvWR)
	case lim.MaxPrivate < privateLen:
		prov.Close()
		return sdi.Local{}, fmt.Errorf("%s: the device carries %d bytes with a connection request, the handshake needs %d", name, lim.MaxPrivate, privateLen)
	case s.nData+ctlSlots+maxReads > lim.MaxSendWR:
		prov.Close()
		return sdi.Local{}, fmt.Errorf("%s: recv_slots %d needs %d sends and reads per connection, the device takes %d", name, s.nData, s.nData+ctlSlots+maxReads, lim.MaxSendWR)
	}
	s.prov = prov
	s.h = p.Handler
	s.placer, _ = p.Handler.(sdi.Placer)
	s.me, s.size = p.Rank, p.Size
	s.secret, s.job = append([]byte(nil), p.Secret...), p.JobID
	s.cs = make([]Completion, 64)
	peers := make([]*peer, p.Size)
	for r := range peers {
		peers[r] = &peer{rank: sdi.Rank(r)}
	}
	s.mu.Lock()
	s.peers.Store(&peers)
	s.conns = make(map[uint32]*conn)
	s.cqSize = lim.CQSize
	s.mu.Unlock()

	bg, stop := context.WithCancel(context.Background())
	s.stop = stop
	s.wg.Add(2)
	go s.accept()
	go s.run(bg)

	caps := sdi.Caps{
		MaxHeader:   MaxHeader,
		MaxEager:    s.eager,
		MaxFrame:    MaxFrame,
		Exclusivity: cmp0(set.Exclusivity, defaultExclusivity),
		Latency:     cmp0(set.Latency, defaultLatency),
		Bandwidth:   cmp0(set.Bandwidth, defaultBandwidth),
		Reach:       sdi.ReachNetwork,
		Flags:       sdi.FlagReliable | sdi.FlagOrdered | sdi.FlagPoll,
	}
	return sdi.Local{Addr: makeCard(s.secret, s.job, s.me, prov.Card()), Caps: caps}, nil
}

func cmp0[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// peerOf returns the peer state of rank r, or an error for a call that
// cannot name it.
func (s *SubDevice) peerOf(what string, r sdi.Rank) (*peer, error) {
	peers := s.peers.Load()
	switch {
	case s.closed.Load():
		return nil, fmt.Errorf("%s: %s: %w", s.info.Name, what, sdi.ErrClosed)
	case peers == nil:
		return nil, fmt.Errorf("%s: %s before open", s.info.Name, what)
	case r < 0 || int(r) >= len(*peers) || r == s.me:
		return nil, fmt.Errorf("%s: %s: rank %d: %w", s.info.Name, what, r, sdi.ErrPeerUnreachable)
	}
	return (*peers)[r], nil
}

// Connect connects to peer unless a connection is up. When both ranks dial
// at once, the lower rank's connection is kept: it refuses the higher
// rank's request, and the higher rank waits for the lower rank's.
//
// A peer has one connection at a time: a new one is not begun while the
// last one's work is still flushing, so that its failure is reported
// before a new connection gives places for the peer's frames.
func (s *SubDevice) Connect(ctx context.Context, r sdi.Rank, card []byte) error {
	p, err := s.peerOf("connect", r)
	if err != nil {
		return err
	}
	wait := 50 * time.Millisecond
	for {
		err, crossed := s.connectOnce(ctx, p, card)
		if !crossed {
			return err
		}
		// Refused: wait a while for the peer's own request, then ask
		// again.
		up, err := s.awaitUp(ctx, p, wait)
		if up || err != nil {
			return err
		}
		wait = min(2*wait, time.Second)
	}
}

// settleLocked ends an attempt to connect: the state becomes st and those
// waiting for the attempt wake.
func settleLocked(p *peer, st connState) {
	p.state = st
	select {
	case <-p.settled:
	default:
		close(p.settled)
	}
}

// connectOnce dials peer once. crossed reports a refusal, after which the
// caller waits for the peer's own request a while and asks again.
func (s *SubDevice) connectOnce(ctx context.Context, p *peer, card []byte) (err error, crossed bool) {
	r := p.rank
	closedErr := fmt.Errorf("%s: connect to rank %d: %w", s.info.Name, r, sdi.ErrClosed)
	for {
		if s.closed.Load() {
			return closedErr, false
		}
		p.mu.Lock()
		var ch chan struct{}
		switch {
		case p.state == stateUp:
			p.mu.Unlock()
			return nil, false
		case p.state == stateDialing || p.state == stateAccepting || p.state == stateAwaiting:
			ch = p.settled
		case p.c != nil: // the last connection is still flushing
			ch = p.c.gone
		}
		if ch != nil {
			p.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return fmt.Errorf("%s: connect to rank %d: %w", s.info.Name, r, ctx.Err()), false
			}
		}
		p.state = stateDialing
		p.settled = make(chan struct{})
		p.mu.Unlock()
		break
	}
	pcard, err := openCard(card, s.secret, s.job, r)
	if err != nil {
		p.mu.Lock()
		settleLocked(p, stateDown)
		p.mu.Unlock()
		return fmt.Errorf("%s: connect to rank %d: %w: %w", s.info.Name, r, sdi.ErrPeerUnreachable, err), false
	}
	c := s.newConn(p)
	_, err = s.prov.Dial(ctx, pcard, makePrivate(s.secret, s.job, s.me, r), c.id, func(ep Endpoint) error { return s.setupConn(c, ep) })
	closed := s.closed.Load()
	if err != nil || closed {
		s.retire(c)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case closed:
		if p.state == stateDialing {
			settleLocked(p, stateGone)
		}
		return closedErr, false
	case err == nil && p.state == stateDialing:
		if up := s.upLocked(p, c); !up {
			return fmt.Errorf("%s: connect to rank %d: the connection failed as it came up: %w: %w", s.info.Name, r, sdi.ErrPeerUnreachable, c.err), false
		}
		return nil, false
	case err == nil:
		// Defensive: a crossing request cannot win while we dial (the
		// lower rank refuses the higher's), but if one did, ours goes.
		p.mu.Unlock()
		s.retire(c)
		p.mu.Lock()
		return nil, false
	case p.state == stateUp:
		return nil, false
	case p.state == stateAccepting:
		p.mu.Unlock()
		_, err := s.awaitUp(ctx, p, 0)
		p.mu.Lock()
		return err, false
	case p.state == stateDialing && errors.Is(err, ErrRejected) && ctx.Err() == nil:
		// Every refusal of a rank of this job passes: the lower rank's
		// own request is on the way, or the peer still holds a
		// connection it is about to find dead, or one still flushing.
		p.state = stateAwaiting
		return err, true
	}
	if p.state == stateDialing {
		settleLocked(p, stateDown)
	}
	return fmt.Errorf("%s: connect to rank %d: %w: %w", s.info.Name, r, sdi.ErrPeerUnreachable, err), false
}

// awaitUp waits for the connection the peer dials to come up, at most d
// (0: until ctx ends). It reports up, or an error once the wait failed for
// good; neither when d passed and the caller may dial again.
func (s *SubDevice) awaitUp(ctx context.Context, p *peer, d time.Duration) (bool, error) {
	p.mu.Lock()
	ch := p.settled
	p.mu.Unlock()
	var timeout <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-ch:
	case <-timeout:
	case <-ctx.Done():
	}
	if s.closed.Load() {
		return false, fmt.Errorf("%s: connect to rank %d: %w", s.info.Name, p.rank, sdi.ErrClosed)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch p.state {
	case stateUp:
		return true, nil
	case stateAwaiting:
		settleLocked(p, stateDown)
		if ctx.Err() != nil {
			return false, fmt.Errorf("%s: connect to rank %d: refused until the time to connect ran out (a rank of another job, or another secret?): %w: %w", s.info.Name, p.rank, sdi.ErrPeerUnreachable, ErrRejected)
		}
		return false, nil
	case stateAccepting:
		if ctx.Err() != nil {
			return false, fmt.Errorf("%s: connect to rank %d: %w", s.info.Name, p.rank, ctx.Err())
		}
		return false, nil // settles shortly; the next try waits for it
	}
	return false, fmt.Errorf("%s: connect to rank %d: its connection failed: %w", s.info.Name, p.rank, sdi.ErrPeerUnreachable)
}

// accept answers connection requests until the provider closes.
func (s *SubDevice) accept() {
	defer s.wg.Done()
	for req := range s.prov.Requests() {
		s.answer(req)
	}
}

func (s *SubDevice) answer(req Request) {
	from, err := checkPrivate(req.Private(), s.secret, s.job, s.me, s.size)
	if err != nil {
		s.log.Warn("refused a connection", "error", err)
		req.Reject()
		return
	}
	p, err := s.peerOf("accept", from)
	if err != nil {
		req.Reject()
		return
	}
	p.mu.Lock()
	switch {
	case p.state == stateAccepting:
		p.mu.Unlock()
		req.Reject()
		return
	case p.state == stateUp && s.me > from:
		// The lower rank dials while we hold a connection: it cannot be
		// crossing ours (the lower rank refuses crossing requests), so
		// the peer has lost the connection. Fail it here too, which
		// reports the peer down once its work has flushed; the peer's
		// next request finds it gone.
		s.failLocked(p, p.c, fmt.Errorf("rank %d dialed again: it lost the connection", from))
		p.mu.Unlock()
		req.Reject()
		return
	case (p.state == stateDialing || p.state == stateUp) && s.me < from:
		// Our own request to the higher rank wins, whether it is still
		// out or already through: a request from a higher rank that
		// crosses ours comes in either while we dial or after.
		p.mu.Unlock()
		req.Reject()
		return
	case p.c != nil:
		// The last connection is still flushing; the peer asks again.
		p.mu.Unlock()
		req.Reject()
		return
	}
	prev := p.state
	p.state = stateAccepting
	if prev != stateDialing && prev != stateAwaiting {
		p.settled = make(chan struct{})
	}
	p.mu.Unlock()

	c := s.newConn(p)
	_, err = req.Accept(c.id, func(ep Endpoint) error { return s.setupConn(c, ep) })
	closed := s.closed.Load()
	if err != nil || closed {
		st := stateDown
		if closed {
			st = stateGone
		}
		p.mu.Lock()
		settleLocked(p, st)
		s.holdLocked(p, c)
		p.mu.Unlock()
		if err != nil {
			s.log.Warn("accepting a connection failed", "peer", from, "error", err)
		}
		s.retire(c)
		return
	}
	p.mu.Lock()
	s.upLocked(p, c)
	p.mu.Unlock()
}

// upLocked makes c the peer's connection, unless it failed on the way up;
// then the peer is down and c finishes like any failed connection.
func (s *SubDevice) upLocked(p *peer, c *conn) bool {
	if c.failing {
		p.downErr = c.err
		settleLocked(p, stateDown)
		s.holdLocked(p, c)
		return false
	}
	p.c = c
	c.up = true
	settleLocked(p, stateUp)
	// Frames that came before the connection was ours owe the peer
	// their slots, and it may be out of credits and silent till it
	// hears of them.
	s.sendOwedLocked(p, c)
	return true
}

// holdLocked keeps the peer on c, a conn that failed before it came up,
// until c has finished: frames may have arrived on it, and its report of
// the peer down must come before a new connection gives places for the
// peer's frames, or the report would end those.
func (s *SubDevice) holdLocked(p *peer, c *conn) {
	if p.c == nil && !c.finished {
		p.c = c
	}
}

// Disconnect flushes the frames for peer, says goodbye and closes the
// connection. The goodbye waits for the fins this rank owes the peer, which
// may wait for its credits; when ctx ends first, it goes without them and
// the peer fails their frames.
func (s *SubDevice) Disconnect(ctx context.Context, r sdi.Rank) error {
	if err := s.Flush(ctx, r); err != nil {
		return err
	}
	p, err := s.peerOf("disconnect", r)
	if err != nil {
		return err
	}
	p.mu.Lock()
	c := p.c
	if c == nil || p.state != stateUp {
		p.mu.Unlock()
		return nil
	}
	s.byeLocked(p, c)
	p.state = stateGone
	said := c.byeSaid
	p.mu.Unlock()
	if said == nil {
		return nil
	}
	select {
	case <-said:
	case <-c.gone:
	case <-ctx.Done():
		// Released all the same: the peer fails the frames whose fins
		// are still owed, which is a loss it reports.
		p.mu.Lock()
		owed := len(c.fins)
		if c.byeDue && !c.failing {
			s.sayByeLocked(p, c)
		}
		p.mu.Unlock()
		return fmt.Errorf("%s: disconnect from rank %d: the fins of %d frames still waited for credits: %w", s.info.Name, r, owed, ctx.Err())
	}
	return nil
}

// byeLocked tells the peer this end goes, after the fins still owed to it
// (sendOwedLocked says the goodbye once the last has gone): on the goodbye
// the peer fails every frame it has heard no fin for, and these were
// delivered.
func (s *SubDevice) byeLocked(p *peer, c *conn) {
	if c.failing || c.byeDue {
		return
	}
	c.quiet = true
	if len(c.fins) > 0 {
		c.byeDue = true
		c.byeSaid = make(chan struct{})
		return
	}
	s.sayByeLocked(p, c)
}

// sayByeLocked tells the peer this end goes, if a control slot is left for
// it, and closes the connection once the goodbye has left: closing at once
// would flush it unsent. Without a slot the peer sees a failure instead.
func (s *SubDevice) sayByeLocked(p *peer, c *conn) {
	if c.byeDue {
		c.byeDue = false
		close(c.byeSaid)
	}
	c.failing = true
	if c.ctlCredits > 0 && len(c.freeSend) > 0 {
		c.ctlCredits--
		c.byeSlot = c.freeSend[len(c.freeSend)-1]
		s.postLocked(p, c, kindBye, nil)
		return
	}
	c.closeEPLocked()
}

// Send sends one frame: eagerly into a slot the peer posted, or, when
// larger, by telling the peer where to read it.
func (s *SubDevice) Send(f *sdi.Frame) (bool, error) {
	p, err := s.peerOf("send", f.Peer)
	if err != nil {
		return false, err
	}
	if len(f.Header) > MaxHeader || len(f.Payload) > MaxFrame {
		return false, fmt.Errorf("%s: send to rank %d: header %d, payload %d bytes (at most %d, %d): %w", s.info.Name, f.Peer, len(f.Header), len(f.Payload), MaxHeader, MaxFrame, sdi.ErrTooLarge)
	}
	p.mu.Lock()
	c := p.c
	if p.state != stateUp || c == nil {
		st, why := p.state, p.downErr
		p.mu.Unlock()
		switch {
		case st == stateIdle:
			return false, fmt.Errorf("%s: send to rank %d: %w", s.info.Name, f.Peer, sdi.ErrNotConnected)
		case st == stateDown && why != nil:
			return false, fmt.Errorf("%s: send to rank %d: connection down: %w: %w", s.info.Name, f.Peer, sdi.ErrPeerUnreachable, why)
		}
		return false, fmt.Errorf("%s: send to rank %d: connection %s: %w", s.info.Name, f.Peer, st, sdi.ErrPeerUnreachable)
	}
	if c.credits == 0 || len(c.freeSend) == 0 || len(c.fins) > 0 {
		p.mu.Unlock()
		return false, sdi.ErrWouldBlock
	}
	if len(f.Payload) <= s.eager {
		c.credits--
		s.postLocked(p, c, kindEager, f)
		p.mu.Unlock()
		return true, nil
	}
	// The credit and slot are ours while the payload registers.
	c.credits--
	slot := c.freeSend[len(c.freeSend)-1]
	c.freeSend = c.freeSend[:len(c.freeSend)-1]
	p.mu.Unlock()
	reg, err := s.prov.Register(f.Payload)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil || p.c != c || c.failing {
		c.freeSend = append(c.freeSend, slot)
		c.credits++
		s.sendOwedLocked(p, c) // a fin may have queued behind the credit
		if err != nil {
			return false, fmt.Errorf("%s: send to rank %d: register %d bytes: %w", s.info.Name, f.Peer, len(f.Payload), err)
		}
		reg.Close()
		return false, fmt.Errorf("%s: send to rank %d: connection failed: %w", s.info.Name, f.Peer, sdi.ErrPeerUnreachable)
	}
	c.large[f.Token] = reg
	c.unfinished++
	s.postSlotLocked(p, c, slot, kindRTS, f, reg)
	return false, nil
}

// postLocked takes a send slot and posts one message of kind. The caller
// took the credit it needs.
func (s *SubDevice) postLocked(p *peer, c *conn, kind uint8, f *sdi.Frame) {
	slot := c.freeSend[len(c.freeSend)-1]
	c.freeSend = c.freeSend[:len(c.freeSend)-1]
	s.postSlotLocked(p, c, slot, kind, f, nil)
}

// postSlotLocked writes a message into send slot and posts it, returning
// the reposted slots it owes the peer on the way. A post that fails fails
// the connection.
func (s *SubDevice) postSlotLocked(p *peer, c *conn, slot int, kind uint8, f *sdi.Frame, reg Region) {
	b := c.sbuf[slot*s.slot : (slot+1)*s.slot]
	h := wireHeader{kind: kind, credits: uint16(c.owed), ctlBack: uint8(c.ctlOwed)}
	c.owed, c.ctlOwed = 0, 0
	n := baseLen
	switch kind {
	case kindEager:
		h.hdrLen = uint16(len(f.Header))
		n += copy(b[n:], f.Header)
		n += copy(b[n:], f.Payload)
	case kindRTS:
		h.hdrLen = uint16(len(f.Header))
		putRTS(b[n:], rts{token: f.Token, addr: reg.Addr(), rkey: reg.RKey(), n: uint64(len(f.Payload))})
		n += rtsLen
		n += copy(b[n:], f.Header)
	case kindFIN:
		putUint64(b[n:], f.Token)
		n += finLen
	}
	putBase(b, h)
	c.outstanding++
	if err := c.ep.PostSend(wrID(wrSend, slot), c.sreg, slot*s.slot, n); err != nil {
		c.outstanding--
		c.freeSend = append(c.freeSend, slot)
		s.failLocked(p, c, fmt.Errorf("post %s: %w", kindName(kind), err))
	}
}

// Flush waits until every frame sent to peer is locally complete: every
// frame the peer reads has been read.
func (s *SubDevice) Flush(ctx context.Context, r sdi.Rank) error {
	p, err := s.peerOf("flush", r)
	if err != nil {
		return err
	}
	for {
		p.mu.Lock()
		c := p.c
		if c == nil || c.unfinished == 0 {
			p.mu.Unlock()
			return nil
		}
		if c.drained == nil {
			c.drained = make(chan struct{})
		}
		ch := c.drained
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("%s: flush to rank %d: %w", s.info.Name, r, ctx.Err())
		}
	}
}

// Poll drives progress on the calling goroutine.
func (s *SubDevice) Poll() int {
	if !s.progress.TryLock() {
		return 0
	}
	n := s.drain()
	s.progress.Unlock()
	return n
}

// run drives progress while nobody polls: it drains the completion queue
// and, when that is empty, arms it and sleeps in the provider's Wait. The
// drain after arming takes the progress lock even when a poller holds it:
// a completion that came before the arming does not wake Wait, and the
// poller may have taken its batch before that completion came.
func (s *SubDevice) run(ctx context.Context) {
	defer s.wg.Done()
	pause := time.Millisecond
	for ctx.Err() == nil {
		if s.Poll() > 0 {
			continue
		}
		if err := s.prov.Arm(); err != nil {
			s.log.Error("arming the completion queue failed", "error", err)
			pause = s.nap(ctx, pause)
			continue
		}
		s.progress.Lock()
		n := s.drain()
		s.progress.Unlock()
		if n > 0 {
			continue
		}
		if err := s.prov.Wait(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("waiting for completions failed", "error", err)
			pause = s.nap(ctx, pause)
			continue
		}
		pause = time.Millisecond
	}
}

// nap waits out a failing provider call, longer each time up to a second,
// so that a provider that fails for good is not spun on.
func (s *SubDevice) nap(ctx context.Context, d time.Duration) time.Duration {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	return min(2*d, time.Second)
}

// Close says goodbye to every peer, each after the fins it is owed, waits
// for their connections' work to complete, fails the frames still in
// flight with ErrClosed and closes the provider.
func (s *SubDevice) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		return nil
	}
	s.closed.Store(true)
	pp := s.peers.Load()
	if s.prov == nil || pp == nil {
		s.mu.Unlock()
		return nil
	}
	peers := *pp
	s.mu.Unlock()

	for _, p := range peers {
		p.mu.Lock()
		if c := p.c; c != nil {
			c.quiet = true
			s.byeLocked(p, c)
		}
		if p.settled != nil {
			settleLocked(p, stateGone)
		}
		p.state = stateGone
		p.mu.Unlock()
	}
	// The progress goroutine ends first, so that this goroutine alone
	// drains what the closed connections flush.
	s.stop()
	var err error
	for {
		s.Poll()
		if s.idle() {
			break
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("%s: close: connections still busy: %w", s.info.Name, ctx.Err())
			break
		}
		time.Sleep(100 * time.Microsecond)
	}
	s.progress.Lock()
	s.dead = true
	// Frames whose connection never finished flushing are failed here.
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		s.finish(c)
	}
	if cerr := s.prov.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("%s: close: %w", s.info.Name, cerr)
	}
	s.progress.Unlock()
	s.wg.Wait()
	return err
}

// idle reports whether every connection has finished.
func (s *SubDevice) idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns) == 0
}
