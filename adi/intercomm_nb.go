package adi

import "context"

// Nonblocking collectives on an Intercomm: each starts the blocking one
// on a goroutine and returns a Request that completes with it, as the
// Comm's do (nbcoll.go). Every rank of both groups starts them in the
// same order, among the blocking ones; several may be in flight at once.

// nonblocking starts run, a blocking collective of ic, as ic's next
// collective, on a copy of ic with state of its own. The copy's tag is
// drawn here, in the order of the calls. Its local phases run on a
// communicator of the local group whose context is derived from that
// tag, which every rank draws alike, so that those of collectives in
// flight at once never match each other's messages.
func (ic *Intercomm) nonblocking(name string, run func(ctx context.Context, x *Intercomm) error) (*Request, error) {
	var x *Intercomm
	draw := func() {
		r, l := ic.remote, ic.coll
		seq := r.collSeq.Add(1) - 1
		x = &Intercomm{
			remote: &Comm{w: r.w, context: r.context, rank: r.rank, ranks: r.ranks, index: r.index, remoteGroup: true},
			coll: &Comm{w: l.w, context: deriveContext(l.context, seq+1, 5), rank: l.rank, ranks: l.ranks, index: l.index,
				identity: l.identity, hosts: l.hosts, ordered: l.ordered},
			local:     ic.local,
			lowLeader: ic.lowLeader,
		}
		x.remote.collSeq.Store(seq) // its begin draws the number drawn here
	}
	return ic.local.w.bg.launch(ic.local, name, draw, func(ctx context.Context) error { return run(ctx, x) })
}

// Ibarrier starts a Barrier.
func (ic *Intercomm) Ibarrier() (*Request, error) {
	return ic.nonblocking("intercomm ibarrier", func(ctx context.Context, x *Intercomm) error { return x.Barrier(ctx) })
}

// Ibcast starts a Bcast.
func (ic *Intercomm) Ibcast(buf []byte, root int) (*Request, error) {
	return ic.nonblocking("intercomm ibcast", func(ctx context.Context, x *Intercomm) error { return x.Bcast(ctx, buf, root) })
}

// Igather starts a Gather.
func (ic *Intercomm) Igather(send, recv []byte, root int) (*Request, error) {
	return ic.nonblocking("intercomm igather", func(ctx context.Context, x *Intercomm) error { return x.Gather(ctx, send, recv, root) })
}

// Iscatter starts a Scatter.
func (ic *Intercomm) Iscatter(send, recv []byte, root int) (*Request, error) {
	return ic.nonblocking("intercomm iscatter", func(ctx context.Context, x *Intercomm) error { return x.Scatter(ctx, send, recv, root) })
}

// Iallgather starts an Allgather.
func (ic *Intercomm) Iallgather(send, recv []byte) (*Request, error) {
	return ic.nonblocking("intercomm iallgather", func(ctx context.Context, x *Intercomm) error { return x.Allgather(ctx, send, recv) })
}

// Ialltoall starts an Alltoall.
func (ic *Intercomm) Ialltoall(send, recv []byte) (*Request, error) {
	return ic.nonblocking("intercomm ialltoall", func(ctx context.Context, x *Intercomm) error { return x.Alltoall(ctx, send, recv) })
}

// IinterReduce starts an InterReduce.
func IinterReduce[T Elem](ic *Intercomm, send, recv []T, op Op[T], root int) (*Request, error) {
	return ic.nonblocking("intercomm ireduce", func(ctx context.Context, x *Intercomm) error {
		return InterReduce(ctx, x, send, recv, op, root)
	})
}

// IinterAllreduce starts an InterAllreduce.
func IinterAllreduce[T Elem](ic *Intercomm, send, recv []T, op Op[T]) (*Request, error) {
	return ic.nonblocking("intercomm iallreduce", func(ctx context.Context, x *Intercomm) error {
		return InterAllreduce(ctx, x, send, recv, op)
	})
}

// Igatherv starts a Gatherv.
func (ic *Intercomm) Igatherv(send []byte, recv [][]byte, root int) (*Request, error) {
	return ic.nonblocking("intercomm igatherv", func(ctx context.Context, x *Intercomm) error { return x.Gatherv(ctx, send, recv, root) })
}

// Iscatterv starts a Scatterv.
func (ic *Intercomm) Iscatterv(send [][]byte, recv []byte, root int) (*Request, error) {
	return ic.nonblocking("intercomm iscatterv", func(ctx context.Context, x *Intercomm) error { return x.Scatterv(ctx, send, recv, root) })
}

// Iallgatherv starts an Allgatherv.
func (ic *Intercomm) Iallgatherv(send []byte, recv [][]byte) (*Request, error) {
	return ic.nonblocking("intercomm iallgatherv", func(ctx context.Context, x *Intercomm) error { return x.Allgatherv(ctx, send, recv) })
}

// Ialltoallv starts an Alltoallv.
func (ic *Intercomm) Ialltoallv(send, recv [][]byte) (*Request, error) {
	return ic.nonblocking("intercomm ialltoallv", func(ctx context.Context, x *Intercomm) error { return x.Alltoallv(ctx, send, recv) })
}

// IinterReduceScatter starts an InterReduceScatter.
func IinterReduceScatter[T Elem](ic *Intercomm, send, recv []T, counts []int, op Op[T]) (*Request, error) {
	return ic.nonblocking("intercomm ireduce_scatter", func(ctx context.Context, x *Intercomm) error {
		return InterReduceScatter(ctx, x, send, recv, counts, op)
	})
}

// IinterReduceScatterBlock starts an InterReduceScatterBlock.
func IinterReduceScatterBlock[T Elem](ic *Intercomm, send, recv []T, op Op[T]) (*Request, error) {
	return ic.nonblocking("intercomm ireduce_scatter_block", func(ctx context.Context, x *Intercomm) error {
		return InterReduceScatterBlock(ctx, x, send, recv, op)
	})
}
