package plugin

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hpc-multidevice/multidevice/internal/shmem"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// Waiting on the rings: a consumer that finds its ring empty spins this
// long, yielding the CPU as it goes, before it parks on the futex, because
// waking a parked thread costs tens of microseconds and the next record
// often comes sooner. Longer spins measured worse on a busy two-core
// machine (BenchmarkPluginTCP: 25us beat 50, 80 and an adaptive spin of
// twice the recent gap), since every spinner takes a CPU from the thread
// it waits for. An idle consumer spins once and parks: no CPU when idle.
// Parked waits are bounded so that a stop is noticed even without a wake-up.
const (
	ringSpin  = 25 * time.Microsecond
	ringNap   = 50 * time.Millisecond
	drainStep = 64 // records handled per lock hold
)

// hostRing is the host's side of the shared-memory plane: it produces on
// the out ring and consumes the in ring on its own goroutine or in poll.
type hostRing struct {
	seg  *shmem.Segment
	h    sdi.Handler
	fail func(error) // a protocol violation: take the plugin out

	outMu    sync.Mutex
	out      *ring
	unmapped bool // guarded by outMu

	once sync.Once

	inMu sync.Mutex // held while records are handed to the Handler
	in   reader

	stopped atomic.Bool
	wg      sync.WaitGroup
}

func newHostRing(seg *shmem.Segment, h sdi.Handler, lim limits, fail func(error)) *hostRing {
	out, in := rings(seg.Bytes())
	p := &hostRing{seg: seg, h: h, fail: fail, out: out, in: reader{r: in, lim: lim}}
	p.wg.Add(1)
	go p.run()
	return p
}

func (p *hostRing) send(peer sdi.Rank, header, payload []byte) error {
	p.outMu.Lock()
	defer p.outMu.Unlock()
	if p.unmapped {
		return sdi.ErrClosed
	}
	if !p.out.tryWrite(kindFrame, peer, 0, header, payload) {
		return sdi.ErrWouldBlock
	}
	return nil
}

func (p *hostRing) run() {
	defer p.wg.Done()
	for !p.stopped.Load() {
		p.inMu.Lock()
		n := p.drainLocked()
		p.inMu.Unlock()
		if n == 0 {
			p.in.sleep(ringSpin, ringNap)
		}
	}
}

func (p *hostRing) poll() int {
	if !p.inMu.TryLock() {
		return 0
	}
	defer p.inMu.Unlock()
	return p.drainLocked()
}

func (p *hostRing) drainLocked() int {
	n := 0
	for n < drainStep && !p.stopped.Load() {
		rec, cur, ok, err := p.in.next()
		if err == nil && ok && !deliver(p.h, rec) {
			err = fmt.Errorf("record kind %d does not travel to the host", rec.kind)
		}
		if err != nil {
			p.stopped.Store(true)
			p.fail(fmt.Errorf("%w: in ring: %w", ErrProtocol, err))
			return n
		}
		if !ok {
			break
		}
		p.in.r.release(cur)
		n++
	}
	return n
}

// stop ends the consumer, waits for a poll and a send in progress, and
// unmaps the segment. It is idempotent.
func (p *hostRing) stop() {
	p.once.Do(func() {
		p.stopped.Store(true)
		p.in.r.wake()
		p.wg.Wait()
		// A poll in progress finishes its record and sees stopped.
		p.inMu.Lock()
		p.inMu.Unlock() //nolint:staticcheck // an empty critical section waits for poll
		p.outMu.Lock()
		p.unmapped = true
		p.seg.Close()
		p.outMu.Unlock()
	})
}

// pluginRing is the plugin's side: it consumes frames from the out ring
// on its own goroutine and produces deliveries on the in ring.
type pluginRing struct {
	seg *shmem.Segment
	srv *server

	out  reader
	rels releaser

	inMu sync.Mutex
	in   *ring

	stopped atomic.Bool
	wg      sync.WaitGroup
}

func newPluginRing(seg *shmem.Segment, srv *server, lim limits) *pluginRing {
	out, in := rings(seg.Bytes())
	p := &pluginRing{seg: seg, srv: srv, out: reader{r: out, lim: lim}, rels: releaser{r: out}, in: in}
	p.wg.Add(1)
	go p.run()
	return p
}

func (p *pluginRing) run() {
	defer p.wg.Done()
	for !p.stopped.Load() {
		rec, cur, ok, err := p.out.next()
		if err == nil && ok && rec.kind != kindFrame {
			err = fmt.Errorf("record kind %d does not travel to the plugin", rec.kind)
		}
		if err != nil {
			p.srv.protocolError(fmt.Errorf("%w: out ring: %w", ErrProtocol, err))
			return
		}
		if !ok {
			// The plugin's subdevice is not polled from here: a poll
			// now and then, followed by a sleep, leaves tcp's readers
			// standing by for a poller that is gone (~0.5 ms per message).
			p.out.sleep(ringSpin, ringNap)
			continue
		}
		seq := p.rels.add(cur)
		p.srv.dispatch(rec, func() { p.rels.done(seq) })
	}
}

func (p *pluginRing) put(kind uint8, peer sdi.Rank, header, payload []byte) bool {
	n := recordLen(len(header), len(payload))
	if n > p.in.maxRecord() {
		p.srv.log.Error("dropping a record larger than the ring allows", "kind", kind, "peer", peer, "bytes", n, "limit", p.in.maxRecord())
		return false
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	for {
		// stop sets stopped before it waits for inMu and unmaps.
		if p.stopped.Load() {
			return false
		}
		if p.in.tryWrite(kind, peer, 0, header, payload) {
			return true
		}
		p.in.waitRoom(n, ringNap)
	}
}

func (p *pluginRing) stop() {
	if p.stopped.Swap(true) {
		return
	}
	p.out.r.wake()
	p.in.wake()
	p.wg.Wait()
	p.inMu.Lock()
	p.inMu.Unlock() //nolint:staticcheck // waits for a put in progress
	p.seg.Close()
}

// releaser hands ring space back in read order while the subdevice
// completes frames in any order: a frame's bytes stay in the ring, where the
// subdevice reads them, until it is done with them and with every frame
// read before it.
type releaser struct {
	r    *ring
	mu   sync.Mutex
	base uint64 // sequence number of q[0]
	q    []release
}

type release struct {
	end  uint64 // ring cursor just past the frame
	done bool
}

func (rl *releaser) add(end uint64) uint64 {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	rl.q = append(rl.q, release{end: end})
	return rl.base + uint64(len(rl.q)) - 1
}

func (rl *releaser) done(seq uint64) {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	i := seq - rl.base
	if i >= uint64(len(rl.q)) {
		return
	}
	rl.q[i].done = true
	k := 0
	for k < len(rl.q) && rl.q[k].done {
		k++
	}
	if k == 0 {
		return
	}
	rl.r.release(rl.q[k-1].end)
	rl.q = append(rl.q[:0], rl.q[k:]...)
	rl.base += uint64(k)
}
