package multidevice

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Trunking (GridMPI's relay pairs, here per block rather than per
// destination): when several trunks lead to one destination, each block
// goes through the live trunk that would deliver it first, by what it
// carries and the rate it was measured to deliver at (delivery.go), so
// faster trunks take more and the blocks of one large message spread over
// all of them; the destination puts them back by offset. A trunk is a
// subdevice and the rank it reaches first: a gateway, or, on a failover
// route (conntable's "failover"), the destination itself. A trunk that
// dies (its subdevice reports that rank down, or a frame to it fails) is
// dropped, and every block still unacknowledged that last went through it
// is sent again through the others. The destination drops the copies it
// already had by block number, so nothing is lost or handled twice. A
// line left without a live trunk for some size class fails, and with it
// the peer.
//
// A dead trunk is tried again in the background (revive): after
// ForwardOptions.Retry, then at doubling pauses up to retryMax, its
// subdevice connects to the rank again with the card kept from Open, and
// once that succeeds the trunk carries blocks again: a network that came
// back takes its share again, and a route on standby stands by again
// behind it. Each end tries its own way to the other: the trunks of a
// line's two directions are separate. A trunk that dies again after a
// revival starts over from the first pause.
//
// A gateway that cannot pass a block on (no live route from it, a next
// hop that failed it, a routing loop) tells the block's source
// (lost.go): the source cuts the trunk the block took from the line for a
// while, sends what it held through the others, and fails the line with
// the gateway's reason when none is left.
//
// Limits: a gateway further along that dies, rather than losing its
// route, loses what it held, and the source notices only that credit
// stops coming.

// pickTrunkLocked returns the live trunk of (peer, class) that would
// deliver n more bytes of line l first (txLine.finish), first in route
// order on a tie; trunks on standby only when no other lives. Among
// trunks that would finish never (not measured yet, and busy), the one
// with the fewest bytes in flight. unknown reports that more than one
// trunk could take the bytes and every one would finish never: no trunk
// is known better, and with blocks of a sample's size or more (a
// gateway's 64 KiB) each unmeasured trunk finishes never after one; by
// route order the slow relay took 15 of a new line's 16 blocks, taken in
// turn a slow network half of a new line's window.
func (d *Device) pickTrunkLocked(l *txLine, peer int32, class, n int) (t trunk, unknown, ok bool) {
	var best trunk
	found, bestAt, usables := false, 0.0, 0
	now := time.Now()
	usable := func(t trunk, standby bool) bool { return d.carriesLocked(l, t, standby, now) }
	for _, standby := range [2]bool{false, true} {
		// A trunk not measured yet counts as the average of those that were.
		sum, measured := 0.0, 0
		for _, t := range d.fwd.paths[peer][class] {
			if r := l.stats[t.slot].rateNow(); r > 0 && usable(t, standby) {
				sum, measured = sum+r, measured+1
			}
		}
		avg := sum / float64(max(measured, 1))
		for _, t := range d.fwd.paths[peer][class] {
			if !usable(t, standby) {
				continue
			}
			usables++
			at := l.finish(t.slot, n, avg)
			if !found || at < bestAt || math.IsInf(at, 1) && math.IsInf(bestAt, 1) && l.carrying(t.slot) < l.carrying(best.slot) {
				best, bestAt, found = t, at, true
			}
		}
		if found {
			break
		}
	}
	return best, found && usables > 1 && math.IsInf(bestAt, 1), found
}

// carriesLocked reports whether trunk t of line l, on standby or not as
// standby says, may carry the line's traffic at now: it lives and is not
// cut from the line.
func (d *Device) carriesLocked(l *txLine, t trunk, standby bool, now time.Time) bool {
	return t.standby == standby && !d.fwd.isDead(t) && (l.cut == nil || !l.cut[t.slot].After(now))
}

// revivedLines notes on every line with trunk k that a trunk came back
// now: the delivery times its other trunks measured while k was dead say
// nothing of k (creditWay).
func (d *Device) revivedLines(k trunkKey) {
	now := time.Now()
	for _, l := range d.fwd.tx {
		if l == nil || !slices.ContainsFunc(l.ways, func(t trunk) bool { return t.key() == k }) {
			continue
		}
		l.mu.Lock()
		l.revived = now
		l.mu.Unlock()
	}
}

// trunksLive reports whether every size class of peer that goes through
// trunks still has a live one.
func (d *Device) trunksLive(peer int32) bool {
	for ci, trunks := range d.fwd.paths[peer] {
		if trunks != nil && len(d.fwd.live(int(peer), ci)) == 0 {
			return false
		}
	}
	return true
}

// failLineLocked gives up on a line whose every trunk died: what waits
// fails, what was sent is dropped, and the peer is reported lost, with
// why the last route went if known.
func (d *Device) failLineLocked(l *txLine, peer int32, bt *fwdBatch, why error) {
	err := fmt.Errorf("%w: rank %d: every route to it is down", ErrPeerDown, peer)
	if why != nil {
		err = fmt.Errorf("%w: rank %d: every route to it is down: %w", ErrPeerDown, peer, why)
	}
	l.failed = err
	for _, pf := range l.waiting {
		bt.failed = append(bt.failed, pf.of)
	}
	l.waiting = nil
	for _, b := range l.retained {
		b.err = err
		bt.release = append(bt.release, b)
	}
	l.retained, l.inflight = nil, 0
	clear(l.load)
	bt.err, bt.lost = err, peer
}

// trunkDown drops the trunk through rank via over subdevice sub from every
// line and sends what it held again through the others; a line left with
// a size class and no live trunk fails. It runs from handler callbacks and
// frame completions, so it only queues; it acts once per trunk.
func (d *Device) trunkDown(via int32, sub int, cause error) {
	f := &d.fwd
	if !f.ready.Load() || via < 0 || int(via) >= d.size || sub < 0 || sub >= len(f.dead[via]) || !f.dead[via][sub].CompareAndSwap(false, true) {
		return
	}
	resent, used := 0, false
	// Why a line left without this trunk fails, unless a gateway said.
	over := fmt.Errorf("over %q: %w", d.subs[sub].name, cause)
	// Every line's batch is finished only after via's loss is reported:
	// a line through via as a gateway, earlier in rank order than via's
	// own, would fail its requests before the report otherwise.
	var batches []*fwdBatch
	viaLost := false
	for peer, l := range f.tx {
		if l == nil {
			continue
		}
		bt := newBatch()
		l.mu.Lock()
		why := l.cutWhy // a gateway's notice says more than the trunk's end
		if why == nil {
			why = over
		}
		resent += d.resendLocked(l, int32(peer), bt, func(t trunk) bool { return t.via == via && t.sub.idx == sub }, why)
		if l.failed == nil && !d.trunksLive(int32(peer)) {
			d.failLineLocked(l, int32(peer), bt, why)
		}
		l.mu.Unlock()
		viaLost = viaLost || bt.lost == via
		batches = append(batches, bt)
	}
	if viaLost && !d.finalizing.Load() && d.down[via].Load() == nil {
		// via lost its last failover route: a loss the device takes,
		// which neither PeerDown nor frameLost reports, since no route
		// carries via directly (carries). Reported before finishBatch
		// fails anything for it or through it (reportLost).
		d.reportLost(sub, int(via), cause)
	}
	for _, bt := range batches {
		d.finishBatch(bt, false)
	}
	f.resent.Add(uint64(resent))
	for _, classes := range f.paths {
		for _, trunks := range classes {
			for _, t := range trunks {
				used = used || (t.via == via && t.sub.idx == sub)
			}
		}
	}
	if used {
		d.log.Warn("route down, sending what it carried through the others", "via", via, "subdevice", d.subs[sub].name, "blocks", resent, "error", cause)
		d.reviveLater(trunkKey{via, sub})
	}
	// Credits this rank returned through it may be lost too.
	d.recredit(trunkKey{via, sub})
}

// resendLocked sends the blocks of line l that last went through a trunk
// gone reports true for again through the line's other live trunks, and
// fails the line with why when one finds none. It returns how many went
// again; the sends are in bt.
func (d *Device) resendLocked(l *txLine, peer int32, bt *fwdBatch, gone func(trunk) bool, why error) int {
	resent := 0
	for _, b := range l.retained {
		if !gone(b.t) {
			continue
		}
		n := b.size()
		t, _, ok := d.pickTrunkLocked(l, peer, b.class, n)
		if !ok {
			d.failLineLocked(l, peer, bt, why)
			break
		}
		l.load[b.t.slot] -= n
		l.moved(b.t.slot)
		l.load[t.slot] += n
		b.t, b.end = t, l.sending(t.slot, n, true)
		bt.sends = append(bt.sends, sendItem{t.sub, d.blockFrame(peer, b, t)})
		resent++
	}
	return resent
}

// retryMax is the longest pause between two attempts to revive a trunk,
// unless ForwardOptions.Retry is longer; retryConnect bounds one attempt.
const (
	retryMax     = 30 * time.Second
	retryConnect = 30 * time.Second
)

// reviveLater starts trying the dead trunk k again, unless retries are off,
// its card is unknown or the Device is closing.
func (d *Device) reviveLater(k trunkKey) {
	f := &d.fwd
	card, ok := f.cards[k]
	if !ok || f.opts.Retry < 0 || d.finalizing.Load() {
		return
	}
	f.lifeMu.Lock()
	defer f.lifeMu.Unlock()
	if f.life.Err() != nil { // shutdown waits for d.wg: nothing may join it now
		return
	}
	d.wg.Add(1)
	go d.revive(k, card)
}

// end stops the attempts to revive trunks; shutdown waits for them.
func (f *forwarder) end() {
	f.lifeMu.Lock()
	f.stopLife()
	f.lifeMu.Unlock()
}

// revive connects trunk k's subdevice to its rank again until that
// succeeds, the rank is known lost, or the Device shuts down, and then
// marks the trunk live.
func (d *Device) revive(k trunkKey, card []byte) {
	defer d.wg.Done()
	f := &d.fwd
	s := d.subs[k.sub]
	pause := f.opts.Retry
	timer := time.NewTimer(pause)
	defer timer.Stop()
	for attempt := 1; ; attempt++ {
		select {
		case <-timer.C:
		case <-f.life.Done():
			return
		}
		if d.finalizing.Load() || d.down[k.via].Load() != nil {
			return
		}
		ctx, cancel := context.WithTimeout(f.life, retryConnect)
		err := s.sd.Connect(ctx, sdi.Rank(k.via), card)
		cancel()
		if err == nil {
			f.dead[k.via][k.sub].Store(false)
			d.revivedLines(k)
			d.log.Info("route back", "via", k.via, "subdevice", s.name, "attempts", attempt)
			return
		}
		if f.life.Err() != nil {
			return
		}
		pause = min(2*pause, max(retryMax, f.opts.Retry))
		d.log.Debug("route still down", "via", k.via, "subdevice", s.name, "attempts", attempt, "next", pause, "error", err)
		timer.Reset(pause)
	}
}
