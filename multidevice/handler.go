package multidevice

import (
	"fmt"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// handler is the sdi.Handler given to subdevice sub. Its methods run on the
// subdevice's goroutines; they never block and never call into a subdevice
// (replies go through the outbox).
type handler struct {
	d   *Device
	sub int
}

func (h *handler) Deliver(from sdi.Rank, hb, payload []byte) {
	d := h.d
	if d.closed.Load() {
		return
	}
	if len(hb) == shortHeaderSize {
		// An eager message straight from its source: addressed to this
		// rank and as long as its payload by construction.
		if err := d.arriveShort(int32(from), hb, payload); err != nil {
			d.log.Warn("dropping malformed frame", "subdevice", d.subs[h.sub].name, "from", from, "error", err)
		}
		return
	}
	if len(hb) == 2*headerSize {
		// A forwarded block sent split: its inner header follows the
		// outer one (outFrame.setBlock).
		hdr, err := decodeHeader(hb[:headerSize], d.size)
		if err == nil && (hdr.kind != kindSys || hdr.tag != sysFwd) {
			err = fmt.Errorf("%w: a %s frame with a %d-byte header", errBadHeader, hdr.kind, len(hb))
		}
		if err != nil {
			d.log.Warn("dropping malformed frame", "subdevice", d.subs[h.sub].name, "from", from, "error", err)
			return
		}
		d.onIndirect(h.sub, int32(from), &hdr, hb[headerSize:], payload)
		return
	}
	hdr, err := decodeHeader(hb, d.size)
	if err != nil {
		d.log.Warn("dropping malformed frame", "subdevice", d.subs[h.sub].name, "from", from, "error", err)
		return
	}
	if hdr.kind == kindSys && (hdr.tag == sysFwd || hdr.tag == sysCredit || hdr.tag == sysLost) {
		// forward.go: may be for another rank. A block's payload
		// begins with its inner header; Place placed none of this form.
		inner, data := payload[:min(len(payload), headerSize)], payload[min(len(payload), headerSize):]
		d.onIndirect(-1, int32(from), &hdr, inner, data)
		return
	}
	if hdr.dst != d.rank || hdr.src != int32(from) {
		d.log.Warn("dropping frame not addressed to this rank", "subdevice", d.subs[h.sub].name,
			"from", from, "source", hdr.src, "destination", hdr.dst)
		return
	}
	if hdr.kind == kindSys && hdr.tag == sysData && d.placedData(h.sub, &hdr, payload) {
		return // Place put it into the receive buffer (place.go)
	}
	d.dispatch(&hdr, payload)
}

// dispatch handles a frame addressed to this rank, arrived directly or
// unwrapped from a forwarded block.
func (d *Device) dispatch(hdr *header, payload []byte) {
	if hdr.kind == kindEager && uint64(len(payload)) != hdr.length {
		d.log.Warn("dropping eager frame whose payload disagrees with its header", "from", hdr.src, "payload", len(payload), "length", hdr.length)
		return
	}
	switch hdr.kind {
	case kindEager, kindRTS:
		d.arrive(hdr, payload)
	case kindSys:
		// A switch, not a table of funcs: a call through a func value would
		// make hdr escape to the heap on every frame.
		switch hdr.tag {
		case sysCTS:
			d.onCTS(hdr.src, hdr, payload)
		case sysData:
			d.onData(hdr.src, hdr, payload)
		case sysAck:
			d.onAck(hdr.src, hdr, payload)
		default:
			d.log.Warn("dropping system message of unknown kind", "from", hdr.src, "tag", hdr.tag)
		}
	}
}

func (h *handler) SendDone(token uint64, err error) {
	h.d.finishToken(token, err)
	h.d.out.freed()
}

func (h *handler) PeerDown(peer sdi.Rank, err error) {
	d := h.d
	if d.closed.Load() || int(peer) < 0 || int(peer) >= d.size {
		return
	}
	if !d.finalizing.Load() && d.carries(int(peer), h.sub) && d.down[peer].Load() == nil {
		// A loss the device takes (see lostOver), told before anything
		// fails for it, unless a failed frame told it (frameLost).
		d.reportLost(h.sub, int(peer), err)
	}
	// Eager messages it placed will not come: their receives fail, even
	// on a subdevice the routes no longer use.
	d.failPlaced(h.sub, peer, fmt.Errorf("%w: rank %d over %q: %v", ErrPeerDown, peer, d.subs[h.sub].name, err))
	if d.isRelay {
		d.relayPeerGone(int(peer))
	}
	if d.finalizing.Load() {
		d.log.Debug("peer closed its links after finalize", "peer", peer, "subdevice", d.subs[h.sub].name)
		return
	}
	d.lostOver(h.sub, int(peer), err)
}

// lostOver is what the loss of peer over subdevice sub fails, whether the
// subdevice reported it (PeerDown) or the device inferred it from a failed
// frame (frameLost). Only the subdevice's own report ends what it places
// (failPlaced): a subdevice whose send side failed may well still be
// writing into a receive buffer, and the message may still arrive.
func (d *Device) lostOver(sub, peer int, err error) {
	// A trunk lost (a gateway, or the peer on a failover route): its
	// blocks go through the other trunks (trunk.go).
	d.trunkDown(int32(peer), sub, err)
	name := d.subs[sub].name
	// A subdevice that carries none of this peer's direct routes losing it
	// is no loss here; trunkDown failed the line if it was one.
	if !d.carries(peer, sub) {
		d.log.Debug("peer down on an unused subdevice", "peer", peer, "subdevice", name, "error", err)
		return
	}
	d.log.Warn("peer down", "peer", peer, "subdevice", name, "error", err)
	d.failPeer(peer, err, fmt.Errorf("%w: rank %d over %q: %v", ErrPeerDown, peer, name, err))
}

// carries reports whether subdevice sub carries one of peer's direct
// routes.
func (d *Device) carries(peer, sub int) bool {
	for ci, idx := range d.routes[peer] {
		if idx == sub && !d.indirect(int32(peer), ci) {
			return true
		}
	}
	return false
}

// dropAcksLocked takes the synchronous sends that keep reports true for
// out of d.syncSend: the acknowledgements they wait for will not come.
// Whoever takes a send out of d.syncSend (onAck, dropAck, this) counts
// its acknowledgement, once.
func (d *Device) dropAcksLocked(keep func(*Request) bool) []*Request {
	var acks []*Request
	for id, r := range d.syncSend {
		if keep(r) {
			acks = append(acks, r)
			delete(d.syncSend, id)
		}
	}
	return acks
}

// failAcks fails the sends dropAcksLocked took and counts their
// acknowledgements, so that each is reusable once its frame is done too.
// The count is the last touch: its owner may reuse it at once.
func failAcks(acks []*Request, err error) {
	for _, r := range acks {
		r.complete(Status{}, err)
		r.frameDone(nil)
	}
}

// failPeer records that peer is lost (why, for later sends) and fails every
// request that depends on it with cause.
func (d *Device) failPeer(peer int, why, cause error) {
	d.down[peer].Store(&why)
	d.mu.Lock()
	var failed []*Request
	for id, r := range d.rndvSend {
		if r.peer == int32(peer) {
			failed = append(failed, r)
			delete(d.rndvSend, id)
		}
	}
	acks := d.dropAcksLocked(func(r *Request) bool { return r.peer == int32(peer) })
	for _, r := range d.rndvRecv {
		if r.status.Source == peer && d.failRndvLocked(r, cause) {
			failed = append(failed, r)
		}
	}
	for id, a := range d.abandoned {
		if a.src == peer { // the rest of its data will never come
			delete(d.abandoned, id)
		}
	}
	for i := 0; i < len(d.posted.items()); {
		if r := d.posted.items()[i]; r.peer == int32(peer) {
			failed = append(failed, r)
			d.posted.remove(i)
			continue
		}
		i++
	}
	// Receives a matching subdevice holds: only it can give them back,
	// and only those it still has not matched fail (what the peer sent
	// before is received). postHeld cancels those it posts after this.
	type heldRecv struct {
		s  *subdev
		id uint64
	}
	var held []heldRecv
	for id, r := range d.held {
		if r.peer == int32(peer) {
			held = append(held, heldRecv{d.subs[r.atSub], id})
		}
	}
	d.mu.Unlock()
	for _, r := range failed {
		r.complete(r.failStatus(), cause)
	}
	failAcks(acks, cause)
	for _, h := range held {
		// Handler callbacks must not call into a subdevice: go through the engine.
		d.out.push(outItem{fn: func() { d.cancelHeld(h.s, h.id, false, cause) }})
	}
	// Probes waiting for the peer fail now (Iprobe reports the loss), but
	// only look again when something changes.
	d.notifyAll()
}
