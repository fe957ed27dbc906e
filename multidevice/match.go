package multidevice

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Matching. Every matchable message (eager or ready-to-send) carries a
// per-(source, destination) sequence number. Arrivals are matched strictly in
// sequence order per source, whichever subdevice, size class or retry
// carried them: an early arrival waits in the out-of-order queue. That is what
// keeps MPI's non-overtaking rule when small and large messages to the same
// peer take different subdevices.
//
// ANY_SOURCE over subdevices that match on their own (sdi.FlagMatching)
// follows Schindler & Rehm: the receive is duplicated, one copy here and one
// in each matching subdevice, all sharing one sdi.Claim. Whoever wins the
// claim writes the buffer and completes the original; the other copies are
// cancelled. A copy here that finds the claim taken is discarded.

func matches(r *Request, h *header) bool {
	return r.context == h.context &&
		(r.peer == AnySource || r.peer == h.src) &&
		(r.tag == AnyTag || r.tag == h.tag)
}

// Irecv posts a receive into buf from world rank src (or AnySource) with tag
// (or AnyTag) on context.
func (d *Device) Irecv(buf []byte, src, tag int, context uint64) (*Request, error) {
	return d.irecv(d.newRequest(false, int32(src)), buf, src, tag, context)
}

// irecv posts r, a fresh receive request for src.
func (d *Device) irecv(r *Request, buf []byte, src, tag int, context uint64) (*Request, error) {
	if err := d.checkRecv(src, tag); err != nil {
		return nil, err
	}
	r.tag, r.context, r.buf = int32(tag), context, buf
	// What r reports if it fails before a message matches it (failStatus).
	r.status.Source, r.status.Tag = src, tag

	if src != AnySource && d.matchSub[src] >= 0 {
		return r, d.postHeld(r, int32(src))
	}
	if src == AnySource && len(d.matchers) > 0 {
		r.id = d.nextID.Add(1) // before r is published: its copies carry it
		r.claim = new(sdi.Claim)
	}

	d.mu.Lock()
	for i, m := range d.unexpected.items() {
		if !matches(r, &m.h) {
			continue
		}
		if r.claim != nil {
			r.claim.TryClaim(claimOwn) // no copy exists yet: always wins
		}
		d.unexpected.remove(i)
		d.deliverLocked(r, &m.h, m.data)
		d.freeMsgLocked(m)
		d.mu.Unlock()
		return r, nil
	}
	// Nothing more will come from a lost source. Checked under the lock:
	// failPeer marks the source down before it takes the lock to fail
	// the posted receives, so either it finds r posted or r sees the mark.
	if src != AnySource {
		if err := d.peerErr(int32(src)); err != nil {
			d.mu.Unlock()
			r.completeOwned(r.failStatus(), err)
			return r, nil
		}
	}
	// Close marks the device closed before failAll takes the lock to fail
	// the posted receives: a receive that passed checkRecv as Close began
	// is either found there or sees the mark here.
	if d.closed.Load() {
		d.mu.Unlock()
		r.completeOwned(r.failStatus(), ErrClosed)
		return r, nil
	}
	d.posted.push(r)
	d.mu.Unlock()

	if r.claim != nil {
		for _, idx := range d.matchers {
			if err := d.postToSub(r, d.subs[idx]); err != nil {
				d.log.Warn("posting ANY_SOURCE copy failed", "subdevice", d.subs[idx].name, "error", err)
			}
		}
	}
	return r, nil
}

// postHeld posts r, a receive from src, into the matching subdevice that
// carries all of src's traffic, which then holds it alone. d.held keeps it
// findable until that subdevice completes it or gives it back, so that
// the loss of src (failPeer) or Close (failAll) can fail it.
func (d *Device) postHeld(r *Request, src int32) error {
	id := d.nextID.Add(1)
	r.id, r.atSub = id, d.matchSub[src]
	s := d.subs[r.atSub]
	// Close marks the device closed before failAll takes the lock to
	// sweep d.held: r is either swept there or sees the mark here.
	d.mu.Lock()
	if d.closed.Load() {
		d.mu.Unlock()
		r.completeOwned(r.failStatus(), ErrClosed)
		return nil
	}
	d.held[id] = r
	d.mu.Unlock()
	if err := d.postToSub(r, s); err != nil {
		if d.unhold(id) == nil {
			return nil // failAll took r and completes it
		}
		return err
	}
	// A lost source is not checked before posting: what it sent before
	// its loss may wait, unexpected, in the subdevice, and is received
	// (the posted path looks at d.unexpected first too). failPeer marks
	// the loss before it sweeps d.held, and its cancel may have reached
	// the subdevice before r did; then r was registered before the sweep,
	// so this load, after PostRecv, sees the mark. Either way a cancel
	// follows PostRecv, and Done or it completes r.
	if lost := d.peerErr(src); lost != nil {
		d.cancelHeld(s, id, false, lost)
	}
	return nil
}

// unhold takes the receive id out of d.held and returns it, or nil if
// somebody else took it: the caller that gets it completes it.
func (d *Device) unhold(id uint64) *Request {
	d.mu.Lock()
	r := d.held[id]
	if r != nil {
		delete(d.held, id)
	}
	d.mu.Unlock()
	return r
}

// cancelHeld takes the held receive id back from s and, if s gave it back,
// completes it with err, as cancelled (Cancel) or failed. It calls into s:
// handler callbacks go through the outbox.
func (d *Device) cancelHeld(s *subdev, id uint64, cancelled bool, err error) {
	if !s.matcher.CancelRecv(id) {
		return // it matched: its Done completes it
	}
	if r := d.unhold(id); r != nil {
		st := r.failStatus()
		if cancelled {
			st = cancelledStatus
		}
		r.complete(st, err)
	}
}

// postToSub posts r (or its duplicate) into a matching subdevice.
func (d *Device) postToSub(r *Request, s *subdev) error {
	// Read now: once r completes it may be reused. Not r.status: the copy
	// of an ANY_SOURCE receive is posted after r, which a message may
	// have matched meanwhile.
	claim, id := r.claim, r.id
	failed := Status{Source: int(r.peer), Tag: int(r.tag)} // r.failStatus before a match
	p := &sdi.PostedRecv{
		ID: id, Source: sdi.Rank(r.peer), Tag: r.tag, Context: r.context, Buf: r.buf, Claim: claim,
		Done: func(env sdi.Envelope, n int, err error) {
			st := Status{Source: int(env.Source), Tag: int(env.Tag), Count: n}
			switch {
			case err != nil && env == (sdi.Envelope{}):
				st = failed // before a message matched
			case err != nil:
				st.Count = 0 // what it wrote before it failed is no message
			}
			if err == nil && env.Len > n {
				err = fmt.Errorf("%w: message of %d bytes, buffer of %d", ErrTruncated, env.Len, n)
			}
			if claim != nil {
				// Before completing: r may be reused once it completes.
				// This copy won the claim, so nobody else completes r.
				d.dropCopies(r, s.idx)
			} else if d.unhold(id) == nil {
				return // taken by failAll, or by a cancel the subdevice granted: not this Done's
			}
			r.complete(st, err)
		},
	}
	if err := s.matcher.PostRecv(p); err != nil {
		return fmt.Errorf("multidevice: post receive into %q: %w", s.name, err)
	}
	return nil
}

// dropCopies removes the copies of a duplicated receive that did not win:
// the one here and those in matching subdevices other than winner. Its
// callers complete r only after it: the queued cancels carry r's id, not
// r, since r may be reused once complete, and a copy that is still
// posted meanwhile writes nothing (its claim is taken) and is dropped
// without Done (sdi.Matcher).
func (d *Device) dropCopies(r *Request, winner int) {
	if winner != 0 {
		d.mu.Lock()
		d.removePostedLocked(r)
		d.mu.Unlock()
	}
	for _, idx := range d.matchers {
		if idx == winner {
			continue
		}
		s, id := d.subs[idx], r.id
		// Handler callbacks must not call into a subdevice: go through the engine.
		d.out.push(outItem{fn: func() { s.matcher.CancelRecv(id) }})
	}
}

func (d *Device) removePostedLocked(r *Request) bool {
	if i := slices.Index(d.posted.items(), r); i >= 0 {
		d.posted.remove(i)
		return true
	}
	return false
}

// arriveShort handles an eager message with the short header hb from
// rank from, which sent it straight to this rank: arrive, but its common
// case (in order, nothing placed, and the oldest posted receive takes it
// whole: a ping-pong's every message) reads the header's fields where
// they lie and completes the receive there, which is what decodeShort,
// arrive, matchLocked and deliverLocked do for it, minus three calls,
// the header's decoding and their tests for what it is not. It checks hb
// as decodeShort does and returns decodeShort's error for a bad one,
// having done nothing.
func (d *Device) arriveShort(from int32, hb, payload []byte) error {
	if len(hb) != shortHeaderSize || binary.LittleEndian.Uint32(hb) != shortWord ||
		int32(binary.LittleEndian.Uint32(hb[4:])) < 0 || uint(from) >= uint(d.size) || uint64(len(payload)) > maxMessage {
		return shortError(hb, from, d.size, len(payload))
	}
	tag := int32(binary.LittleEndian.Uint32(hb[4:]))
	cid := binary.LittleEndian.Uint64(hb[8:])
	seq := binary.LittleEndian.Uint64(hb[16:])
	d.mu.Lock()
	// A message Place matched (d.placing) is never the next in sequence
	// here: Place took its number.
	if q := &d.posted; q.head < len(q.all) && seq == d.recvSeq[from] && len(d.ooo[from]) == 0 {
		// matches and deliverLocked's tests, for this message.
		if r := q.all[q.head]; r.claim == nil && r.context == cid && (r.peer == AnySource || r.peer == from) &&
			(r.tag == AnyTag || r.tag == tag) && len(payload) <= len(r.buf) {
			d.recvSeq[from] = seq + 1
			q.removeFirst()
			r.completeOwned(Status{Source: int(from), Tag: int(tag), Count: copy(r.buf, payload)}, nil)
			d.mu.Unlock()
			return nil
		}
	}
	var h header
	err := h.decodeShort(hb, from, d.rank, d.size, len(payload)) // checked above: nil
	if err == nil {
		d.arriveLocked(&h, payload)
	}
	d.mu.Unlock()
	return err
}

// arrive handles a matchable message from the wire, in sequence order.
func (d *Device) arrive(h *header, payload []byte) {
	d.mu.Lock()
	d.arriveLocked(h, payload)
	d.mu.Unlock()
}

// arriveLocked is arrive for a caller that holds d.mu.
func (d *Device) arriveLocked(h *header, payload []byte) {
	if len(d.placing) != 0 && d.finishPlacedLocked(h, payload) {
		return
	}
	src := h.src
	exp := d.recvSeq[src]
	// len, not nil: the map of a source that once had a message arrive
	// early stays, empty, once its queue drained.
	if h.seq == exp && len(d.ooo[src]) == 0 { // in order, nothing waiting behind it
		d.matchLocked(h, payload)
		d.recvSeq[src] = exp + 1
		return
	}
	switch {
	case h.seq == exp:
		d.matchLocked(h, payload)
		exp++
		for q := d.ooo[src]; q != nil; {
			m, ok := q[exp]
			if !ok {
				break
			}
			delete(q, exp)
			d.matchLocked(&m.h, m.data)
			d.freeMsgLocked(m)
			exp++
		}
		d.recvSeq[src] = exp
	case h.seq > exp:
		if d.ooo[src] == nil {
			d.ooo[src] = make(map[uint64]*inMsg)
		}
		if _, dup := d.ooo[src][h.seq]; dup {
			d.log.Warn("dropping duplicate message", "source", src, "seq", h.seq)
			return
		}
		d.ooo[src][h.seq] = d.newMsgLocked(h, payload)
	default:
		d.log.Warn("dropping duplicate message", "source", src, "seq", h.seq, "expected", exp)
	}
}

// Unexpected and early messages are recycled through a short free list, so
// that a steady stream of messages arriving before their receives costs no
// allocation. Buffers above freeMsgMax are left to the garbage collector.
const (
	freeMsgs   = 64
	freeMsgMax = 64 << 10
)

// newMsgLocked returns a queued message holding h and, for an eager
// message, a copy of payload.
func (d *Device) newMsgLocked(h *header, payload []byte) *inMsg {
	var m *inMsg
	if n := len(d.freeMsgs); n > 0 {
		m = d.freeMsgs[n-1]
		d.freeMsgs = d.freeMsgs[:n-1]
	} else {
		m = new(inMsg)
	}
	m.h = *h
	if h.kind == kindEager {
		m.data = append(m.data[:0], payload...)
	} else {
		m.data = m.data[:0]
	}
	return m
}

// freeMsgLocked recycles a message that left every queue.
func (d *Device) freeMsgLocked(m *inMsg) {
	if len(d.freeMsgs) < freeMsgs && cap(m.data) <= freeMsgMax {
		d.freeMsgs = append(d.freeMsgs, m)
	}
}

// matchLocked matches one in-order arrival against the posted receives or
// queues it as unexpected.
func (d *Device) matchLocked(h *header, payload []byte) {
	for i := 0; i < len(d.posted.items()); {
		r := d.posted.items()[i]
		if !matches(r, h) {
			i++
			continue
		}
		d.posted.remove(i)
		if r.claim != nil && !r.claim.TryClaim(claimOwn) {
			continue // a matching subdevice or Cancel won this receive
		}
		d.deliverLocked(r, h, payload)
		return
	}
	d.unexpected.push(d.newMsgLocked(h, payload))
	d.notifyAll()
}

// deliverLocked completes (eager) or advances (rendezvous) a matched receive.
func (d *Device) deliverLocked(r *Request, h *header, payload []byte) {
	if r.claim != nil {
		d.dropCopies(r, 0)
	}
	st := Status{Source: int(h.src), Tag: int(h.tag)}
	var err error
	if h.length > uint64(len(r.buf)) {
		// The sender is not named: the status names it, and a layer
		// above numbers ranks otherwise (a communicator's) and says so.
		err = fmt.Errorf("%w: message of %d bytes, buffer of %d", ErrTruncated, h.length, len(r.buf))
	}
	if h.kind == kindEager {
		st.Count = copy(r.buf, payload)
		if h.flags&flagSync != 0 {
			d.sendSys(h.src, header{tag: sysAck, context: h.context, sreq: h.sreq}, nil, nil)
		}
		// Every caller took r out of the posted queue, or has it before
		// it was posted, and won its claim if it has one.
		r.completeOwned(st, err)
		return
	}
	// Rendezvous: ask for as much as fits; the sender completes either way.
	// A sender lost since its ready-to-send came will send no data: fail
	// the receive now (failPeer, which marks the loss before it takes
	// d.mu, fails the ones it finds waiting).
	if lost := d.peerErr(h.src); lost != nil {
		r.completeOwned(st, lost)
		return
	}
	r.rndvLen = min(h.length, uint64(len(r.buf)))
	r.status, r.truncErr = st, err
	r.status.Count = int(r.rndvLen)
	if r.id == 0 {
		r.id = d.nextID.Add(1) // r left every queue: nobody else reads it
	}
	if r.rndvLen > 0 {
		d.rndvRecv[r.id] = r
	}
	d.sendSys(h.src, header{tag: sysCTS, context: h.context, sreq: h.sreq, rreq: r.id, offset: r.rndvLen}, nil, nil)
	if r.rndvLen == 0 {
		r.complete(r.status, err)
	}
}

// onData copies one rendezvous block into its receive buffer.
func (d *Device) onData(from int32, h *header, payload []byte) {
	d.mu.Lock()
	r := d.rndvRecv[h.rreq]
	if r == nil || r.status.Source != int(from) {
		abandoned := d.abandonedLocked(h.rreq, int(from), uint64(len(payload)))
		d.mu.Unlock()
		if !abandoned {
			d.log.Warn("dropping data block for no pending receive", "from", from, "request", h.rreq)
		}
		return
	}
	want := r.rndvLen
	end := h.offset + uint64(len(payload))
	if end > want || end < h.offset {
		d.mu.Unlock()
		d.log.Warn("dropping data block outside the receive buffer", "from", from, "offset", h.offset, "len", len(payload), "expected", want)
		return
	}
	// Blocks cover disjoint ranges, so they copy without the matching
	// lock; blocks that came through different gateways copy concurrently.
	// Counted busy meanwhile, r does not complete, not even on failure,
	// until this copy is over.
	r.rndvBusy++
	d.mu.Unlock()
	copy(r.buf[h.offset:], payload)
	d.blockDone(r, uint64(len(payload)))
}

// cancelledStatus is what a cancelled receive reports.
var cancelledStatus = Status{Source: AnySource, Tag: AnyTag, Cancelled: true}

// Cancel cancels a receive that has not matched yet: it completes with
// ErrCanceled and Status.Cancelled set. A receive that already matched, and
// any send, completes normally (MPI allows a cancel to fail).
func (d *Device) Cancel(r *Request) {
	if r.send || r.state.Load()&reqPhase != reqPending {
		return
	}
	switch {
	case r.atSub >= 0:
		d.cancelHeld(d.subs[r.atSub], r.id, true, ErrCanceled)
	case r.claim != nil:
		if !r.claim.TryClaim(claimCancel) {
			return // a copy matched; it completes the request
		}
		d.mu.Lock()
		d.removePostedLocked(r)
		d.mu.Unlock()
		for _, idx := range d.matchers {
			d.subs[idx].matcher.CancelRecv(r.id)
		}
		r.complete(cancelledStatus, ErrCanceled)
	default:
		d.mu.Lock()
		removed := d.removePostedLocked(r)
		d.mu.Unlock()
		if removed {
			r.complete(cancelledStatus, ErrCanceled)
		}
	}
}

// Iprobe looks for a message that a receive with (src, tag, context) would
// match, without receiving it. A probe of one source that is lost, with
// no message of it left, fails with ErrPeerDown.
func (d *Device) Iprobe(src, tag int, context uint64) (Status, bool, error) {
	if err := d.checkRecv(src, tag); err != nil {
		return Status{}, false, err
	}
	if src == AnySource || d.matchSub[src] < 0 {
		probe := Request{peer: int32(src), tag: int32(tag), context: context}
		d.mu.Lock()
		for _, m := range d.unexpected.items() {
			if matches(&probe, &m.h) {
				st := Status{Source: int(m.h.src), Tag: int(m.h.tag), Count: int(m.h.length)}
				d.mu.Unlock()
				return st, true, nil
			}
		}
		d.mu.Unlock()
		// A lost source sends nothing more: a probe for it alone would
		// wait for ever.
		if src != AnySource {
			if err := d.peerErr(int32(src)); err != nil {
				return Status{}, false, err
			}
		}
	}
	subs := d.matchers
	if src != AnySource {
		subs = nil
		if m := d.matchSub[src]; m >= 0 {
			subs = []int{m}
		}
	}
	for _, idx := range subs {
		if env, ok := d.subs[idx].matcher.Probe(sdi.Rank(src), int32(tag), context); ok {
			return Status{Source: int(env.Source), Tag: int(env.Tag), Count: env.Len}, true, nil
		}
	}
	return Status{}, false, d.matchedSourceLost(src)
}

// matchedSourceLost is the error of a probe of src that found nothing
// when a matching subdevice carries src's messages: src's loss, if it is
// lost (what it sent before was found already), else nil. A probe of a
// source the device matches itself checks that before its subdevices.
func (d *Device) matchedSourceLost(src int) error {
	if src != AnySource && d.matchSub[src] >= 0 {
		return d.peerErr(int32(src))
	}
	return nil
}

// checkRecv checks the source and tag of a receive or probe.
func (d *Device) checkRecv(src, tag int) error {
	if d.closed.Load() {
		return ErrClosed
	}
	if src != AnySource && (src < 0 || src >= d.appSize) {
		return fmt.Errorf("%w: source %d not in [0,%d)", ErrRank, src, d.appSize)
	}
	if tag != AnyTag && (tag < 0 || tag > maxTag) {
		return fmt.Errorf("%w: %d (tags are 0..%d or AnyTag)", ErrTag, tag, maxTag)
	}
	return nil
}

// Message is a message that a matched probe (Improbe) took out of
// matching: no receive matches it any more, and only MrecvRequest
// receives it, once. It is what makes probe-then-receive safe when several
// goroutines receive from the same sources: between a plain probe and its
// receive another receive may take the message.
type Message struct {
	d *Device
	m atomic.Pointer[inMsg] // nil once received
}

// Improbe is Iprobe that also takes the message it finds out of matching
// and hands it over as a Message. A message a matching subdevice
// (sdi.FlagMatching) holds cannot be handed over: finding one, Improbe
// fails with an error wrapping errors.ErrUnsupported.
func (d *Device) Improbe(src, tag int, context uint64) (*Message, Status, bool, error) {
	if err := d.checkRecv(src, tag); err != nil {
		return nil, Status{}, false, err
	}
	if src == AnySource || d.matchSub[src] < 0 {
		probe := Request{peer: int32(src), tag: int32(tag), context: context}
		d.mu.Lock()
		for i, m := range d.unexpected.items() {
			if matches(&probe, &m.h) {
				d.unexpected.remove(i)
				d.mu.Unlock()
				msg := &Message{d: d}
				msg.m.Store(m)
				return msg, Status{Source: int(m.h.src), Tag: int(m.h.tag), Count: int(m.h.length)}, true, nil
			}
		}
		d.mu.Unlock()
		if src != AnySource {
			if err := d.peerErr(int32(src)); err != nil {
				return nil, Status{}, false, err
			}
		}
	}
	for _, idx := range d.matchers {
		if src != AnySource && idx != d.matchSub[src] {
			continue
		}
		if _, ok := d.subs[idx].matcher.Probe(sdi.Rank(src), int32(tag), context); ok {
			return nil, Status{}, false, fmt.Errorf("multidevice: matched probe: a message held by subdevice %q, which matches on its own: %w", d.subs[idx].name, errors.ErrUnsupported)
		}
	}
	// As Iprobe: or Mprobe would wait for a lost source for ever.
	return nil, Status{}, false, d.matchedSourceLost(src)
}

var (
	errReceived       = errors.New("multidevice: message already received")
	errForeignMessage = errors.New("multidevice: receive of a message this device did not probe")
)

// MrecvRequest starts receiving m into buf with r, a Request the caller
// owns (see IrecvRequest). It completes as a receive that matched m would:
// at once for a small message, once its data came for a large one.
func (d *Device) MrecvRequest(r *Request, m *Message, buf []byte) error {
	if m == nil || m.d != d {
		return errForeignMessage
	}
	if err := d.reuseRequest(r, false, 0); err != nil {
		return err
	}
	if err := d.mrecv(r, m, buf); err != nil {
		r.unstart()
		return err
	}
	return nil
}

// mrecv receives m into buf with r, a fresh receive request.
func (d *Device) mrecv(r *Request, m *Message, buf []byte) error {
	msg := m.m.Swap(nil)
	if msg == nil {
		return errReceived
	}
	r.peer, r.tag, r.context, r.buf = msg.h.src, msg.h.tag, msg.h.context, buf
	d.mu.Lock()
	// As irecv: Close marks the device closed before failAll sweeps the
	// receives under d.mu, and a large message's receive filed after
	// that sweep would wait for data nobody asks for any more.
	if d.closed.Load() {
		d.freeMsgLocked(msg)
		d.mu.Unlock()
		r.completeOwned(r.failStatus(), ErrClosed)
		return nil
	}
	d.deliverLocked(r, &msg.h, msg.data)
	d.freeMsgLocked(msg)
	d.mu.Unlock()
	return nil
}

// Mrecv receives m into buf, as MrecvRequest plus Wait. When ctx ends
// before a large message's data came, the receive is given up, as Recv's.
func (d *Device) Mrecv(ctx context.Context, m *Message, buf []byte) (Status, error) {
	if m == nil || m.d != d {
		return Status{}, errForeignMessage
	}
	r := d.getRequest(false, 0)
	if err := d.mrecv(r, m, buf); err != nil {
		d.putRequest(r)
		return Status{}, err
	}
	return d.waitRecv(ctx, r)
}

// HasMatchingSubDevices reports whether some loaded subdevice matches on its
// own, in which case probes must poll it.
func (d *Device) HasMatchingSubDevices() bool { return len(d.matchers) > 0 }
