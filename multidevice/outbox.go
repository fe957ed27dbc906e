package multidevice

import (
	"context"
	"sync"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// outbox is the engine's queue: frames a subdevice refused with
// ErrWouldBlock, frames sent on behalf of handler callbacks (which must not
// call into a subdevice), and small jobs such as cancelling duplicated
// receives. One goroutine, started by Open and stopped by shutdown, owns the
// retries.
type outbox struct {
	d     *Device
	mu    sync.Mutex
	items []outItem
	wake  chan struct{} // capacity 1: "the queue or a subdevice changed"
	quit  chan struct{}
	empty *sync.Cond // signalled when items becomes empty
	once  sync.Once
}

type outItem struct {
	sub   *subdev
	frame *sdi.Frame
	done  func(error)
	fn    func() // a job instead of a frame
}

func (o *outbox) init(d *Device) {
	o.d = d
	o.wake = make(chan struct{}, 1)
	o.quit = make(chan struct{})
	o.empty = sync.NewCond(&o.mu)
}

func (o *outbox) push(it outItem) {
	o.mu.Lock()
	o.items = append(o.items, it)
	o.mu.Unlock()
	o.kick()
}

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
	go func() {
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

// run drains the queue until stop. Items that would block stay queued, in
// order, and are retried after a SendDone kick or a growing pause.
func (o *outbox) run(wg *sync.WaitGroup) {
	defer wg.Done()
	pause := 20 * time.Microsecond
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		o.mu.Lock()
		items := o.items
		o.items = nil
		o.mu.Unlock()

		var blocked []outItem
		for _, it := range items {
			if it.fn != nil {
				it.fn()
				continue
			}
			if o.d.closed.Load() {
				it.done(ErrClosed)
				continue
			}
			if !o.d.trySend(it.sub, it.frame, it.done, false) {
				blocked = append(blocked, it)
			}
		}

		o.mu.Lock()
		o.items = append(blocked, o.items...)
		idle := len(o.items) == 0
		if idle {
			o.empty.Broadcast()
		}
		o.mu.Unlock()

		if len(blocked) == 0 {
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
	items := o.items
	o.items = nil
	o.empty.Broadcast()
	o.mu.Unlock()
	for _, it := range items {
		if it.done != nil {
			it.done(ErrClosed)
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
	for len(o.items) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		o.empty.Wait()
	}
	return nil
}
