package multidevice

import (
	"slices"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Place implements [sdi.Placer]: a subdevice that can move a payload
// straight into its final place (shm reads it from the sender's memory
// with process_vm_readv) asks here first. Two kinds of frames have a
// place in the user's buffer:
//
//   - a rendezvous data block addressed to this rank, from the source its
//     receive matched, for a receive still waiting for data, and lying
//     wholly inside the part of the buffer the receive asked for: the
//     slice at the block's offset. A truncated receive asked the sender
//     for no more than its buffer holds (rndvLen), so a block that fits is
//     written there and the receive still completes with ErrTruncated; one
//     that does not fit is never placed.
//   - an eager message straight from its source that is the next in its
//     sequence and matches a posted receive whose buffer holds it whole:
//     the receive is matched here, as it would be in the Deliver that
//     follows (placeEager).
//   - a forwarded block sent split (its inner header in the frame's
//     header) that wraps such a rendezvous data block for this rank and
//     has not arrived before (placeForwarded).
//
// Everything else gets nil and is delivered from the subdevice's buffer
// as before: ready-to-send frames, eager messages that arrive unexpected,
// out of order, for a duplicated ANY_SOURCE receive or for a buffer too
// short, forwarded blocks for another rank or not sent split, blocks for
// unknown requests, and blocks that would run past the receive's length.
//
// The slice stays valid until the Deliver that follows (or the placing
// subdevice's PeerDown): the request is not completed before its bytes
// are counted, they are counted only in that Deliver, and a receive that
// fails meanwhile (its source lost on another subdevice) completes only
// once no placed block of it is still being filled.
func (h *handler) Place(from sdi.Rank, hb []byte, n int) []byte {
	d := h.d
	// Cheap tests first: Place is called for every large frame.
	if n <= 0 || d.closed.Load() {
		return nil
	}
	if len(hb) == shortHeaderSize || len(hb) == headerSize && kind(hb[1]) == kindEager {
		return d.placeEager(h.sub, from, hb, n)
	}
	if len(hb) == 2*headerSize {
		return d.placeForwarded(h.sub, int32(from), hb, n)
	}
	if len(hb) != headerSize || kind(hb[1]) != kindSys {
		return nil
	}
	hdr, err := decodeHeader(hb, d.size)
	if err != nil || hdr.tag != sysData || hdr.dst != d.rank || hdr.src != int32(from) {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.placeDataLocked(placedBlock{sub: h.sub, off: hdr.offset}, hdr.rreq, hdr.src, n)
}

// placeDataLocked returns the place of a data block of n bytes at p.off
// for receive rreq from src, and records p as being filled; nil if that
// receive does not wait for such a block. d.mu must be held.
func (d *Device) placeDataLocked(p placedBlock, rreq uint64, src int32, n int) []byte {
	r := d.rndvRecv[rreq]
	if r == nil || r.status.Source != int(src) {
		return nil
	}
	end := p.off + uint64(n)
	if end < p.off || end > r.rndvLen {
		return nil
	}
	r.rndvBusy++
	p.r = r
	d.filling = append(d.filling, p)
	return r.buf[p.off:end:end]
}

// placeForwarded places the rendezvous data block inside a forwarded block
// sent split (hb: outer and inner header) for this rank, unless a copy of
// it (sent again after a trunk died) arrived before or is being placed by
// another subdevice. A copy that arrives while this one is being placed is
// kept aside, not written (stashLocked): the buffer has one writer at a
// time.
func (d *Device) placeForwarded(sub int, from int32, hb []byte, n int) []byte {
	f := &d.fwd
	if !f.ready.Load() {
		return nil
	}
	outer, err := decodeHeader(hb[:headerSize], d.size)
	if err != nil || outer.kind != kindSys || outer.tag != sysFwd || outer.dst != d.rank || outer.length != uint64(headerSize+n) {
		return nil
	}
	inner, err := decodeHeader(hb[headerSize:], d.size)
	if err != nil || inner.kind != kindSys || inner.tag != sysData || inner.src != outer.src || inner.dst != d.rank {
		return nil
	}
	// The line is checked under the matching lock, which onForward takes
	// only after it counted a copy as arrived: such a copy is either seen
	// here or finds this placement.
	d.mu.Lock()
	defer d.mu.Unlock()
	f.rxMu.Lock()
	l := &f.rx[outer.src]
	_, seen := l.above[outer.seq]
	seen = seen || outer.seq < l.cum
	f.rxMu.Unlock()
	if seen || d.placingLocked(outer.src, outer.seq) >= 0 {
		return nil
	}
	return d.placeDataLocked(placedBlock{sub: sub, off: inner.offset, fwd: true, via: from, seq: outer.seq}, inner.rreq, inner.src, n)
}

// placedBlock is a rendezvous data block that Place gave a slice of its
// receive's buffer: sub is filling it, and delivers it or reports the
// source down. Until then the receive counts it as busy (Request.rndvBusy)
// and does not complete, even if it fails meanwhile: the subdevice may
// still be writing into the buffer, which its owner could already reuse.
// A forwarded one (fwd) came from rank via as block seq of its line;
// stash holds another copy's data that arrived meanwhile.
type placedBlock struct {
	r     *Request
	sub   int
	off   uint64
	fwd   bool
	via   int32
	seq   uint64
	stash *[]byte
}

// placingLocked returns the index in filling of a placement of block seq
// of the line from src, or -1. d.mu must be held.
func (d *Device) placingLocked(src int32, seq uint64) int {
	return slices.IndexFunc(d.filling, func(p placedBlock) bool {
		return p.fwd && p.seq == seq && p.r.status.Source == int(src)
	})
}

// stashLocked keeps data, a copy of block seq of the line from src that
// another subdevice is placing, with that placement, and reports whether
// there is one. The placed copy counts when delivered; if its subdevice
// loses the peer instead, the stash is written (endPlacedForward). d.mu
// must be held.
func (d *Device) stashLocked(src int32, seq uint64, data []byte) bool {
	i := d.placingLocked(src, seq)
	if i < 0 {
		return false
	}
	if d.filling[i].stash == nil {
		p := getBlock(len(data))
		copy(*p, data)
		d.filling[i].stash = p
	}
	return true
}

// endPlacedForward ends a forwarded placement whose subdevice delivered
// payload (delivered) or lost the peer: the placed bytes count, or those
// of a copy stashed meanwhile, or, with neither, nothing does and the
// block comes again.
func (d *Device) endPlacedForward(p placedBlock, delivered bool, payload []byte) {
	switch {
	case delivered:
		d.filled(p.r, p.off, payload)
	case p.stash != nil:
		d.filled(p.r, p.off, *p.stash)
	default:
		d.blockDone(p.r, 0)
	}
	if p.stash != nil {
		putBlock(p.stash)
	}
}

// filled completes the accounting for a data block placed into r at off:
// a subdevice that delivers it from another buffer after all is copied
// from.
func (d *Device) filled(r *Request, off uint64, payload []byte) {
	place := r.buf[off:r.rndvLen]
	n := len(payload)
	if n > 0 && &payload[0] != &place[0] {
		n = copy(place, payload)
	}
	d.blockDone(r, uint64(min(n, len(place))))
}

// placedData completes the accounting for a data block that sub filled
// in place, and reports whether it was one. A subdevice that delivers it
// from another buffer after all is copied from. Anything else is left to
// onData.
func (d *Device) placedData(sub int, h *header, payload []byte) bool {
	d.mu.Lock()
	i := slices.IndexFunc(d.filling, func(p placedBlock) bool {
		return !p.fwd && p.sub == sub && p.off == h.offset && p.r.id == h.rreq && p.r.status.Source == int(h.src)
	})
	if i < 0 {
		d.mu.Unlock()
		return false
	}
	r := d.filling[i].r
	d.filling = slices.Delete(d.filling, i, i+1)
	d.mu.Unlock()
	d.filled(r, h.offset, payload)
	return true
}

// blockDone counts n bytes that a data block wrote into r's buffer and
// ends the block's busy count: r completes once it holds every byte it
// asked for, or, if it failed while blocks were being written, once the
// last of them is done.
func (d *Device) blockDone(r *Request, n uint64) {
	d.mu.Lock()
	r.rndvBusy--
	var done bool
	var st Status
	err := r.rndvFail
	if err != nil {
		done, st = r.rndvBusy == 0, r.failStatus()
		d.abandonedLocked(r.id, r.status.Source, n)
	} else {
		// Complete only once no block is being written any more: a
		// placement still open would write into a buffer its owner may
		// be reusing, and count into the request's next use.
		r.received += n
		if done = r.received == r.rndvLen && r.rndvBusy == 0; done {
			delete(d.rndvRecv, r.id)
			st, err = r.status, r.truncErr
		}
	}
	d.mu.Unlock()
	if done {
		r.complete(st, err)
	}
}

// failRndvLocked fails r, a rendezvous receive waiting for data, with err,
// and reports whether it can complete now; with blocks still being
// written into its buffer it completes when the last is done (blockDone).
func (d *Device) failRndvLocked(r *Request, err error) bool {
	delete(d.rndvRecv, r.id)
	if r.rndvFail == nil {
		r.rndvFail = err
	}
	return r.rndvBusy == 0
}

// abandonedRecv is a rendezvous receive given up (abandonRecv) while its
// sender was still sending: the data blocks still to come from src, left
// bytes of them, are dropped without a word.
type abandonedRecv struct {
	src  int
	left uint64
}

// abandonRecv gives up r, a rendezvous receive that matched but whose data
// has not all come, with err: blocks that come later are dropped instead
// of written into its buffer, which its owner has back as soon as r
// completes. That is when the blocks being written now are done (at once
// if none is). It reports whether r was such a receive; a receive that
// completed, or that a matching subdevice carries, is left alone.
func (d *Device) abandonRecv(r *Request, err error) bool {
	d.mu.Lock()
	if r.id == 0 || d.rndvRecv[r.id] != r {
		d.mu.Unlock()
		return false
	}
	if left := r.rndvLen - r.received; left > 0 {
		d.abandoned[r.id] = abandonedRecv{src: r.status.Source, left: left}
	}
	now := d.failRndvLocked(r, err)
	d.mu.Unlock()
	if now {
		r.complete(r.failStatus(), err)
	}
	return true
}

// abandonedLocked counts n bytes of a block for abandoned receive id from
// src that came or was being written, and reports whether it was one.
// d.mu must be held.
func (d *Device) abandonedLocked(id uint64, src int, n uint64) bool {
	a, ok := d.abandoned[id]
	if !ok || a.src != src {
		return false
	}
	if a.left <= n {
		delete(d.abandoned, id)
	} else {
		a.left -= n
		d.abandoned[id] = a
	}
	return true
}

// placedEager is an eager message matched by Place: its receive left the
// posted queue and its sequence number was taken, and it completes in the
// Deliver that follows the fill, or fails if sub reports the source down
// instead.
type placedEager struct {
	r   *Request
	sub int
	src int32
	seq uint64
}

// placeEager matches the eager message of header hb, n bytes from rank
// from, if it is the next from its source and a posted receive takes it
// whole, and returns that receive's buffer.
func (d *Device) placeEager(sub int, from sdi.Rank, hb []byte, n int) []byte {
	var h header
	if len(hb) == shortHeaderSize {
		if h.decodeShort(hb, int32(from), d.rank, d.size, n) != nil {
			return nil
		}
	} else {
		var err error
		if h, err = decodeHeader(hb, d.size); err != nil || h.kind != kindEager ||
			h.dst != d.rank || h.src != int32(from) || h.length != uint64(n) {
			return nil
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if h.seq != d.recvSeq[h.src] || len(d.ooo[h.src]) != 0 {
		return nil
	}
	for i, r := range d.posted.items() {
		if !matches(r, &h) {
			continue
		}
		// The receive the message matches, as matchLocked would find it.
		// A duplicated ANY_SOURCE receive must win its claim first and a
		// short buffer means truncation: both take the ordinary path.
		if r.claim != nil || len(r.buf) < n {
			return nil
		}
		d.posted.remove(i)
		d.recvSeq[h.src]++
		r.status.Source, r.status.Tag = int(h.src), int(h.tag) // for failStatus
		d.placing = append(d.placing, placedEager{r: r, sub: sub, src: h.src, seq: h.seq})
		return r.buf[:n:n]
	}
	return nil
}

// finishPlacedLocked completes the receive Place matched h to, if it did,
// and reports whether it did. The payload is the placed slice; a
// subdevice that filled another is copied from.
func (d *Device) finishPlacedLocked(h *header, payload []byte) bool {
	i := slices.IndexFunc(d.placing, func(p placedEager) bool { return p.src == h.src && p.seq == h.seq })
	if i < 0 || h.kind != kindEager {
		return false
	}
	r := d.placing[i].r
	d.placing = slices.Delete(d.placing, i, i+1)
	n := len(payload)
	if len(payload) > 0 && &payload[0] != &r.buf[0] {
		n = copy(r.buf, payload)
	}
	if h.flags&flagSync != 0 {
		d.sendSys(h.src, header{tag: sysAck, context: h.context, sreq: h.sreq}, nil, nil)
	}
	r.completeOwned(Status{Source: int(h.src), Tag: int(h.tag), Count: n}, nil)
	return true
}

// failPlaced fails the receives of messages from peer that sub placed
// and will not deliver, since it reported peer down: eager messages, and
// rendezvous receives that a placed block will now never complete.
func (d *Device) failPlaced(sub int, peer sdi.Rank, err error) {
	d.mu.Lock()
	var failed []*Request
	d.placing = slices.DeleteFunc(d.placing, func(p placedEager) bool {
		if p.sub == sub && p.src == int32(peer) {
			failed = append(failed, p.r)
			return true
		}
		return false
	})
	var dropped []placedBlock
	d.filling = slices.DeleteFunc(d.filling, func(p placedBlock) bool {
		switch {
		case p.fwd:
			// The block comes again if its line survives (else the
			// line's failure fails the receive), or came already.
			if p.sub != sub || p.via != int32(peer) {
				return false
			}
			dropped = append(dropped, p)
			return true
		case p.sub != sub || p.r.status.Source != int(peer):
			return false
		}
		p.r.rndvBusy--
		if d.failRndvLocked(p.r, err) {
			failed = append(failed, p.r)
		}
		return true
	})
	d.mu.Unlock()
	for _, p := range dropped {
		d.endPlacedForward(p, false, nil)
	}
	for _, r := range failed {
		if r.rndvFail != nil { // it left every queue: nobody else writes it
			r.complete(r.failStatus(), r.rndvFail)
		} else {
			r.complete(r.failStatus(), err)
		}
	}
}
