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
// buffers back. A sender that takes longer than assistPatience (a
// process stopped mid-copy, a garbled claim word) is logged, and checked
// on every millisecond instead of spun on. Giving up sooner let a
// stopped sender, once resumed, write its chunk into a buffer the
// application had been given back, or count it done in the next epoch's
// word, where the receiver took it for a chunk of the next payload.
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
)

// chunks returns the number of assistChunk pieces of an n-byte payload.
func chunks(n int) int { return (n + assistChunk - 1) / assistChunk }

// readAssisted fills dst from addr in process pr (sender rank r, record
// at cursor head), with the sender's help if it gives it. The caller
// checked that pr runs.
func (rc *receiver) readAssisted(r int, pr *peerProc, dst []byte, addr, head uint64) error {
	n := len(dst)
	nc := chunks(n)
	pid := pr.pid
	if nc < 2 || rc.noAssist[r] || rc.sendingTo(r) {
		return rc.vm.read(pid, dst, addr)
	}
	// The wait below asks pr whether the sender still runs; a
	// reconnect may release it meanwhile, which would leave no answer.
	if !pr.hold() {
		return fmt.Errorf("connection to process %d released: %w", pid, sdi.ErrPeerUnreachable)
	}
	defer func() {
		if err := pr.release(); err != nil {
			rc.sd.log.Warn("releasing the process of peer", "peer", r, "error", err)
		}
	}()
	aw := rc.sd.inbound[r].assist
	rc.epoch[r]++
	e := uint64(rc.epoch[r]) << 32
	aw.done.Store(0)
	aw.at.Store(head)
	aw.dst.Store(uint64(uintptr(unsafe.Pointer(unsafe.SliceData(dst)))))
	aw.n.Store(uint64(n))
	aw.claim.Store(e) // opens the epoch: the request above is complete
	took := 0         // chunks this side took, copied or not
	var err error
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
	failed, werr := rc.awaitSender(r, pr, aw.done, taken-took)
	switch {
	case werr != nil:
		return werr
	case err != nil:
		return err
	case failed:
		// The sender could not write (it may lack permission to write
		// here): read it all, and stop asking this sender.
		rc.noAssist[r] = true
		rc.sd.log.Debug("peer failed to write its part of a payload; reading its payloads alone", "peer", r)
		return rc.vm.read(pid, dst, addr)
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
// failed, and reports whether one failed. It gives up only when the
// sender's process pr exited: until then the sender may still write a
// chunk it took into the place (see the top of this file). The caller
// holds pr.
func (rc *receiver) awaitSender(r int, pr *peerProc, done *atomic.Uint64, want int) (bool, error) {
	var start time.Time
	stalled := false
	for i := 0; ; i++ {
		d := done.Load()
		if int(uint32(d))+int(d>>32) >= want {
			return d>>32 != 0, nil
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
			return false, fmt.Errorf("rank %d stopped while copying a payload: %w", r, err)
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
			return false
		}
		aw.done.Add(1)
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
