package multidevice

import "fmt"

// Trunking (GridMPI's relay pairs, here per block rather than per
// destination): when several trunks lead to one destination, each block
// goes through the live trunk with the fewest unacknowledged bytes, so
// faster trunks take more and the blocks of one large message spread over
// all of them; the destination puts them back by offset. A trunk is a
// subdevice and the rank it reaches first: a gateway, or, on a failover
// route (conntable's "failover"), the destination itself. A trunk that
// dies (its subdevice reports that rank down, or a frame to it fails) is
// dropped for good, and every block still unacknowledged that last went
// through it is sent again through the others. The destination drops the
// copies it already had by block number, so nothing is lost or handled
// twice. A dead trunk is not retried later; a line left without a live
// trunk for some size class fails, and with it the peer.
//
// Limits: only the first hop of a route is watched this way; a gateway
// further along that dies loses what it held, and the source notices only
// that credit stops coming.

// pickTrunkLocked returns the live trunk of (peer, class) with the least
// unacknowledged bytes on line l, first in route order on a tie; trunks on
// standby only when no other lives.
func (d *Device) pickTrunkLocked(l *txLine, peer int32, class int) (trunk, bool) {
	var best trunk
	found := false
	for _, standby := range [2]bool{false, true} {
		for _, t := range d.fwd.paths[peer][class] {
			if t.standby != standby || d.fwd.isDead(t) {
				continue
			}
			if !found || l.load[t] < l.load[best] {
				best, found = t, true
			}
		}
		if found {
			break
		}
	}
	return best, found
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
// fails, what was sent is dropped, and the peer is reported lost.
func (d *Device) failLineLocked(l *txLine, peer int32, bt *fwdBatch) {
	err := fmt.Errorf("%w: rank %d: every route to it is down", ErrPeerDown, peer)
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
	for peer, l := range f.tx {
		if l == nil {
			continue
		}
		bt := fwdBatch{lost: -1}
		l.mu.Lock()
		for _, b := range l.retained {
			if b.t.via != via || b.t.sub.idx != sub {
				continue
			}
			t, ok := d.pickTrunkLocked(l, int32(peer), b.class)
			if !ok {
				d.failLineLocked(l, int32(peer), &bt)
				break
			}
			n := b.size()
			l.load[b.t] -= n
			l.load[t] += n
			b.t = t
			bt.sends = append(bt.sends, sendItem{t.sub, d.blockFrame(int32(peer), b, t)})
			resent++
		}
		if l.failed == nil && !d.trunksLive(int32(peer)) {
			d.failLineLocked(l, int32(peer), &bt)
		}
		l.mu.Unlock()
		d.finishBatch(&bt, false)
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
	}
	// Credits this rank returned through it may be lost too.
	d.recredit()
}
