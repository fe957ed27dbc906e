package multidevice

import (
	"runtime"
	"sync/atomic"
)

// lane is what sends to one peer share: its sequence numbers, and for the
// blocking Send of a small standard-mode message (sendNow) the route, a
// frame and traffic counts. A sender that holds the lane takes its
// sequence number, uses its frame and counts the frame with one
// compare-and-swap, and lets go with one addition: two locked
// instructions where the sequence number, a spare frame's take and give
// and the traffic counter cost four. A sender that finds the lane held
// (another goroutine sends to the same peer at that moment) takes a
// sequence number alone and does the rest as before.
//
// Only word is shared; the fields below it are set at Open (sub, short)
// or belong to the holder (of, frames, bytes). Lanes are padded to a cache
// line, so that senders to different peers do not share one.
type lane struct {
	// word is the next sequence number times two, plus laneHeld while a
	// sender holds the lane. next adds two and leaves the bit alone, so
	// sequence numbers are taken with or without the lane.
	word atomic.Uint64
	// sub carries every message of at most short bytes to the peer
	// straight and eagerly, in the table's first size class; nil (short
	// -1) when that class is forwarded or its subdevice matches on its own.
	sub   *subdev
	short int
	// Owned by the holder: the frame sendNow fills (nil until the first
	// send), and the frames and payload bytes sub carried to the peer
	// through the lane, which sentTo adds to sub.sent's.
	of            *outFrame
	frames, bytes uint64
	_             [64 - 6*8]byte
}

const laneHeld = 1

// next takes the peer's next sequence number without holding the lane.
func (l *lane) next() uint64 { return l.word.Add(2)>>1 - 1 }

// hold takes the lane, and seqs sequence numbers with it (zero or one),
// unless another goroutine holds it. It returns the first number taken.
func (l *lane) hold(seqs uint64) (uint64, bool) {
	v := l.word.Load()
	if v&laneHeld != 0 || !l.word.CompareAndSwap(v, v+2*seqs+laneHeld) {
		return 0, false
	}
	return v >> 1, true
}

// release lets go of the lane: it clears laneHeld, which only the holder
// sets and next leaves alone.
func (l *lane) release() { l.word.Add(^uint64(0)) }

// counts returns the frames and bytes counted in the lane. It waits for a
// sender that holds it, which does so for one subdevice Send, which never
// blocks.
func (l *lane) counts() (frames, bytes uint64) {
	for {
		if _, ok := l.hold(0); ok {
			break
		}
		runtime.Gosched()
	}
	frames, bytes = l.frames, l.bytes
	l.release()
	return frames, bytes
}

// initLanes finds each peer's lane route once the routes are known; they
// do not change after Open.
func (d *Device) initLanes() {
	classes := d.table.Classes()
	for peer := range d.lanes {
		l := &d.lanes[peer]
		l.short = -1
		if d.matchSub[peer] >= 0 || d.indirect(int32(peer), 0) {
			continue
		}
		l.sub = d.subs[d.routes[peer][0]]
		l.short = l.sub.caps.MaxEager
		if len(classes) > 1 && classes[0].MaxBytes < int64(l.short) {
			l.short = int(max(classes[0].MaxBytes, 0))
		}
	}
}

// sentTo returns the frames and payload bytes s carried to peer.
func (d *Device) sentTo(s *subdev, peer int) (frames, bytes uint64) {
	frames, bytes = s.sent[peer].load()
	if l := &d.lanes[peer]; l.sub == s {
		f, b := l.counts()
		frames, bytes = frames+f, bytes+b
	}
	return frames, bytes
}
