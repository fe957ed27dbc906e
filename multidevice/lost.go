package multidevice

import (
	"errors"
	"fmt"
	"time"
)

// A gateway that drops a block it cannot pass on tells the block's source
// with a sysLost message, which travels to the source as credits do (by
// the gateway's own route, through other gateways if need be). Without
// it the source kept the block for a credit that never came: a standard
// send had completed, a synchronous one and the receive waited forever.
//
// The notice names the trunk slot the block left the source by (the
// source stamps it into the block's sreq), so the source knows which of
// its trunks leads to the gateway that lost it, however far along.

// maxLostReason bounds the reason a notice carries.
const maxLostReason = 512

// lost tells the source of forwarded frame h, which this gateway drops,
// why. Only blocks get a notice: a lost credit is sent again (recredit),
// and a lost notice would only loop.
func (d *Device) lost(h *header, why string) {
	if h.tag != sysFwd || h.src == d.rank {
		return
	}
	d.fwd.lostBlocks.Add(1)
	t, ok := d.nextHop(h.src, 0, h.seq)
	if !ok {
		d.log.Warn("cannot tell the source of a lost block: no live route to it", "source", h.src, "destination", h.dst)
		return
	}
	why = fmt.Sprintf("gateway rank %d lost a block: %s", d.rank, why)
	if len(why) > maxLostReason {
		why = why[:maxLostReason]
	}
	var n header
	n.kind, n.tag, n.src, n.dst = kindSys, sysLost, d.rank, h.src
	n.seq, n.offset, n.sreq, n.length = h.seq, uint64(h.dst), h.sreq, uint64(len(why))
	d.out.push(outItem{sub: t.sub, frame: d.frame(t.via, &n, []byte(why))})
}

// lostPause is the first pause of a trunk cut from a line; it doubles,
// up to retryMax, each time a gateway beyond it loses a block again.
const lostPause = time.Second

// onLost runs at the source of a line when a gateway reports a block of
// it lost (h from lost): the trunk the block took carries nothing of the
// line for a while, what the line sent through it goes again through its
// other trunks, and a line left with none fails with the gateway's reason.
func (d *Device) onLost(h *header, why string) {
	dst := int32(min(h.offset, uint64(d.size)))
	if dst >= int32(d.size) || d.fwd.tx[dst] == nil {
		d.log.Warn("dropping a lost-block notice for a line this rank does not have", "from", h.src, "destination", h.offset)
		return
	}
	l := d.fwd.tx[dst]
	bt := newBatch()
	l.mu.Lock()
	slot := int(h.sreq) - 1
	// Only a notice of a block still retained that last went through the
	// slot counts: another is stale (the block went again through
	// another trunk since, or arrived) and must neither cut nor lengthen
	// a cut, as a burst of lost blocks would otherwise.
	stale := true
	for _, b := range l.retained {
		if b.seq == h.seq {
			stale = b.t.slot != slot
			break
		}
	}
	if slot < 0 || slot >= len(l.ways) || l.failed != nil || stale {
		l.mu.Unlock()
		bt.recycle()
		return
	}
	d.log.Warn("a gateway lost a block; sending the line's blocks through its other routes", "destination", dst, "gateway", h.src, "first_hop", l.ways[slot].via, "reason", why)
	if l.cut == nil {
		l.cut, l.cutFor = make([]time.Time, len(l.ways)), make([]time.Duration, len(l.ways))
	}
	l.cutFor[slot] = min(max(2*l.cutFor[slot], lostPause), retryMax)
	l.cut[slot] = time.Now().Add(l.cutFor[slot])
	cause := errors.New(why)
	l.cutWhy = cause
	n := d.resendLocked(l, dst, bt, func(t trunk) bool { return t.slot == slot }, cause)
	d.fwd.resent.Add(uint64(n))
	l.mu.Unlock()
	d.finishBatch(bt, false)
}
