package multidevice

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
)

// Delivery feedback: how fast each trunk of a line delivers, as the
// destination sees it. The cumulative credit cannot tell: while an early
// block crawls over a slow trunk, the blocks a fast one delivered after it
// stay unacknowledged too, so trunks picked by unacknowledged bytes kept
// equal loads and the slow trunk got half the blocks.
//
// Every block carries the slot of the trunk its source sent it through
// (blockFrame stamps it into sreq, and gateways pass it on untouched). The
// destination counts, per line and slot, the bytes of the blocks that
// arrived, copies too. While blocks beyond the cumulative credit arrived
// (one trunk overtook another), its credit messages carry those counts (a
// report, see appendReport), which then say more than the credit; a
// credit riding on a block carries the cumulative block number alone. A
// line whose blocks arrive in order gets no reports: a ping-pong's
// credits keep riding on its replies.
//
// The source keeps per slot the bytes it sent and those reported
// received; a block the credit releases was received too, through its
// trunk unless it was copied (trunks deliver in order). From that it
// measures each trunk's delivery rate (bytes reported while the trunk had
// something in flight, over that time, averaged) and the delivery time of
// one block at a time (srtt and rttvar, as TCP's retransmission timer). A
// block goes through the trunk that would deliver it first
// (pickTrunkLocked, txLine.finish), a direct line's watch gives its
// oldest block as long as its trunk needs (txLine.patience), and a credit
// message takes the trunk that delivers fastest the other way
// (creditWay): behind a slow route's queue it made the source take a
// fast trunk's block for lost.

// maxSlots bounds the trunk slots a report counts: a slot beyond is not
// counted, and its trunk is never measured.
const maxSlots = 64

const (
	// rateSample is the fewest bytes one rate sample spans: a sample of a
	// small frame or two measures the route's latency, not its rate.
	rateSample = 16 << 10
	// initialRTO is the watch's patience with a trunk whose delivery time
	// was never measured (RFC 6298's initial RTO): a first block over a
	// healthy but slow route must not be taken for lost.
	initialRTO = time.Second
	// maxPatience is the longest the watch waits for a trunk.
	maxPatience = retryMax
)

var errBadReport = errors.New("multidevice: malformed delivery report")

// appendReport appends counts, a line's bytes received per trunk slot, to
// b as a credit message's payload: one little-endian uint64 per slot.
func appendReport(b []byte, counts []uint64) []byte {
	for _, c := range counts {
		b = binary.LittleEndian.AppendUint64(b, c)
	}
	return b
}

// decodeReport appends the counts of the report b to counts. It never
// panics; every error wraps errBadReport.
func decodeReport(counts []uint64, b []byte) ([]uint64, error) {
	switch {
	case len(b)%8 != 0:
		return nil, fmt.Errorf("%w: %d bytes, not a whole number of 8-byte counts", errBadReport, len(b))
	case len(b) > 8*maxSlots:
		return nil, fmt.Errorf("%w: %d counts, more than the %d trunk slots a line has", errBadReport, len(b)/8, maxSlots)
	}
	for i := 0; i < len(b); i += 8 {
		counts = append(counts, binary.LittleEndian.Uint64(b[i:]))
	}
	return counts, nil
}

// count counts at the destination a block of n bytes that came through
// the source's trunk slot sreq-1 (sreq as the block's outer header
// carries it).
func (l *rxLine) count(sreq, n uint64) {
	if sreq == 0 || sreq > maxSlots {
		return
	}
	s := int(sreq - 1)
	if s >= len(l.got) {
		l.got = append(l.got, make([]uint64, s+1-len(l.got))...)
	}
	l.got[s] += n
	l.news = l.news || n > 0
}

// reportDue reports whether the line's source lacks counts it needs:
// blocks arrived since the last report, and the credit does not cover
// them all.
func (l *rxLine) reportDue() bool { return l.news && len(l.above) > 0 }

// wayStat is what the source of a line measured of one of its trunks.
type wayStat struct {
	sent uint64 // bytes sent through it, copies and blocks moved away too
	recv uint64 // bytes the destination received through it, at most sent
	// rate is the delivery rate in bytes per second, averaged, and last
	// the latest sample's; 0 until the first sample.
	rate, last float64
	// busy is when the sample under way began: when the trunk got
	// something in flight, or its last delivery since; zero while idle.
	// accBytes and accTime are what the sample spans so far.
	busy     time.Time
	accBytes uint64
	accTime  time.Duration
	// base is sent when the trunk last got something in flight after
	// standing idle: bytes below it were sent before the sample under way
	// began, and never count as delivered in it (blocks moved away when
	// the trunk died may be among them, lost, and the first credit for a
	// block sent after its revival took them for delivered with it).
	base uint64
	// timed is the end (in sent) of the one block being timed, 0 for
	// none, sent at timedAt; srtt and rttvar are the delivery time
	// measured so far (0: none yet).
	timed        uint64
	timedAt      time.Time
	srtt, rttvar time.Duration
	measured     time.Time // when srtt was last sampled
	looked       uint64    // recv when the watch last looked at the trunk
	// missed is until when the trunk takes credits only in turn with
	// the others, if they are not blamed too: a credit to the peer that
	// took it for its srtt went missing since the trunk's delivery time
	// was last measured, and the trunk may deliver blocks and lose
	// credits (creditWay). missedFor is its pause, doubling as a cut's.
	missed    time.Time
	missedFor time.Duration
}

// miss blames the trunk for a credit that went missing at now: until a
// measure of its delivery time says otherwise, or its pause ends, it
// takes credits in turn if others are not blamed. The pause bounds the
// blame: a rank that only receives measures nothing, and its credits
// took the other trunks for good, the slow one too.
func (w *wayStat) miss(now time.Time) {
	if w.missed.After(now) {
		return // a burst of lost credits blames the trunk once
	}
	w.missedFor = min(max(2*w.missedFor, lostPause), retryMax)
	w.missed = now.Add(w.missedFor)
}

// carrying returns the bytes of line l that trunk slot s carries: sent
// and not reported received, and at most what l retains through it (the
// credit covers the rest).
func (l *txLine) carrying(s int) int {
	w := &l.stats[s]
	return int(min(uint64(l.load[s]), w.sent-w.recv))
}

// sending counts n bytes sent through slot s now and returns the end of
// them in the slot's bytes; a block sent for the first time on the slot
// (not a copy) may be timed. A copy voids the slot's timing, as TCP's
// retransmission does (Karn): the credit it brings may be the copy's or
// the original's, and counted from the original's send it includes the
// watch's wait, which then grew with each lost credit, up to maxPatience.
func (l *txLine) sending(s, n int, timed bool) uint64 {
	w := &l.stats[s]
	if w.busy.IsZero() {
		w.base = w.sent
	}
	w.sent += uint64(n)
	if !timed {
		w.timed = 0
	}
	if w.busy.IsZero() || timed && w.timed == 0 {
		now := time.Now()
		if w.busy.IsZero() {
			w.busy = now
		}
		if timed && w.timed == 0 {
			w.timed, w.timedAt = w.sent, now
		}
	}
	return w.sent
}

// copying records that a copy of b, still retained, goes through slot s
// (a nudge) and counts its bytes there. Neither trunk times a delivery
// across it (Karn): on b's own trunk, the credit for the blocks after b
// waits for the copy now.
func (l *txLine) copying(b *block, s int) {
	b.copied = true
	if s != b.t.slot {
		l.moved(b.t.slot)
	}
	l.sending(s, b.size(), false)
}

// moved records that a block sent through slot s goes again through
// another trunk: its timing there is void. Its bytes stay in the slot's
// sent: the block may have arrived (only its credit lost), and then the
// destination's reports count it; taken off, they ran ahead of sent for
// good and a block on its way looked delivered. If it was lost, reports
// stay behind sent, but credits still release what the slot carries
// (onCredit), and carrying is bounded by the slot's load.
func (l *txLine) moved(s int) {
	l.stats[s].timed = 0
}

// delivered records that slot s delivered its first recv bytes, known at
// now: the rate and delivery time samples they complete.
func (l *txLine) delivered(s int, recv uint64, now time.Time) {
	w := &l.stats[s]
	recv = min(recv, w.sent)
	if recv <= w.recv {
		return
	}
	if !w.busy.IsZero() && recv > w.base {
		w.accBytes += recv - max(w.recv, w.base)
		w.accTime += now.Sub(w.busy)
		w.busy = now
		if w.accBytes >= rateSample && w.accTime > 0 {
			sample := float64(w.accBytes) / w.accTime.Seconds()
			if w.rate == 0 {
				w.rate = sample
			} else {
				w.rate += (sample - w.rate) / 4
			}
			w.last, w.accBytes, w.accTime = sample, 0, 0
		}
	}
	w.recv = recv
	if w.timed != 0 && recv >= w.timed {
		r := max(now.Sub(w.timedAt), time.Microsecond)
		if w.srtt == 0 {
			w.srtt, w.rttvar = r, r/2
		} else {
			w.rttvar += (max(w.srtt-r, r-w.srtt) - w.rttvar) / 4
			w.srtt += (r - w.srtt) / 8
		}
		w.timed, w.missed, w.missedFor, w.measured = 0, time.Time{}, 0, now
	}
}

// settle ends the sample under way of every slot with nothing in flight
// any more: time a trunk stands idle says nothing of its rate.
func (l *txLine) settle() {
	for s := range l.stats {
		if w := &l.stats[s]; !w.busy.IsZero() && l.carrying(s) == 0 {
			w.busy, w.timed = time.Time{}, 0
		}
	}
}

// rateNow is the rate the trunk delivers at now, as far as measured:
// the average, or the latest sample if lower (0: none yet). Each sample
// moves the average by a quarter only, and a route measured fast that
// turned slow kept taking blocks at the rate it had for many samples.
func (w *wayStat) rateNow() float64 { return min(w.rate, w.last) }

// finish returns when, in seconds from now, trunk slot s would deliver n
// more bytes: what it has in flight and them, at its rate (rateNow); avg
// stands in for a rate not measured yet (0: none is, all count alike). A
// trunk not measured yet carries at most about a sample's bytes
// (rateSample): with that in flight it would finish never, so that a slow
// route takes little before it is known; with every trunk at that, the
// line waits for a credit to measure one (pickTrunkLocked, admitLocked).
// It once carried one block at a time: with small
// blocks, a fast trunk then took eight round trips to be measured, while
// a slow one first in route order took nearly every block of a new line.
func (l *txLine) finish(s, n int, avg float64) float64 {
	in, rate := l.carrying(s), l.stats[s].rateNow()
	if rate == 0 {
		if in >= rateSample {
			return math.Inf(1)
		}
		rate = max(avg, 1)
	}
	return float64(in+n) / rate
}

// patience is how long the watch of a direct line waits for b, its oldest
// block, before it takes b or its credit for lost: the delivery time its
// trunk measured (srtt plus four rttvar, or initialRTO before the first
// measure), or twice the time to deliver what the trunk carries up to b
// at its rate if that is longer (from the sample's base: what it sent
// before it last stood idle is not ahead of b); never below nudgeAfter.
func (l *txLine) patience(b *block) time.Duration {
	w := &l.stats[b.t.slot]
	p := initialRTO
	if w.srtt > 0 {
		p = w.srtt + 4*w.rttvar
	}
	if from := max(w.recv, w.base); w.rate > 0 && b.end > from {
		// In seconds first: a rate measured tiny must not overflow.
		q := 2 * float64(b.end-from) / w.rate
		p = max(p, time.Duration(min(q, maxPatience.Seconds())*float64(time.Second)))
	}
	return min(max(p, nudgeAfter), maxPatience)
}
