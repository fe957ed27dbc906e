package multidevice

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// outbox is the engine's queue: frames a subdevice refused with
// ErrWouldBlock, frames sent on behalf of handler callbacks (which must not
// call into a subdevice), and small jobs such as cancelling duplicated
// receives. One goroutine, started by Open and stopped by shutdown, owns the
// retries; a goroutine waiting in Device.spin sends queued items itself
// (help), and meanwhile pushes do not wake the outbox goroutine.
type outbox struct {
	d *Device
	// drainMu makes the outbox goroutine and helpers take turns, so queued
	// items leave in order.
	drainMu sync.Mutex
	queued  atomic.Int64 // len(items), readable without mu
	// backlog[peer] counts the frames to peer in items. A send that
	// finds any goes behind them instead of trying its subdevice first:
	// a frame that got into a ring or socket the moment a queued one
	// would still block arrives ahead of it, and the receiver then holds
	// it, copied, until the gap is filled.
	backlog []atomic.Int32
	mu      sync.Mutex
	items   []outItem
	stopped bool // set by failRest: nothing queued from then on is sent
	// passing is how many items a pass took out of items and has not
	// put back or sent: drain waits for them too.
	passing int
	// Owned by the drainMu holder: the slices pass collects kept items in
	// and the links found full, reused from pass to pass. A sender with a
	// window of large messages finds the ring full on most passes, and
	// fresh slices there made the spinning sender spend a quarter of its
	// time allocating.
	kept []outItem
	full []link
	wake chan struct{} // capacity 1: "the queue or a subdevice changed"
	// backoffs counts goroutines in backoff, which a freed subdevice
	// (SendDone) wakes as it wakes the outbox goroutine for queued items.
	backoffs atomic.Int32
	quit     chan struct{}
	empty    *sync.Cond // signalled when items becomes empty
	once     sync.Once
}

// link is one subdevice's connection to one peer.
type link struct {
	sub  *subdev
	peer sdi.Rank
}

type outItem struct {
	sub   *subdev
	frame *outFrame
	fn    func() // a job instead of a frame
}

func (o *outbox) init(d *Device) {
	o.d = d
	o.backlog = make([]atomic.Int32, d.size)
	o.wake = make(chan struct{}, 1)
	o.quit = make(chan struct{})
	o.empty = sync.NewCond(&o.mu)
}

// push queues an item. The outbox goroutine is woken only when no
// goroutine spins: a spinner sends the item itself, and when the last one
// stops it wakes the outbox goroutine if items are left (stopSpinning reads
// queued after its decrement, push reads spinners after its increment, so
// one of them sees the other).
func (o *outbox) push(it outItem) {
	if it.frame != nil {
		o.backlog[it.frame.f.Peer].Add(1)
	}
	o.mu.Lock()
	if o.stopped {
		// Close ran while this send was on its way (a goroutine of the
		// program still sending as another finalizes): fail the frame
		// rather than queue it where nobody looks. On a goroutine of its
		// own, since push may be called with d.mu held and a frame's
		// completion may take it.
		o.mu.Unlock()
		if it.frame != nil {
			o.backlog[it.frame.f.Peer].Add(-1)
			go o.d.finishFrame(it.frame, ErrClosed)
		}
		return
	}
	o.items = append(o.items, it)
	o.queued.Store(int64(len(o.items)))
	o.mu.Unlock()
	if o.d.prog.spinners.Load() == 0 {
		o.kick()
	}
}

// help sends what is queued on the calling goroutine, unless the outbox
// goroutine is at it, and returns how many items left the queue. It must
// not be called from a Handler callback.
func (o *outbox) help() int {
	if o.queued.Load() == 0 {
		return 0 // inlined: a waiter asks after every message
	}
	return o.helpQueued()
}

// helpQueued is help once something is queued.
func (o *outbox) helpQueued() int {
	if !o.drainMu.TryLock() {
		return 0
	}
	sent, _, _ := o.pass()
	o.drainMu.Unlock()
	return sent
}

// pass tries every queued item once, in order, and keeps those that would
// block at the front of the queue. It reports how many left, whether some
// were kept and whether the queue is now empty. The caller holds drainMu.
func (o *outbox) pass() (sent int, blocked, idle bool) {
	o.mu.Lock()
	items := o.items
	o.items = nil
	o.passing = len(items)
	o.mu.Unlock()

	// Once a link would block, later frames for it wait their turn
	// without being tried: a full ring or socket stays full for the rest
	// of the pass, and trying costs a Send per queued frame.
	full, kept := o.full[:0], o.kept[:0]
	for _, it := range items {
		if it.fn != nil {
			it.fn()
			continue
		}
		l := link{it.sub, it.frame.f.Peer}
		if o.d.closed.Load() {
			o.backlog[l.peer].Add(-1)
			o.d.finishFrame(it.frame, ErrClosed)
			continue
		}
		if slices.Contains(full, l) || !o.d.trySend(it.sub, it.frame, false) {
			if !slices.Contains(full, l) {
				full = append(full, l)
			}
			kept = append(kept, it)
			continue
		}
		o.backlog[l.peer].Add(-1)
	}

	o.mu.Lock()
	o.passing = 0
	if o.stopped {
		// failRest ran while this pass held the items, and the outbox
		// goroutine is gone: kept items would wait where nobody looks.
		// (push fails what comes after failRest, so nothing else is
		// queued.)
		o.empty.Broadcast()
		o.mu.Unlock()
		o.fail(kept)
		clear(items)
		clear(kept)
		o.kept, o.full = kept[:0], full[:0]
		return len(items) - len(kept), false, true
	}
	// The kept items go first, then what was pushed meanwhile; the slice
	// that is not the queue any more becomes next pass's kept, cleared
	// so that it holds no frames for the collector.
	spare := items
	if len(o.items) == 0 {
		o.items = kept
	} else {
		spare = o.items
		o.items = append(kept, o.items...)
	}
	o.queued.Store(int64(len(o.items)))
	idle = len(o.items) == 0
	if idle {
		o.empty.Broadcast()
	}
	o.mu.Unlock()
	clear(spare)
	o.kept, o.full = spare[:0], full[:0]
	return len(items) - len(kept), len(kept) > 0, idle
}

// behind reports whether frames to peer wait in the queue, so that one
// more must queue behind them to keep its place.
func (o *outbox) behind(peer int32) bool { return o.backlog[peer].Load() != 0 }

func (o *outbox) kick() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

func (o *outbox) stop() { o.once.Do(func() { close(o.quit) }) }

// backoff returns a channel that fires after a short pause or a kick,
// whichever comes first.
func (o *outbox) backoff() <-chan struct{} {
	c := make(chan struct{})
	o.backoffs.Add(1)
	go func() {
		defer o.backoffs.Add(-1)
		t := time.NewTimer(50 * time.Microsecond)
		defer t.Stop()
		select {
		case <-t.C:
		case <-o.wake:
		case <-o.quit:
		}
		close(c)
	}()
	return c
}

// freed is called when a subdevice finished a frame and may take more:
// whoever waits for that, if anybody, is woken. Nobody waiting is the
// rule (a frame is queued only when a link was full), and a kick then
// would wake the outbox goroutine for nothing: a thread woken, and on a
// host with as many spinning ranks as cores, one taken from them, at
// every completion of a frame the subdevice kept (shm's single-copy
// payloads, tcp's large frames).
func (o *outbox) freed() {
	if o.queued.Load() > 0 || o.backoffs.Load() > 0 {
		o.kick()
	}
}

// run drains the queue until stop. Items that would block stay queued, in
// order, and are retried after a SendDone kick or a growing pause.
func (o *outbox) run(wg *sync.WaitGroup) {
	defer wg.Done()
	pause := 20 * time.Microsecond
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		o.drainMu.Lock()
		_, blocked, idle := o.pass()
		o.drainMu.Unlock()

		if !blocked {
			pause = 20 * time.Microsecond
			if idle {
				select {
				case <-o.wake:
				case <-o.quit:
					o.failRest()
					return
				}
			}
			continue
		}
		timer.Reset(pause)
		select {
		case <-o.wake:
		case <-timer.C:
			pause = min(2*pause, 5*time.Millisecond)
		case <-o.quit:
			o.failRest()
			return
		}
	}
}

func (o *outbox) failRest() {
	o.mu.Lock()
	o.stopped = true
	items := o.items
	o.items = nil
	o.queued.Store(0)
	o.empty.Broadcast()
	o.mu.Unlock()
	o.fail(items)
}

// fail fails the frames of items, taken out of the queue, with ErrClosed.
func (o *outbox) fail(items []outItem) {
	for _, it := range items {
		if it.frame != nil {
			o.backlog[it.frame.f.Peer].Add(-1)
			o.d.finishFrame(it.frame, ErrClosed)
		}
	}
}

// drain waits until the queue is empty or ctx is done.
func (o *outbox) drain(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		o.mu.Lock()
		o.empty.Broadcast()
		o.mu.Unlock()
	})
	defer stop()
	o.mu.Lock()
	defer o.mu.Unlock()
	for len(o.items) > 0 || o.passing > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		o.empty.Wait()
	}
	return nil
}
