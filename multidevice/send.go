package multidevice

import (
	"errors"
	"fmt"

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
	if d.closed.Load() {
		return nil, ErrClosed
	}
	if dst < 0 || dst >= d.size {
		return nil, fmt.Errorf("%w: destination %d not in [0,%d)", ErrRank, dst, d.size)
	}
	if tag < 0 || tag > maxTag {
		return nil, fmt.Errorf("%w: %d (tags are 0..%d)", ErrTag, tag, maxTag)
	}
	if err := d.peerErr(int32(dst)); err != nil {
		return nil, err
	}
	r := d.newRequest(true, int32(dst))
	if m := d.matchSub[dst]; m >= 0 {
		return r, d.sendTagged(r, d.subs[m], buf, tag, context, sync)
	}
	s := d.subs[d.routes[dst][d.table.Class(len(buf))]]
	h := header{
		tag: int32(tag), src: d.rank, dst: int32(dst), context: context,
		seq: d.sendSeq[dst].Add(1) - 1, length: uint64(len(buf)), sreq: r.id,
	}
	if len(buf) <= s.caps.MaxEager {
		h.kind = kindEager
		r.pending.Store(1)
		if sync {
			h.flags |= flagSync
			r.pending.Add(1)
			d.mu.Lock()
			d.syncSend[r.id] = r
			d.mu.Unlock()
		}
		d.sendFrame(s, int32(dst), &h, buf, r.frameDone)
		return r, nil
	}
	// Rendezvous: announce, send data on clear-to-send. A rendezvous send is
	// synchronous by nature: the receiver has matched before data moves.
	h.kind = kindRTS
	r.buf = buf
	d.mu.Lock()
	d.rndvSend[r.id] = r
	d.mu.Unlock()
	d.sendFrame(s, int32(dst), &h, nil, func(err error) {
		if err != nil {
			d.mu.Lock()
			delete(d.rndvSend, r.id)
			d.mu.Unlock()
			r.complete(Status{}, err)
		}
	})
	return r, nil
}

// maxTag is the largest application tag (MPI_TAG_UB).
const maxTag = 1<<31 - 1

func (d *Device) peerErr(peer int32) error {
	if err := d.down[peer].Load(); err != nil {
		return fmt.Errorf("%w: rank %d: %v", ErrPeerDown, peer, *err)
	}
	return nil
}

// sendFrame hands one frame to a subdevice; done is called exactly once when
// the frame is locally complete or failed. Never called with d.mu held by a
// handler goroutine of s: it may call s.Send.
func (d *Device) sendFrame(s *subdev, peer int32, h *header, payload []byte, done func(error)) {
	d.trySend(s, d.frame(peer, h, payload), done, true)
}

// frame builds an outbound frame with a fresh token.
func (d *Device) frame(peer int32, h *header, payload []byte) *sdi.Frame {
	hb := make([]byte, headerSize)
	h.put(hb)
	return &sdi.Frame{Peer: sdi.Rank(peer), Header: hb, Payload: payload, Token: d.nextID.Add(1)}
}

// trySend sends f now or queues it on the outbox when the subdevice would
// block (direct=true) or when called from the engine (direct=false), in which
// case it reports whether the frame left the queue.
func (d *Device) trySend(s *subdev, f *sdi.Frame, done func(error), direct bool) bool {
	d.tokMu.Lock()
	d.tokens[f.Token] = done
	d.tokMu.Unlock()
	complete, err := s.sd.Send(f)
	switch {
	case err == nil:
		s.frames[f.Peer].Add(1)
		s.bytes[f.Peer].Add(uint64(len(f.Payload)))
		if complete {
			d.finishToken(f.Token, nil)
		}
		return true
	case errors.Is(err, sdi.ErrWouldBlock):
		d.tokMu.Lock()
		delete(d.tokens, f.Token)
		d.tokMu.Unlock()
		if direct {
			d.out.push(outItem{sub: s, frame: f, done: done})
		}
		return false
	default:
		d.finishToken(f.Token, fmt.Errorf("multidevice: send to rank %d over %q: %w", f.Peer, s.name, err))
		return true
	}
}

// finishToken runs the completion registered for a frame token, once.
func (d *Device) finishToken(token uint64, err error) {
	d.tokMu.Lock()
	done := d.tokens[token]
	delete(d.tokens, token)
	d.tokMu.Unlock()
	if done != nil {
		done(err)
	}
}

// sendSys queues a system message. It is used from handler callbacks, which
// must not call into a subdevice, so it always goes through the engine.
func (d *Device) sendSys(peer int32, h header, payload []byte, done func(error)) {
	h.kind = kindSys
	h.src, h.dst = d.rank, peer
	s := d.subs[d.routes[peer][d.table.Class(len(payload))]]
	if done == nil {
		done = func(err error) {
			if err != nil {
				d.log.Warn("system message failed", "peer", peer, "tag", h.tag, "error", err)
			}
		}
	}
	d.out.push(outItem{sub: s, frame: d.frame(peer, &h, payload), done: done})
}

// sendTagged sends through a subdevice that matches on its own.
func (d *Device) sendTagged(r *Request, s *subdev, buf []byte, tag int, context uint64, sync bool) error {
	r.pending.Store(1)
	m := &sdi.TaggedMessage{Peer: sdi.Rank(r.peer), Tag: int32(tag), Context: context, Payload: buf, Sync: sync, Token: d.nextID.Add(1)}
	d.tokMu.Lock()
	d.tokens[m.Token] = r.frameDone
	d.tokMu.Unlock()
	for {
		complete, err := s.matcher.SendTagged(m)
		switch {
		case err == nil:
			s.frames[r.peer].Add(1)
			s.bytes[r.peer].Add(uint64(len(buf)))
			if complete {
				d.finishToken(m.Token, nil)
			}
			return nil
		case errors.Is(err, sdi.ErrWouldBlock):
			<-d.out.backoff()
		default:
			d.tokMu.Lock()
			delete(d.tokens, m.Token)
			d.tokMu.Unlock()
			return fmt.Errorf("multidevice: send to rank %d over %q: %w", r.peer, s.name, err)
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
	s := d.subs[d.routes[from][d.table.Class(len(r.buf))]]
	chunk := uint64(s.caps.MaxFrame)
	blocks := int32((n + chunk - 1) / chunk)
	if blocks == 0 {
		r.complete(Status{}, nil)
		return
	}
	r.pending.Store(blocks)
	for off := uint64(0); off < n; off += chunk {
		end := min(off+chunk, n)
		dh := header{kind: kindSys, tag: sysData, src: d.rank, dst: from, context: h.context, length: uint64(len(r.buf)), sreq: r.id, rreq: h.rreq, offset: off}
		d.out.push(outItem{sub: s, frame: d.frame(from, &dh, r.buf[off:end]), done: r.frameDone})
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
