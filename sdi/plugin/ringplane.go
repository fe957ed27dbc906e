package plugin

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hpc-multidevice/multidevice/internal/sched"
	"github.com/hpc-multidevice/multidevice/internal/shmem"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// Waiting on the rings: a consumer that finds its ring empty spins this
// long, yielding the CPU as it goes, before it parks on the futex, because
// waking a parked thread costs tens of microseconds and the next record
// often comes sooner. Longer spins measured worse on a busy two-core
// machine (an SDI-level ping-pong: 25us beat 50, 80 and an adaptive spin of
// twice the recent gap), since every spinner takes a CPU from the thread
// it waits for. An idle consumer spins once and parks: no CPU when idle.
// Parked waits are bounded so that a stop is noticed even without a wake-up.
const (
	ringSpin  = 25 * time.Microsecond
	ringNap   = 50 * time.Millisecond
	drainStep = 64 // records handled per lock hold
)

// Polling across the plane. While a rank polls the Client (it waits for a
// message), the host's consumer goroutine stands by, so that it does not
// take a CPU from the poller, and the plugin polls its own subdevice on its
// ring goroutine, as the rank would poll a built-in one: a message then
// crosses both processes with no thread woken on its way. The rank says
// when it parks (sdi.Idler); a rank that simply stops polling (it got its
// message and went back to work) is noticed after standbyNap without a
// Poll, by both sides.
//
// standbyNap is as long as the multidevice's polling budget (2 ms): shorter
// naps woke the host's consumer goroutine thousands of times a second while
// a rank polled, a timer and a thread wake-up each on a two-core machine.
const (
	standbyNap = 2 * time.Millisecond
	// pollsPerTick is how many Poll calls pass between stores of the
	// host's Poll count into the segment: often enough that the plugin
	// sees it move well within standbyNap, rarely enough that the
	// plugin's reads of that line are not answered by a cache miss each.
	pollsPerTick = 32
)

// hostRing is the host's side of the shared-memory plane: it produces on
// the out ring and consumes the in ring on its own goroutine or in poll.
type hostRing struct {
	seg  *shmem.Segment
	area *placeArea     // nil without a place area
	aseg *shmem.Segment // the area's segment; nil without one
	h    sdi.Handler
	fail func(error) // a protocol violation: take the plugin out

	outMu    sync.Mutex
	out      *ring
	unmapped bool // guarded by outMu

	once sync.Once

	inMu sync.Mutex // held while records are handed to the Handler
	in   reader

	act     activity      // the segment's host-activity words
	polls   atomic.Uint64 // Poll calls so far
	polling atomic.Bool   // a rank polls: run stands by, the plugin polls
	idleCh  chan struct{} // ends run's stand-by: Idle or stop

	stopped atomic.Bool
	wg      sync.WaitGroup
}

// newHostRing starts the host's side of seg; aseg is its place area, or nil.
func newHostRing(seg, aseg *shmem.Segment, h sdi.Handler, lim limits, fail func(error)) *hostRing {
	out, in := rings(seg.Bytes())
	p := &hostRing{seg: seg, aseg: aseg, h: h, fail: fail, out: out, in: reader{r: in, lim: lim},
		act: activityAt(seg.Bytes()), idleCh: make(chan struct{}, 1)}
	if aseg != nil {
		p.area = placeAreaAt(aseg.Bytes())
	}
	p.act.parked.Store(1)
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

// run consumes the in ring while nobody polls. While a rank polls, it
// stands by, and takes over when the rank parks or has not polled for a
// whole standbyNap.
func (p *hostRing) run() {
	defer p.wg.Done()
	nap := time.NewTimer(standbyNap)
	defer nap.Stop()
	for !p.stopped.Load() {
		if p.polling.Load() {
			seen := p.polls.Load()
			nap.Reset(standbyNap)
			select {
			case <-p.idleCh:
			case <-nap.C:
			}
			if p.polling.Load() && p.polls.Load() != seen {
				continue
			}
			// The rank went back to its own work without parking:
			// the plugin is told to stop polling too.
			p.endSpell()
		}
		p.inMu.Lock()
		n := p.drainLocked()
		p.inMu.Unlock()
		if n == 0 {
			p.in.sleep(ringSpin, ringNap, p.polling.Load)
		}
	}
}

func (p *hostRing) poll() int {
	n := p.polls.Add(1)
	if !p.polling.Load() {
		p.startPolling()
	} else if n%pollsPerTick == 0 {
		p.mapped(func() { p.act.polls.Store(uint32(n)) })
	}
	if !p.inMu.TryLock() {
		return 0
	}
	defer p.inMu.Unlock()
	return p.drainLocked()
}

// startPolling moves both consumers aside for a polling rank: the plugin's
// ring goroutine starts polling its subdevice, the host's own goroutine
// stands by. Each is woken if it sleeps, which costs a system call at the
// start of a polling spell, not per message.
func (p *hostRing) startPolling() {
	p.polling.Store(true)
	p.mapped(func() {
		p.act.polls.Store(uint32(p.polls.Load()))
		p.act.parked.Store(0)
		p.out.nudge()
		p.in.r.nudge()
	})
}

// mapped calls write, which writes into the segment, unless stop has
// unmapped it: Poll and Idle may come after the plugin was taken out, or
// race with Close, and a write there would fault and end the process.
// Only a spell's start and end and every pollsPerTick-th Poll come here;
// the records themselves are read under inMu, which stop waits for.
func (p *hostRing) mapped(write func()) {
	p.outMu.Lock()
	defer p.outMu.Unlock()
	if !p.unmapped {
		write()
	}
}

// idle ends a polling spell because the rank parks (sdi.Idler), and ends
// run's stand-by.
func (p *hostRing) idle() {
	if p.endSpell() {
		select {
		case p.idleCh <- struct{}{}:
		default:
		}
	}
}

// endSpell ends a polling spell, if one is on, and tells the plugin; it
// reports whether one was.
func (p *hostRing) endSpell() bool {
	if !p.polling.Swap(false) {
		return false
	}
	p.mapped(func() { p.act.parked.Store(1) })
	return true
}

func (p *hostRing) drainLocked() int {
	n := 0
	for n < drainStep && !p.stopped.Load() {
		rec, cur, ok, err := p.in.next()
		if err == nil && ok {
			err = p.deliver(rec)
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

// deliver hands one record from the in ring to the Handler: a placed one
// from its slot, which is then free again.
func (p *hostRing) deliver(rec record) error {
	if rec.kind != kindPlaced {
		if !deliver(p.h, rec) {
			return fmt.Errorf("record kind %d does not travel to the host", rec.kind)
		}
		return nil
	}
	if p.area == nil {
		return fmt.Errorf("%w: a placed record, but there is no place area", sdi.ErrBadFrame)
	}
	payload, err := p.area.take(rec)
	if err != nil {
		return err
	}
	p.h.Deliver(rec.peer, rec.header, payload)
	p.area.free(int(rec.aux))
	return nil
}

// stop ends the consumer, waits for a poll and a send in progress, and
// unmaps the segment. It is idempotent.
func (p *hostRing) stop() {
	p.once.Do(func() {
		p.stopped.Store(true)
		p.in.r.wake()
		select {
		case p.idleCh <- struct{}{}:
		default:
		}
		p.wg.Wait()
		// A poll in progress finishes its record and sees stopped.
		p.inMu.Lock()
		p.inMu.Unlock() //nolint:staticcheck // an empty critical section waits for poll
		p.outMu.Lock()
		p.unmapped = true
		p.seg.Close()
		if p.aseg != nil {
			p.aseg.Close()
		}
		p.outMu.Unlock()
	})
}

// pluginRing is the plugin's side: it consumes frames from the out ring
// on its own goroutine and produces deliveries on the in ring. While the
// host polls, the same goroutine polls the plugin's subdevice (if it has
// FlagPoll) between looks at the ring.
type pluginRing struct {
	seg  *shmem.Segment
	aseg *shmem.Segment // the place area's segment; nil without one
	srv  *server
	act  activity

	out  reader
	rels releaser

	inMu sync.Mutex
	in   *ring

	stopped atomic.Bool
	wg      sync.WaitGroup
}

// newPluginRing starts the plugin's side of seg; aseg is its checked place
// area, or nil.
func newPluginRing(seg, aseg *shmem.Segment, srv *server, lim limits) *pluginRing {
	out, in := rings(seg.Bytes())
	p := &pluginRing{seg: seg, aseg: aseg, srv: srv, act: activityAt(seg.Bytes()),
		out: reader{r: out, lim: lim}, rels: releaser{r: out}, in: in}
	p.wg.Add(1)
	go p.run()
	return p
}

func (p *pluginRing) run() {
	defer p.wg.Done()
	poller, idler := p.srv.poller, p.srv.idler
	var host hostWatch
	polling := false
	for i := 0; !p.stopped.Load(); i++ {
		rec, cur, ok, err := p.out.next()
		if err == nil && ok && rec.kind != kindFrame {
			err = fmt.Errorf("record kind %d does not travel to the plugin", rec.kind)
		}
		if err != nil {
			p.srv.protocolError(fmt.Errorf("%w: out ring: %w", ErrProtocol, err))
			return
		}
		if ok {
			seq := p.rels.add(cur)
			p.srv.dispatch(rec, func() { p.rels.done(seq) })
			continue
		}
		if poller != nil && host.active(p.act) {
			polling = true
			if poller.Poll() == 0 {
				// Yield the CPU to any thread: the rank that polls us,
				// or the peer it waits for, may need this one. Rarely
				// to this process's goroutines as well: runtime.Gosched
				// wakes an idle thread to look for work (a futex call and
				// a runnable thread more), and they get the other P anyway.
				if i%64 == 63 {
					runtime.Gosched()
				}
				sched.Yield()
			}
			continue
		}
		if polling {
			polling = false
			if idler != nil {
				idler.Idle()
			}
		}
		// A host that stopped polling without parking is marked parked
		// by its own goroutine within about standbyNap; until then the
		// nap is that short, so that Poll calls that resume meanwhile
		// (they do not nudge) are noticed.
		nap := ringNap
		if poller != nil && p.act.parked.Load() == 0 {
			nap = standbyNap
		}
		p.out.sleep(ringSpin, nap, func() bool { return poller != nil && host.resumed(p.act) })
	}
}

// hostWatch tells from the segment's activity words whether a rank polls
// the host's side of the plane. Owned by the plugin's ring goroutine.
type hostWatch struct {
	polls uint32
	moved time.Time // when polls last changed
}

func (w *hostWatch) active(a activity) bool {
	if a.parked.Load() != 0 {
		return false
	}
	now := time.Now()
	if n := a.polls.Load(); n != w.polls {
		w.polls, w.moved = n, now
		return true
	}
	return now.Sub(w.moved) < standbyNap
}

// resumed reports whether the host polls again since active last looked.
func (w *hostWatch) resumed(a activity) bool {
	return a.parked.Load() == 0 && a.polls.Load() != w.polls
}

func (p *pluginRing) put(kind uint8, peer sdi.Rank, header, payload []byte) bool {
	return p.write(kind, peer, recordLen(len(header), len(payload)), func() bool {
		return p.in.tryWrite(kind, peer, 0, header, payload)
	})
}

// putPlaced writes a kindPlaced record for the n bytes in slot, waiting
// like put.
func (p *pluginRing) putPlaced(peer sdi.Rank, slot int, header []byte, n int) bool {
	return p.write(kindPlaced, peer, recordLen(len(header), 0), func() bool {
		return p.in.tryWritePlaced(peer, uint32(slot), header, n)
	})
}

// write calls try, which writes a record of n bytes into the in ring,
// until it has room.
func (p *pluginRing) write(kind uint8, peer sdi.Rank, n int, try func() bool) bool {
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
		if try() {
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
	if p.aseg != nil {
		p.aseg.Close()
	}
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
