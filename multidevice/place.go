package multidevice

import "github.com/hpc-multidevice/multidevice/sdi"

// Place implements [sdi.Placer]: a subdevice that can move a payload
// straight into its final place (shm reads it from the sender's memory
// with process_vm_readv) asks here first. Only a rendezvous data block
// addressed to this rank, from the source its receive matched, for a
// receive still waiting for data, and lying wholly inside the part of the
// buffer the receive asked for has a place: the slice of the user's buffer
// at the block's offset. Everything else gets nil and is delivered from
// the subdevice's buffer as before: eager messages and ready-to-send
// frames (not matched yet), forwarded blocks (they may be for another rank
// and are unwrapped first), blocks for unknown requests, and blocks that
// would run past the receive's length. A truncated receive asked the
// sender for no more than its buffer holds (rndvLen), so a block that
// fits is written there and the receive still completes with
// ErrTruncated; one that does not fit is never placed.
//
// The slice stays valid until the Deliver that follows: the request is
// not completed before all its bytes are counted, and they are counted
// only in that Deliver.
func (h *handler) Place(from sdi.Rank, hb []byte, n int) []byte {
	d := h.d
	// Cheap tests first: Place is called for every large frame.
	if n <= 0 || len(hb) != headerSize || kind(hb[1]) != kindSys || d.closed.Load() {
		return nil
	}
	hdr, err := decodeHeader(hb, d.size)
	if err != nil || hdr.tag != sysData || hdr.dst != d.rank || hdr.src != int32(from) {
		return nil
	}
	r := d.rndvWaiting(&hdr)
	if r == nil {
		return nil
	}
	end := hdr.offset + uint64(n)
	if end < hdr.offset || end > r.rndvLen {
		return nil
	}
	return r.buf[hdr.offset:end:end]
}

// rndvWaiting returns the rendezvous receive a data block is for, if it
// still waits for data from the block's source.
func (d *Device) rndvWaiting(h *header) *Request {
	d.mu.Lock()
	r := d.rndvRecv[h.rreq]
	d.mu.Unlock()
	if r == nil || r.status.Source != int(h.src) {
		return nil
	}
	return r
}

// placedData completes the accounting for a data block whose payload
// Place put into the receive buffer, and reports whether it was one: the
// payload is the slice of the buffer at the block's offset, so there is
// nothing to copy. Anything else is left to onData.
func (d *Device) placedData(h *header, payload []byte) bool {
	if len(payload) == 0 {
		return false
	}
	r := d.rndvWaiting(h)
	if r == nil {
		return false
	}
	end := h.offset + uint64(len(payload))
	if end < h.offset || end > r.rndvLen || &payload[0] != &r.buf[h.offset] {
		return false
	}
	// As in onData: once this block is counted another may complete r,
	// so nothing of r is read after the addition unless this one did.
	if r.received.Add(uint64(len(payload))) == r.rndvLen {
		d.mu.Lock()
		delete(d.rndvRecv, r.id)
		d.mu.Unlock()
		r.complete(r.status, r.truncErr)
	}
	return true
}
