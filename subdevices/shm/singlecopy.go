package shm

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Single copy of large payloads.
//
// A receiver that may read a sender's memory with process_vm_readv (the
// kernel checks ptrace access: same user and no Yama ptrace_scope or
// seccomp filter forbidding it) marks the sender's ring in its own segment
// readable at Connect, after a probe. For such a ring the sender writes a
// payload of at least single_copy_min bytes as a descriptor record (the
// frame's header and where the payload lies in the sender's memory)
// instead of copying it, keeps the payload, and returns done=false from
// Send. The receiver asks its Handler where the payload goes
// ([sdi.Placer]), reads it there with one process_vm_readv (or into a
// buffer of its own), delivers, and advances the ring's consumer cursor.
// That cursor is the acknowledgement: once it passes the record, the
// sender reports SendDone. The receiver rings the sender's doorbell after
// a descriptor so that a sender asleep in its progress goroutine notices.
//
// Why reading the sender's memory is safe: Go's garbage collector does not
// move heap objects, and a payload that reaches Send is on the heap (it is
// stored in an sdi.Frame that outlives the call, so it has escaped; memory
// mapped outside the Go heap does not move either). The sender keeps the
// payload referenced in its inflight list, and the multidevice keeps the
// request's buffer until SendDone, so the address in the descriptor stays
// valid and unchanged until the receiver has passed the record.
//
// Before a sender fails a descriptor it has published (Close, Disconnect,
// the receiver reported gone), it stores the ring's tail in the revoked
// word; after SendDone the caller may reuse the payload. The receiver
// loads the revoked word after its read: a read that finished before the
// store saw the payload intact (sequentially consistent atomics order the
// read, the store, SendDone and the reuse); a read that sees the store is
// thrown away and the peer reported down, never delivered.

// descBytes is the size of a descriptor record's body.
const descBytes = 16

// probeWord is the word peers read with process_vm_readv to find out
// whether they may. It is a package variable, so it lives in the data
// segment at a fixed address for the life of the process. Its value is
// random so that a peer that names the right address in the wrong process
// (the pid in the segment seen from another pid namespace) cannot match.
var probeWord = func() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return binary.LittleEndian.Uint64(b[:]) | 1
}()

// descriptor says where a payload lies in the sender's memory.
type descriptor struct {
	addr uint64 // address in the sender's address space
	n    int    // bytes
}

// put writes d into b[:descBytes].
func (d descriptor) put(b []byte) {
	_ = b[descBytes-1]
	binary.LittleEndian.PutUint64(b[0:], d.addr)
	binary.LittleEndian.PutUint64(b[8:], uint64(d.n))
}

// decodeDescriptor parses a descriptor record's body. The bytes come from
// shared memory and may be anything: the length must be exactly
// descBytes, the payload length in [1, maxPayload] and the range must not
// wrap the address space. Failures wrap [sdi.ErrBadFrame].
func decodeDescriptor(b []byte, maxPayload int) (descriptor, error) {
	if len(b) != descBytes {
		return descriptor{}, fmt.Errorf("%w: descriptor of %d bytes, want %d", sdi.ErrBadFrame, len(b), descBytes)
	}
	addr := binary.LittleEndian.Uint64(b[0:])
	n := binary.LittleEndian.Uint64(b[8:])
	switch {
	case n == 0 || n > uint64(maxPayload):
		return descriptor{}, fmt.Errorf("%w: descriptor for %d bytes, want 1 to %d", sdi.ErrBadFrame, n, maxPayload)
	case addr == 0 || addr+n < addr:
		return descriptor{}, fmt.Errorf("%w: descriptor range [%#x, +%d) is not an address range", sdi.ErrBadFrame, addr, n)
	}
	return descriptor{addr: addr, n: int(n)}, nil
}

// descriptorOf returns the descriptor of payload in this process.
func descriptorOf(payload []byte) descriptor {
	return descriptor{addr: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(payload)))), n: len(payload)}
}

// singleCopyWanted returns, from this rank's configuration and
// environment, the mode its rings take where a probe lets it read the
// sender's memory (copyDesc, or copyAuto to let senders choose), or copyRing
// with the reason. A value of the environment variable it does not know
// is an error: a misspelt "of" silently keeping single copy on would
// leave a user measuring the wrong thing.
func singleCopyWanted(c config) (uint32, string, error) {
	switch v := os.Getenv(envSingleCopy); strings.ToLower(strings.TrimSpace(v)) {
	case "0", "off", "false", "no":
		return copyRing, "turned off by " + envSingleCopy, nil
	case "1", "on", "true", "yes":
		return copyDesc, "", nil
	case "auto":
		return copyAuto, "", nil
	case "":
	default:
		return 0, "", fmt.Errorf("shm: %s=%q: want on, off or auto (or 1, 0)", envSingleCopy, v)
	}
	switch {
	case c.SingleCopy == nil:
		return copyAuto, "", nil
	case *c.SingleCopy:
		return copyDesc, "", nil
	}
	return copyRing, "off in the config (single_copy)", nil
}

// yamaScopePath is where Linux's Yama module says who may ptrace whom,
// and so who may use process_vm_readv on whom.
const yamaScopePath = "/proc/sys/kernel/yama/ptrace_scope"

// ptracerAny is PR_SET_PTRACER_ANY ((unsigned long)-1 in the kernel).
const ptracerAny = ^uintptr(0)

// yamaScope parses the contents of yamaScopePath, -1 if unreadable.
func yamaScope(b []byte) int {
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// allowPeerReads lets the ranks on this host read this process's memory
// where Yama's ptrace_scope 1 (Ubuntu's default) would allow it only to
// ancestors: ranks are siblings under a launcher, so without this every
// probe fails and large messages take the ring. It declares any process
// of the same user a permitted tracer (PR_SET_PTRACER_ANY), as Open MPI
// does for its single copy; that is what scope 0 allows everyone anyway.
// Scopes 2 and 3 admit no such exception; the probe then fails and says so.
func allowPeerReads(log hclog.Logger) {
	b, err := os.ReadFile(yamaScopePath)
	if err != nil || yamaScope(b) != 1 {
		return // no Yama, or it does not stand in the way (0), or nothing helps (2, 3)
	}
	if err := unix.Prctl(unix.PR_SET_PTRACER, ptracerAny, 0, 0, 0); err != nil {
		log.Debug("Yama ptrace_scope is 1 and PR_SET_PTRACER failed: peers cannot read this process's memory", "error", err)
		return
	}
	log.Debug("Yama ptrace_scope is 1: processes of this user may read this process's memory (PR_SET_PTRACER_ANY) for the single copy")
}

// vmReader reads other processes' memory. Its iovecs are reused, so it
// belongs to one goroutine at a time (the receiver's owner).
type vmReader struct {
	local  [1]unix.Iovec
	remote [1]unix.RemoteIovec
}

// read fills dst from addr in process pid, looping over partial reads. It
// never writes beyond dst. An error wraps [sdi.ErrPeerUnreachable] when the
// process is gone or no longer readable, and [sdi.ErrBadFrame] when the
// range is not mapped in it.
func (v *vmReader) read(pid int, dst []byte, addr uint64) error {
	for len(dst) > 0 {
		v.local[0] = unix.Iovec{Base: &dst[0]}
		v.local[0].SetLen(len(dst))
		v.remote[0] = unix.RemoteIovec{Base: uintptr(addr), Len: len(dst)}
		n, err := unix.ProcessVMReadv(pid, v.local[:], v.remote[:], 0)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ESRCH), errors.Is(err, unix.EPERM):
			return fmt.Errorf("process_vm_readv from process %d: %w: %w", pid, sdi.ErrPeerUnreachable, err)
		case err != nil:
			return fmt.Errorf("process_vm_readv of %d bytes at %#x from process %d: %w: %w", len(dst), addr, pid, sdi.ErrBadFrame, err)
		case n <= 0 || n > len(dst):
			return fmt.Errorf("process_vm_readv of %d bytes at %#x from process %d read %d: %w", len(dst), addr, pid, n, sdi.ErrBadFrame)
		}
		dst = dst[n:]
		addr += uint64(n)
	}
	return nil
}

// probe checks that this process may read process pid's memory by reading
// the probe word it published, and says why not otherwise.
func probe(pid int, addr, want uint64) error {
	if pid <= 0 || addr == 0 {
		return fmt.Errorf("peer published no probe word (pid %d, address %#x)", pid, addr)
	}
	var got [8]byte
	var v vmReader
	if err := v.read(pid, got[:], addr); err != nil {
		return err
	}
	if g := binary.LittleEndian.Uint64(got[:]); g != want {
		return fmt.Errorf("probe word at %#x in process %d reads %#x, want %#x", addr, pid, g, want)
	}
	return nil
}

// setupSingleCopy decides, at Connect to p's rank, whether this rank
// reads that rank's large payloads from its memory, and tells it through
// the readable word of its ring in this rank's segment.
func (sd *device) setupSingleCopy(p *peer) {
	r := int(p.rank)
	in := sd.inbound[r]
	if sd.copyWant == copyRing {
		in.copyMode.Store(copyRing)
		sd.log.Debug("large messages from peer go through the ring", "peer", r, "path", "ring", "reason", sd.singleCopyWhy)
		return
	}
	// The probe goes to the pid p.proc was opened for, and the check after
	// it makes sure that process is the one that answered (pidfd.go).
	err := probe(p.proc.pid, word64(p.mem, offProbeAddr).Load(), word64(p.mem, offProbeVal).Load())
	if err == nil {
		err = p.proc.guard()
	}
	if err != nil {
		in.copyMode.Store(copyRing)
		sd.log.Debug("large messages from peer go through the ring", "peer", r, "path", "ring",
			"reason", "process_vm_readv probe failed", "error", err)
		return
	}
	p.procKnown.Store(true)
	// The process is stored before the flag: a sender that sees the flag
	// writes descriptors, and the receiver reading one finds the process.
	if old := sd.srcProc[r].Swap(p.proc.acquire()); old != nil {
		if err := old.release(); err != nil {
			sd.log.Warn("releasing the previous process of peer", "peer", r, "error", err)
		}
	}
	// The same permission lets this rank write into r's memory, to help
	// r read this rank's payloads (assist.go).
	p.canWrite.Store(true)
	if sd.copyWant == copyDesc {
		in.copyMode.Store(copyDesc)
		sd.log.Debug("large messages from peer are copied once", "peer", r, "path", "process_vm_readv", "min_bytes", sd.cfg.SingleCopyMin)
		return
	}
	in.copyMode.Store(copyAuto)
	sd.log.Debug("large messages from peer take the faster of the ring and process_vm_readv", "peer", r, "path", "chosen")
}

// inflight is a descriptor the receiver has not passed yet.
type inflight struct {
	token   uint64
	at      uint64 // ring cursor of the record
	end     uint64 // ring cursor after the record
	payload []byte // kept referenced until SendDone (see the comment at the top)
}

// completed pops, under p.mu, the descriptors whose records the receiver
// has passed (consumer cursor head) and appends their tokens to done.
func (p *peer) completedLocked(head uint64, done []uint64) []uint64 {
	k := 0
	for k < len(p.inflight) && p.inflight[k].end <= head {
		done = append(done, p.inflight[k].token)
		p.inflight[k] = inflight{}
		k++
	}
	if k > 0 {
		p.inflight = p.inflight[k:]
		if len(p.inflight) == 0 {
			p.inflight = p.inflight[:0:0]
		}
		p.sd.inflight.Add(-int64(k))
		p.reporting += k
	}
	return done
}

// reap reports SendDone for the descriptors towards p that its receiver
// has passed, and returns how many.
func (p *peer) reap(buf []uint64) ([]uint64, int) {
	p.mu.Lock()
	if len(p.inflight) == 0 || p.seg == nil {
		p.mu.Unlock()
		return buf, 0
	}
	// Acquire: pairs with the receiver's head.Store after its Deliver,
	// which follows its read of the payloads.
	h := p.ring.head.Load()
	if h-p.head > p.tail-p.head || h%recAlign != 0 {
		p.mu.Unlock()
		p.failUnread(fmt.Errorf("shm: rank %d: consumer cursor %d outside [%d, %d]: %w: %w",
			p.rank, h, p.head, p.tail, sdi.ErrPeerUnreachable, sdi.ErrBadFrame))
		return buf, 0
	}
	p.head = h
	done := p.completedLocked(h, buf[:0])
	p.mu.Unlock()
	for _, t := range done {
		p.sd.handler.SendDone(t, nil)
	}
	p.reported(len(done))
	return done, len(done)
}

// reapable reports whether the receiver passed a descriptor towards p
// that is not reported yet.
func (p *peer) reapable() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.inflight) > 0 && p.seg != nil && p.ring.head.Load() >= p.inflight[0].end
}

// failInflightLocked revokes the descriptors published to p and returns
// them for failing; the caller holds p.mu and reports them with
// p.failDescs after unlocking.
func (p *peer) failInflightLocked() []inflight {
	if len(p.inflight) == 0 {
		return nil
	}
	if p.seg != nil {
		// The receiver throws away any read that sees this (see the
		// comment at the top); the payloads may be reused after SendDone.
		p.ring.revoked.Store(p.tail)
	}
	failed := p.inflight
	p.inflight = nil
	p.sd.inflight.Add(-int64(len(failed)))
	p.reporting += len(failed)
	return failed
}

// failDescs reports descriptors failInflightLocked took with err.
func (p *peer) failDescs(failed []inflight, err error) {
	for _, f := range failed {
		p.sd.handler.SendDone(f.token, err)
	}
	p.reported(len(failed))
}

// reported notes that n descriptors taken out of inflight had their
// SendDone.
func (p *peer) reported(n int) {
	if n == 0 {
		return
	}
	p.mu.Lock()
	p.reporting -= n
	p.mu.Unlock()
}

// pendingDescs returns how many descriptors towards p are in flight or
// still being reported: Flush returns only after their SendDone.
func (p *peer) pendingDescs() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.inflight) + p.reporting
}

// reapAll reports completed descriptors towards every peer. It runs on the
// receiver's owner and returns the completions it reported.
func (rc *receiver) reapAll() int {
	sd := rc.sd
	if sd.inflight.Load() == 0 {
		return 0
	}
	n := 0
	for i := range sd.peers {
		if p := sd.peers[i].Load(); p != nil {
			var k int
			p.assist()
			rc.doneBuf, k = p.reap(rc.doneBuf)
			n += k
		}
	}
	return n
}

// reapPending reports whether a descriptor towards any peer completed.
func (rc *receiver) reapPending() bool {
	sd := rc.sd
	if sd.inflight.Load() == 0 {
		return false
	}
	for i := range sd.peers {
		if p := sd.peers[i].Load(); p != nil && p.reapable() {
			return true
		}
	}
	return false
}

// fetch reads the payload a descriptor record from rank r points at,
// into the place the Handler gives or a buffer of the receiver's, and
// returns it. head is the record's cursor. It returns errParked when the
// read waits for chunks the sender took (parkedRead); the caller calls
// it again for the same record once finishParked ended the wait.
func (rc *receiver) fetch(r int, rec *record, head uint64) ([]byte, error) {
	sd := rc.sd
	pr := sd.srcProc[r].Load()
	if pr == nil {
		return nil, fmt.Errorf("%w: descriptor record at cursor %d, but this rank never agreed to read rank %d's memory", sdi.ErrBadFrame, head, r)
	}
	var dst []byte
	if pk := rc.parked[r]; pk.ready {
		// The read of this record, parked before, has ended.
		dst = pk.dst
		rc.parked[r] = parkedRead{}
		if pk.head != head || len(dst) != rec.desc.n {
			return nil, fmt.Errorf("%w: descriptor record at cursor %d changed while its payload was read", sdi.ErrBadFrame, head)
		}
	} else {
		// Not one byte is read from a process that exited: its pid may
		// name another by now (pidfd.go).
		if err := pr.guard(); err != nil {
			return nil, err
		}
		n := rec.desc.n
		if sd.placer != nil {
			dst = sd.placer.Place(sdi.Rank(r), rec.header, n)
			if dst != nil && len(dst) != n {
				return nil, fmt.Errorf("shm: handler placed a %d-byte payload in %d bytes", n, len(dst))
			}
		}
		if dst == nil {
			if cap(rc.scratch) < n {
				rc.scratch = make([]byte, sd.caps.MaxFrame)
			}
			dst = rc.scratch[:n:n]
		}
		parked, err := rc.startAssisted(r, pr, dst, rec.desc.addr, head)
		if err != nil {
			return nil, err
		}
		if parked {
			if unsafe.SliceData(dst) == unsafe.SliceData(rc.scratch) {
				rc.scratch = nil // the parked read keeps it; other rings get another
			}
			return nil, errParked
		}
	}
	// After the read: a sender that gave up on this record before the read
	// ended may have reused the payload (see the comment at the top).
	if rv := sd.inbound[r].revoked.Load(); rv > head {
		return nil, fmt.Errorf("rank %d revoked the descriptor at cursor %d while it was read: %w", r, head, sdi.ErrPeerUnreachable)
	}
	return dst, nil
}

// wakeSender rings rank r's doorbell after this rank passed a descriptor
// of r's, so that r reports SendDone even when it sleeps.
func (sd *device) wakeSender(r int) {
	if p := sd.peers[r].Load(); p != nil {
		p.mu.Lock()
		if p.seg != nil {
			sd.ringDoorbell(p.mem)
		}
		p.mu.Unlock()
	}
}
