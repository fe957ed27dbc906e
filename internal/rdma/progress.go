package rdma

import (
	"fmt"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// drain handles one batch of completions. The caller holds the progress
// lock.
func (s *SubDevice) drain() int {
	if s.dead {
		return 0
	}
	n, err := s.prov.Poll(s.cs)
	if err != nil {
		s.log.Error("polling the completion queue failed", "error", err)
		return 0
	}
	for _, cp := range s.cs[:n] {
		s.complete(cp)
	}
	return n
}

func (s *SubDevice) complete(cp Completion) {
	s.mu.Lock()
	c := s.conns[cp.Endpoint]
	s.mu.Unlock()
	if c == nil {
		return // a conn finished already; nothing of it is left to count
	}
	kind, idx := splitWR(cp.WR)
	if cp.Err != nil {
		// The read's bookkeeping goes first: once outstanding reaches 0
		// another goroutine may finish c.
		if kind == wrRead {
			if in := c.reads[uint64(idx)]; in != nil {
				in.pending--
				delete(c.reads, uint64(idx))
			}
		}
		p := c.p
		p.mu.Lock()
		c.outstanding--
		s.failLocked(p, c, fmt.Errorf("%s %w", cp.Op, cp.Err))
		s.unlockFinishing(p, c)
		return
	}
	switch kind {
	case wrSend:
		p := c.p
		p.mu.Lock()
		c.outstanding--
		c.freeSend = append(c.freeSend, idx)
		if idx == c.byeSlot {
			c.closeEPLocked()
		}
		s.sendOwedLocked(p, c)
		s.unlockFinishing(p, c)
	case wrRecv:
		s.arrived(c, idx, cp.Len)
	case wrRead:
		s.readDone(c, uint64(idx))
	default:
		p := c.p
		p.mu.Lock()
		c.outstanding--
		s.failLocked(p, c, fmt.Errorf("completion of unknown work %#x", cp.WR))
		s.unlockFinishing(p, c)
	}
}

// arrived handles a message in receive slot of c.
func (s *SubDevice) arrived(c *conn, slot, n int) {
	p := c.p
	var m message
	var err error
	if n < 0 || n > s.slot {
		err = fmt.Errorf("%w: a message of %d bytes in a slot of %d", sdi.ErrBadFrame, n, s.slot)
	} else {
		m, err = decode(c.rbuf[slot*s.slot:slot*s.slot+n], s.eager, MaxFrame)
	}
	var reg Region
	p.mu.Lock()
	c.outstanding--
	if c.failing {
		s.unlockFinishing(p, c)
		return
	}
	if err == nil {
		c.credits += int(m.credits)
		c.ctlCredits += int(m.ctlBack)
		if c.credits > s.nData || c.ctlCredits > ctlSlots {
			err = fmt.Errorf("%w: credits %d and %d beyond the %d and %d slots", sdi.ErrBadFrame, c.credits, c.ctlCredits, s.nData, ctlSlots)
		}
	}
	if err == nil && m.kind == kindFIN {
		var ok bool
		if reg, ok = c.large[m.token]; !ok {
			err = fmt.Errorf("%w: fin for frame %d, which is not being read", sdi.ErrBadFrame, m.token)
		} else {
			delete(c.large, m.token)
		}
	}
	if err == nil && m.kind == kindBye {
		c.quiet = true
		s.failLocked(p, c, errBye)
		if p.c == c {
			p.state = stateGone
		}
	}
	if err != nil {
		s.log.Warn("dropping the connection", "peer", p.rank, "error", err)
		s.failLocked(p, c, err)
	}
	if c.failing {
		s.unlockFinishing(p, c)
		return
	}
	if m.kind == kindEager || m.kind == kindRTS {
		c.spoke = true
	}
	p.mu.Unlock()

	switch m.kind {
	case kindEager:
		if len(c.queue) == 0 {
			s.h.Deliver(p.rank, m.header, m.payload)
		} else {
			c.queue = append(c.queue, &inbound{header: clone(m.header), payload: clone(m.payload)})
		}
	case kindRTS:
		c.queue = append(c.queue, &inbound{header: clone(m.header), isRead: true, rts: m.rts})
		s.advance(c)
	case kindFIN:
		reg.Close()
		s.h.SendDone(m.token, nil)
		p.mu.Lock()
		c.unfinished--
		if c.unfinished == 0 && c.drained != nil { // after the SendDone, as Flush promises
			close(c.drained)
			c.drained = nil
		}
		p.mu.Unlock()
	}

	p.mu.Lock()
	if m.kind == kindCredit {
		c.ctlOwed++
	} else {
		c.owed++
	}
	if !c.failing {
		c.outstanding++
		if err := c.ep.PostRecv(wrID(wrRecv, slot), c.rreg, slot*s.slot, s.slot); err != nil {
			c.outstanding--
			s.failLocked(p, c, fmt.Errorf("repost receive %d: %w", slot, err))
		} else {
			s.sendOwedLocked(p, c)
		}
	}
	s.unlockFinishing(p, c)
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

// sendOwedLocked sends the fins waiting for credits, then a credit message
// if the peer may be short of credits and nothing else carried them, then
// the goodbye that waited for the fins.
func (s *SubDevice) sendOwedLocked(p *peer, c *conn) {
	if p.c != c || c.failing {
		return
	}
	for len(c.fins) > 0 && c.credits > 0 && len(c.freeSend) > 0 && !c.failing {
		tok := c.fins[0]
		c.fins = c.fins[1:]
		c.credits--
		s.postLocked(p, c, kindFIN, &sdi.Frame{Token: tok})
	}
	// A goodbye that is due keeps a control slot for itself. Credit
	// messages still go while fins wait: the peer may owe fins as well.
	keep := 0
	if c.byeDue {
		keep = 1
	}
	if c.owed >= max(1, s.nData/2) && c.ctlCredits > keep && len(c.freeSend) > 0 && !c.failing {
		c.ctlCredits--
		s.postLocked(p, c, kindCredit, nil)
	}
	// Without a control slot the goodbye becomes a closed endpoint, once
	// every send has left, lest the fins flush unsent.
	if c.byeDue && len(c.fins) == 0 && !c.failing &&
		(c.ctlCredits > 0 && len(c.freeSend) > 0 || len(c.freeSend) == s.nData+ctlSlots) {
		s.sayByeLocked(p, c)
	}
}

// advance delivers the frames at the head of c's queue that are complete
// and starts the read of the first that is not. A read starts only at the
// head, where its Deliver would be, so places are asked for in the order
// of the peer's frames.
func (s *SubDevice) advance(c *conn) {
	p := c.p
	for len(c.queue) > 0 {
		in := c.queue[0]
		if in.isRead {
			if in.reg == nil && !s.startRead(c, in) {
				return
			}
			if in.pending > 0 || in.next < len(in.payload) {
				return
			}
			in.reg.Close()
			in.reg = nil
		}
		c.queue[0] = nil
		c.queue = c.queue[1:]
		// The fin is owed before Deliver, not after: a goodbye said
		// meanwhile, by a goroutine the handler woke, must find it and
		// wait for it, or the peer fails a frame that was delivered. The
		// read is done, so the peer's region may go already.
		if in.isRead {
			p.mu.Lock()
			c.fins = append(c.fins, in.rts.token)
			s.sendOwedLocked(p, c)
			p.mu.Unlock()
		}
		s.h.Deliver(p.rank, in.header, in.payload)
	}
}

// startRead finds the frame's destination, registers it and posts the
// first reads. It reports false when the conn failed on the way.
func (s *SubDevice) startRead(c *conn, in *inbound) bool {
	p := c.p
	n := int(in.rts.n)
	var buf []byte
	if s.placer != nil {
		buf = s.placer.Place(p.rank, in.header, n)
		if buf != nil && len(buf) != n {
			s.log.Error("the handler placed a frame in a slice of the wrong length; reading into a buffer of our own", "want", n, "got", len(buf))
			buf = nil
		}
	}
	if buf == nil {
		buf = make([]byte, n)
	}
	in.payload = buf
	reg, err := s.prov.Register(buf)
	if err != nil {
		p.mu.Lock()
		s.failLocked(p, c, fmt.Errorf("register %d bytes to read into: %w", n, err))
		s.unlockFinishing(p, c)
		return false
	}
	in.reg = reg
	return s.postReads(c, in)
}

// postReads posts reads of in's payload until maxReads are out.
func (s *SubDevice) postReads(c *conn, in *inbound) bool {
	p := c.p
	p.mu.Lock()
	defer p.mu.Unlock()
	for in.pending < maxReads && in.next < len(in.payload) && !c.failing {
		k := min(s.chunk, len(in.payload)-in.next)
		c.readSeq++
		id := c.readSeq & (1<<56 - 1)
		c.outstanding++
		if err := c.ep.PostRead(wrID(wrRead, int(id)), in.reg, in.next, k, in.rts.addr+uint64(in.next), in.rts.rkey); err != nil {
			c.outstanding--
			s.failLocked(p, c, fmt.Errorf("post read of %d bytes: %w", k, err))
			break
		}
		c.reads[id] = in
		in.pending++
		in.next += k
	}
	return !c.failing
}

// readDone counts one read of c done and moves on.
func (s *SubDevice) readDone(c *conn, id uint64) {
	p := c.p
	in := c.reads[id]
	delete(c.reads, id)
	p.mu.Lock()
	c.outstanding--
	failing := c.failing
	done := failing && c.outstanding == 0
	p.mu.Unlock()
	if in != nil {
		in.pending--
	}
	if done {
		s.finish(c)
		return
	}
	if failing || in == nil {
		return
	}
	if s.postReads(c, in) && in.pending == 0 && in.next == len(in.payload) {
		s.advance(c)
	}
}
