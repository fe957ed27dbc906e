package sditest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// LoopbackOptions configure a [Fabric] and every loopback subdevice it makes.
type LoopbackOptions struct {
	Name       string   // Info.Name; default "loop"
	Caps       sdi.Caps // zero value: MaxHeader 256, MaxEager 4096, MaxFrame 65536, ReachNetwork, FlagReliable|FlagOrdered, Exclusivity 1
	QueueLimit int      // frames in flight per (sender, peer) before Send returns ErrWouldBlock; default 1024
}

func (o LoopbackOptions) withDefaults() LoopbackOptions {
	if o.Name == "" {
		o.Name = "loop"
	}
	if o.Caps == (sdi.Caps{}) {
		o.Caps = sdi.Caps{
			MaxHeader:   256,
			MaxEager:    4096,
			MaxFrame:    65536,
			Exclusivity: 1,
			Reach:       sdi.ReachNetwork,
			Flags:       sdi.FlagReliable | sdi.FlagOrdered,
		}
	}
	if o.QueueLimit <= 0 {
		o.QueueLimit = 1024
	}
	return o
}

// fabricIDs makes business cards of different fabrics distinct, so a card
// from one fabric is refused by another instead of naming a stranger.
var fabricIDs atomic.Uint64

// Fabric is an in-memory network. Loopback subdevices made by one Fabric
// reach each other through their business cards; cards from another Fabric
// are refused with [sdi.ErrPeerUnreachable].
//
// The loopback subdevice delivers asynchronously: every open instance owns
// one goroutine that calls its Handler, so Deliver is serialized (and FIFO)
// per peer. Send copies the frame, returns done=true for a frame without
// payload and done=false otherwise, and reports SendDone once the receiver
// has delivered the frame; both completion paths are therefore exercised by
// ordinary traffic. [sdi.ReachHost] caps make it refuse cards from another
// [sdi.OpenParams.Host]; cards of another JobID or Secret are always refused.
// OpenParams.Config is ignored.
//
// A Fabric and its subdevices are safe for concurrent use.
type Fabric struct {
	opts LoopbackOptions
	id   uint64

	mu     sync.Mutex
	nextID uint64
	open   map[uint64]*loopback
}

// NewFabric returns an empty in-memory network whose subdevices use opts.
func NewFabric(opts LoopbackOptions) *Fabric {
	return &Fabric{
		opts: opts.withDefaults(),
		id:   fabricIDs.Add(1),
		open: make(map[uint64]*loopback),
	}
}

// New returns an unopened loopback subdevice attached to f. Its signature
// makes f.New usable as an [sdi.Factory].
func (f *Fabric) New(logger hclog.Logger) sdi.SubDevice {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &loopback{fabric: f, logger: logger}
}

// Kill simulates the death of every open instance of rank in f, as if its
// process had crashed: peers connected to it get PeerDown with an error
// wrapping [sdi.ErrPeerUnreachable] and their frames still queued for it fail
// the same way; the killed instance refuses every later call with an error
// wrapping [sdi.ErrClosed] and makes no more Handler calls. Close still has
// to be called on it to release it.
func (f *Fabric) Kill(rank sdi.Rank) {
	for _, l := range f.instances(rank) {
		l.shutdown(true)
	}
}

// instances returns the open instances of rank.
func (f *Fabric) instances(rank sdi.Rank) []*loopback {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ls []*loopback
	for _, l := range f.open {
		if l.p.Rank == rank {
			ls = append(ls, l)
		}
	}
	return ls
}

// Sever simulates the failure of rank's link to f while its process lives
// on, as when its cable or NIC dies: unlike [Fabric.Kill], both ends learn
// it. Peers connected to rank get PeerDown for it, and rank's instances get
// PeerDown for every peer they were connected to, all with an error
// wrapping [sdi.ErrPeerUnreachable]. Rank's frames that no peer has taken
// yet fail through SendDone with such an error, frames still on their way
// to rank are refused back to their senders the same way, and later Send
// and Connect calls on rank's instances fail with it. Close still has to
// be called on them to release them.
func (f *Fabric) Sever(rank sdi.Rank) {
	for _, l := range f.instances(rank) {
		l.sever()
	}
}

// Mend ends a [Fabric.Sever] of rank, as when its link comes back: its
// instances send and connect again, and peers connect to it again. Nothing
// lost while the link was down comes back; connections survive, as they
// would not over a real network, so a caller that reconnects (as it must
// after PeerDown) finds Connect succeeding at once.
func (f *Fabric) Mend(rank sdi.Rank) {
	for _, l := range f.instances(rank) {
		l.mu.Lock()
		l.severed = false
		l.mu.Unlock()
	}
}

func (f *Fabric) register(l *loopback) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	f.open[f.nextID] = l
	return f.nextID
}

func (f *Fabric) unregister(id uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.open, id)
}

func (f *Fabric) lookup(id uint64) *loopback {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.open[id]
}

func (f *Fabric) snapshot() []*loopback {
	f.mu.Lock()
	defer f.mu.Unlock()
	all := make([]*loopback, 0, len(f.open))
	for _, l := range f.open {
		all = append(all, l)
	}
	return all
}

const cardPrefix = "sditest-loop"

func (f *Fabric) card(id uint64) []byte {
	return fmt.Appendf(nil, "%s/%d/%d", cardPrefix, f.id, id)
}

// parseCard returns the instance id in a card made by f.
func (f *Fabric) parseCard(card []byte) (uint64, bool) {
	parts := strings.Split(string(card), "/")
	if len(parts) != 3 || parts[0] != cardPrefix {
		return 0, false
	}
	fid, err1 := strconv.ParseUint(parts[1], 10, 64)
	id, err2 := strconv.ParseUint(parts[2], 10, 64)
	if err1 != nil || err2 != nil || fid != f.id {
		return 0, false
	}
	return id, true
}

type lbState uint8

const (
	lbUnopened lbState = iota
	lbOpen
	lbClosed
)

// Frame states; the receiver and a closing sender race for a queued frame
// with a compare-and-swap, so it is either delivered or failed, never both.
const (
	frameQueued uint32 = iota
	frameTaken
)

// lbFrame is a frame copied at Send and queued in the receiver's inbox.
type lbFrame struct {
	from    *loopback
	peer    sdi.Rank
	token   uint64
	header  []byte
	payload []byte
	silent  bool // Send returned done=true: no SendDone follows
	state   atomic.Uint32
}

type lbEventKind uint8

const (
	evFrame      lbEventKind = iota // an arriving frame
	evCompletion                    // the receiver delivered or refused one of our frames
	evPeerDown
)

type lbEvent struct {
	kind  lbEventKind
	frame *lbFrame
	peer  sdi.Rank
	err   error
}

// lbQueue is the inbox of one instance's goroutine.
type lbQueue struct {
	mu           sync.Mutex
	events       []lbEvent
	stopping     bool // Close or Kill asked the goroutine to finish
	stopSeen     bool
	refuseFrames bool // no new arriving frames once stopping
	exited       bool // the goroutine is gone; nothing is accepted
	wake         chan struct{}
}

func (q *lbQueue) push(ev lbEvent) bool {
	q.mu.Lock()
	if q.exited || (ev.kind == evFrame && q.refuseFrames) {
		q.mu.Unlock()
		return false
	}
	q.events = append(q.events, ev)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return true
}

func (q *lbQueue) stop() {
	q.mu.Lock()
	q.stopping, q.refuseFrames = true, true
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// take blocks until there are events, or until a stop request not yet seen.
func (q *lbQueue) take() (evs []lbEvent, stopping bool) {
	for {
		q.mu.Lock()
		evs, q.events = q.events, nil
		stopping = q.stopping
		fresh := stopping && !q.stopSeen
		q.stopSeen = q.stopSeen || stopping
		q.mu.Unlock()
		if len(evs) > 0 || fresh {
			return evs, stopping
		}
		<-q.wake
	}
}

// exit marks the queue dead and returns what was still in it.
func (q *lbQueue) exit() []lbEvent {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.exited = true
	evs := q.events
	q.events = nil
	return evs
}

// loopback is one instance of the loopback subdevice.
type loopback struct {
	fabric *Fabric
	logger hclog.Logger

	// sendMu is held shared by Send and exclusively by Close and Kill, so a
	// frame is never half accepted when shutdown starts failing pending ones.
	sendMu sync.RWMutex

	mu       sync.Mutex
	state    lbState
	killed   bool
	severed  bool // its link is down: no frame goes out or comes in
	id       uint64
	p        sdi.OpenParams // immutable once open
	caps     sdi.Caps
	conns    map[sdi.Rank]*loopback
	inflight map[sdi.Rank]int      // frames queued at the peer, counted against QueueLimit
	pending  map[*lbFrame]struct{} // accepted with done=false; SendDone not yet called
	unacked  map[sdi.Rank]int      // pending per peer, dropped after SendDone, for Flush
	flushed  chan struct{}         // closed and replaced whenever unacked drops

	q    lbQueue
	done chan struct{} // closed when the goroutine exits
}

func (l *loopback) Info(context.Context) (sdi.Info, error) {
	return sdi.Info{Name: l.fabric.opts.Name, Version: "1.0.0", APIVersions: []string{sdi.APIVersion}}, nil
}

func (l *loopback) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	caps := l.fabric.opts.Caps
	switch {
	case p.Handler == nil:
		return sdi.Local{}, errors.New("loop: open: nil Handler")
	case p.APIVersion != sdi.APIVersion:
		return sdi.Local{}, fmt.Errorf("loop: open: API version %q, speaks %s: %w", p.APIVersion, sdi.APIVersion, sdi.ErrUnsupported)
	}
	if err := caps.Validate(); err != nil {
		return sdi.Local{}, fmt.Errorf("loop: open: %w", err)
	}
	if p.Logger == nil {
		p.Logger = l.logger
	}
	l.mu.Lock()
	if l.state != lbUnopened {
		l.mu.Unlock()
		return sdi.Local{}, fmt.Errorf("loop: open called twice: %w", sdi.ErrClosed)
	}
	l.state = lbOpen
	l.p, l.caps = p, caps
	l.conns = make(map[sdi.Rank]*loopback)
	l.inflight = make(map[sdi.Rank]int)
	l.pending = make(map[*lbFrame]struct{})
	l.unacked = make(map[sdi.Rank]int)
	l.flushed = make(chan struct{})
	l.q.wake = make(chan struct{}, 1)
	l.done = make(chan struct{})
	l.mu.Unlock()

	id := l.fabric.register(l)
	l.mu.Lock()
	l.id = id
	l.mu.Unlock()
	go l.run()
	return sdi.Local{Addr: l.fabric.card(id), Caps: caps}, nil
}

// liveLocked returns an error unless l is open and not killed. l.mu must be held.
func (l *loopback) liveLocked(op string) error {
	switch {
	case l.killed:
		return fmt.Errorf("loop: %s: rank %d was killed: %w", op, l.p.Rank, sdi.ErrClosed)
	case l.state == lbUnopened:
		return fmt.Errorf("loop: %s before Open: %w", op, sdi.ErrNotConnected)
	case l.state == lbClosed:
		return fmt.Errorf("loop: %s: %w", op, sdi.ErrClosed)
	}
	return nil
}

// linkedLocked returns an error unless l is live and its link is up. l.mu
// must be held.
func (l *loopback) linkedLocked(op string) error {
	if err := l.liveLocked(op); err != nil {
		return err
	}
	if l.severed {
		return fmt.Errorf("loop: %s: rank %d's link is down: %w", op, l.p.Rank, sdi.ErrPeerUnreachable)
	}
	return nil
}

func (l *loopback) Connect(ctx context.Context, peer sdi.Rank, addr []byte) error {
	l.mu.Lock()
	err := l.linkedLocked("connect")
	p := l.p
	l.mu.Unlock()
	if err != nil {
		return err
	}
	unreachable := func(why string, args ...any) error {
		return fmt.Errorf("loop: connect rank %d: %s: %w", peer, fmt.Sprintf(why, args...), sdi.ErrPeerUnreachable)
	}
	id, ok := l.fabric.parseCard(addr)
	if !ok {
		return unreachable("%q is not a card of this fabric", addr)
	}
	target := l.fabric.lookup(id)
	switch {
	case target == nil:
		return unreachable("no open instance has card %q", addr)
	case target.p.JobID != p.JobID || !bytes.Equal(target.p.Secret, p.Secret):
		return unreachable("card belongs to another job")
	case target.p.Rank != peer:
		return unreachable("card belongs to rank %d", target.p.Rank)
	case target.isSevered():
		return unreachable("rank %d's link is down", peer)
	case l.caps.Reach == sdi.ReachHost && target.p.Host != p.Host:
		return unreachable("host %q is not %q and reach is host", target.p.Host, p.Host)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.linkedLocked("connect"); err != nil {
		return err
	}
	l.conns[peer] = target
	return nil
}

func (l *loopback) Disconnect(ctx context.Context, peer sdi.Rank) error {
	if err := l.Flush(ctx, peer); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.conns, peer)
	return nil
}

func (l *loopback) Send(f *sdi.Frame) (bool, error) {
	l.sendMu.RLock()
	defer l.sendMu.RUnlock()

	l.mu.Lock()
	if err := l.linkedLocked("send"); err != nil {
		l.mu.Unlock()
		return false, err
	}
	if len(f.Header) > l.caps.MaxHeader || len(f.Payload) > l.caps.MaxFrame {
		l.mu.Unlock()
		return false, fmt.Errorf("loop: send header %d payload %d bytes, limits %d and %d: %w",
			len(f.Header), len(f.Payload), l.caps.MaxHeader, l.caps.MaxFrame, sdi.ErrTooLarge)
	}
	target, ok := l.conns[f.Peer]
	if !ok {
		l.mu.Unlock()
		return false, fmt.Errorf("loop: send to rank %d: %w", f.Peer, sdi.ErrNotConnected)
	}
	if l.inflight[f.Peer] >= l.fabric.opts.QueueLimit {
		l.mu.Unlock()
		return false, sdi.ErrWouldBlock
	}
	buf := make([]byte, len(f.Header)+len(f.Payload))
	copy(buf, f.Header)
	copy(buf[len(f.Header):], f.Payload)
	fr := &lbFrame{
		from:    l,
		peer:    f.Peer,
		token:   f.Token,
		header:  buf[:len(f.Header):len(f.Header)],
		payload: buf[len(f.Header):],
		silent:  len(f.Payload) == 0,
	}
	l.inflight[f.Peer]++
	if !fr.silent {
		l.pending[fr] = struct{}{}
		l.unacked[f.Peer]++
	}
	l.mu.Unlock()

	if !target.q.push(lbEvent{kind: evFrame, frame: fr}) {
		l.mu.Lock()
		l.inflight[f.Peer]--
		if !fr.silent {
			delete(l.pending, fr)
			l.unackLocked(f.Peer)
		}
		l.mu.Unlock()
		return false, fmt.Errorf("loop: send to rank %d: peer is gone: %w", f.Peer, sdi.ErrPeerUnreachable)
	}
	return fr.silent, nil
}

func (l *loopback) unackLocked(peer sdi.Rank) {
	l.unacked[peer]--
	close(l.flushed)
	l.flushed = make(chan struct{})
}

func (l *loopback) Flush(ctx context.Context, peer sdi.Rank) error {
	for {
		l.mu.Lock()
		if err := l.liveLocked("flush"); err != nil {
			l.mu.Unlock()
			return err
		}
		n, ch := l.unacked[peer], l.flushed
		l.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("loop: flush rank %d, %d frames pending: %w", peer, n, ctx.Err())
		}
	}
}

func (l *loopback) Close(ctx context.Context) error {
	l.mu.Lock()
	opened := l.state != lbUnopened
	l.mu.Unlock()
	l.shutdown(false)
	if !opened {
		return nil
	}
	select {
	case <-l.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("loop: close rank %d: %w", l.p.Rank, ctx.Err())
	}
}

// shutdown stops accepting work, tells peers, and asks the goroutine to fail
// or finish every pending frame and exit. kill leaves l open but dead.
func (l *loopback) shutdown(kill bool) {
	l.sendMu.Lock()
	l.mu.Lock()
	wasLive := l.state == lbOpen && !l.killed
	severed := l.severed
	if kill {
		l.killed = l.killed || l.state == lbOpen
	} else {
		l.state = lbClosed
	}
	l.mu.Unlock()
	l.sendMu.Unlock()
	if !wasLive {
		return
	}

	l.fabric.unregister(l.id)
	how := "closed"
	if kill {
		how = "killed"
	}
	if !severed { // else its peers heard it already
		l.tellPeers(fmt.Errorf("loop: rank %d %s: %w", l.p.Rank, how, sdi.ErrPeerUnreachable))
	}
	if l.logger.IsDebug() {
		l.logger.Debug("loopback shutting down", "rank", l.p.Rank, "how", how)
	}
	l.q.stop()
}

// tellPeers reports l down, with err, to every instance connected to it.
func (l *loopback) tellPeers(err error) {
	for _, other := range l.fabric.snapshot() {
		other.mu.Lock()
		linked := other.conns[l.p.Rank] == l
		other.mu.Unlock()
		if linked {
			other.q.push(lbEvent{kind: evPeerDown, peer: l.p.Rank, err: err})
		}
	}
}

// sever cuts l's link (Fabric.Sever). The failures it reports reach l's
// Handler through l's own goroutine, as every Handler call does.
func (l *loopback) sever() {
	l.sendMu.Lock()
	l.mu.Lock()
	live := l.state == lbOpen && !l.killed && !l.severed
	var peers []sdi.Rank
	var frames []*lbFrame
	if live {
		l.severed = true
		for peer := range l.conns {
			peers = append(peers, peer)
		}
		for fr := range l.pending {
			frames = append(frames, fr)
		}
	}
	l.mu.Unlock()
	l.sendMu.Unlock()
	if !live {
		return
	}
	down := fmt.Errorf("loop: rank %d's link is down: %w", l.p.Rank, sdi.ErrPeerUnreachable)
	l.tellPeers(down)
	for _, fr := range frames {
		if fr.state.CompareAndSwap(frameQueued, frameTaken) {
			l.q.push(lbEvent{kind: evCompletion, frame: fr, err: fmt.Errorf("loop: frame to rank %d lost: %w", fr.peer, down)})
		}
	}
	for _, peer := range peers {
		l.q.push(lbEvent{kind: evPeerDown, peer: peer, err: down})
	}
	if l.logger.IsDebug() {
		l.logger.Debug("loopback link severed", "rank", l.p.Rank)
	}
}

func (l *loopback) isSevered() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.severed
}

// run is the instance's only goroutine: every Handler call comes from here.
func (l *loopback) run() {
	defer close(l.done)
	failed := false
	for {
		evs, stopping := l.q.take()
		if stopping && !failed {
			l.failPending()
			failed = true
		}
		for _, ev := range evs {
			l.handle(ev, stopping)
		}
		if stopping && l.drained() {
			for _, ev := range l.q.exit() {
				l.handle(ev, true)
			}
			return
		}
	}
}

// failPending fails our frames that no receiver has taken yet; those already
// taken complete through the receiver, so the goroutine waits for them.
func (l *loopback) failPending() {
	l.mu.Lock()
	frames := make([]*lbFrame, 0, len(l.pending))
	for fr := range l.pending {
		frames = append(frames, fr)
	}
	l.mu.Unlock()
	for _, fr := range frames {
		if fr.state.CompareAndSwap(frameQueued, frameTaken) {
			l.complete(fr, fmt.Errorf("loop: frame to rank %d not sent: %w", fr.peer, sdi.ErrClosed))
		}
	}
}

func (l *loopback) drained() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.pending) == 0
}

func (l *loopback) handle(ev lbEvent, stopping bool) {
	switch ev.kind {
	case evFrame:
		fr := ev.frame
		if !fr.state.CompareAndSwap(frameQueued, frameTaken) {
			return // its sender closed and failed it
		}
		if stopping || l.isSevered() {
			fr.from.q.push(lbEvent{kind: evCompletion, frame: fr,
				err: fmt.Errorf("loop: rank %d closed or cut off before delivery: %w", l.p.Rank, sdi.ErrPeerUnreachable)})
			return
		}
		l.p.Handler.Deliver(fr.from.p.Rank, fr.header, fr.payload)
		fr.from.q.push(lbEvent{kind: evCompletion, frame: fr})
	case evCompletion:
		l.complete(ev.frame, ev.err)
	case evPeerDown:
		if !stopping {
			l.p.Handler.PeerDown(ev.peer, ev.err)
		}
	}
}

// complete frees fr's queue slot before SendDone, so a sender that retries
// from SendDone finds room, and drops it from Flush's count after, so Flush
// returns only once SendDone was called.
func (l *loopback) complete(fr *lbFrame, err error) {
	l.mu.Lock()
	l.inflight[fr.peer]--
	killed := l.killed
	l.mu.Unlock()
	if fr.silent {
		return
	}
	if !killed {
		l.p.Handler.SendDone(fr.token, err)
	}
	l.mu.Lock()
	delete(l.pending, fr)
	l.unackLocked(fr.peer)
	l.mu.Unlock()
}
