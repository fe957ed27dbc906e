package shm

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/hpc-multidevice/multidevice/internal/futex"
	"github.com/hpc-multidevice/multidevice/internal/sched"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// Waiting policy of the progress goroutine after its last frame: spin for
// spinPolls polls, then poll yieldPolls more times with runtime.Gosched
// between them, then sleep on the doorbell. A busy rank therefore reacts
// within one poll; an idle one parks an OS thread in futex_wait and uses no
// CPU. Together the spin and yield phases last tens of microseconds, short
// enough not to starve other processes on a small machine.
const (
	spinPolls  = 256
	yieldPolls = 64
	// sleepTimeout bounds a doorbell sleep so that a peer whose process died
	// without closing is noticed (at most a few wake-ups per second).
	sleepTimeout = 500 * time.Millisecond
	// livenessEvery is how many polls a busy receiver makes between checks
	// of its peers' liveness.
	livenessEvery = 1 << 12
	// napFor is how long the progress goroutine stays out of the way while
	// a waiting goroutine drives the rings through Poll. It is also the
	// longest a frame waits for the progress goroutine after the last
	// poller gave up: the multidevice polls for longer than this before it
	// parks, so that hand-over is rarely on a message's path. Shorter naps
	// mean more wake-ups, each of which can preempt a spinning rank on a
	// machine with few cores.
	napFor = time.Millisecond
	// drainBudget bounds the payload bytes one pass over a ring delivers
	// (see receiver.drain).
	drainBudget = 1 << 20
)

// receiver is the receive-side state. Whoever holds device.rxMu owns it:
// the progress goroutine or a goroutine in Poll, never both, which keeps
// Deliver calls serialized and in ring order.
type receiver struct {
	sd       *device
	heads    []uint64 // consumer cursor per inbound ring; the shared copy is only ever written
	dead     []bool   // inbound rings no longer read: their rank was reported down (reportDown)
	reported []bool   // ranks already reported through PeerDown
	// active lists the rings a sender attached to and that are not dead,
	// so a rank polls only the ranks that talk to it, not the whole job.
	// gen is the attach generation active was built from.
	active []int
	gen    uint32
	polls  int // polls since the last liveness check

	// Single copy (singlecopy.go): the reader of peers' memory, a buffer
	// for payloads the Handler does not place, and the tokens of
	// completed descriptors being reported.
	vm      vmReader
	scratch []byte
	doneBuf []uint64
	// parts[r] is the frame arriving in fragments on ring r.
	parts []partial
	// watch[r] is rank r's process, held after Disconnect(r) came while
	// a frame of r's was being placed, so that the receiver notices if r
	// dies before the frame is whole (checkWatched): without the
	// connection, nothing else would, and the place would wait for ever.
	watch []*peerProc
	// fastNext[r] counts the fast frames taken from ring r's sender
	// (fast.go).
	fastNext []uint64
	// Sender-assisted copies (assist.go): the last epoch opened per ring,
	// the senders that failed to help and are no longer asked, and the
	// reads that wait for a sender's chunks.
	epoch    []uint32
	noAssist []bool
	parked   []parkedRead
	// out[r] and desc[r] time this rank's copies out of ring r and its
	// reads of r's payloads (choose.go); wholes[r] counts the whole
	// frames of ring r that could have been timed.
	out, desc []rateWindow
	wholes    []int
}

func newReceiver(sd *device) *receiver {
	n := len(sd.inbound)
	return &receiver{sd: sd, heads: make([]uint64, n), dead: make([]bool, n), reported: make([]bool, n), parts: make([]partial, n), watch: make([]*peerProc, n),
		epoch: make([]uint32, n), noAssist: make([]bool, n), parked: make([]parkedRead, n), fastNext: make([]uint64, n), out: make([]rateWindow, n), desc: make([]rateWindow, n), wholes: make([]int, n)}
}

// Poll implements [sdi.Poller]: it drains the inbound rings once on the
// calling goroutine. A call that finds the progress goroutine or another
// poller at work returns 0 at once; the frames are delivered by that one.
func (sd *device) Poll() int {
	if sd.state.Load() != devOpen {
		return 0
	}
	if !sd.polled.Load() {
		sd.polled.Store(true)
	}
	if sd.stop.Load() || !sd.rxMu.TryLock() {
		return 0
	}
	defer sd.rxMu.Unlock()
	// Close sets stop before it takes rxMu to unmap the rings: checked
	// again under the lock, stop==false means the rings are mapped.
	if sd.stop.Load() {
		return 0
	}
	return sd.rx.poll()
}

// progress delivers frames while nobody polls, until Close.
//
// While a goroutine calls Poll (a rank waiting for a message) the progress
// goroutine naps instead of spinning beside it: on a machine with few cores
// two spinners per process starve each other and the peer. It naps without
// announcing a sleep in the segment, so senders do not pay a futex wake
// per frame. Once no Poll came during a nap, it takes over: spin, yield,
// then sleep on the doorbell.
func (sd *device) progress() {
	defer sd.wg.Done()
	idle := 0
	lastCheck := time.Now()
	napTimer := time.NewTimer(napFor)
	defer napTimer.Stop()
	for !sd.stop.Load() {
		if sd.polled.Swap(false) {
			sd.nap(napTimer)
			if time.Since(lastCheck) > sleepTimeout {
				sd.locked(func(rc *receiver) { rc.checkPeers() })
				lastCheck = time.Now()
			}
			idle = 0
			continue
		}
		n := 0
		if !sd.locked(func(rc *receiver) {
			n = rc.poll()
			if rc.polls >= livenessEvery {
				rc.checkPeers()
			}
		}) {
			// A poller holds the rings, perhaps for long (reading large
			// payloads from a sender's memory): stay out of its way
			// rather than spin on the lock beside it.
			sd.nap(napTimer)
			idle = 0
			continue
		}
		if n != 0 {
			idle = 0
			// A rank bound to one CPU shares it between this goroutine's
			// thread and the one its application waits on. Delivering
			// a stream here while that thread waits for the CPU starves
			// it: its Poll never comes to make this goroutine nap, its
			// sends stop, and both ranks crawl at the scheduler's time
			// slices (bibw fell from ~17 to ~2 GB/s in one run of four).
			// Yielding the thread after every pass that delivered lets
			// the waiter run; it costs a system call when nothing else
			// is runnable.
			sched.Yield()
			continue
		}
		idle++
		switch {
		case idle <= spinPolls:
		case idle <= spinPolls+yieldPolls:
			runtime.Gosched()
		default:
			sd.locked(func(rc *receiver) { rc.checkPeers() })
			lastCheck = time.Now()
			if sched.Runnable() {
				// Another goroutine waits for a processor: the
				// application computing between messages, on a rank
				// bound to one CPU. Sleeping in futex_wait would keep
				// the processor from it until the runtime's monitor
				// took it back, 20 us to 10 ms later; a bound rank
				// computing beside an idle subdevice stood still for
				// ~20 ms twice every 4 s. The nap gives the processor
				// back and the next round looks again.
				sd.nap(napTimer)
				sd.naps.Add(1)
			} else {
				sd.sleep()
			}
			idle = 0
		}
	}
}

// locked runs fn with the receive state if no poller holds it, and reports
// whether it did. Close may have unmapped the rings once stop is set.
func (sd *device) locked(fn func(rc *receiver)) bool {
	if !sd.rxMu.TryLock() {
		return false
	}
	defer sd.rxMu.Unlock()
	if sd.stop.Load() {
		return false
	}
	fn(sd.rx)
	return true
}

// nap pauses the progress goroutine for napFor, or until Close. It waits
// in the Go scheduler, not in a system call: a goroutine blocked in a
// system call keeps its processor until the runtime's monitor takes it
// back, after 20 us to 10 ms, and with GOMAXPROCS 1 (a rank its launcher
// bound to one core) the waiting goroutine, which the nap is meant to
// leave the processor to, could not poll meanwhile: with GOMAXPROCS 1,
// 8 B latency was 0.63 us with a futex nap and is 0.25 us with this one
// (mdbench lat, interleaved runs).
func (sd *device) nap(t *time.Timer) {
	t.Reset(napFor)
	select {
	case <-t.C:
	case <-sd.stopping:
	}
}

// poll drains every active inbound ring once and returns the number of
// records consumed. If it completed the last sends of this rank's still
// in flight, it returns their number without draining: the caller may be
// a blocking Send waiting for exactly that, and once it returns its rank
// posts the receive that the peer's next message (often visible in the
// same poll, in a ping-pong) is for. Drained first, that message would
// find no receive and be delivered unexpected, copied twice more. With
// sends still in flight (a stream) draining goes on as usual: a poll
// that skipped it for every completion would starve the other direction.
func (rc *receiver) poll() int {
	rc.polls++
	rc.refresh()
	n := rc.reapAll()
	if n > 0 && rc.sd.inflight.Load() == 0 {
		return n
	}
	for _, r := range rc.active {
		if !rc.dead[r] {
			n += rc.drain(r)
		}
	}
	return n
}

// refresh rebuilds the active list when a sender attached since the last
// look. The generation load is one read of a line senders write only at
// Connect.
func (rc *receiver) refresh() {
	gen := word32(rc.sd.seg.Bytes(), offAttachGen).Load()
	if gen == rc.gen && rc.active != nil {
		return
	}
	if rc.active == nil {
		rc.active = make([]int, 0, len(rc.sd.inbound))
	}
	rc.gen = gen
	rc.active = rc.active[:0]
	for r, rg := range rc.sd.inbound {
		if !rc.dead[r] && rg.attached.Load() != 0 {
			rc.active = append(rc.active, r)
		}
	}
}

// drain delivers the records published in ring r when it was looked at.
func (rc *receiver) drain(r int) int {
	sd := rc.sd
	rg := &sd.inbound[r]
	head := rc.heads[r]
	var rec record
	n := 0
	// Payload bytes delivered in this pass, through the ring or read from
	// the sender's memory: a pass stops after drainBudget of them, so
	// that a poller gets back to its caller (which sends the replies the
	// frames asked for) between large payloads instead of taking a whole
	// window of them at once, and the progress goroutine lets go of the
	// rings. A sender that refills the ring as fast as it is drained kept
	// one pass of the progress goroutine going without end: the rank's
	// waiter, finding the rings taken, counted its requests completing
	// under it as no progress and parked, and its own sends waited for
	// the outbox goroutine's pauses (bibw at 64 KiB fell to ~1.7 GB/s in
	// most runs after a test of 4 MiB messages).
	read := 0
	if rc.parked[r].pr != nil {
		// A payload of this ring waits for chunks its sender took
		// (parkedRead): nothing after it goes first.
		if err := rc.finishParked(r, false); err != nil {
			if !errors.Is(err, errParked) {
				rc.fail(r, err)
			}
			return 0
		}
	}
	// published is the acquire that pairs with the sender's stamp, so
	// every byte of the record is visible. A sender that rewrites a
	// record after stamping it breaks its own frames, nothing else:
	// parseRecord checks lengths against the ring, and handle copies or
	// delivers only within them.
	for !sd.stop.Load() && read < drainBudget {
		// The fast slots first: a frame there was sent after every
		// record the ring holds was taken (fast.go).
		if !rc.parked[r].ready && rc.fastThere(r) {
			if err := rc.takeFast(r, &rec); err != nil {
				rc.fail(r, err)
				break
			}
			n++
			continue
		}
		if !published(rg.data, head) {
			break
		}
		err := parseRecord(&rec, rg.data, head, maxHeader, sd.caps.MaxFrame)
		if err == nil && rc.parked[r].ready && !rec.isDesc {
			err = fmt.Errorf("%w: descriptor record at cursor %d changed while its payload was read", sdi.ErrBadFrame, head)
		}
		if err == nil && rc.fastDue(r, &rec) {
			if rc.fastThere(r) {
				continue // it goes first, at the top of the loop
			}
			err = fmt.Errorf("%w: record at cursor %d follows fast frames that are not there", sdi.ErrBadFrame, head)
		}
		if err == nil {
			err = rc.handle(r, head, &rec, &read)
		}
		if errors.Is(err, errParked) {
			break // the record stays at head for a later pass
		}
		if err != nil {
			rc.fail(r, err)
			break
		}
		head = rec.next
		rc.heads[r] = head
		// Release: pairs with the sender's head.Load; it may reuse the
		// bytes of this record, and the payload a descriptor pointed at,
		// only after Deliver returned.
		rg.head.Store(head)
		if rec.isDesc {
			sd.wakeSender(r)
		}
		n++
	}
	return n
}

// partial is a frame whose fragments are arriving on one ring.
type partial struct {
	active bool
	header []byte        // a copy of the frame's header
	dst    []byte        // where the payload goes: the Handler's place, or buf
	placed bool          // dst is the Handler's place
	got    int           // bytes of dst filled
	buf    []byte        // this ring's buffer for frames the Handler does not place
	spent  time.Duration // copying fragments out so far, if the rank chooses paths (choose.go)
	lapped bool          // the frame started past the ring's first lap
}

// copyOut copies a fragment's payload out of the ring into part's place and
// returns the bytes copied, timing the copy where the rank chooses
// between the ring and the single copy (choose.go).
func (rc *receiver) copyOut(part *partial, payload []byte) int {
	if rc.sd.copyWant != copyAuto {
		return copy(part.dst[part.got:], payload)
	}
	start := monoNow()
	n := copy(part.dst[part.got:], payload)
	part.spent += monoNow() - start
	return n
}

// handle delivers the frame in rec, read at cursor head of ring r, or
// takes its part of a fragmented frame, and adds the payload bytes it
// moved, out of the ring or the sender's memory, to read.
func (rc *receiver) handle(r int, head uint64, rec *record, read *int) error {
	sd := rc.sd
	if rec.pad {
		return nil
	}
	*read += len(rec.payload) // the ring's bytes; a descriptor's are added once fetched
	part := &rc.parts[r]
	if part.active != (rec.frag == flagNext) {
		if part.active {
			return fmt.Errorf("%w: record at cursor %d breaks into a fragmented frame (%d of %d bytes arrived)", sdi.ErrBadFrame, head, part.got, len(part.dst))
		}
		return fmt.Errorf("%w: fragment at cursor %d continues no frame", sdi.ErrBadFrame, head)
	}
	header, payload := rec.header, rec.payload
	switch {
	case rec.frag == flagFirst:
		var dst []byte
		if sd.placer != nil && rc.watchable(r) {
			dst = sd.placer.Place(sdi.Rank(r), rec.header, rec.total)
			if dst != nil && len(dst) != rec.total {
				return fmt.Errorf("shm: handler placed a %d-byte payload in %d bytes", rec.total, len(dst))
			}
		}
		part.placed = dst != nil
		if dst == nil {
			if cap(part.buf) < rec.total {
				part.buf = make([]byte, sd.caps.MaxFrame)
			}
			dst = part.buf[:rec.total:rec.total]
		}
		part.header = append(part.header[:0], rec.header...)
		part.active, part.dst, part.got, part.spent = true, dst, 0, 0
		// The ring's first lap maps pages for the first time; timing it
		// would time page faults, not the path (choose.go).
		part.lapped = head >= uint64(len(sd.inbound[r].data))
		part.got = rc.copyOut(part, rec.payload)
		return nil
	case rec.frag == flagNext:
		if len(rec.payload) > len(part.dst)-part.got {
			return fmt.Errorf("%w: fragment at cursor %d of %d bytes overruns its frame (%d of %d bytes arrived)",
				sdi.ErrBadFrame, head, len(rec.payload), part.got, len(part.dst))
		}
		part.got += rc.copyOut(part, rec.payload)
		if part.got < len(part.dst) {
			return nil
		}
		header, payload = part.header, part.dst
		part.active, part.dst, part.placed = false, nil, false
		if sd.copyWant == copyAuto && part.lapped {
			rc.sample(r, pathRing, len(payload), part.spent)
		}
	case rec.isDesc:
		var start time.Duration
		// A read that was parked is not timed: its time is the
		// sender's stall, not the path's.
		timed := sd.copyWant == copyAuto && !rc.parked[r].ready
		if timed {
			start = monoNow()
		}
		var err error
		if payload, err = rc.fetch(r, rec, head); err != nil {
			return err
		}
		*read += len(payload)
		if timed {
			rc.sample(r, pathDesc, len(payload), monoNow()-start)
		}
	}
	if sd.trace {
		sd.log.Trace("deliver", "peer", r, "header_bytes", len(header), "payload_bytes", len(payload), "single_copy", rec.isDesc)
	}
	if rec.frag == 0 && !rec.isDesc && len(payload) >= sd.cfg.SingleCopyMin && sd.copyWant == copyAuto &&
		head >= uint64(len(sd.inbound[r].data)) && rc.sampled(r) {
		// A whole frame's payload is copied out of the ring by the
		// Handler, in Deliver (choose.go; not on the first lap, see
		// partial.lapped; one in sampleEvery).
		start := monoNow()
		sd.handler.Deliver(sdi.Rank(r), header, payload)
		rc.sample(r, pathRing, len(payload), monoNow()-start)
		return nil
	}
	sd.handler.Deliver(sdi.Rank(r), header, payload)
	return nil
}

// pending reports whether a sender attached since the last poll or an
// active ring holds unread records.
func (rc *receiver) pending() bool {
	if word32(rc.sd.seg.Bytes(), offAttachGen).Load() != rc.gen || rc.reapPending() {
		return true
	}
	for _, r := range rc.active {
		if rc.dead[r] {
			continue
		}
		if pk := &rc.parked[r]; pk.pr != nil {
			// The record at head waits for the sender's chunks; the
			// sender rings the doorbell after each (peer.assistOne).
			if rc.sendersDone(r) {
				return true
			}
			continue
		}
		if rc.fastThere(r) || published(rc.sd.inbound[r].data, rc.heads[r]) {
			return true
		}
	}
	return false
}

// fail stops reading ring r after a corrupt record or a payload that
// could not be read from the sender's memory, stops sending to that rank
// too, and reports it down.
func (rc *receiver) fail(r int, err error) {
	if errors.Is(err, sdi.ErrPeerUnreachable) {
		err = fmt.Errorf("shm: rank %d: reading a payload from its memory: %w", r, err)
		rc.sd.log.Debug("peer gone while reading its memory", "peer", r, "error", err)
	} else {
		err = fmt.Errorf("shm: ring from rank %d is corrupt, no longer reading it: %w", r, err)
		rc.sd.log.Error("corrupt shared-memory ring", "peer", r, "error", err)
	}
	if p := rc.sd.peers[r].Load(); p != nil {
		p.markDown(err)
	}
	rc.reportDown(r, err)
}

// checkPeers reports connected peers that went away, after delivering what
// they sent before.
func (rc *receiver) checkPeers() {
	rc.polls = 0
	for r := range rc.sd.peers {
		if rc.reported[r] {
			continue
		}
		if rc.parked[r].pr != nil {
			// The sender may still write a chunk into the place of the
			// read parked on its ring for as long as its process runs,
			// whatever else it did meanwhile (closed its segment, for
			// one): it is reported down only once its process exited.
			// Its frames after that read are not delivered, as when a
			// read fails: they would overtake the read's.
			if err := rc.checkParked(r, true); err != nil {
				rc.fail(r, err)
			}
			continue
		}
		p := rc.sd.peers[r].Load()
		if p == nil {
			rc.checkWatched(r)
			continue
		}
		if err := p.alive(); err != nil {
			p.markDown(err) // what it read completes, the rest fails
			rc.drainGone(r)
			rc.reportDown(r, err)
		}
	}
}

// watchable reports whether the receiver would notice that rank r died
// while it fills a place with r's fragments: through the connection to r,
// or, after Disconnect, through the process it kept (watch). The frame of
// a rank it cannot watch is not placed, but assembled in a buffer of its
// own: if r died halfway through, nothing would report r down, and the
// Handler would keep the place for a Deliver that never comes.
func (rc *receiver) watchable(r int) bool {
	return rc.watch[r] != nil || rc.sd.peers[r].Load() != nil
}

// disconnected notes that the connection to rank r, whose process is
// proc, is ending: if a frame of r's is being placed, the receiver keeps
// the process until the frame is whole, to notice r's death meanwhile.
// The caller holds rxMu.
func (rc *receiver) disconnected(r int, proc *peerProc) {
	part := &rc.parts[r]
	if !part.active || !part.placed || rc.dead[r] || proc == nil || !proc.hold() {
		return
	}
	rc.unwatch(r) // one from an earlier connection to r
	rc.watch[r] = proc
}

// checkWatched checks on rank r, disconnected while a frame of its was
// being placed: once its process exited with the frame not whole, it
// delivers what r left and reports r down, which ends the place; once no
// frame of r's is being placed any more, it lets go of the process.
func (rc *receiver) checkWatched(r int) {
	w := rc.watch[r]
	if w == nil {
		return
	}
	if part := &rc.parts[r]; part.active && part.placed {
		err := w.check()
		if err == nil {
			return
		}
		rc.drainGone(r)
		rc.reportDown(r, fmt.Errorf("shm: rank %d, disconnected, went away while a frame of its was being placed: %w", r, err))
	}
	rc.unwatch(r)
}

// unpark drops the read parked on ring r, if any, with its place. Only
// reportDown calls it, and a parked read is reported down only once its
// sender's process exited (checkPeers): before, the sender may still
// write into the place.
func (rc *receiver) unpark(r int) {
	pk := rc.parked[r]
	rc.parked[r] = parkedRead{}
	if pk.pr != nil {
		if err := pk.pr.release(); err != nil {
			rc.sd.log.Warn("releasing the process of peer", "peer", r, "error", err)
		}
	}
}

// unwatch lets go of the process kept for rank r, if any.
func (rc *receiver) unwatch(r int) {
	if w := rc.watch[r]; w != nil {
		rc.watch[r] = nil
		if err := w.release(); err != nil {
			rc.sd.log.Warn("releasing the process of peer", "peer", r, "error", err)
		}
	}
}

// drainGone delivers what rank r, which went away, left in its ring, so
// that nothing it sent before is lost to the report that follows (after
// which the ring is no longer read). A pass stops at drainBudget, so it
// takes several; their number is bounded by what the ring holds, which
// keeps a rank that goes on writing from holding the receiver.
func (rc *receiver) drainGone(r int) {
	passes := len(rc.sd.inbound[r].data)/drainBudget + 2
	for i := 0; i < passes && !rc.dead[r] && rc.drain(r) > 0; i++ {
	}
}

// reportDown reports rank r down, once, and stops reading its ring. The
// report ends every place the Handler gave for r's frames ([sdi.Placer]):
// the rest of a frame being placed must not be copied into its place,
// which the multidevice may hand back to its owner at the report, nor the
// frame delivered; and a frame of r's placed after the report could not
// be ended by another if it could not be filled (a rank is reported once).
// So the frame being assembled is dropped and the ring left alone, even
// when r's Send was still writing into it (a Close marks the segment
// closed while a Send of the same rank is halfway through the fragments
// of a frame).
func (rc *receiver) reportDown(r int, err error) {
	rc.dead[r] = true
	part := &rc.parts[r]
	part.active, part.dst, part.got, part.placed = false, nil, 0, false
	rc.unpark(r)
	rc.unwatch(r)
	if rc.reported[r] || rc.sd.stop.Load() {
		return
	}
	rc.reported[r] = true
	rc.sd.log.Debug("peer down", "peer", r, "error", err)
	rc.sd.handler.PeerDown(sdi.Rank(r), err)
}

// sleep waits on the doorbell until a sender rings it, Close does, or
// sleepTimeout passes.
//
// Why no wake-up is lost. Go's atomics are sequentially consistent, so all
// the loads and stores below and in ringDoorbell fall into one total order.
// The receiver does
//
//	R1 seq := doorbell   R2 sleeping = 1   R3 re-check the stamp at every head (and stop)   R4 futex_wait(doorbell, seq)
//
// and a sender (or Close) does
//
//	S1 store a record's stamp (stop)   S2 load sleeping; if 1: S3 doorbell++, S4 futex_wake(doorbell)
//
// (R3 scans only the active rings, but it also compares the attach
// generation, which a new sender bumps before its first S1; so "R3 misses
// S1" still implies S1 follows R3.)
//
// If R3 misses S1, then S1 follows R3, so S2 follows R2 and reads 1: the
// sender rings. S3 follows R1, so the doorbell no longer equals seq. If S3
// comes before the kernel's check in R4, futex_wait returns at once (EAGAIN);
// otherwise the receiver is already queued when S4 runs and is woken. If R3
// sees S1, the receiver does not sleep at all. Either way the record is read.
//
// R3 runs under rxMu; when a poller holds it the receiver does not sleep at
// all (a rank that polls is awake), and a record a poller consumes after R3
// only makes the wake-up spurious.
func (sd *device) sleep() {
	mem := sd.seg.Bytes()
	bell := word32(mem, offDoorbell)
	sleeping := word32(mem, offSleeping)
	seq := bell.Load()
	sleeping.Store(1)
	pending := true
	sd.locked(func(rc *receiver) { pending = rc.pending() })
	if !pending && !sd.stop.Load() {
		sd.sleeps.Add(1)
		timeout := sd.sleepFor
		if sd.inflight.Load() > 0 {
			// A receiver that disconnected from this rank still reads
			// the descriptors it had, but has no mapping of this
			// segment to ring the doorbell through: their SendDone
			// would wait for the whole timeout (or for good in tests).
			timeout = napFor
		}
		if err := futex.Wait(rawWord32(mem, offDoorbell), seq, timeout); err != nil {
			// Should not happen; fall back to a short nap rather than a busy loop.
			sd.log.Warn("futex wait failed", "error", err)
			time.Sleep(time.Millisecond)
		}
	}
	sleeping.Store(0)
}
