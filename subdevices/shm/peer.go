package shm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hpc-multidevice/multidevice/internal/shmem"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// peer is the outbound side towards one rank: a mapping of that rank's
// segment and the ring in it that carries this rank's frames.
//
// The ring is single-producer; mu makes the goroutines that Send to the same
// peer take turns. It is held only while copying one frame.
type peer struct {
	rank sdi.Rank
	sd   *device

	mu   sync.Mutex
	seg  *shmem.Segment // nil once detached
	mem  []byte
	ring ring
	tail uint64 // producer cursor; stored in ring.tail when the connection ends
	head uint64 // last consumer cursor read from ring.head
	// fastSent counts the frames sent through the fast slots (fast.go);
	// stored in ring.fastSent when the connection ends. ringSends counts
	// those sent through the ring, for fastRecheck.
	fastSent  uint64
	ringSends uint32
	proc      *peerProc // the peer's process (pidfd.go); detach releases it
	gone      error     // set when the peer may no longer be used; Send returns it
	// inflight are the descriptors (singlecopy.go) the peer has not passed
	// yet, in ring order; reporting counts those taken out of it whose
	// SendDone has not returned yet, which Flush waits for as well.
	inflight  []inflight
	reporting int
	// canWrite is set once this rank may write into the peer's memory,
	// to copy part of its own payloads there (assist.go).
	canWrite atomic.Bool
	// procKnown is set once the probe showed that proc is the process
	// that made the segment (singlecopy.go). Until then its pid may name
	// nobody, or a stranger: the peer may run in another pid namespace
	// that shares /dev/shm. Liveness then goes by the segment's lock.
	procKnown atomic.Bool
	// choose picks the path of large payloads where the peer leaves it
	// open (choose.go).
	choose chooser
}

// Connect maps the segment named in rank r's business card. The card must come
// from the same host and job; a card for another host or job, an unreadable
// card, or a segment that does not match it yields an error wrapping
// [sdi.ErrPeerUnreachable]. Connecting again to the same segment is a no-op.
func (sd *device) Connect(ctx context.Context, r sdi.Rank, addr []byte) error {
	if err := sd.usable(); err != nil {
		return fmt.Errorf("shm: connect to rank %d: %w", r, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("shm: connect to rank %d: %w", r, err)
	}
	if r < 0 || int(r) >= len(sd.peers) {
		return fmt.Errorf("shm: connect to rank %d: not in a job of %d ranks: %w", r, len(sd.peers), sdi.ErrPeerUnreachable)
	}
	c, err := decodeCard(addr)
	if err != nil {
		return fmt.Errorf("shm: connect to rank %d: %w: %w", r, sdi.ErrPeerUnreachable, err)
	}
	switch {
	case c.Host != sd.host:
		return fmt.Errorf("shm: connect to rank %d: it runs on host %q, this rank on %q: %w", r, c.Host, sd.host, sdi.ErrPeerUnreachable)
	case c.JobID != sd.jobID:
		return fmt.Errorf("shm: connect to rank %d: card is from job %q, this is job %q: %w", r, c.JobID, sd.jobID, sdi.ErrPeerUnreachable)
	case c.Rank != r:
		return fmt.Errorf("shm: connect to rank %d: card belongs to rank %d: %w", r, c.Rank, sdi.ErrPeerUnreachable)
	}

	sd.connMu.Lock()
	defer sd.connMu.Unlock()
	if err := sd.usable(); err != nil {
		return fmt.Errorf("shm: connect to rank %d: %w", r, err)
	}
	old := sd.peers[r].Load()
	if old != nil && old.segmentName() == c.Segment {
		// A no-op while that connection works; a rank reported down
		// keeps its card, and the caller (the multidevice reviving a
		// route) must not take its route for back.
		old.mu.Lock()
		gone := old.gone
		old.mu.Unlock()
		if gone != nil {
			return fmt.Errorf("shm: connect to rank %d: %w: %w", r, sdi.ErrPeerUnreachable, gone)
		}
		return nil
	}
	seg, err := shmem.Open(c.Segment)
	if err != nil {
		return fmt.Errorf("shm: connect to rank %d: %w: %w", r, sdi.ErrPeerUnreachable, err)
	}
	p, err := sd.newPeer(r, seg)
	if err != nil {
		return errors.Join(fmt.Errorf("shm: connect to rank %d: segment %s: %w: %w", r, c.Segment, sdi.ErrPeerUnreachable, err), seg.Close())
	}
	// Tell r's receiver to start polling our ring. The generation bump comes
	// after the flag and before any record, so a receiver that sees the
	// bump sees the flag, and one that sleeps through it is woken by the
	// first record's doorbell (see receiver.sleep).
	p.ring.attached.Store(1)
	word32(p.mem, offAttachGen).Add(1)
	sd.peers[r].Store(p)
	// After the store: the receiver rings r's doorbell through peers[r]
	// once it read a descriptor of r's, which r sends once this allows it.
	sd.setupSingleCopy(p)
	if old != nil {
		if err := old.detach(fmt.Errorf("shm: rank %d: reconnected: %w", r, sdi.ErrNotConnected)); err != nil {
			sd.log.Warn("releasing the previous connection failed", "peer", r, "error", err)
		}
	}
	sd.log.Debug("connected", "peer", r, "segment", c.Segment)
	return nil
}

// newPeer checks that seg is rank r's live segment for this job, made with
// the same ring size, and returns the connection to it.
func (sd *device) newPeer(r sdi.Rank, seg *shmem.Segment) (*peer, error) {
	mem := seg.Bytes()
	if len(mem) < hdrBytes {
		return nil, fmt.Errorf("%d bytes, shorter than the %d-byte header", len(mem), hdrBytes)
	}
	if string(mem[offMagic:offMagic+len(segMagic)]) != segMagic {
		return nil, errors.New("not an shm segment (bad magic)")
	}
	if v := word32(mem, offVersion).Load(); v != segVersion {
		return nil, fmt.Errorf("layout version %d, this build speaks %d", v, segVersion)
	}
	if s := word32(mem, offState).Load(); s != stateOpen {
		return nil, fmt.Errorf("owner is not receiving (state %d)", s)
	}
	if owner := sdi.Rank(int32(word32(mem, offRank).Load())); owner != r {
		return nil, fmt.Errorf("segment belongs to rank %d", owner)
	}
	if !bytes.Equal(mem[offJobHash:offJobHash+16], sd.jobHash[:]) {
		return nil, errors.New("segment belongs to another job")
	}
	if !bytes.Equal(mem[offSecretHash:offSecretHash+16], sd.secHash[:]) {
		return nil, errors.New("segment was made with another job secret")
	}
	nrings := int(word32(mem, offNRings).Load())
	ringBytes := word64(mem, offRingBytes).Load()
	if nrings != len(sd.peers) {
		return nil, fmt.Errorf("made for a job of %d ranks, this job has %d", nrings, len(sd.peers))
	}
	if ringBytes != sd.cfg.RingBytes {
		return nil, fmt.Errorf("ring_bytes %d differs from this rank's %d; every rank must use the same config", ringBytes, sd.cfg.RingBytes)
	}
	if want, err := segmentSize(nrings, ringBytes); err != nil || want != len(mem) {
		return nil, fmt.Errorf("%d bytes, want %d for %d rings of %d bytes", len(mem), want, nrings, ringBytes)
	}
	// Both rings of the pair get their memory before either side touches
	// them: this rank writes into its ring in r's segment, and r into its
	// own in this rank's, which this rank also writes (its head and
	// copy-mode words). Without it a full Dir would kill whichever
	// process first touched a page it has no room for.
	stride := ringStride(ringBytes)
	if err := seg.Reserve(ringOffset(nrings, int(sd.rank), ringBytes), stride); err != nil {
		return nil, fmt.Errorf("no room for this rank's ring in it: %w", err)
	}
	if err := sd.seg.Reserve(ringOffset(nrings, int(r), ringBytes), stride); err != nil {
		return nil, fmt.Errorf("no room for its ring in this rank's segment: %w", err)
	}
	p := &peer{rank: r, sd: sd, seg: seg, mem: mem, ring: ringAt(mem, nrings, int(sd.rank), ringBytes)}
	// Resume where an earlier connection from this rank stopped.
	p.tail = p.ring.tail.Load()
	p.head = p.ring.head.Load()
	p.fastSent = p.ring.fastSent.Load()
	if p.tail-p.head > ringBytes || p.tail%recAlign != 0 || p.head%recAlign != 0 {
		return nil, fmt.Errorf("%w: ring cursors %d and %d are inconsistent", sdi.ErrBadFrame, p.tail, p.head)
	}
	// Opened before setupSingleCopy's probe, which is what ties the
	// pidfd to the segment's owner (pidfd.go).
	proc, unavail, err := openPeerProc(int(int32(word32(mem, offPID).Load())), sd.pidfdOpen)
	if err != nil {
		// No process has that pid here. One in another pid namespace
		// sharing /dev/shm (containers) may still hold the segment's
		// lock: then its messages take the ring, and the lock tells
		// whether it lives.
		if lives, lerr := seg.CreatorLives(); lerr != nil || !lives {
			return nil, err
		}
		sd.log.Debug("peer's process is not visible from here (another pid namespace?); large messages take the ring, and liveness goes by its segment's lock",
			"peer", r, "pid", word32(mem, offPID).Load())
		proc, unavail = &peerProc{fd: -1, refs: 1}, nil
	}
	if unavail != nil {
		sd.pidfdOnce.Do(func() {
			sd.log.Debug("peers' processes are watched by pid, which cannot tell a pid reused by another process",
				"path", "kill", "reason", "pidfd_open unavailable", "error", unavail)
		})
	}
	p.proc = proc
	return p, nil
}

// Disconnect waits until rank r has read the large payloads sent to it by
// descriptor (or ctx ends; those still unread then fail), stops reading
// r's memory, and releases the mapping of r's segment. Frames r sends
// still arrive; one being placed in the Handler's place ([sdi.Placer])
// keeps r's process watched until it is whole, so that r's death reports
// r down. Disconnecting a rank that is not connected is a no-op; after
// Close it returns an error wrapping [sdi.ErrClosed].
func (sd *device) Disconnect(ctx context.Context, r sdi.Rank) error {
	if err := sd.usable(); err != nil {
		return fmt.Errorf("shm: disconnect rank %d: %w", r, err)
	}
	if r < 0 || int(r) >= len(sd.peers) {
		return fmt.Errorf("shm: disconnect rank %d: not in a job of %d ranks: %w", r, len(sd.peers), sdi.ErrNotConnected)
	}
	if err := sd.Flush(ctx, r); err != nil {
		sd.log.Debug("disconnecting with large frames unread", "peer", r, "error", err)
	}
	// The receive lock, taken before connMu as teardown takes them: the
	// receiver must see the connection end between two of its passes,
	// to keep r's process if it is placing a frame of r's (see
	// receiver.disconnected). Checked under it, stop == false also
	// means that Close has not unmapped this rank's segment.
	sd.rxMu.Lock()
	defer sd.rxMu.Unlock()
	if sd.stop.Load() {
		return fmt.Errorf("shm: disconnect rank %d: %w", r, sdi.ErrClosed)
	}
	sd.connMu.Lock()
	defer sd.connMu.Unlock()
	p := sd.peers[r].Swap(nil)
	if p == nil {
		// Never connected, or disconnected before: the copy mode is
		// copyRing (zero) already, and the ring may have no memory.
		return nil
	}
	sd.inbound[r].copyMode.Store(copyRing)
	sd.rx.disconnected(int(r), p.proc)
	if err := p.detach(fmt.Errorf("shm: rank %d: disconnected: %w", r, sdi.ErrNotConnected)); err != nil {
		return fmt.Errorf("shm: disconnect rank %d: %w", r, err)
	}
	return nil
}

// Send copies f into the ring towards f.Peer and returns done=true: the
// caller may reuse its buffers at once and no SendDone follows. A payload
// of at least single_copy_min bytes to a peer that reads this rank's
// memory may go by descriptor instead (always with single_copy = true,
// when chosen otherwise, see choose.go): Send returns done=false and keeps
// the payload until SendDone, which follows once the peer has read it
// (singlecopy.go). When the
// ring lacks space it returns [sdi.ErrWouldBlock] and the caller retries
// later; this subdevice keeps no backlog of its own (the multidevice owns
// the pending queue). Send never blocks beyond waiting for another Send to
// the same peer to finish its copy, and never calls the Handler.
func (sd *device) Send(f *sdi.Frame) (bool, error) {
	if err := sd.usable(); err != nil {
		return false, fmt.Errorf("shm: send: %w", err)
	}
	if f == nil {
		return false, errors.New("shm: send: nil frame")
	}
	if len(f.Header) > maxHeader || len(f.Payload) > sd.caps.MaxFrame {
		return false, fmt.Errorf("shm: send to rank %d: header %d bytes (max %d), payload %d bytes (max %d): %w",
			f.Peer, len(f.Header), maxHeader, len(f.Payload), sd.caps.MaxFrame, sdi.ErrTooLarge)
	}
	if f.Peer < 0 || int(f.Peer) >= len(sd.peers) {
		return false, fmt.Errorf("shm: send to rank %d: not in a job of %d ranks: %w", f.Peer, len(sd.peers), sdi.ErrNotConnected)
	}
	p := sd.peers[f.Peer].Load()
	if p == nil {
		return false, fmt.Errorf("shm: send to rank %d: %w", f.Peer, sdi.ErrNotConnected)
	}
	return p.send(f)
}

// send writes f into the ring: the payload itself, or, when it is large
// and the peer reads this rank's memory, a descriptor of it (done=false;
// SendDone follows once the peer has read it, see singlecopy.go). A
// payload that goes through the ring and is longer than a fragment is
// written in fragments, each published as soon as it is copied, so that
// the receiver copies one out while this rank copies the next in.
func (p *peer) send(f *sdi.Frame) (bool, error) {
	hdr, payload := f.Header, f.Payload
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone != nil {
		return false, p.gone
	}
	if word32(p.mem, offState).Load() != stateOpen {
		p.gone = fmt.Errorf("shm: send to rank %d: it closed its segment: %w", p.rank, sdi.ErrPeerUnreachable)
		return false, p.gone
	}
	capacity := uint64(len(p.ring.data))
	chunk := fragmentBytes(capacity)
	body, flags := payload, uint8(0)
	var desc [descBytes]byte
	byDesc, chosen := p.byDescriptor(len(payload), chunk)
	if byDesc {
		descriptorOf(payload).put(desc[:])
		body, flags = desc[:], flagDesc
	}
	split := !byDesc && len(payload) > chunk
	if !byDesc && !split && recordLen(len(hdr), len(payload)) <= fastSlotSize && p.sendFast(hdr, payload) {
		p.wake()
		return true, nil
	}
	p.ringSends++
	fast := fastBits(p.fastSent)
	var need uint64
	if split {
		need = fragmentsSpace(capacity, p.tail, len(hdr), len(payload), chunk)
	} else {
		need = spaceNeeded(capacity, p.tail, recordLen(len(hdr), len(body)))
	}
	if p.tail-p.head+need > capacity {
		// Acquire: pairs with the receiver's head.Store, made after its
		// Deliver for every record before head returned, so those bytes
		// may now be overwritten.
		h := p.ring.head.Load()
		if h-p.head > p.tail-p.head || h%recAlign != 0 {
			p.gone = fmt.Errorf("shm: send to rank %d: consumer cursor %d outside [%d, %d]: %w: %w",
				p.rank, h, p.head, p.tail, sdi.ErrPeerUnreachable, sdi.ErrBadFrame)
			return false, p.gone
		}
		p.head = h
		if p.tail-p.head+need > capacity {
			return false, sdi.ErrWouldBlock
		}
	}
	// Where this rank chooses paths, its copies of chosen-for payloads
	// into the ring are timed (choose.go), except on the ring's first lap,
	// whose copies map its pages (tmpfs allocates them at first touch):
	// ~1.3 GB/s against ~8 after, which would put the single copy ahead
	// for exploreEvery.
	timed := chosen && !byDesc && p.tail >= capacity && p.choose.sampled(split)
	var start time.Duration
	if timed {
		start = monoNow()
	}
	if split {
		p.tail = putFragments(p.ring.data, p.tail, p.head+capacity, fast, hdr, payload, chunk, p.wake)
	} else {
		p.tail = putFlagged(p.ring.data, p.tail, p.head+capacity, flags|fast, hdr, body)
	}
	if timed {
		p.choose.in.add(len(payload), monoNow()-start)
	}
	if split {
		return true, nil
	}
	if byDesc {
		at := p.tail - recordLen(len(hdr), len(body))
		p.inflight = append(p.inflight, inflight{token: f.Token, at: at, end: p.tail, payload: payload})
		if p.sd.inflight.Add(1) == 1 {
			// Our progress goroutine may sleep without a bound, having
			// had nothing in flight: woken, it naps instead while
			// descriptors are (sleep), as a receiver that disconnects
			// reads them but cannot ring for them. Our segment is
			// mapped: Close detaches every peer, under p.mu, first.
			p.sd.ringDoorbell(p.sd.seg.Bytes())
		}
	}
	p.wake()
	return !byDesc, nil
}

// wake rings the receiver's doorbell if it sleeps, after a record was
// stamped. The caller holds p.mu.
func (p *peer) wake() { p.sd.ringDoorbell(p.mem) }

// fragmentBytes is the largest part of a payload one fragment carries in a
// ring of capacity bytes: a sixteenth of the ring (64 KiB by default, the
// eager limit, so that eager messages are never split), small enough that
// the receiver starts copying soon and large enough that a record costs
// little.
func fragmentBytes(capacity uint64) int { return int(capacity / 16) }

// alive reports an error wrapping [sdi.ErrPeerUnreachable] once the peer
// closed its segment, its process exited, or a Send found its ring corrupt.
// It returns nil for a detached peer: that one was let go on purpose.
func (p *peer) alive() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.seg == nil {
		return nil
	}
	if p.gone != nil {
		if errors.Is(p.gone, sdi.ErrPeerUnreachable) {
			return p.gone
		}
		return nil
	}
	if word32(p.mem, offState).Load() != stateOpen {
		p.gone = fmt.Errorf("shm: rank %d closed its segment: %w", p.rank, sdi.ErrPeerUnreachable)
		return p.gone
	}
	if !p.procKnown.Load() {
		// Its pid may name another process than the peer's: the lock
		// its process holds on the segment says, wherever it runs.
		lives, err := p.seg.CreatorLives()
		switch {
		case err != nil:
			p.gone = fmt.Errorf("shm: rank %d: %w: %w", p.rank, sdi.ErrPeerUnreachable, err)
		case !lives:
			p.gone = fmt.Errorf("shm: rank %d: its process exited (its segment's lock is free): %w", p.rank, sdi.ErrPeerUnreachable)
		}
		return p.gone
	}
	// Ranks in this process share its pid and never look exited; their
	// Close marks the state above.
	if err := p.proc.check(); err != nil {
		p.gone = fmt.Errorf("shm: rank %d: %w", p.rank, err)
		return p.gone
	}
	return nil
}

// markDown stops further sends to the peer with err: the descriptors it
// read by now complete (a payload it delivered must not fail), the rest
// fail.
func (p *peer) markDown(err error) {
	p.reap(nil)
	p.failUnread(err)
}

// failUnread is markDown without the reap, for reap itself: a peer whose
// cursor cannot be trusted has read nothing we could tell.
func (p *peer) failUnread(err error) {
	p.mu.Lock()
	if p.gone == nil {
		p.gone = err
	}
	failed := p.failInflightLocked()
	p.mu.Unlock()
	p.failDescs(failed, err)
}

// segmentName returns the name of the mapped segment, "" once detached.
func (p *peer) segmentName() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.seg == nil {
		return ""
	}
	return p.seg.Name()
}

// detach makes later sends fail with reason, wakes the peer so that it
// notices a closing rank promptly, and unmaps the peer's segment.
func (p *peer) detach(reason error) error {
	// Descriptors the peer read by now are complete: reported so before
	// the rest fail (a reconnect detaches without a Flush).
	p.reap(nil)
	p.mu.Lock()
	if p.seg == nil {
		p.mu.Unlock()
		return nil
	}
	failed := p.failInflightLocked()
	// A later connection from this rank resumes here (newPeer).
	p.ring.tail.Store(p.tail)
	p.ring.fastSent.Store(p.fastSent)
	p.sd.ringDoorbell(p.mem)
	p.gone = reason
	err := errors.Join(p.seg.Close(), p.proc.release())
	p.seg, p.mem = nil, nil
	p.mu.Unlock()
	p.failDescs(failed, reason)
	return err
}

// usable returns nil while the device is open.
func (sd *device) usable() error {
	switch sd.state.Load() {
	case devOpen:
		return nil
	case devClosed:
		return sdi.ErrClosed
	}
	return errNotOpen
}
