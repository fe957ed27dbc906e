package multidevice

import "fmt"

// Trunking (GridMPI's relay pairs, here per block rather than per
// destination): when several gateways lead to one destination, each block
// goes through the live trunk with the fewest unacknowledged bytes, so
// faster trunks take more and the blocks of one large message spread over
// all of them; the destination puts them back by offset. A gateway that
// dies (its subdevice reports the peer down, or a frame to it fails) is
// dropped for good, and every block still unacknowledged that last went
// through it is sent again through the others. The destination drops the
// copies it already had by block number, so nothing is lost or handled
// twice. A dead gateway is not retried later.
//
// Limits: only the first gateway of a route is watched this way; a gateway
// further along that dies loses what it held, and the source notices only
// that credit stops coming.

// pickTrunkLocked returns the live trunk of (peer, class) with the least
// unacknowledged bytes on line l, first in route order on a tie.
func (d *Device) pickTrunkLocked(l *txLine, peer int32, class int) (trunk, bool) {
	var best trunk
	found := false
	for _, t := range d.fwd.paths[peer][class] {
		if d.fwd.dead[t.via].Load() {
			continue
		}
		if !found || l.load[t.via] < l.load[best.via] {
			best, found = t, true
		}
	}
	return best, found
}

// failLineLocked gives up on a line whose every trunk died: what waits
// fails, what was sent is dropped, and the peer is reported lost.
func (d *Device) failLineLocked(l *txLine, peer int32, bt *fwdBatch) {
	err := fmt.Errorf("%w: rank %d: every gateway towards it is down", ErrPeerDown, peer)
	l.failed = err
	for _, pf := range l.waiting {
		bt.failed = append(bt.failed, pf.of)
	}
	l.waiting = nil
	for _, b := range l.retained {
		b.release()
	}
	l.retained, l.inflight = nil, 0
	clear(l.load)
	bt.err, bt.lost = err, peer
}

// gatewayDown drops gateway g from every trunk set and sends what it held
// again through the others. It runs from handler callbacks and frame
// completions, so it only queues; it acts once per gateway.
func (d *Device) gatewayDown(g int32, cause error) {
	if !d.fwd.ready.Load() || g < 0 || int(g) >= d.size || !d.fwd.dead[g].CompareAndSwap(false, true) {
		return
	}
	resent := 0
	for peer, l := range d.fwd.tx {
		if l == nil {
			continue
		}
		bt := fwdBatch{lost: -1}
		l.mu.Lock()
		for _, b := range l.retained {
			if b.via != g {
				continue
			}
			t, ok := d.pickTrunkLocked(l, int32(peer), b.class)
			if !ok {
				d.failLineLocked(l, int32(peer), &bt)
				break
			}
			n := len(b.buf)
			l.load[g] -= n
			l.load[t.via] += n
			b.via = t.via
			bt.sends = append(bt.sends, sendItem{t.sub, d.blockFrame(int32(peer), b, t.via)})
			resent++
		}
		l.mu.Unlock()
		d.finishBatch(&bt, false)
	}
	d.fwd.resent.Add(uint64(resent))
	if d.isGateway(g) {
		d.log.Warn("gateway down, sending its blocks through the other trunks", "gateway", g, "blocks", resent, "error", cause)
	}
	// Credits this rank returned through g may be lost too.
	d.recredit()
}

// isGateway reports whether some route of this rank goes through g.
func (d *Device) isGateway(g int32) bool {
	for _, classes := range d.fwd.paths {
		for _, trunks := range classes {
			for _, t := range trunks {
				if t.via == g {
					return true
				}
			}
		}
	}
	return false
}
