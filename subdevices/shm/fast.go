package shm

import (
	"fmt"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Fast slots. Next to each ring are two slots of fastSlotSize bytes that
// carry small frames while the conversation is a back and forth: a frame
// goes into a slot when the ring holds nothing the receiver has not taken
// yet and the slot's previous frame was taken. The ring walks through
// 16384 lines before it comes back to one, so each of its records lands
// on lines neither core has cached; the two slots stay in both cores'
// caches (BenchmarkRingFloor: ~58 ns a half round trip through 2 lines
// against ~75 through the ring's 16384). Through the multidevice that
// took a tenth off 8-byte latency and nearly a third off 64 and 512
// bytes; slots of one line helped 8 bytes alone.
//
// Order. A slot is a one-record ring of fastSlotSize bytes whose cursor
// is k*fastSlotSize for the k-th fast frame of the pair, so its stamp
// (ring.go) says which frame it holds; the receiver marks a frame taken by
// storing fastTaken(k) over that stamp. Frames stay in the order they were
// sent because:
//   - a fast frame is written only while the ring is empty (this sender's
//     cached copy of the consumer cursor equals its tail), so every
//     record before it was taken, and the receiver looks at the slots
//     before the ring;
//   - a ring record carries, in its wire-header flags, how many fast
//     frames were sent before it (modulo 4; at most two are ever
//     outstanding), and the receiver takes those first. Their stamps
//     were stored before the record's, so they are there.
//
// A stream fills the ring: while it holds records, frames go there, and
// the sender re-reads the consumer cursor only every fastRecheck ring
// sends to see whether it may use the slots again, so a stream pays one
// read of that line per fastRecheck frames. So does a conversation that
// mixes in frames too large for a slot: those go through the ring, and the
// small frames after one follow it there until a re-read finds it empty.

// fastRecheck is how many ring sends pass between reads of the consumer
// cursor made only to get back to the fast slots.
const fastRecheck = 16

// fastTaken is the value a slot's stamp takes once the receiver has
// delivered fast frame k from it: never a stamp (those are k*64+1).
func fastTaken(k uint64) uint64 { return k*fastSlotSize + 2 }

// fastBits is what a ring record written after sent fast frames carries
// in its flags.
func fastBits(sent uint64) uint8 { return uint8(sent&3) << fastShift }

// sendFast writes a frame of at most fastSlotSize record bytes into the
// next fast slot and reports true, or reports false when it must go
// through the ring. The caller holds p.mu.
func (p *peer) sendFast(hdr, payload []byte) bool {
	if p.tail != p.head {
		if p.ringSends%fastRecheck != 0 {
			return false
		}
		// Acquire, as in send: a cursor outside what was written is left
		// for send's own check to report.
		h := p.ring.head.Load()
		if h-p.head > p.tail-p.head || h%recAlign != 0 || h != p.tail {
			return false
		}
		p.head = h
	}
	k := p.fastSent
	slot := p.ring.fast[k%fastSlots]
	if st := word64(slot, 0).Load(); st != 0 && (k < fastSlots || st != fastTaken(k-fastSlots)) {
		return false // its previous frame is not taken yet
	}
	// Limit 0, nothing cleared after the record: the receiver reads a
	// slot's stamp at its start only, a word that holds a stamp, a taken
	// mark or zero, never payload, and none of an earlier frame reads as
	// this one's.
	putParts(slot, k*fastSlotSize, 0, 0, hdr, nil, payload)
	p.fastSent = k + 1
	return true
}

// takeFast delivers the next fast frame from ring r's sender, which
// fastThere reported in its slot, parsing it into rec (the caller's, on
// its stack: filling a record on the heap paid a write barrier check per
// slice). The caller holds rxMu.
func (rc *receiver) takeFast(r int, rec *record) error {
	k := rc.fastNext[r]
	slot := rc.sd.inbound[r].fast[k%fastSlots]
	if err := parseRecord(rec, slot, k*fastSlotSize, maxHeader, rc.sd.caps.MaxFrame); err != nil {
		return fmt.Errorf("fast frame %d: %w", k, err)
	}
	if rec.pad || rec.isDesc || rec.frag != 0 || rec.fastBefore != 0 {
		return fmt.Errorf("%w: fast frame %d is not a whole frame", sdi.ErrBadFrame, k)
	}
	if rc.sd.trace {
		rc.sd.log.Trace("deliver", "peer", r, "header_bytes", len(rec.header), "payload_bytes", len(rec.payload), "fast", true)
	}
	rc.sd.handler.Deliver(sdi.Rank(r), rec.header, rec.payload)
	// Release: the sender reuses the slot only after Deliver returned.
	word64(slot, 0).Store(fastTaken(k))
	rc.fastNext[r] = k + 1
	return nil
}

// fastDue reports whether ring r's sender wrote a fast frame before the
// ring record rec that has not been taken yet.
func (rc *receiver) fastDue(r int, rec *record) bool {
	return !rec.pad && (rec.fastBefore-uint8(rc.fastNext[r]))&3 != 0
}

// fastThere reports whether the next fast frame from ring r's sender is
// in its slot.
func (rc *receiver) fastThere(r int) bool {
	k := rc.fastNext[r]
	return published(rc.sd.inbound[r].fast[k%fastSlots], k*fastSlotSize)
}
