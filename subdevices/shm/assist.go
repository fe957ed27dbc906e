package shm

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Sender-assisted single copy.
//
// A receiver reading a large payload with process_vm_readv copies at the
// kernel's copy speed on one core, while the sender, waiting for the
// SendDone of that very payload, polls on the other. So the receiver asks
// for help (unless it is sending large payloads to that sender itself,
// which then has its own reading to do): before it reads a descriptor's
// payload of at least two chunks it publishes, in the assist words of the
// sender's ring, the record's cursor and where the payload goes in its
// own memory, and both sides take chunks from one counter. The receiver
// reads its chunks with process_vm_readv, the sender writes its chunks
// with process_vm_writev into the receiver's buffer, and the two copies
// run on two cores.
//
// The counter (claim word) holds an epoch in its upper half and the next
// chunk in its lower half. The receiver opens an epoch after storing the
// request, takes chunks with Add, and once a chunk at or past the end
// comes back every chunk has been taken exactly once; it closes the epoch
// (chunk index assistClosed) before it writes the next request, and waits
// until the done word counts the chunks the sender took. A sender takes a
// chunk with a compare-and-swap from the claim word it loaded before the
// request, so a sender holding an old view fails its swap: a request it
// read after the word it swaps on belongs to a later epoch only if that
// epoch's close came first, and the closed word never matches.
//
// What a peer can do wrong. The sender checks the cursor against its own
// descriptors in flight and the length against that payload before it
// takes a chunk, and reads only from that payload; the destination is the
// receiver's, written through the kernel, which refuses addresses not
// mapped there. A receiver that names anything else gets no help. A
// sender that fails a write adds assistFailed; the receiver then reads the
// whole payload itself.
//
// A sender that took a chunk may write it into the place until it counts
// it done, and nothing the receiver does stops a process_vm_writev under
// way in another process. So the receiver waits for every chunk the
// sender took for as long as the sender's process runs, and reports it
// down, its place ended ([sdi.Placer]), only once it has exited; not at
// the receiver's Close either, after which the multidevice hands the
// buffers back: Close waits for them, and a Close whose ctx ends first
// returns its error while the chunks are still due, so that the
// multidevice keeps those buffers (see [sdi.Placer]). Giving up sooner let a stopped
// sender, once resumed, write its chunk into a buffer the application
// had been given back, or count it done in the next epoch's word, where
// the receiver took it for a chunk of the next payload.
//
// It waits without holding the receive lock. A read whose sender's
// chunks are not in shortly after the receiver's own is parked
// (parkedRead): the record stays at the ring's head, so nothing that
// sender sent later is delivered first, and whoever holds the lock next
// looks again, while the other rings are drained as usual. A sender
// stopped mid-chunk (SIGSTOP, a debugger) thus holds up its own frames
// only. The sender rings the receiver's doorbell after each chunk it
// counts, so a receiver asleep meanwhile wakes for it; its process is
// checked at most once a millisecond while polled and at every liveness
// check while idle, and a stall past assistPatience is logged once.
//
// Revocation (singlecopy.go) still holds: the receiver waits for the
// sender's chunks before it loads the revoked word, so a chunk copied from
// a payload already handed back to its owner is never delivered.
// Payloads stay referenced by the sender's inflight list until SendDone,
// which needs the receiver's head to pass the record, which it does only
// after the wait.

// assistWords are a ring's assist words in the receiver's segment.
type assistWords struct {
	at    *atomic.Uint64 // cursor of the descriptor record
	dst   *atomic.Uint64 // destination address in the receiver
	n     *atomic.Uint64 // payload length
	claim *atomic.Uint64 // epoch<<32 | next chunk
	done  *atomic.Uint64 // chunks the sender copied + assistFailed per failed one
}

const (
	// assistChunk is the unit the two sides take turns on: large enough
	// that a system call costs little against its copy (~15 µs), small
	// enough that a 256 KiB block is split four ways.
	assistChunk = 64 << 10
	// assistClosed in the claim word's lower half closes its epoch.
	assistClosed = 1<<32 - 1
	// assistFailed is added to the done word for a chunk the sender
	// could not write.
	assistFailed = 1 << 32
	// assistPatience is how long a receiver waits for a sender's chunk
	// before it logs the stall and checks on the sender every millisecond
	// instead of spinning; it waits on while the sender's process runs.
	assistPatience = 2 * time.Second
	// assistSpin is how many times a receiver that copied its own chunks
	// looks whether the sender's are done before it parks the read
	// (parkedRead): a chunk takes ~15 us, and a sender that is not
	// copying is not helped by the receiver waiting with the lock held.
	assistSpin = 1 << 12
)

// chunks returns the number of assistChunk pieces of an n-byte payload.
func chunks(n int) int { return (n + assistChunk - 1) / assistChunk }

// readAssisted fills dst from addr in process pr (sender rank r, record
// at cursor head), with the sender's help if it gives it, and returns
// once every byte is there or the sender's process exited. The caller
// checked that pr runs.
func (rc *receiver) readAssisted(r int, pr *peerProc, dst []byte, addr, head uint64) error {
	parked, err := rc.startAssisted(r, pr, dst, addr, head)
	if err != nil || !parked {
		return err
	}
	err = rc.finishParked(r, true)
	rc.parked[r] = parkedRead{} // the caller has dst
	return err
}

// startAssisted starts filling dst from addr in process pr (sender rank
// r, record at cursor head) and copies its own part. It reports parked
// when chunks the sender took are still being copied a little later:
// then rc.parked[r] holds the read, and finishParked ends it. The caller
// checked that pr runs.
func (rc *receiver) startAssisted(r int, pr *peerProc, dst []byte, addr, head uint64) (parked bool, err error) {
	n := len(dst)
	nc := chunks(n)
	pid := pr.pid
	if nc < 2 || rc.noAssist[r] || rc.sendingTo(r) {
		return false, rc.vm.read(pid, dst, addr)
	}
	// The wait below asks pr whether the sender still runs; a
	// reconnect may release it meanwhile, which would leave no answer.
	if !pr.hold() {
		return false, fmt.Errorf("connection to process %d released: %w", pid, sdi.ErrPeerUnreachable)
	}
	aw := rc.sd.inbound[r].assist
	rc.epoch[r]++
	e := uint64(rc.epoch[r]) << 32
	aw.done.Store(0)
	aw.at.Store(head)
	aw.dst.Store(uint64(uintptr(unsafe.Pointer(unsafe.SliceData(dst)))))
	aw.n.Store(uint64(n))
	aw.claim.Store(e) // opens the epoch: the request above is complete
	took := 0         // chunks this side took, copied or not
	for {
		k := int(uint32(aw.claim.Add(1))) - 1
		if k >= nc || k < 0 {
			break
		}
		took++
		off := k * assistChunk
		end := min(off+assistChunk, n)
		if err = rc.vm.read(pid, dst[off:end], addr+uint64(off)); err != nil {
			break
		}
	}
	// Closing with a swap tells exactly how many chunks were taken: no
	// swap of the sender's succeeds after it.
	taken := min(int(uint32(aw.claim.Swap(e|assistClosed))), nc)
	rc.parked[r] = parkedRead{pr: pr, dst: dst, addr: addr, head: head, want: taken - took, err: err}
	for range assistSpin {
		if rc.sendersDone(r) {
			err := rc.finishParked(r, false)
			rc.parked[r] = parkedRead{} // the caller has dst
			return false, err
		}
	}
	// The wait that assistPatience bounds starts now, not at the first
	// checkParked, which may come a liveness check later.
	now := time.Now()
	rc.parked[r].since, rc.parked[r].looked = now, now
	return true, nil
}

// parkedRead is a payload read of one ring whose sender still copies
// chunks it took into dst. The receiver leaves it there rather than
// wait with the receive lock held, so that a sender stopped mid-chunk
// (SIGSTOP, a debugger) holds up its own ring only, not the others:
// drain delivers nothing more of that ring until the read ends. dst
// stays the read's, neither delivered nor given up, until every chunk
// is copied or the sender's process exited (see the top of this file).
// Once the chunks are in, ready says that dst holds the payload of the
// record at head, for fetch to deliver on the next pass.
type parkedRead struct {
	pr      *peerProc // held while parked; nil when no read is parked
	ready   bool      // the read ended well; dst is the payload
	dst     []byte
	addr    uint64    // the payload's address in the sender
	head    uint64    // cursor of the descriptor record
	want    int       // chunks the sender took
	err     error     // from this side's own reads
	since   time.Time // when the read was parked
	looked  time.Time // when the sender's process was last checked, since at first
	stalled bool      // the stall was logged
}

// sendersDone reports whether the sender of ring r copied, or failed,
// every chunk it took of the read parked there. The done word's load is
// the acquire that pairs with the sender's Add after its write.
func (rc *receiver) sendersDone(r int) bool {
	d := rc.sd.inbound[r].assist.done.Load()
	return int(uint32(d))+int(d>>32) >= rc.parked[r].want
}

// errParked says that a read is parked (parkedRead): the frame is
// delivered by a later pass.
var errParked = errors.New("shm: payload read waits for its sender's chunks")

// finishParked ends the read parked on ring r once the sender copied
// every chunk it took, reading the payload alone if one failed. With
// wait it waits for them, for as long as the sender's process runs;
// without, it returns errParked while they are still being copied. It
// returns an error wrapping [sdi.ErrPeerUnreachable] once the process
// exited: no chunk can come any more, and the place may be given up.
func (rc *receiver) finishParked(r int, wait bool) error {
	pk := rc.parked[r]
	done := rc.sd.inbound[r].assist.done
	var err error
	if !rc.sendersDone(r) {
		if wait {
			err = rc.awaitSender(r, pk.pr, done, pk.want)
		} else if err = rc.checkParked(r, false); err == nil {
			return errParked
		}
	}
	rc.parked[r] = parkedRead{}
	defer func() {
		if rerr := pk.pr.release(); rerr != nil {
			rc.sd.log.Warn("releasing the process of peer", "peer", r, "error", rerr)
		}
	}()
	switch {
	case err != nil:
		return err
	case pk.err != nil:
		return pk.err
	case done.Load()>>32 != 0:
		// The sender could not write (it may lack permission to write
		// here): read it all, and stop asking this sender.
		rc.noAssist[r] = true
		rc.sd.log.Debug("peer failed to write its part of a payload; reading its payloads alone", "peer", r)
		if err := pk.pr.guard(); err != nil {
			return err
		}
		if err := rc.vm.read(pk.pr.pid, pk.dst, pk.addr); err != nil {
			return err
		}
	}
	rc.parked[r] = parkedRead{ready: true, dst: pk.dst, head: pk.head}
	return nil
}

// checkParked returns an error wrapping [sdi.ErrPeerUnreachable] once the
// process of ring r's sender, whose read is parked, exited. It looks at
// most once a millisecond unless forced, and logs a sender that took
// longer than assistPatience once.
func (rc *receiver) checkParked(r int, force bool) error {
	pk := &rc.parked[r]
	now := time.Now()
	if !force && now.Sub(pk.looked) < time.Millisecond {
		return nil
	}
	pk.looked = now
	if err := pk.pr.check(); err != nil {
		return fmt.Errorf("rank %d stopped while copying a payload: %w", r, err)
	}
	if !pk.stalled && now.Sub(pk.since) > rc.sd.assistPatience {
		pk.stalled = true
		rc.sd.assistStalls.Add(1)
		rc.sd.log.Warn("peer took part of a payload and has not copied it; its frames wait while its process runs, since it may still write into the place",
			"peer", r, "waited", rc.sd.assistPatience, "chunks_outstanding", pk.want-int(uint32(rc.sd.inbound[r].assist.done.Load())))
	}
	return nil
}

// sendingTo reports whether this rank has payloads of its own in flight
// towards rank r by descriptor: then r is reading them (a two-way
// exchange), has no idle core to lend, and its help would cost both sides
// chunked system calls and waits. Reading alone then, bibw at 1 MiB rose
// by 4-16 % in four interleaved runs of 8-16 launches (12.7 -> 14.3 GB/s
// in one), while one-way bw, where the sender is idle, keeps its help.
func (rc *receiver) sendingTo(r int) bool {
	p := rc.sd.peers[r].Load()
	return p != nil && p.pendingDescs() > 0
}

// awaitSender waits until the done word counts want chunks copied or
// failed. It gives up only when the sender's process pr exited: until
// then the sender may still write a chunk it took into the place (see
// the top of this file). The caller holds pr. Only a read that must end
// now waits here (Close's, and tests'); drain parks its reads instead.
func (rc *receiver) awaitSender(r int, pr *peerProc, done *atomic.Uint64, want int) error {
	var start time.Time
	stalled := false
	for i := 0; ; i++ {
		d := done.Load()
		if int(uint32(d))+int(d>>32) >= want {
			return nil
		}
		if i < 1024 {
			continue
		}
		if stalled {
			time.Sleep(time.Millisecond)
		} else {
			runtime.Gosched()
			if i%1024 != 0 {
				continue
			}
		}
		if start.IsZero() {
			start = time.Now()
			continue
		}
		if err := pr.check(); err != nil {
			return fmt.Errorf("rank %d stopped while copying a payload: %w", r, err)
		}
		if !stalled && time.Since(start) > rc.sd.assistPatience {
			stalled = true
			rc.sd.assistStalls.Add(1)
			rc.sd.log.Warn("peer took part of a payload and has not copied it; waiting while its process runs, since it may still write into the place",
				"peer", r, "waited", rc.sd.assistPatience, "chunks_outstanding", want-int(uint32(done.Load())))
		}
	}
}

// assist copies chunks of the payload the receiver behind p asks help
// with, if it is one of this rank's descriptors in flight. It runs on the
// receiver's owner of this rank (while this rank polls), one chunk per
// hold of p.mu so that a Send to the same peer waits for one chunk at
// most, and returns the chunks it copied.
func (p *peer) assist() int {
	copied := 0
	checked := false
	for p.assistOne(&checked) {
		copied++
	}
	return copied
}

// assistOne takes and copies one chunk, and reports whether it did. Before
// the first write of an assist call it checks that the peer's process
// runs (*checked records it): once per payload or so, since a chunk of
// one takes tens of microseconds and pid reuse needs the whole pid range
// to cycle first.
func (p *peer) assistOne(checked *bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.seg == nil || p.gone != nil || len(p.inflight) == 0 || !p.canWrite.Load() {
		return false
	}
	aw := p.ring.assist
	for {
		w := aw.claim.Load()
		k := uint64(uint32(w))
		if k == assistClosed {
			return false
		}
		at, dst, n := aw.at.Load(), aw.dst.Load(), aw.n.Load()
		payload := p.inflightAt(at)
		if payload == nil || uint64(len(payload)) != n || k >= uint64(chunks(len(payload))) || dst == 0 || dst+n < dst {
			return false
		}
		if !*checked {
			// Writing into a process that exited could write into
			// a stranger that has its pid by now (pidfd.go).
			if err := p.proc.guard(); err != nil {
				p.gone = fmt.Errorf("shm: rank %d: %w", p.rank, err)
				return false
			}
			*checked = true
		}
		if !aw.claim.CompareAndSwap(w, w+1) {
			continue // the receiver took one, or a new epoch began
		}
		off := int(k) * assistChunk
		end := min(off+assistChunk, len(payload))
		if err := p.writeChunk(payload[off:end], dst+uint64(off)); err != nil {
			p.canWrite.Store(false)
			p.sd.log.Debug("writing part of a payload into the peer's memory failed; it reads them alone", "peer", p.rank, "error", err)
			aw.done.Add(assistFailed)
			p.wake()
			return false
		}
		aw.done.Add(1)
		// A receiver that parked the read may sleep on its doorbell
		// meanwhile (device.sleep re-checks parked reads after
		// announcing the sleep, so this cannot be lost).
		p.wake()
		return true
	}
}

// inflightAt returns the payload of the descriptor in flight whose record
// is at cursor at, nil if there is none. The caller holds p.mu.
func (p *peer) inflightAt(at uint64) []byte {
	for i := range p.inflight {
		if p.inflight[i].at == at {
			return p.inflight[i].payload
		}
	}
	return nil
}

// writeChunk writes src to addr in the peer's process, partial writes
// looped.
func (p *peer) writeChunk(src []byte, addr uint64) error {
	var local [1]unix.Iovec
	var remote [1]unix.RemoteIovec
	for len(src) > 0 {
		local[0] = unix.Iovec{Base: &src[0]}
		local[0].SetLen(len(src))
		remote[0] = unix.RemoteIovec{Base: uintptr(addr), Len: len(src)}
		n, err := unix.ProcessVMWritev(p.proc.pid, local[:], remote[:], 0)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return fmt.Errorf("process_vm_writev of %d bytes at %#x to process %d: %w", len(src), addr, p.proc.pid, err)
		case n <= 0 || n > len(src):
			return fmt.Errorf("process_vm_writev of %d bytes at %#x to process %d wrote %d", len(src), addr, p.proc.pid, n)
		}
		src = src[n:]
		addr += uint64(n)
	}
	return nil
}
