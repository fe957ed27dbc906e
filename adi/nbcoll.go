package adi

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Nonblocking collectives (MPI_Ibarrier and the rest). Each runs the
// blocking collective on a goroutine of its own and returns a Request that
// completes when it is done, so that a rank computes, or talks
// point-to-point, while the collective moves. The collective takes its
// place in the communicator's sequence of collectives when it is
// started, not when its goroutine runs: every rank starts its blocking
// and nonblocking collectives in the same order, as MPI requires, and
// any number of them may be in progress at once. Each runs on state of its
// own, so the one-at-a-time rule of the blocking collectives does not
// apply to them. Their buffers belong to the collective until its request
// completes. A nonblocking collective cannot be cancelled; Finalize ends
// those still running with ErrFinalized.

// background runs a world's goroutines of its own: nonblocking
// collectives, and the servers of RMA windows (win.go). It counts them, so
// that Finalize returns only once they are over. The goroutines that run
// collectives stay, waiting for the next, until Finalize: a goroutine
// started for each grew its stack through the collective's frames every
// time, which was a third of an 8-byte Iallreduce's cost.
type background struct {
	mu      sync.Mutex
	closed  bool
	tasks   chan func() // idle workers wait here; closed by finish
	servers map[*Win]context.CancelFunc
	wg      sync.WaitGroup
}

// serve runs a window's server until Free (unserve) or Finalize.
func (g *background) serve(w *Win, run func(ctx context.Context)) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return ErrFinalized
	}
	ctx, cancel := context.WithCancel(context.Background())
	if g.servers == nil {
		g.servers = make(map[*Win]context.CancelFunc)
	}
	g.servers[w] = cancel
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		run(ctx)
	}()
	return nil
}

// stop stops w's server and leaves w among the windows Finalize ends,
// for one stopped before Free, which unserves it.
func (g *background) stop(w *Win) {
	g.mu.Lock()
	cancel := g.servers[w]
	g.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// unserve stops w's server, which Free ends: Finalize no longer does.
func (g *background) unserve(w *Win) {
	g.mu.Lock()
	cancel := g.servers[w]
	delete(g.servers, w)
	g.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// nonblocking starts run, a blocking collective, as the next collective
// of c, on a copy of c that has state of its own.
func (c *Comm) nonblocking(name string, run func(ctx context.Context, c *Comm) error) (*Request, error) {
	var own *Comm
	draw := func() {
		// The copies, with the requests and scratch space their
		// collectives keep, are recycled: a fresh one per call cost twice
		// the allocations.
		own, _ = c.copies.Get().(*Comm)
		if own == nil {
			own = &Comm{w: c.w, context: c.context, rank: c.rank, ranks: c.ranks, index: c.index, identity: c.identity, hosts: c.hosts, ordered: c.ordered}
		}
		own.collSeq.Store(c.collSeq.Add(1) - 1) // its begin draws the number drawn here
	}
	return c.w.bg.launch(c, name, draw, func(ctx context.Context) error {
		err := run(ctx, own)
		if err == nil { // a failed one may have sends still in flight from its scratch
			c.copies.Put(own)
		}
		return err
	})
}

// launch starts run on a worker and returns the request that completes
// with it, on c. draw, called first under the lock that orders the
// launches, takes what run needs to be the next collective.
func (g *background) launch(c *Comm, name string, draw func(), run func(ctx context.Context) error) (*Request, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, fmt.Errorf("adi: %s: %w", name, ErrFinalized)
	}
	draw()
	op := &localOp{done: make(chan struct{})}
	g.wg.Add(1)
	task := func() {
		defer g.wg.Done()
		op.err = run(context.Background())
		close(op.done)
		c.w.dev.Notify() // for WaitAny, which waits on Changed
	}
	if g.tasks == nil {
		g.tasks = make(chan func())
	}
	select {
	case g.tasks <- task: // an idle worker took it
	default:
		go g.work(task)
	}
	return &Request{c: c, local: op}, nil
}

// work runs task, then the tasks handed to it while idle, until finish.
func (g *background) work(task func()) {
	for ok := true; ok; task, ok = <-g.tasks {
		task()
	}
}

// finish stops the window servers and waits for them and for the
// nonblocking collectives still running, after the device closed and
// failed their requests, or until ctx ends.
func (g *background) finish(ctx context.Context) error {
	g.mu.Lock()
	if !g.closed && g.tasks != nil {
		close(g.tasks) // idle workers end; nothing is sent once closed is set
	}
	var unfreed []*Win
	for w, cancel := range g.servers {
		cancel()
		delete(g.servers, w)
		unfreed = append(unfreed, w)
	}
	g.closed = true // Finalize may be called again
	g.mu.Unlock()
	over := make(chan struct{})
	go func() {
		g.wg.Wait()
		close(over)
	}()
	select {
	case <-over:
		// Windows not freed give their shared memory back now that
		// their servers stopped.
		var errs []error
		for _, w := range unfreed {
			errs = append(errs, w.unmap())
		}
		return errors.Join(errs...)
	case <-ctx.Done():
		return fmt.Errorf("adi: finalize: nonblocking collectives or window servers still running: %w", ctx.Err())
	}
}

// Ibarrier starts a Barrier.
func (c *Comm) Ibarrier() (*Request, error) {
	return c.nonblocking("barrier", func(ctx context.Context, c *Comm) error { return c.Barrier(ctx) })
}

// Ibcast starts a Bcast.
func (c *Comm) Ibcast(buf []byte, root int) (*Request, error) {
	return c.nonblocking("bcast", func(ctx context.Context, c *Comm) error { return c.Bcast(ctx, buf, root) })
}

// Igather starts a Gather.
func (c *Comm) Igather(send, recv []byte, root int) (*Request, error) {
	return c.nonblocking("gather", func(ctx context.Context, c *Comm) error { return c.Gather(ctx, send, recv, root) })
}

// Igatherv starts a Gatherv.
func (c *Comm) Igatherv(send []byte, recv [][]byte, root int) (*Request, error) {
	return c.nonblocking("gatherv", func(ctx context.Context, c *Comm) error { return c.Gatherv(ctx, send, recv, root) })
}

// Iscatter starts a Scatter.
func (c *Comm) Iscatter(send, recv []byte, root int) (*Request, error) {
	return c.nonblocking("scatter", func(ctx context.Context, c *Comm) error { return c.Scatter(ctx, send, recv, root) })
}

// Iscatterv starts a Scatterv.
func (c *Comm) Iscatterv(send [][]byte, recv []byte, root int) (*Request, error) {
	return c.nonblocking("scatterv", func(ctx context.Context, c *Comm) error { return c.Scatterv(ctx, send, recv, root) })
}

// Iallgather starts an Allgather.
func (c *Comm) Iallgather(send, recv []byte) (*Request, error) {
	return c.nonblocking("allgather", func(ctx context.Context, c *Comm) error { return c.Allgather(ctx, send, recv) })
}

// Iallgatherv starts an Allgatherv.
func (c *Comm) Iallgatherv(send []byte, recv [][]byte) (*Request, error) {
	return c.nonblocking("allgatherv", func(ctx context.Context, c *Comm) error { return c.Allgatherv(ctx, send, recv) })
}

// Ialltoall starts an Alltoall.
func (c *Comm) Ialltoall(send, recv []byte) (*Request, error) {
	return c.nonblocking("alltoall", func(ctx context.Context, c *Comm) error { return c.Alltoall(ctx, send, recv) })
}

// Ialltoallv starts an Alltoallv.
func (c *Comm) Ialltoallv(send, recv [][]byte) (*Request, error) {
	return c.nonblocking("alltoallv", func(ctx context.Context, c *Comm) error { return c.Alltoallv(ctx, send, recv) })
}

// Ireduce starts a Reduce.
func Ireduce[T Elem](c *Comm, send, recv []T, op Op[T], root int) (*Request, error) {
	return c.nonblocking("reduce", func(ctx context.Context, c *Comm) error { return Reduce(ctx, c, send, recv, op, root) })
}

// Iallreduce starts an Allreduce.
func Iallreduce[T Elem](c *Comm, send, recv []T, op Op[T]) (*Request, error) {
	return c.nonblocking("allreduce", func(ctx context.Context, c *Comm) error { return Allreduce(ctx, c, send, recv, op) })
}

// Iscan starts a Scan.
func Iscan[T Elem](c *Comm, send, recv []T, op Op[T]) (*Request, error) {
	return c.nonblocking("scan", func(ctx context.Context, c *Comm) error { return Scan(ctx, c, send, recv, op) })
}

// Iexscan starts an Exscan.
func Iexscan[T Elem](c *Comm, send, recv []T, op Op[T]) (*Request, error) {
	return c.nonblocking("exscan", func(ctx context.Context, c *Comm) error { return Exscan(ctx, c, send, recv, op) })
}

// IreduceScatter starts a ReduceScatter.
func IreduceScatter[T Elem](c *Comm, send, recv []T, counts []int, op Op[T]) (*Request, error) {
	return c.nonblocking("reduce_scatter", func(ctx context.Context, c *Comm) error { return ReduceScatter(ctx, c, send, recv, counts, op) })
}

// IreduceScatterBlock starts a ReduceScatterBlock.
func IreduceScatterBlock[T Elem](c *Comm, send, recv []T, op Op[T]) (*Request, error) {
	return c.nonblocking("reduce_scatter_block", func(ctx context.Context, c *Comm) error { return ReduceScatterBlock(ctx, c, send, recv, op) })
}
