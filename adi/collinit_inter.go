package adi

import (
	"cmp"
	"context"
)

// Persistent collectives on an Intercomm (MPI 4.0's init forms on an
// intercommunicator), as those of collinit.go on a Comm: every rank of
// both groups makes the Init calls in the same order as its Dup, Split,
// Create and Merge calls on ic; Init fixes the arguments and a context of
// the collective's own, and checks this rank's arguments as the blocking
// form does (initChecked); each Start runs the nonblocking form once.

// collInit makes the persistent request whose Start calls start on a
// duplicate of ic, made now.
func (ic *Intercomm) collInit(start func(own *Intercomm) (*Request, error)) *Request {
	own, _ := ic.Dup(context.Background()) // local: it draws a context id, sends nothing
	return ic.local.persistentColl(func() (*Request, error) { return start(own) })
}

// BarrierInit makes a persistent Barrier.
func (ic *Intercomm) BarrierInit() (*Request, error) {
	return ic.collInit((*Intercomm).Ibarrier), nil
}

// BcastInit makes a persistent Bcast.
func (ic *Intercomm) BcastInit(buf []byte, root int) (*Request, error) {
	q := ic.collInit(func(own *Intercomm) (*Request, error) { return own.Ibcast(buf, root) })
	return initChecked(q, "intercomm bcast", ic.rootArg(root))
}

// GatherInit makes a persistent Gather.
func (ic *Intercomm) GatherInit(send, recv []byte, root int) (*Request, error) {
	q := ic.collInit(func(own *Intercomm) (*Request, error) { return own.Igather(send, recv, root) })
	return initChecked(q, "intercomm gather", ic.rootArg(root))
}

// GathervInit makes a persistent Gatherv.
func (ic *Intercomm) GathervInit(send []byte, recv [][]byte, root int) (*Request, error) {
	q := ic.collInit(func(own *Intercomm) (*Request, error) { return own.Igatherv(send, recv, root) })
	return initChecked(q, "intercomm gatherv", cmp.Or(ic.rootArg(root), ic.gathervArgs(recv, root)))
}

// ScatterInit makes a persistent Scatter.
func (ic *Intercomm) ScatterInit(send, recv []byte, root int) (*Request, error) {
	q := ic.collInit(func(own *Intercomm) (*Request, error) { return own.Iscatter(send, recv, root) })
	return initChecked(q, "intercomm scatter", ic.rootArg(root))
}

// ScattervInit makes a persistent Scatterv.
func (ic *Intercomm) ScattervInit(send [][]byte, recv []byte, root int) (*Request, error) {
	q := ic.collInit(func(own *Intercomm) (*Request, error) { return own.Iscatterv(send, recv, root) })
	return initChecked(q, "intercomm scatterv", cmp.Or(ic.rootArg(root), ic.scattervArgs(send, root)))
}

// AllgatherInit makes a persistent Allgather.
func (ic *Intercomm) AllgatherInit(send, recv []byte) (*Request, error) {
	q := ic.collInit(func(own *Intercomm) (*Request, error) { return own.Iallgather(send, recv) })
	return initChecked(q, "intercomm allgather", ic.allgatherArgs(recv))
}

// AllgathervInit makes a persistent Allgatherv.
func (ic *Intercomm) AllgathervInit(send []byte, recv [][]byte) (*Request, error) {
	q := ic.collInit(func(own *Intercomm) (*Request, error) { return own.Iallgatherv(send, recv) })
	return initChecked(q, "intercomm allgatherv", ic.allgathervArgs(recv))
}

// AlltoallInit makes a persistent Alltoall.
func (ic *Intercomm) AlltoallInit(send, recv []byte) (*Request, error) {
	q := ic.collInit(func(own *Intercomm) (*Request, error) { return own.Ialltoall(send, recv) })
	return initChecked(q, "intercomm alltoall", ic.alltoallArgs(send, recv))
}

// AlltoallvInit makes a persistent Alltoallv.
func (ic *Intercomm) AlltoallvInit(send, recv [][]byte) (*Request, error) {
	q := ic.collInit(func(own *Intercomm) (*Request, error) { return own.Ialltoallv(send, recv) })
	return initChecked(q, "intercomm alltoallv", ic.alltoallvArgs(send, recv))
}

// InterReduceInit makes a persistent InterReduce.
func InterReduceInit[T Elem](ic *Intercomm, send, recv []T, op Op[T], root int) (*Request, error) {
	q := ic.collInit(func(own *Intercomm) (*Request, error) { return IinterReduce(own, send, recv, op, root) })
	return initChecked(q, "intercomm reduce", cmp.Or(ic.rootArg(root), interReduceArgs(op, root)))
}

// InterAllreduceInit makes a persistent InterAllreduce.
func InterAllreduceInit[T Elem](ic *Intercomm, send, recv []T, op Op[T]) (*Request, error) {
	q := ic.collInit(func(own *Intercomm) (*Request, error) { return IinterAllreduce(own, send, recv, op) })
	return initChecked(q, "intercomm allreduce", allreduceArgs(send, recv, op))
}

// InterReduceScatterInit makes a persistent InterReduceScatter.
func InterReduceScatterInit[T Elem](ic *Intercomm, send, recv []T, counts []int, op Op[T]) (*Request, error) {
	q := ic.collInit(func(own *Intercomm) (*Request, error) { return IinterReduceScatter(own, send, recv, counts, op) })
	return initChecked(q, "intercomm reduce_scatter", interReduceScatterArgs(ic, send, recv, counts, op))
}

// InterReduceScatterBlockInit makes a persistent InterReduceScatterBlock.
func InterReduceScatterBlockInit[T Elem](ic *Intercomm, send, recv []T, op Op[T]) (*Request, error) {
	q := ic.collInit(func(own *Intercomm) (*Request, error) { return IinterReduceScatterBlock(own, send, recv, op) })
	return initChecked(q, "intercomm reduce_scatter_block", interReduceScatterArgs(ic, send, recv, blockCounts(ic.Size(), len(recv)), op))
}
