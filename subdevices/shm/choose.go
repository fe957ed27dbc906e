package shm

import (
	"slices"
	"sync/atomic"
	"time"
)

// Choosing between the ring and the single copy.
//
// Neither path is faster everywhere. On the 2-CPU VMs this was built on
// the ring moved 1 MiB payloads at ~15 GB/s against ~10 GB/s for the
// single copy while the two CPUs shared a cache; for seconds at a time
// the same machine makes every cache line that crosses from one CPU to
// the other several times slower, and then the ring fell to ~2.2 GB/s
// while the single copy, which reads the sender's payload once, kept
// ~9 GB/s (interleaved launches of mdbench --sizes 8,1M lat bw, the state
// told apart by the 8 B latency of the same launch). MPICH and Open MPI
// copy once and do not fall.
//
// So where the receiver leaves the choice open (copyAuto, the default)
// the sender picks, for each payload of at least single_copy_min bytes
// (16 KiB by default) or longer than a ring fragment, the
// ring unless its copies show the slow state (slowWrites). Each side times the
// copies it makes and nothing else, since what happens between them
// (polls that come late, other work) is not the path's cost:
//   - the sender its copy of a payload into the ring, fragment after
//     fragment;
//   - the receiver its copies of those fragments out of the ring, and its
//     read of a descriptor's payload (which includes the sender's help,
//     assist.go); it publishes both rates in the ring's control block.
// Streaming, the ring moves payloads as fast as the slower of its two
// copies, which overlap fragment by fragment; the single copy as fast as
// the read. In the slow state it is the sender's copy into the ring that
// collapses (2.3 against ~18 GB/s, 64-payload medians), over lines the
// receiver has just read; the receiver's copies out kept ~22 GB/s.
// Earlier attempts timed a payload's whole passage, on the sender from
// sending to seeing the receiver pass the record, on the receiver from its
// first fragment to its last; both counted polls in between and picked
// the wrong path.
//
// Each rate is the median of the last few samples (window), so a sample
// disturbed by preemption or page faults does not decide. The path not
// preferred is put on trial for a window of payloads once it has gone
// untried for exploreEvery, so a change of state shows within that time;
// a trial of the slow ring costs a window of payloads' worth of the
// difference per exploreEvery (four 256 KiB frames, ~0.35 ms in the slow
// state, every 20 ms).

// Modes of a ring's copy-mode word (offCopyMode), set by its receiver at
// Connect.
const (
	copyRing uint32 = iota // every payload through the ring
	copyDesc               // payloads of at least the sender's single_copy_min by descriptor
	// copyAuto: payloads of at least single_copy_min bytes, or longer
	// than a fragment, by the path the sender chooses; smaller ones
	// through the ring. While the two CPUs share a cache the ring wins
	// at every size: a process_vm_readv of 16 KiB costs ~3.5 µs here,
	// against ~1 µs for a copy in cache, and with the single copy forced
	// on and off (mdbench, eight interleaved runs, medians) the ring won
	// from 16 KiB to 4 MiB, latency 0.45x at 16 KiB and 0.69x at 64 KiB,
	// bandwidth 2.5-3.6x up to 64 KiB. In the slow state it collapsed at
	// those sizes too (64 KiB: 2.3 against MPICH's 9.3 GB/s).
	copyAuto
)

// exploreEvery is how long the path not preferred goes untried, the
// default of device.exploreEvery.
const exploreEvery = 20 * time.Millisecond

// slowWrites is how many times slower the sender's copies into the ring
// must be than the receiver's copies out of it for the single copy to be
// preferred. Both copies move the same bytes between the same two
// caches; what only the writes pay is taking back the ownership of every
// line the other side has just read, the cost the single copy does not
// have (its source is only read, its destination is the receiver's). On
// the machine above, medians of four payloads: out/in 0.9-2.4 in the
// fast state, 4.6-9 in the slow one, once the ring's first lap is left
// out (peer.send). Comparing the rates of the two paths instead failed: a
// path on trial runs in other conditions than the path in use (a single
// copy tried while the sender streams through the ring gets none of its
// help, a ring tried after a while of single copies finds its lines gone
// from the receiver's cache), and the measured rates crossed between the
// states.
const slowWrites = 3.5

// window is how many recent samples a rate is the median of, and how many
// payloads a trial of a path takes.
const window = 4

// epoch is the origin of monoNow.
var epoch = time.Now()

// monoNow reads the monotonic clock.
func monoNow() time.Duration { return time.Since(epoch) }

// rateWindow keeps a path's latest samples. Its owner serializes access.
type rateWindow struct {
	samples [window]float64 // bytes per ns, 0 where none yet
	next    int
}

// add records n bytes copied in d and returns the rate.
func (w *rateWindow) add(n int, d time.Duration) float64 {
	w.samples[w.next] = float64(n) / float64(max(d, 1))
	w.next = (w.next + 1) % window
	return w.rate()
}

// rate returns the median of the recent samples, 0 before the first.
func (w *rateWindow) rate() float64 {
	var s [window]float64
	k := 0
	for _, r := range w.samples {
		if r > 0 {
			s[k] = r
			k++
		}
	}
	if k == 0 {
		return 0
	}
	slices.Sort(s[:k])
	return (s[(k-1)/2] + s[k/2]) / 2
}

// Published rates are in MB/s (bytes per µs) in a uint32, 0 for none.
func publishRate(word *atomic.Uint32, bytesPerNs float64) {
	v := uint32(min(bytesPerNs*1000, 1<<32-1))
	if word.Load() != v {
		word.Store(v)
	}
}

// chooser is a sender's view of its ring to one peer: how fast its own
// copies into the ring went lately, when each path was last taken, and
// the trial under way. The peer's mu guards it.
type chooser struct {
	in    rateWindow
	tried [2]time.Duration // monoNow when a payload last took the ring, the single copy
	ever  [2]bool          // whether each path was ever taken
	trial int              // the path on trial
	left  int              // payloads the trial still takes
	best  int              // the path found faster at the last choice
	calls int              // choices for frames of a fragment or less, for settled
}

// sampleEvery is how often a frame of one fragment or less gets a fresh
// decision and has its copy timed, on each side; the others follow the
// last decision untimed. Two clock reads per side cost ~160 ns and a
// fresh decision ~100 ns more, up to a quarter of a 16 KiB message's
// time when streaming in the fast state.
const sampleEvery = 8

// settled reports whether this frame of a fragment or less may follow the
// last decision: both paths have been taken, and it is not the
// sampleEvery-th.
func (c *chooser) settled() bool {
	c.calls++
	return c.ever[pathRing] && c.ever[pathDesc] && c.calls%sampleEvery != 0
}

// sampled reports whether to time the copy of a frame into the ring:
// every fragmented one, those of a trial (but its last, whose choice
// ended it), and the one of a fragment or less that got a fresh decision
// (settled).
func (c *chooser) sampled(split bool) bool {
	return split || c.left > 0 || c.calls%sampleEvery == 0
}

// Paths a chooser picks from.
const (
	pathRing = iota
	pathDesc
)

// byDesc reports whether the payload to send now goes by descriptor,
// given the receiver's published rates (MB/s, 0 for none yet) of its
// copies out of the ring and of its reads. The single copy is preferred
// when the ring's writes are slowWrites times slower than its reads and
// the receiver's reads beat the ring's slower copy.
//
// The path not preferred is put on trial for a window of payloads once it
// has gone untried for every (exploreEvery but in tests), so that its
// rate is the median of samples all taken now: a single payload through a
// ring left alone for a while finds the receiver's cache emptied of the
// ring's lines and is copied in several times as fast as the next ones.
func (c *chooser) byDesc(now, every time.Duration, outRate, descRate uint32) bool {
	in, out := c.in.rate()*1000, float64(outRate)
	best, other := pathRing, pathDesc
	if in > 0 && out > in*slowWrites && float64(descRate) > in {
		best, other = pathDesc, pathRing
	}
	c.best = best
	if c.left == 0 && (!c.ever[other] || now-c.tried[other] >= every) {
		c.trial, c.left = other, window
	}
	path := best
	if c.left > 0 {
		path = c.trial
		c.left--
	}
	c.tried[path], c.ever[path] = now, true
	return path == pathDesc
}

// byDescriptor reports whether p sends a payload of n bytes by descriptor,
// fragments being chunk bytes long, and whether p's chooser picked the
// path (so that a copy into the ring is its to time). The caller holds
// p.mu.
func (p *peer) byDescriptor(n, chunk int) (desc, chosen bool) {
	if n < p.sd.cfg.SingleCopyMin && n <= chunk {
		// Small payloads, most of them, never load the mode word: it
		// shares a line with the consumer cursor the receiver stores
		// after every record.
		return false, false
	}
	switch p.ring.copyMode.Load() {
	case copyDesc:
		return n >= p.sd.cfg.SingleCopyMin, false
	case copyAuto:
		if c := &p.choose; n <= chunk && c.left == 0 && c.settled() {
			// The last decision stands: a fresh one costs a clock read
			// and two loads of the receiver's line, ~100 ns, a sixth of
			// a 16 KiB message's time when streaming.
			return c.best == pathDesc, true
		}
		out, desc, was := p.ring.outRate.Load(), p.ring.descRate.Load(), p.choose.best
		d := p.choose.byDesc(monoNow(), p.sd.exploreEvery, out, desc)
		if p.choose.best != was && p.sd.log.IsDebug() {
			p.sd.log.Debug("large payloads to peer change path", "peer", int(p.rank), "path", pathNames[p.choose.best],
				"ring_in_mbps", int(p.choose.in.rate()*1000), "ring_out_mbps", out, "single_copy_mbps", desc)
		}
		return d, true
	}
	return false, false
}

// pathNames names the paths for the debug log.
var pathNames = [2]string{pathRing: "ring", pathDesc: "process_vm_readv"}

// sample records, on the receiving side of ring r, a payload of n bytes
// copied out of the ring (path pathRing) or read from the sender (pathDesc)
// in d, and publishes the rate for the sender.
func (rc *receiver) sample(r, path, n int, d time.Duration) {
	in := &rc.sd.inbound[r]
	if path == pathRing {
		publishRate(in.outRate, rc.out[r].add(n, d))
	} else {
		publishRate(in.descRate, rc.desc[r].add(n, d))
	}
}

// sampled reports whether to time this whole frame of ring r: one in
// sampleEvery (see chooser.sampled).
func (rc *receiver) sampled(r int) bool {
	rc.wholes[r]++
	return rc.wholes[r]%sampleEvery == 0
}
