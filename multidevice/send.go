package multidevice

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// System message tags (negative, never visible to applications).
const (
	sysCTS  int32 = -1 // rendezvous clear-to-send: rreq, sreq, offset = receiver capacity
	sysData int32 = -2 // rendezvous data block at offset for rreq
	sysAck  int32 = -3 // synchronous eager send matched: sreq
)

// Isend starts sending buf to world rank dst with tag on context. With sync
// set it completes only after the receiver matched the message (Ssend). The
// caller must not modify buf until the request completes.
func (d *Device) Isend(buf []byte, dst, tag int, context uint64, sync bool) (*Request, error) {
	return d.isend(d.newRequest(true, int32(dst)), buf, dst, tag, context, sync)
}

// isend starts r, a fresh send request for dst.
func (d *Device) isend(r *Request, buf []byte, dst, tag int, context uint64, sync bool) (*Request, error) {
	if d.closed.Load() {
		return nil, ErrClosed
	}
	if dst < 0 || dst >= d.appSize {
		return nil, fmt.Errorf("%w: destination %d not in [0,%d)", ErrRank, dst, d.appSize)
	}
	if tag < 0 || tag > maxTag {
		return nil, fmt.Errorf("%w: %d (tags are 0..%d)", ErrTag, tag, maxTag)
	}
	if err := d.peerErr(int32(dst)); err != nil {
		return nil, err
	}
	if m := d.matchSub[dst]; m >= 0 {
		r.arm()
		return r, d.sendTagged(r, d.subs[m], buf, tag, context, sync)
	}
	class := d.table.Class(len(buf))
	s := d.subs[d.routes[dst][class]]
	seq := d.lanes[dst].next()
	if len(buf) <= d.eagerMax(int32(dst), class, s) {
		of := r.eagerFrame()
		if !sync && !d.indirect(int32(dst), class) && !d.out.behind(int32(dst)) {
			of.setShort(int32(dst), int32(tag), context, seq, buf)
			complete, err := s.sd.Send(&of.f)
			if err == nil && complete {
				// Done at once (shm copied it): nobody has seen r yet, so
				// it completes without the frame accounting's atomics.
				s.sent[dst].add(len(buf))
				recycleFrame(of)
				r.completeUnseen()
				return r, nil
			}
			// A SendDone that comes before sent registers the frame
			// waits for it (see register), so these may follow Send.
			r.arm()
			r.pending.Store(1)
			of.req = r
			d.sent(s, of, complete, err, true)
			return r, nil
		}
		var h header
		d.envelope(&h, kindEager, dst, tag, context, seq, len(buf))
		of.req = r
		r.arm()
		if !sync {
			r.pending.Store(1)
		} else {
			h.flags |= flagSync
			r.pending.Store(2) // the frame and the acknowledgement
			r.id = d.nextID.Add(1)
			h.sreq = r.id
			d.mu.Lock()
			d.syncSend[r.id] = r
			d.mu.Unlock()
		}
		of.set(int32(dst), &h, buf)
		of.numbered = true
		d.post(int32(dst), class, len(buf), of, true)
		return r, nil
	}
	// Rendezvous: announce, send data on clear-to-send. A rendezvous send is
	// synchronous by nature: the receiver has matched before data moves.
	var h header
	d.envelope(&h, kindRTS, dst, tag, context, seq, len(buf))
	r.arm()
	r.buf = buf
	r.id = d.nextID.Add(1)
	h.sreq = r.id
	d.mu.Lock()
	d.rndvSend[r.id] = r
	d.mu.Unlock()
	of := d.frame(int32(dst), &h, nil)
	of.numbered = true
	id := r.id // not r: a pooled request may be reused before a late failure
	of.done = func(err error) {
		if err == nil {
			return
		}
		d.mu.Lock()
		r := d.rndvSend[id]
		delete(d.rndvSend, id)
		d.mu.Unlock()
		if r != nil {
			r.complete(Status{}, err)
		}
	}
	d.post(int32(dst), class, len(buf), of, true)
	return r, nil
}

// envelope fills h, zero, for a message of kind k and n bytes from this
// rank to dst. Field by field, not h = header{...}: the literal was built
// on the stack and copied in 16-byte moves that waited for the narrower
// stores before them (a store-forwarding stall; see decodeShort).
func (d *Device) envelope(h *header, k kind, dst, tag int, context, seq uint64, n int) {
	h.kind, h.tag, h.src, h.dst, h.context, h.seq, h.length = k, int32(tag), d.rank, int32(dst), context, seq, uint64(n)
}

// maxTag is the largest application tag (MPI_TAG_UB).
const maxTag = 1<<31 - 1

func (d *Device) peerErr(peer int32) error {
	if err := d.down[peer].Load(); err != nil {
		if errors.Is(*err, ErrPeerDown) { // a line that failed says so itself
			return *err
		}
		return fmt.Errorf("%w: rank %d: %v", ErrPeerDown, peer, *err)
	}
	return nil
}

// outFrame is an outbound frame with its header storage and what to do
// when it completes. Frames are pooled, or embedded in the request they
// belong to: sending one costs no allocation.
type outFrame struct {
	f sdi.Frame
	// hb holds the header; a forwarded block sent split (setBlock) puts
	// its inner header in the second half.
	hb [2 * headerSize]byte
	// On completion: req.frameDone if req is set, else done if set, else a
	// failure is logged (system messages nobody waits for).
	req  *Request
	done func(error)
	// trunk, if set (sub non-nil), is the trunk of a line this frame
	// goes through, carrying block blk or a credit: on completion,
	// Device.trunkSent (credit.go).
	blk   *block
	trunk trunk
	// sub is the subdevice that kept or failed the frame (set by sent
	// and sendTagged only then: a frame done at once needs none): a
	// failure is its loss of the peer (frameLost).
	sub *subdev
	// numbered: the frame carries a message of this rank's numbered
	// stream to f.Peer (eager, short or ready-to-send), which the peer
	// matches in order. passed: a gateway passes it on for other ranks
	// (passOn).
	numbered bool
	passed   bool
	pooled   bool
}

var framePool = sync.Pool{New: func() any { return &outFrame{pooled: true} }}

// ownFrame returns a frame for a request to keep: one taken from the pool
// for good, so that it is never put back while the request holds it.
func ownFrame() *outFrame {
	of := framePool.Get().(*outFrame)
	of.pooled = false
	return of
}

// eagerFrame returns the frame for r's one eager frame: its own if it has
// one (it is done before r completes), else a pooled one.
func (r *Request) eagerFrame() *outFrame {
	if r.of != nil {
		return r.of
	}
	return framePool.Get().(*outFrame)
}

// frame builds a pooled outbound frame.
func (d *Device) frame(peer int32, h *header, payload []byte) *outFrame {
	of := framePool.Get().(*outFrame)
	of.set(peer, h, payload)
	return of
}

// set fills in the frame's header and payload for peer.
func (of *outFrame) set(peer int32, h *header, payload []byte) {
	h.put(of.hb[:headerSize])
	of.f = sdi.Frame{Peer: sdi.Rank(peer), Header: of.hb[:headerSize], Payload: payload, Token: of.token()}
}

// setBlock fills in the frame that carries a forwarded block to peer
// under the outer header h: its inner header and data, and whole, the two
// in one buffer, or nil when they lie apart (data still in the
// application's buffer). Split, the frame's header is the outer header
// followed by the inner one and its payload the data alone, so a
// receiver can place it (Place); a block with no whole buffer always
// goes split. Otherwise the payload is whole.
func (of *outFrame) setBlock(peer int32, h *header, inner, data, whole []byte, split bool) {
	h.put(of.hb[:headerSize])
	if split || whole == nil {
		copy(of.hb[headerSize:], inner)
		of.f = sdi.Frame{Peer: sdi.Rank(peer), Header: of.hb[:], Payload: data, Token: of.token()}
		return
	}
	of.f = sdi.Frame{Peer: sdi.Rank(peer), Header: of.hb[:headerSize], Payload: whole, Token: of.token()}
}

// setShort fills in the frame of a standard-mode eager message that goes
// straight to peer, with the short header.
func (of *outFrame) setShort(peer int32, tag int32, context, seq uint64, payload []byte) {
	putShort(of.hb[:], tag, context, seq)
	// Field by field, not of.f = sdi.Frame{...}: see header.decodeShort.
	of.f.Peer, of.f.Header, of.f.Payload, of.f.Token = sdi.Rank(peer), of.hb[:shortHeaderSize], payload, of.token()
	of.numbered = true
}

// token is the frame's address: unique among the frames in flight, which
// is all a token must be (it finds the frame at SendDone), and free where
// a counter would cost an atomic per frame.
func (of *outFrame) token() uint64 { return uint64(uintptr(unsafe.Pointer(of))) }

// finishFrame runs a frame's completion and recycles it.
func (d *Device) finishFrame(of *outFrame, err error) {
	req, done, peer, blk, t, s, passed := of.req, of.done, of.f.Peer, of.blk, of.trunk, of.sub, of.passed
	recycleFrame(of)
	lost := false
	if err != nil && t.sub == nil {
		err = peerLost(err)
		switch {
		case s == nil: // not failed by a subdevice: at Close, or a lost peer's queued frame
		case passed:
			// The trunk to the next hop failed under a frame passed on:
			// nextHop picks another, for this frame (its done) too, as
			// after the subdevice's PeerDown. Finalizing too: a relay
			// passes frames on from inside its Close, until the job's
			// last rank has closed.
			// A frame too large for the next hop's subdevice is not
			// the link's end: the block was cut for the source's first
			// hop (its done tells the source, lost.go).
			if !d.closed.Load() && !errors.Is(err, sdi.ErrTooLarge) {
				d.trunkDown(int32(peer), s.idx, err)
			}
		case errors.Is(err, sdi.ErrTooLarge):
			// A tagged message too large for its matching subdevice,
			// refused in its SendDone: not the link's end either.
		default:
			lost = d.frameLost(s, peer, err)
			// Whoever marked it (this frame, another failing with it,
			// the subdevice's PeerDown), one event has one error.
			if d.down[peer].Load() != nil && !errors.Is(err, ErrPeerDown) {
				err = fmt.Errorf("%w: %w", ErrPeerDown, err)
			}
		}
	}
	switch {
	case t.sub != nil:
		d.trunkSent(t, blk, err)
	case req != nil:
		// Before frameDone: once that completes req, its owner may
		// reuse it.
		ack := err != nil && d.dropAck(req)
		req.frameDone(err)
		if ack {
			req.frameDone(nil)
		}
	case done != nil:
		done(err)
	case err != nil:
		d.log.Warn("system message failed", "peer", peer, "error", err)
	}
	if lost {
		// What else waits for the peer fails now; this frame's own
		// request got the frame's error, which says more.
		d.lostOver(s.idx, int(peer), err)
	}
}

// frameLost takes a frame that s failed, other than at Close, as s's
// report that it lost peer, whether or not s also calls PeerDown (the SDI
// does not require it): the frame took a sequence number that peer now
// waits for, so every later message to it would arrive, stay unmatched
// behind the gap, and yet count as sent here. It marks the peer down
// before the frame's request completes, so that a caller who sends again
// on the failure finds it down, and reports whether it did; the caller
// then fails the rest through lostOver.
func (d *Device) frameLost(s *subdev, peer sdi.Rank, err error) bool {
	if d.closed.Load() || d.finalizing.Load() || !d.carries(int(peer), s.idx) {
		return false
	}
	if !d.down[peer].CompareAndSwap(nil, &err) {
		return false
	}
	d.reportLost(s.idx, int(peer), err) // before the caller fails anything
	return true
}

// dropAck stops r, a synchronous eager send whose frame failed, from
// waiting for the acknowledgement that frame would have brought: it
// reports whether r still waited for one (an acknowledgement that came
// anyway, for a frame that arrived before its link failed, took it
// first).
func (d *Device) dropAck(r *Request) bool {
	if r.id == 0 {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.syncSend[r.id] != r {
		return false
	}
	delete(d.syncSend, r.id)
	return true
}

// peerLost makes a subdevice's report that it lost the peer of a frame
// (sdi.ErrPeerUnreachable) an ErrPeerDown as well: a Send or SendDone
// can report the loss before the subdevice's PeerDown reaches the device
// and marks the peer down, and a caller should not have to test two
// errors for one event depending on which came first.
func peerLost(err error) error {
	if errors.Is(err, sdi.ErrPeerUnreachable) && !errors.Is(err, ErrPeerDown) {
		return fmt.Errorf("%w: %w", ErrPeerDown, err)
	}
	return err
}

// recycleFrame puts a pooled frame back, dropping what it points to (the
// header bytes are overwritten by the next use); a request's own frame
// only lets go of the payload.
func recycleFrame(of *outFrame) {
	of.f.Payload, of.req, of.done, of.blk, of.trunk, of.sub = nil, nil, nil, nil, trunk{}, nil
	of.numbered, of.passed = false, false
	if of.pooled {
		framePool.Put(of)
	}
}

// trySend sends of now, or queues it on the outbox when the subdevice would
// block or frames to the same peer wait there already (direct=true), or
// when called from the engine (direct=false), in which case it reports
// whether the frame left the queue.
//
// A frame the subdevice completes at once (done=true, as shm does) touches
// no shared state here. One it keeps is registered by token afterwards;
// its SendDone may come first, from another goroutine, and then waits in
// early until the registration finds it.
func (d *Device) trySend(s *subdev, of *outFrame, direct bool) bool {
	if direct && d.out.behind(int32(of.f.Peer)) {
		d.out.push(outItem{sub: s, frame: of})
		return false
	}
	// A numbered frame queued before its peer was lost would otherwise
	// go out, and wait there unmatched behind the message the loss took.
	// Others go: an acknowledgement or a block of data a peer still
	// waits for crosses a link that works, and a subdevice whose link is
	// dead fails them itself.
	if of.numbered { // never a trunk's: lines send blocks (blockFrame)
		if err := d.peerErr(int32(of.f.Peer)); err != nil {
			d.finishFrame(of, err)
			return true
		}
	}
	complete, err := s.sd.Send(&of.f)
	return d.sent(s, of, complete, err, direct)
}

// sent does what trySend does once the subdevice's Send returned.
func (d *Device) sent(s *subdev, of *outFrame, complete bool, err error, direct bool) bool {
	switch {
	case err == nil:
		s.sent[of.f.Peer].add(len(of.f.Payload))
		if complete {
			d.finishFrame(of, nil)
		} else {
			of.sub = s
			d.register(of)
		}
		return true
	case errors.Is(err, sdi.ErrWouldBlock):
		if direct {
			d.out.push(outItem{sub: s, frame: of})
		}
		return false
	default:
		of.sub = s
		d.finishFrame(of, fmt.Errorf("multidevice: send to rank %d over %q: %w", of.f.Peer, s.name, err))
		return true
	}
}

// sendNow is the blocking Send of a standard-mode eager message that goes
// straight to its destination. When the subdevice takes the frame at once
// (shm copies it into its ring) no request is involved: no pool, no
// completion, none of their atomics; a sender that holds the peer's lane
// (lane.go) uses its frame and counts there. When the subdevice keeps or
// refuses the frame, a request waits for it as Isend's would. It reports
// false, having done nothing, for any other message (and for bad
// arguments, which isend reports).
func (d *Device) sendNow(ctx context.Context, buf []byte, dst, tag int, context uint64) (bool, error) {
	if d.closed.Load() || uint(dst) >= uint(d.appSize) || uint(tag) > maxTag || d.down[dst].Load() != nil {
		return false, nil
	}
	l := &d.lanes[dst]
	s := l.sub
	if len(buf) > l.short {
		// Not in the lane's class: the route by size, as isend finds it.
		if d.matchSub[dst] >= 0 {
			return false, nil
		}
		class := d.table.Class(len(buf))
		if d.indirect(int32(dst), class) {
			return false, nil
		}
		s = d.subs[d.routes[dst][class]]
		if len(buf) > s.caps.MaxEager {
			return false, nil
		}
	}
	if d.out.behind(int32(dst)) {
		return false, nil
	}
	seq, held := l.hold(1)
	var of *outFrame
	switch {
	case !held:
		seq = l.next()
		of = framePool.Get().(*outFrame)
	case l.of == nil:
		of = framePool.Get().(*outFrame)
		l.of = of
	default:
		of = l.of
	}
	of.setShort(int32(dst), int32(tag), context, seq, buf)
	complete, err := s.sd.Send(&of.f)
	if held {
		if err == nil && complete {
			if s == l.sub {
				l.frames++
				l.bytes += uint64(len(buf))
			} else {
				s.sent[dst].add(len(buf))
			}
			of.f.Payload = nil
			l.release()
			return true, nil
		}
		l.of = nil // the subdevice or the request below has it now
		l.release()
	} else if err == nil && complete {
		s.sent[dst].add(len(buf))
		recycleFrame(of)
		return true, nil
	}
	// Refused, the frame waits in the outbox for as long as the peer
	// does not make room: from a copy when ctx can end, so that the
	// caller has buf back then (see Send).
	copied := err != nil && ctx.Done() != nil
	if copied {
		of.f.Payload = slices.Clone(buf)
	}
	r := d.getRequest(true, int32(dst))
	r.pending.Store(1)
	of.req = r
	d.sent(s, of, complete, err, true)
	if _, err = r.Wait(ctx); err != nil && !r.isDone() && !copied {
		d.giveBackBuf(r)
	}
	d.putRequest(r)
	return true, err
}

// register files a frame the subdevice still owns under its token, or
// completes it if its SendDone already came.
func (d *Device) register(of *outFrame) {
	d.tokMu.Lock()
	if err, ok := d.early[of.f.Token]; ok {
		delete(d.early, of.f.Token)
		d.tokMu.Unlock()
		d.finishFrame(of, err)
		return
	}
	d.tokens[of.f.Token] = of
	d.tokMu.Unlock()
}

// finishToken completes the frame registered under token, once; a token
// not registered yet is remembered for register.
func (d *Device) finishToken(token uint64, err error) {
	d.tokMu.Lock()
	of := d.tokens[token]
	if of == nil {
		d.early[token] = err
		d.tokMu.Unlock()
		return
	}
	delete(d.tokens, token)
	d.tokMu.Unlock()
	d.finishFrame(of, err)
}

// sendSys queues a system message. It is used from handler callbacks, which
// must not call into a subdevice, so it always goes through the engine.
func (d *Device) sendSys(peer int32, h header, payload []byte, done func(error)) {
	h.kind = kindSys
	h.src, h.dst = d.rank, peer
	of := d.frame(peer, &h, payload)
	of.done = done
	d.post(peer, d.table.Class(len(payload)), len(payload), of, false)
}

// sendTagged sends through a subdevice that matches on its own.
func (d *Device) sendTagged(r *Request, s *subdev, buf []byte, tag int, context uint64, sync bool) error {
	r.pending.Store(1)
	of := r.eagerFrame()
	of.f, of.req = sdi.Frame{Peer: sdi.Rank(r.peer), Token: of.token()}, r // Peer: whom a failure loses (finishFrame)
	m := &sdi.TaggedMessage{Peer: sdi.Rank(r.peer), Tag: int32(tag), Context: context, Payload: buf, Sync: sync, Token: of.f.Token}
	for {
		complete, err := s.matcher.SendTagged(m)
		switch {
		case err == nil:
			s.sent[r.peer].add(len(buf))
			if complete {
				d.finishFrame(of, nil)
			} else {
				of.sub = s // its failure is s's loss of the peer (frameLost)
				d.register(of)
			}
			return nil
		case errors.Is(err, sdi.ErrWouldBlock):
			<-d.out.backoff()
		case errors.Is(err, sdi.ErrTooLarge):
			// The message's size, not the link's end: the peer stays.
			return fmt.Errorf("multidevice: send to rank %d over %q: %w", r.peer, s.name, err)
		default:
			// A failed send is the subdevice's loss of the peer, as a
			// failed frame is (frameLost), reported before anything
			// fails for it.
			err = peerLost(fmt.Errorf("multidevice: send to rank %d over %q: %w", r.peer, s.name, err))
			if d.frameLost(s, sdi.Rank(r.peer), err) {
				d.lostOver(s.idx, int(r.peer), err)
			}
			return err
		}
	}
}

// onCTS runs at the sender when the receiver matched a rendezvous message.
func (d *Device) onCTS(from int32, h *header, _ []byte) {
	r := d.takeSend(d.rndvSend, h.sreq, from, "clear-to-send")
	if r == nil {
		return
	}
	n := uint64(len(r.buf))
	if h.offset < n {
		n = h.offset // the receiver's buffer is shorter: it reports truncation
	}
	class := d.table.Class(len(r.buf))
	chunk := uint64(d.chunk(from, class, d.subs[d.routes[from][class]]))
	blocks := int32((n + chunk - 1) / chunk)
	if blocks == 0 {
		r.complete(Status{}, nil)
		return
	}
	r.pending.Store(blocks)
	for off := uint64(0); off < n; off += chunk {
		end := min(off+chunk, n)
		dh := header{kind: kindSys, tag: sysData, src: d.rank, dst: from, context: h.context, length: uint64(len(r.buf)), sreq: r.id, rreq: h.rreq, offset: off}
		of := d.frame(from, &dh, r.buf[off:end])
		of.req = r
		d.post(from, class, len(r.buf), of, false)
	}
}

// onAck runs at the sender of a synchronous eager message once it matched.
func (d *Device) onAck(from int32, h *header, _ []byte) {
	if r := d.takeSend(d.syncSend, h.sreq, from, "acknowledgement"); r != nil {
		r.frameDone(nil)
	}
}

// takeSend removes and returns the send waiting in m under id, if it went to
// from; a control message for anything else is dropped with a warning.
func (d *Device) takeSend(m map[uint64]*Request, id uint64, from int32, what string) *Request {
	d.mu.Lock()
	r := m[id]
	if r != nil && r.peer == from {
		delete(m, id)
	} else {
		r = nil
	}
	d.mu.Unlock()
	if r == nil {
		d.log.Warn("dropping "+what+" for no pending send", "from", from, "request", id)
	}
	return r
}
