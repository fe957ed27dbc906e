package adi

import (
	"context"
	"fmt"
	"sync"
)

// Nonblocking collectives (MPI_Ibarrier and the rest). Each starts the
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

// collGoroutines counts a world's nonblocking collectives still running,
// so that Finalize returns only once they are over.
type collGoroutines struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// nonblocking starts run, a blocking collective, as the next collective
// of c, on a copy of c that has state of its own.
func (c *Comm) nonblocking(name string, run func(ctx context.Context, c *Comm) error) (*Request, error) {
	g := &c.w.colls
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, fmt.Errorf("adi: %s: %w", name, ErrFinalized)
	}
	own := &Comm{w: c.w, context: c.context, rank: c.rank, ranks: c.ranks, index: c.index, identity: c.identity}
	own.collSeq.Store(c.collSeq.Add(1) - 1) // its begin draws the number drawn here
	op := &localOp{done: make(chan struct{})}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		op.err = run(context.Background(), own)
		close(op.done)
		c.w.dev.Notify() // for WaitAny, which waits on Changed
	}()
	return &Request{c: c, local: op}, nil
}

// finish waits for the nonblocking collectives still running, after the
// device closed and failed their requests, or until ctx ends.
func (g *collGoroutines) finish(ctx context.Context) error {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	over := make(chan struct{})
	go func() {
		g.wg.Wait()
		close(over)
	}()
	select {
	case <-over:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("adi: finalize: nonblocking collectives still running: %w", ctx.Err())
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
