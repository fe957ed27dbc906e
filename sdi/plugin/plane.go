package plugin

import (
	"github.com/hpc-multidevice/multidevice/sdi"
)

// The data plane moves records between the host and the plugin: frames
// out, deliveries and lost peers in. Two implementations share one record
// format: rings in shared memory (ringplane.go), and batches on the
// Transfer stream (streamplane.go) where a segment cannot be shared.

// hostPlane is the host's side.
type hostPlane interface {
	// send writes one frame record. It never blocks and returns
	// sdi.ErrWouldBlock when the plane is full. Safe for concurrent use.
	send(peer sdi.Rank, header, payload []byte) error
	// poll hands arrived records to the Handler on the calling goroutine
	// and returns how many; 0 at once if another goroutine is at it.
	poll() int
	// idle says the polling rank parks; see sdi.Idler.
	idle()
	// stop ends the plane's goroutines; no Handler call follows its return.
	stop()
}

// pluginPlane is the plugin's side.
type pluginPlane interface {
	// put writes one record towards the host. It waits while the plane is
	// full, and gives up (returning false) once the plane stops.
	put(kind uint8, peer sdi.Rank, header, payload []byte) bool
	// stop ends the plane's goroutines.
	stop()
}

// deliver hands one inbound record to h. It reports a protocol violation
// for a record kind that does not travel to the host.
func deliver(h sdi.Handler, rec record) bool {
	switch rec.kind {
	case kindDeliver:
		h.Deliver(rec.peer, rec.header, rec.payload)
	case kindPeerDown:
		h.PeerDown(rec.peer, &remoteError{op: "peer down", msg: string(rec.payload)})
	default:
		return false
	}
	return true
}

// planeBytes sizes the data plane for a subdevice's caps: a ring is the
// smallest power of two that holds four of its largest records, up to
// maxPlaneBytes. A subdevice whose record would exceed half of that (a
// ring takes records of up to half its size) gets its MaxFrame lowered to
// fit, so a ring holds at least two; the multidevice then cuts large
// messages into more frames. The result depends on caps alone, so every
// rank that runs the subdevice as a plugin publishes the same limits.
func planeBytes(c sdi.Caps) (int, sdi.Caps) {
	rec := recordLen(c.MaxHeader, c.MaxFrame)
	size := 1 << 20
	for size < 4*rec && size < maxPlaneBytes {
		size <<= 1
	}
	if limit := size/2 - recordPrefix - c.MaxHeader; c.MaxFrame > limit {
		c.MaxFrame = limit &^ (recordAlign - 1)
		c.MaxEager = min(c.MaxEager, c.MaxFrame)
	}
	return size, c
}

// inboundMax is the largest payload the host takes from the plugin, in a
// place-area slot: up to the subdevice's own MaxFrame, own, within
// maxPlaneBytes, and never less than the ring's limit, fitted. A rank that
// runs the subdevice built in cuts frames to own, not to fitted, and those
// must reach this one (plugins.hcl.md: the same subdevice may be built in
// on one rank and a plugin on another).
func inboundMax(own, fitted int) int {
	return max(fitted, min(own, maxPlaneBytes))
}

// maxPlaneBytes bounds one direction of the data plane.
const maxPlaneBytes = 64 << 20
