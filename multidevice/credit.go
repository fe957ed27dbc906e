package multidevice

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Flow control over virtual lines (Madeleine III's answer to a gateway
// whose destination never drains). The source end of a line admits a
// frame only while the line's unacknowledged bytes stay within
// ForwardOptions.Window; admitting copies the frame into a block, which the
// source keeps until the destination's cumulative credit covers it, so
// that a block lost with a dead gateway can be sent again. A block is
// acknowledged only after the destination handled it, so at any moment
// the gateways of a line together hold at most Window bytes of it.
//
// Credits are coalesced and late. A block this rank sends to the source of
// a line it receives on carries that line's newest credit (flagCredit),
// and a credit message of its own leaves only if no block did within
// creditDelay, or at once when the source marked a block urgent (half its
// window unacknowledged). A ping-pong then pays no credit message: each
// reply returns the credit for the message it answers. (Sending one per
// block, in the waiter's path before the reply, doubled a failover
// route's small-message latency over tcp.) The destination queues at most
// one credit message per line in the outbox, and that message carries the
// newest cumulative block number when it leaves.

// creditDelay is how long a credit waits for a block to ride on.
const creditDelay = time.Millisecond

// txLine is the source end of a virtual line to one indirect peer.
type txLine struct {
	mu       sync.Mutex
	next     uint64         // block number of the next block
	inflight int            // bytes of retained blocks
	retained []*block       // unacknowledged blocks, ascending block numbers
	waiting  []pendingFrame // frames not admitted yet, in send order
	load     []int          // unacknowledged bytes per trunk, by trunk.slot
	ways     []trunk        // the trunks of load's slots; set during Open
	stats    []wayStat      // what each slot's trunk delivers (delivery.go)
	report   []uint64       // a credit's report as decoded, for reuse
	failed   error          // every trunk died; the line takes nothing more
	// cut is, per trunk slot, until when the slot carries nothing: a
	// gateway beyond its first hop lost a block of this line (lost.go).
	// Nil until that happens; cutFor is the slot's pause, doubling.
	cut    []time.Time
	cutFor []time.Duration
	cutWhy error // the reason of the latest cut, for the line's failure
	// creditCut is, per trunk slot, until when the slot takes none of
	// this rank's credits to the peer: a gateway beyond its first hop lost
	// one (onLostCredit). Only creditWay reads it: cut for blocks too, a
	// rank that had only returned credits found its line failed, and its
	// peer lost, once the pause had doubled past a network's outage. Nil
	// until then; creditCutFor is the slot's pause, doubling as cutFor.
	creditCut    []time.Time
	creditCutFor []time.Duration
	// nudged is the block number plus one of the oldest block when the
	// line was last nudged, and nudgedVia the trunk slots (bit per slot)
	// that carried a copy of it: a later nudge of that block takes only
	// another trunk, so that each gateway holds at most one copy beyond
	// the window, and a slow direct route gets no pile of copies.
	nudged    uint64
	nudgedVia uint64
	// revived is when a trunk of the line last came back (revive).
	revived time.Time
	// creditSlot is the slot plus one of the trunk the last credit to the
	// peer took for its srtt (0: it took its trunk in turn), for
	// creditWay to find the trunk that may have lost it.
	creditSlot int

	// The watch (see watch): armed while blocks are retained on a line
	// whose trunks all go straight to the peer.
	watching bool
	acked    uint64        // credits that released blocks
	seen     uint64        // acked when the watch last looked
	pause    time.Duration // until the watch looks again
	nudges   uint64        // nudges sent, to spread them over the trunks
}

// pendingFrame is a protocol frame waiting for credit. Its payload still
// belongs to the application: the request completes only once admitted.
type pendingFrame struct {
	of     *outFrame
	class  int
	msgLen int
}

// copyWaiting gives the frame of r, an eager send to peer whose caller's
// ctx ended, a copy of its payload if it still waits for credit on the
// line: admitted, it is copied into its block already (admitLocked), and
// the caller's buffer is free either way once it returns.
func (d *Device) copyWaiting(peer int32, r *Request) {
	l := d.fwd.tx[peer]
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, pf := range l.waiting {
		if pf.of.req == r {
			pf.of.f.Payload = slices.Clone(pf.of.f.Payload)
		}
	}
}

// block is an admitted frame: its inner header and data, kept until the
// destination acknowledges it.
//
// Most blocks are copies (bufp). Rendezvous data on a line whose
// subdevices take split frames is not copied: the block is the frame
// itself (of), its data the application's buffer, and the frame, with it
// the send request, completes only when the block is acknowledged and no
// subdevice holds it any more (release). The rendezvous sender waits for
// its data to arrive anyway; the copy cost a line half its bandwidth.
type block struct {
	seq    uint64
	class  int
	msgLen int
	t      trunk   // the trunk it was last sent through; guarded by txLine.mu
	end    uint64  // where it ends in the bytes sent through t (wayStat.sent)
	copied bool    // the watch sent a copy of it: its credit does not say t delivered it
	urgent bool    // the destination should credit it at once
	inner  []byte  // the inner header
	data   []byte  // the data
	bufp   *[]byte // a copy's pooled buffer, inner header then data; else nil
	of     *outFrame
	err    error // how of completes; set before the last release
	// refs counts the owners of the block's bytes: one while retained,
	// one per outer frame a subdevice has not completed.
	refs atomic.Int32
}

// size is the block's bytes against the line's window.
func (b *block) size() int { return headerSize + len(b.data) }

// blocks pools block structs: a line makes one per message, and their
// allocation was most of the cost of admitting one.
var blocks = sync.Pool{New: func() any { return new(block) }}

// release drops one owner; the last recycles the copy or completes the
// frame the block is, and gives the block back to its pool: no owner is
// left to look at it.
func (b *block) release(d *Device) {
	if b.refs.Add(-1) != 0 {
		return
	}
	bufp, of, err := b.bufp, b.of, b.err
	b.t, b.inner, b.data, b.bufp, b.of, b.err = trunk{}, nil, nil, nil, nil, nil
	blocks.Put(b)
	if bufp != nil {
		putBlock(bufp)
	}
	if of != nil {
		d.finishFrame(of, err)
	}
}

// rxLine is the destination end of a virtual line.
type rxLine struct {
	cum    uint64              // every block below it arrived
	above  map[uint64]struct{} // blocks beyond cum that arrived (trunks reorder)
	queued bool                // a credit for this line waits in the outbox
	sent   uint64              // the newest credit sent, alone or on a block
	timer  bool                // a late credit is due
	// got counts the bytes of the blocks that arrived through each of the
	// source's trunk slots, copies too, and news says whether one grew
	// since the last report (delivery.go).
	got  []uint64
	news bool
	// lost says a credit of the line may have been lost: creditWay then
	// stops preferring the trunk the last one took.
	lost bool
}

type sendItem struct {
	sub *subdev
	of  *outFrame
}

// fwdBatch is what a line operation does once the line's lock is released.
// Batches are pooled with their lists' capacity: built fresh, the lists of
// one message's batch cost three allocations.
type fwdBatch struct {
	sends   []sendItem
	done    []*outFrame // frames copied into blocks: locally complete
	failed  []*outFrame
	err     error    // for failed
	release []*block // blocks no longer retained
	lost    int32    // a peer whose last gateway died, or -1
}

var batchPool = sync.Pool{New: func() any { return new(fwdBatch) }}

// newBatch returns an empty batch; finishBatch gives it back.
func newBatch() *fwdBatch {
	bt := batchPool.Get().(*fwdBatch)
	bt.lost = -1
	return bt
}

// fwdSend sends a protocol frame to an indirect peer, now or once credit
// allows.
func (d *Device) fwdSend(peer int32, class, msgLen int, of *outFrame, direct bool) {
	l := d.fwd.tx[peer]
	bt := newBatch()
	pf := pendingFrame{of: of, class: class, msgLen: msgLen}
	l.mu.Lock()
	if len(l.waiting) > 0 || !d.admitLocked(l, peer, pf, bt) {
		l.waiting = append(l.waiting, pf)
	}
	l.mu.Unlock()
	d.finishBatch(bt, direct)
}

// admitLocked copies pf into a block and sends it through the live trunk
// that would deliver it first, unless the window is full or every trunk
// carries a sample's bytes not measured yet (false: pf must wait for a
// credit).
func (d *Device) admitLocked(l *txLine, peer int32, pf pendingFrame, bt *fwdBatch) bool {
	if l.failed != nil {
		bt.failed, bt.err = append(bt.failed, pf.of), l.failed
		return true
	}
	n := headerSize + len(pf.of.f.Payload)
	if l.inflight > 0 && l.inflight+n > d.fwd.opts.Window {
		return false
	}
	t, unknown, ok := d.pickTrunkLocked(l, peer, pf.class, n)
	if unknown && l.inflight > 0 {
		// Until a credit measures one of the trunks, more would go
		// blindly: a slow one might take half of a new line's window.
		return false
	}
	if !ok {
		d.failLineLocked(l, peer, bt, l.cutWhy)
		bt.failed = append(bt.failed, pf.of)
		return true
	}
	b := blocks.Get().(*block)
	b.seq, b.class, b.msgLen, b.t, b.copied = l.next, pf.class, pf.msgLen, t, false
	b.urgent = l.inflight+n > d.fwd.opts.Window/2
	hb := pf.of.f.Header
	if d.fwd.split[peer][pf.class] && pf.of.req != nil && isData(hb) {
		b.inner, b.data, b.of = hb, pf.of.f.Payload, pf.of
		// Its request completes at the credit: ask for that at once
		// for the message's last block.
		off, length := dataPlace(hb)
		b.urgent = b.urgent || off+uint64(len(b.data)) >= length
	} else {
		b.bufp = getBlock(n)
		buf := *b.bufp
		copy(buf[copy(buf, hb):], pf.of.f.Payload)
		b.inner, b.data = buf[:headerSize], buf[headerSize:]
		bt.done = append(bt.done, pf.of)
	}
	b.refs.Store(1)
	l.next++
	l.inflight += n
	l.load[t.slot] += n
	b.end = l.sending(t.slot, n, true)
	l.retained = append(l.retained, b)
	bt.sends = append(bt.sends, sendItem{t.sub, d.blockFrame(peer, b, t)})
	if !l.watching {
		l.watching, l.pause = true, gatedWatch
		if !d.fwd.gated[peer] {
			l.pause = l.patience(l.retained[0])
		}
		time.AfterFunc(l.pause, func() { d.watch(peer) })
	}
	return true
}

// watch looks at a line while it retains blocks. If no credit released
// any since it last looked, it sends the oldest block again (nudge) and
// looks again after twice the pause, up to watchMax (or the first pause
// if longer), or eight first pauses through gateways.
// On a direct line the first pause is what the trunk of the oldest block
// was measured to need (txLine.patience), and that trunk delivering more
// of what it carries up to the block is no stall: with a fixed nudgeAfter
// a healthy route that needs longer to deliver a block was taken for a
// lost frame, and its blocks went twice. Each trunk carries one copy of a
// block at most, as through gateways, until the pause is at its longest.
// Resending relies on a trunk's subdevice reporting the peer down; a
// frame lost without that report (a credit on a connection that broke as
// it was replaced, say) would otherwise stall the line until Close, the
// only other place that nudges. Through gateways, the same: a gateway
// that passed a block to a subdevice which then lost its link lost the
// block unknowing, and the copy sent again meets the gateway's lost route
// and comes back as a notice (lost.go). There a copy sits in a gateway
// beside the original, beyond the window that bounds what gateways hold,
// so such a line is looked at only after gatedWatch without credit, and
// its oldest block goes again through each trunk at most once.
func (d *Device) watch(peer int32) {
	l := d.fwd.tx[peer]
	l.mu.Lock()
	if len(l.retained) == 0 || l.failed != nil || d.closed.Load() {
		l.watching = false
		l.mu.Unlock()
		return
	}
	gated, b := d.fwd.gated[peer], l.retained[0]
	stalled := l.acked == l.seen
	l.seen = l.acked
	base, longest := gatedWatch, max(watchMax, gatedWatch*8)
	if !gated {
		if w := &l.stats[b.t.slot]; w.recv != w.looked && w.looked < b.end {
			stalled = false
		}
		for s := range l.stats {
			l.stats[s].looked = l.stats[s].recv
		}
		base = l.patience(b)
		longest = max(watchMax, base)
	}
	nudge := stalled
	if stalled {
		if _, ok := d.nudgeWayLocked(l, peer, b, true); !ok {
			// Every live trunk carries a copy of b.
			switch {
			case gated:
				stalled, nudge = false, false // its copies may sit in the gateways still
			case l.pause >= longest:
				l.nudgedVia = 0 // each copy had the longest pause: another round
			default:
				nudge = false
			}
		}
	}
	if stalled {
		l.pause = min(2*l.pause, longest)
	} else {
		l.pause = base
	}
	pause := l.pause
	l.mu.Unlock()
	if nudge {
		d.fwd.nudged.Add(1)
		d.log.Debug("no credit for a while: sending the oldest block again", "to", peer, "next_look", pause)
		d.nudge(peer, true)
	}
	time.AfterFunc(pause, func() { d.watch(peer) })
}

// watchMax is the longest pause of a line's watch, unless its first pause
// is longer: a destination that is slow rather than cut off gets at most
// a copy of one block this often; through gateways every eight
// gatedWatch.
const watchMax = time.Second

// gatedWatch is the first pause of the watch of a line through gateways.
const gatedWatch = time.Second

// blockFrame wraps a retained block for one trip through trunk t: to a
// gateway, or to the peer itself over a failover route.
func (d *Device) blockFrame(peer int32, b *block, t trunk) *outFrame {
	// Field by field, not from a literal: see header.decodeShort.
	var h header
	h.kind, h.tag, h.src, h.dst = kindSys, sysFwd, d.rank, peer
	h.seq, h.length, h.offset = b.seq, uint64(b.size()), uint64(b.msgLen)
	h.sreq = uint64(t.slot) + 1 // for a gateway that loses it to name (lost.go)
	if b.urgent {
		h.flags |= flagUrgent
	}
	if cum := d.fwd.rideCredit(peer); cum > 0 {
		h.flags |= flagCredit
		h.rreq = cum
	}
	of := framePool.Get().(*outFrame)
	var whole []byte
	if b.bufp != nil {
		whole = *b.bufp
	}
	of.setBlock(t.via, &h, b.inner, b.data, whole, t.sub.splits())
	b.refs.Add(1)
	of.blk, of.trunk = b, t // trunkSent, without a closure to allocate
	return of
}

// trunkSent ends a frame's trip through trunk t, carrying block b (or a
// credit, b nil): a trunk that failed it is down, and the trip's hold on
// the block ends. A gateway whose direct route the trunk's subdevice
// carries is lost with it, as after a failed direct frame (frameLost):
// reported before trunkDown fails a line through it.
func (d *Device) trunkSent(t trunk, b *block, err error) {
	if err != nil && !d.closed.Load() && !d.finalizing.Load() {
		if d.frameLost(t.sub, sdi.Rank(t.via), err) {
			d.lostOver(t.sub.idx, int(t.via), err)
		} else {
			d.trunkDown(t.via, t.sub.idx, err)
		}
	}
	if b != nil {
		b.release(d)
	}
}

// finishBatch sends and completes what a line operation decided.
func (d *Device) finishBatch(bt *fwdBatch, direct bool) {
	defer bt.recycle()
	for _, s := range bt.sends {
		if direct {
			d.trySend(s.sub, s.of, true)
		} else {
			d.out.push(outItem{sub: s.sub, frame: s.of})
		}
	}
	for _, of := range bt.done {
		d.finishFrame(of, nil)
	}
	for _, of := range bt.failed {
		d.finishFrame(of, bt.err)
	}
	for _, b := range bt.release {
		b.release(d)
	}
	if bt.lost >= 0 {
		d.failPeer(int(bt.lost), bt.err, bt.err)
	}
}

// recycle empties bt, keeping its lists' capacity, and gives it back.
func (bt *fwdBatch) recycle() {
	// Field by field: rebuilding the struct from a literal was most of
	// this function's time in profiles, on every message of a line.
	clear(bt.sends)
	clear(bt.done)
	clear(bt.failed)
	clear(bt.release)
	bt.sends, bt.done, bt.failed, bt.release = bt.sends[:0], bt.done[:0], bt.failed[:0], bt.release[:0]
	bt.err = nil
	batchPool.Put(bt)
}

// onCredit runs at the source of a line when its destination peer
// acknowledges every block below cum: they are released and waiting
// frames admitted. rep is the credit message's report of the bytes
// received per trunk slot (delivery.go); empty for none.
func (d *Device) onCredit(peer int32, cum uint64, rep []byte) {
	l := d.fwd.tx[peer]
	if l == nil {
		d.log.Warn("dropping credit from a rank this one does not reach through gateways", "from", peer)
		return
	}
	bt := newBatch()
	l.mu.Lock()
	if cum > l.next {
		l.mu.Unlock()
		bt.recycle()
		d.log.Warn("dropping credit for blocks never sent", "from", peer, "credit", cum)
		return
	}
	now := time.Now()
	i := 0
	for ; i < len(l.retained) && l.retained[i].seq < cum; i++ {
		b := l.retained[i]
		n := b.size()
		l.inflight -= n
		l.load[b.t.slot] -= n
		if !b.copied {
			l.delivered(b.t.slot, b.end, now) // trunks deliver in order
		}
		bt.release = append(bt.release, b)
	}
	if i > 0 {
		l.acked++
		rest := copy(l.retained, l.retained[i:])
		clear(l.retained[rest:])
		l.retained = l.retained[:rest]
	}
	if len(rep) > 0 {
		counts, err := decodeReport(l.report[:0], rep)
		if err != nil {
			d.log.Warn("ignoring a credit's delivery report", "from", peer, "error", err)
		}
		l.report = counts[:0]
		for s, c := range counts[:min(len(counts), len(l.stats))] {
			l.delivered(s, c, now)
		}
	}
	l.settle()
	j := 0
	for j < len(l.waiting) && d.admitLocked(l, peer, l.waiting[j], bt) {
		j++
	}
	if j > 0 {
		rest := copy(l.waiting, l.waiting[j:])
		clear(l.waiting[rest:])
		l.waiting = l.waiting[:rest]
	}
	l.mu.Unlock()
	d.finishBatch(bt, false)
}

// onForward runs at the destination of a line: a new block is unwrapped
// and handled as a direct frame, a duplicate (sent again after a gateway
// died) is dropped; either way a credit is queued. sub is the subdevice
// that delivered it split, which may have placed it; -1 for none.
//
// Copies of a rendezvous data block can race: one being placed (written
// into the receive buffer by its subdevice), another arriving over
// another trunk. Exactly one counts. Whether this copy is new, and what
// becomes of a placement of the block, is decided in one step under the
// matching lock, which placeForwarded holds too: this subdevice's own
// placement always counts (a copy that came first was stashed, not
// counted); a new copy with another subdevice's placement in progress is
// stashed with it (endPlacedForward writes it if that one fails); a new
// copy with none is handled. Decided in separate steps, a placement taken
// between the count and the stash let both copies count, and the receive
// completed with a block of its buffer never written.
func (d *Device) onForward(sub int, from int32, h *header, ib, data []byte) {
	f := &d.fwd
	inner, idata, uerr := unwrap(h, ib, data, d.size)
	dataBlock := uerr == nil && inner.kind == kindSys && inner.tag == sysData && len(idata) > 0
	if dataBlock {
		d.mu.Lock()
	}
	f.rxMu.Lock()
	l := &f.rx[h.src]
	l.count(h.sreq, h.length)
	dup, far, expected := true, false, l.cum
	switch {
	case h.seq >= l.cum+maxAhead:
		far = true
	case h.seq == l.cum:
		dup = false
		l.cum++
		for len(l.above) > 0 {
			if _, ok := l.above[l.cum]; !ok {
				break
			}
			delete(l.above, l.cum)
			l.cum++
		}
	case h.seq > l.cum:
		if _, dup = l.above[h.seq]; !dup {
			if l.above == nil {
				l.above = make(map[uint64]struct{})
			}
			l.above[h.seq] = struct{}{}
		}
	}
	if dup && !far {
		// The source sent it again, so it lacks a credit this rank
		// counts as sent: the one that covered it was lost.
		l.sent, l.lost = 0, true
	}
	f.rxMu.Unlock()
	var own placedBlock
	placed, stashed := false, false
	if dataBlock {
		if sub >= 0 {
			if i := slices.IndexFunc(d.filling, func(p placedBlock) bool {
				return p.fwd && p.sub == sub && p.via == from && p.seq == h.seq && p.r.status.Source == int(h.src)
			}); i >= 0 {
				own, placed = d.filling[i], true
				d.filling = slices.Delete(d.filling, i, i+1)
			}
		}
		if !dup && !far && !placed {
			stashed = d.stashLocked(h.src, h.seq, idata)
		}
		d.mu.Unlock()
	}
	if far {
		if placed {
			d.endPlacedForward(own, false, nil)
		}
		d.log.Warn("dropping forwarded block far beyond its line's window", "from", from, "source", h.src, "block", h.seq, "expected", expected)
		return
	}
	if h.flags&flagCredit != 0 {
		d.onCredit(h.src, h.rreq, nil)
	}
	if dup {
		f.dups.Add(1)
	}
	switch {
	case placed:
		d.endPlacedForward(own, true, data)
	case dup, stashed:
	case uerr != nil:
		d.log.Warn("dropping forwarded block", "from", from, "source", h.src, "error", uerr)
	default:
		d.dispatch(&inner, idata)
	}
	if dup || h.flags&flagUrgent != 0 {
		// A copy sent again may mean the credit for it was lost.
		d.queueCredit(h.src)
	} else {
		d.creditLater(h.src)
	}
}

// rideCredit returns the credit due for the line from src (0: none), for
// a block to src to carry or a credit message, and counts it as sent.
func (f *forwarder) rideCredit(src int32) uint64 {
	f.rxMu.Lock()
	defer f.rxMu.Unlock()
	l := &f.rx[src]
	if l.cum <= l.sent {
		return 0
	}
	l.sent = l.cum
	return l.cum
}

// creditLater makes sure the line from src gets its credit within
// creditDelay, unless a block to src carries it first, and its report
// (which no block carries) within creditDelay too.
func (d *Device) creditLater(src int32) {
	f := &d.fwd
	f.rxMu.Lock()
	l := &f.rx[src]
	arm := !l.timer && (l.cum > l.sent || l.reportDue())
	l.timer = l.timer || arm
	f.rxMu.Unlock()
	if !arm {
		return
	}
	time.AfterFunc(creditDelay, func() {
		f.rxMu.Lock()
		l := &f.rx[src]
		l.timer = false
		due := l.cum > l.sent || l.reportDue()
		f.rxMu.Unlock()
		if due {
			d.queueCredit(src)
		}
	})
}

// queueCredit makes sure a credit for the line from src leaves soon.
func (d *Device) queueCredit(src int32) {
	f := &d.fwd
	f.rxMu.Lock()
	l := &f.rx[src]
	queued := l.queued
	l.queued = true
	f.rxMu.Unlock()
	if !queued {
		d.out.push(outItem{fn: func() { d.sendCredit(src) }})
	}
}

// sendCredit runs in the outbox: it sends the line's newest credit, with
// its report if one is due.
func (d *Device) sendCredit(src int32) {
	f := &d.fwd
	f.rxMu.Lock()
	l := &f.rx[src]
	l.queued = false
	due := l.cum > l.sent
	var rep []byte
	if l.reportDue() {
		due, rep, l.news = true, appendReport(make([]byte, 0, 8*len(l.got)), l.got), false
	}
	l.sent = max(l.sent, l.cum)
	cum, again := l.cum, l.lost
	l.lost = false
	f.rxMu.Unlock()
	if d.closed.Load() || !due {
		return
	}
	t, ok := d.creditWay(src, again)
	if !ok {
		d.log.Warn("cannot return credit: no live route", "to", src)
		return
	}
	of := d.creditFrame(src, cum, rep, t)
	if !d.trySend(t.sub, of, false) {
		d.out.push(outItem{sub: t.sub, frame: of})
	}
}

// creditWay picks the trunk a credit to src takes, among those that
// take this rank's credits to src now (takesCreditsLocked; on standby
// only while no other does, as pickTrunkLocked): the one the line
// measured to deliver fastest
// (least srtt), so that a credit does not queue behind a slow route's
// traffic (the source then took a block of a fast trunk, whose credit it
// was, for lost). After a credit taken that way went missing (again), the
// trunks take credits in turn, skipping that one, until its delivery time
// is measured again or a while passed (wayStat.miss): a trunk can deliver
// blocks fast and yet lose every credit (its gateway lost its link to
// src), but a rank that only receives measures nothing, and a trunk it
// once blamed took none of its credits again. With nothing measured, or
// a trunk not measured since one of the line last came back, they take
// credits in turn too, spread by count, not by cum: a credit sent again
// for the same blocks must not take the same dead trunk again.
func (d *Device) creditWay(src int32, again bool) (trunk, bool) {
	f := &d.fwd
	if f.paths[src][0] == nil { // a direct route
		return d.nextHop(src, 0, f.credits.Add(1))
	}
	l := f.tx[src] // setPath made it
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if again && l.creditSlot > 0 {
		l.stats[l.creditSlot-1].miss(now)
	}
	l.creditSlot = 0
	for _, standby := range [2]bool{false, true} {
		var best trunk
		var fastest time.Duration
		n, trusted, turns := 0, 0, again
		for _, t := range f.paths[src][0] {
			if !d.takesCreditsLocked(l, t, standby, now) {
				continue
			}
			n++
			w := &l.stats[t.slot]
			if w.missed.After(now) {
				turns = true
			} else {
				trusted++
			}
			// Since a trunk of the line came back, delivery times
			// measured before say nothing of it, which may be the faster
			// now: until every trunk was measured again, in turn.
			if w.measured.Before(l.revived) {
				turns = true
			}
			if w.srtt > 0 && (fastest == 0 || w.srtt < fastest) {
				best, fastest = t, w.srtt
			}
		}
		if n == 0 {
			continue
		}
		if !turns && fastest > 0 {
			l.creditSlot = best.slot + 1
			return best, true
		}
		// In turn, skipping the trunks that missed a credit while others
		// did not: they may well lose the next one too.
		pool := n
		if trusted > 0 {
			pool = trusted
		}
		k := f.credits.Add(1) % uint64(pool)
		for _, t := range f.paths[src][0] {
			if d.takesCreditsLocked(l, t, standby, now) && (trusted == 0 || !l.stats[t.slot].missed.After(now)) {
				if k == 0 {
					return t, true
				}
				k--
			}
		}
	}
	// Every live trunk is cut: a credit through one may still arrive.
	return d.nextHop(src, 0, f.credits.Add(1))
}

// takesCreditsLocked reports whether trunk t of line l, on standby or not
// as standby says, takes credits to the line's peer at now: it carries
// the line (carriesLocked) and no gateway beyond it lost a credit lately.
func (d *Device) takesCreditsLocked(l *txLine, t trunk, standby bool, now time.Time) bool {
	return d.carriesLocked(l, t, standby, now) && (l.creditCut == nil || !l.creditCut[t.slot].After(now))
}

// creditTrunkLocked reports whether some trunk of l, the line to src,
// takes credits at now, so that creditWay need not fall back on a trunk
// that is cut.
func (d *Device) creditTrunkLocked(l *txLine, src int32, now time.Time) bool {
	for _, t := range d.fwd.paths[src][0] {
		if d.takesCreditsLocked(l, t, t.standby, now) {
			return true
		}
	}
	return false
}

// creditFrame is a credit message for the line from src, with report rep
// (nil for none), through t. If it is lost with its trunk, trunkDown
// sends every line's credit again through the others; through gateways
// it carries t's slot plus one in sreq, as a block does, for a gateway
// that drops it to name (lost.go).
func (d *Device) creditFrame(src int32, cum uint64, rep []byte, t trunk) *outFrame {
	h := header{kind: kindSys, tag: sysCredit, src: d.rank, dst: src, seq: cum, length: uint64(len(rep))}
	if d.fwd.paths[src][0] != nil {
		h.sreq = uint64(t.slot) + 1
	}
	of := d.frame(t.via, &h, rep)
	of.trunk = t // trunkSent
	return of
}

// flushCredits sends, at Close, the credit of every line that is still
// due, over each live trunk to its source: a late credit's timer may not
// fire before this rank is gone, and the source's Close waits for it.
func (d *Device) flushCredits() {
	f := &d.fwd
	for src := range f.rx {
		cum := f.rideCredit(int32(src))
		if cum == 0 {
			continue
		}
		ways := f.live(src, 0)
		if len(ways) == 0 { // a direct route, or none left
			if t, ok := d.nextHop(int32(src), 0, 0); ok {
				ways = []trunk{t}
			}
		}
		for _, t := range ways {
			d.out.push(outItem{sub: t.sub, frame: d.creditFrame(int32(src), cum, nil, t)})
		}
	}
}

// recredit queues a credit on every line that has seen a block, in case
// trunk k, which died, swallowed the last one. Only k is blamed for it
// (wayStat.miss), and only where the last credit took k: blaming the
// trunk the last credit took whichever died, a rank whose route b broke
// for 50 ms returned its credits through b, the slow one, for good.
func (d *Device) recredit(k trunkKey) {
	f := &d.fwd
	var srcs []int32
	f.rxMu.Lock()
	for src := range f.rx {
		if f.rx[src].cum > 0 || len(f.rx[src].above) > 0 {
			srcs = append(srcs, int32(src))
			f.rx[src].sent = 0 // it may have been lost with the trunk
		}
	}
	f.rxMu.Unlock()
	now := time.Now()
	for _, src := range srcs {
		// Not under rxMu: a line's lock is taken before it (blockFrame).
		if l := f.tx[src]; l != nil && f.paths[src][0] != nil {
			l.mu.Lock()
			if s := l.creditSlot - 1; s >= 0 && l.ways[s].key() == k {
				l.stats[s].miss(now)
			}
			l.mu.Unlock()
		}
		d.queueCredit(src)
	}
}

// fwdDrain waits until every block this rank sent on its lines (through
// gateways or over failover routes) is acknowledged, so that Close does not tear down before the destinations
// have everything. A line whose credit stops coming gets its oldest block
// again every nudgeAfter (see nudge).
func (d *Device) fwdDrain(ctx context.Context) error {
	for peer, l := range d.fwd.tx {
		if l == nil {
			continue
		}
		last, since := -1, time.Now()
		for {
			l.mu.Lock()
			n, failed := len(l.retained)+len(l.waiting), l.failed
			l.mu.Unlock()
			if n == 0 || failed != nil {
				break
			}
			if n != last {
				last, since = n, time.Now()
			} else if time.Since(since) > nudgeAfter {
				d.nudge(int32(peer), false)
				since = time.Now()
			}
			d.out.help()
			select {
			case <-ctx.Done():
				return fmt.Errorf("multidevice: %d blocks to rank %d still unacknowledged: %w", n, peer, ctx.Err())
			case <-time.After(200 * time.Microsecond):
			}
		}
	}
	return nil
}

// nudgeAfter is how long fwdDrain waits for credit before nudging, and
// the least a direct line's watch waits (txLine.patience).
const nudgeAfter = 50 * creditDelay

// nudge sends the oldest unacknowledged block to peer again. It or its
// credit may have been lost on a trunk that broke without either end
// noticing; the destination drops a copy it has and answers it with a
// credit at once, sent over the next of its trunks. Nudges take the live
// trunks in turn, so that one that loses frames unnoticed does not take
// them all. With once (the watch), a block takes each trunk at most once
// (see txLine.nudged); Close's drain nudges without that bound.
func (d *Device) nudge(peer int32, once bool) {
	l := d.fwd.tx[peer]
	bt := newBatch()
	l.mu.Lock()
	if len(l.retained) > 0 {
		b := l.retained[0]
		if t, ok := d.nudgeWayLocked(l, peer, b, once); ok {
			if l.nudged != b.seq+1 {
				l.nudged, l.nudgedVia = b.seq+1, 0
			}
			if t.slot < 64 {
				l.nudgedVia |= 1 << t.slot
			}
			l.nudges++
			l.copying(b, t.slot)
			bt.sends = append(bt.sends, sendItem{t.sub, d.blockFrame(peer, b, t)})
		}
	}
	l.mu.Unlock()
	d.finishBatch(bt, false)
}

// nudgeWayLocked picks the trunk a nudge of b, the oldest block of l, the
// line to peer, takes: the live trunks in turn, and with once only one
// that carried no copy of b yet. A copy through a gateway that lost its
// link unknowing is lost as the block was; the next goes through another.
func (d *Device) nudgeWayLocked(l *txLine, peer int32, b *block, once bool) (trunk, bool) {
	live := d.fwd.live(int(peer), b.class)
	for i := range uint64(len(live)) {
		t := live[(l.nudges+i)%uint64(len(live))]
		if once && l.nudged == b.seq+1 && (t.slot >= 64 || l.nudgedVia&(1<<t.slot) != 0) {
			continue
		}
		return t, true
	}
	return trunk{}, false
}
