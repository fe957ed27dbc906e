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
//
// A credit message through gateways carries its trunk slot likewise
// (creditFrame), and a gateway that drops it tells the credit's sender
// the same way: without it the sender kept returning credits through
// that gateway, all lost, until the source's watch sent a block again (a
// second or more later), and an eager stream crawled. Such a notice
// names the slot in rreq and leaves sreq 0: a rank that knows only block
// notices takes it for one of a block sent through no trunk and drops
// it, where the slot in sreq would have had it cut the trunk and send
// blocks again by a credit's number taken for a block's.

// maxLostReason bounds the reason a notice carries.
const maxLostReason = 512

// lost tells the source of forwarded frame h, which this gateway drops,
// why: of a block, or of a credit that names its trunk slot. A lost notice
// gets none: notices about notices would only loop.
func (d *Device) lost(h *header, why string) {
	credit := h.tag == sysCredit && h.sreq > 0
	if h.tag != sysFwd && !credit || h.src == d.rank {
		return
	}
	what := "a block"
	if credit {
		what = "a credit"
	} else {
		d.fwd.lostBlocks.Add(1)
	}
	t, ok := d.nextHop(h.src, 0, h.seq)
	if !ok {
		d.log.Warn("cannot tell the source of a lost frame: no live route to it", "frame", what, "source", h.src, "destination", h.dst)
		return
	}
	why = fmt.Sprintf("gateway rank %d lost %s: %s", d.rank, what, why)
	if len(why) > maxLostReason {
		why = why[:maxLostReason]
	}
	var n header
	n.kind, n.tag, n.src, n.dst = kindSys, sysLost, d.rank, h.src
	n.seq, n.offset, n.length = h.seq, uint64(h.dst), uint64(len(why))
	if credit {
		n.rreq = h.sreq
	} else {
		n.sreq = h.sreq
	}
	d.out.push(outItem{sub: t.sub, frame: d.frame(t.via, &n, []byte(why))})
}

// lostPause is the first pause of a trunk cut from a line; it doubles,
// up to retryMax, each time a gateway beyond it loses a block again.
const lostPause = time.Second

// onLost runs at the source of a line when a gateway reports a block of
// it lost (h from lost): the trunk the block took carries nothing of the
// line for a while, what the line sent through it goes again through its
// other trunks, and a line left with none fails with the gateway's reason.
// A notice of a lost credit goes to onLostCredit.
func (d *Device) onLost(h *header, why string) {
	dst := int32(min(h.offset, uint64(d.size)))
	if dst >= int32(d.size) || d.fwd.tx[dst] == nil {
		d.log.Warn("dropping a lost-block notice for a line this rank does not have", "from", h.src, "destination", h.offset)
		return
	}
	l := d.fwd.tx[dst]
	if h.sreq == 0 && h.rreq > 0 {
		d.onLostCredit(l, dst, h.rreq-1, why)
		return
	}
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
	now := time.Now()
	l.cutFor[slot] = nextPause(l.cutFor[slot], l.cut[slot], now)
	l.cut[slot] = now.Add(l.cutFor[slot])
	cause := errors.New(why)
	l.cutWhy = cause
	n := d.resendLocked(l, dst, bt, func(t trunk) bool { return t.slot == slot }, cause)
	d.fwd.resent.Add(uint64(n))
	l.mu.Unlock()
	d.finishBatch(bt, false)
}

// onLostCredit runs at the destination of the line from src when a
// gateway reports a credit for it lost, sent through slot of l, this
// rank's own line to src, whose trunks credits take (creditWay): the slot
// takes no credits for a while (txLine.creditCut), and the credit goes
// again through another trunk if one takes credits. A burst of lost
// credits cuts the slot once: only a notice that finds it taking credits
// again lengthens the pause.
//
// The slot still carries blocks, and a lost credit never fails the line:
// cut for blocks too, a rank that had only returned credits found its
// line failed and its peer lost once the network healed. With no other
// trunk, the credit goes again only once the cut ends (recreditAfter):
// sent at once, it went back through the cut trunk, to be lost and
// noticed again, thousands of frames in a fraction of a second; and left
// to the source's watch, which sends a block through each trunk once, it
// was never sent after an outage longer than that, and a send waiting for
// it hung after the network healed.
func (d *Device) onLostCredit(l *txLine, src int32, slot uint64, why string) {
	l.mu.Lock()
	if slot >= uint64(len(l.ways)) || l.failed != nil {
		l.mu.Unlock()
		return
	}
	now := time.Now()
	fresh := l.creditCut == nil || !l.creditCut[slot].After(now)
	if fresh {
		d.log.Warn("a gateway lost a credit; returning the line's credits through its other routes", "source", src, "gateway", l.ways[slot].via, "reason", why)
		if l.creditCut == nil {
			l.creditCut, l.creditCutFor = make([]time.Time, len(l.ways)), make([]time.Duration, len(l.ways))
		}
		l.creditCutFor[slot] = nextPause(l.creditCutFor[slot], l.creditCut[slot], now)
		l.creditCut[slot] = now.Add(l.creditCutFor[slot])
	}
	again, pause := d.creditTrunkLocked(l, src, now), l.creditCutFor[slot]
	l.mu.Unlock()
	switch {
	case again:
		d.creditAgain(src)
	case fresh: // a burst of notices waits for one cut's end
		d.recreditAfter(src, pause)
	}
}

// creditAgain makes the newest credit of the line from src, and its report,
// due again, and queues it.
func (d *Device) creditAgain(src int32) {
	f := &d.fwd
	f.rxMu.Lock()
	f.rx[src].sent, f.rx[src].news = 0, true
	f.rxMu.Unlock()
	d.queueCredit(src)
}

// recreditAfter queues the credit of the line from src again once pause,
// the cut of the only trunk that took it, has passed, unless the Device
// shuts down first (which waits for it, as for revive).
func (d *Device) recreditAfter(src int32, pause time.Duration) {
	f := &d.fwd
	f.lifeMu.Lock()
	defer f.lifeMu.Unlock()
	if f.life.Err() != nil {
		return
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		t := time.NewTimer(pause)
		defer t.Stop()
		select {
		case <-t.C:
			d.creditAgain(src)
		case <-f.life.Done():
		}
	}()
}

// nextPause returns the pause of a cut beginning at now, after one that
// lasted last and ended at end: twice the last while losses follow each
// other, from lostPause again after a quiet spell as long as the last
// pause, up to retryMax. Doubled for good, a few brief outages once left
// every later one waiting up to 30 s after the network healed.
func nextPause(last time.Duration, end, now time.Time) time.Duration {
	if now.Sub(end) > last {
		last = 0
	}
	return min(max(2*last, lostPause), retryMax)
}
