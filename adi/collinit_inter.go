package adi

import (
	"context"
	"fmt"
)

// Persistent collectives on an Intercomm (MPI 4.0's init forms on an
// intercommunicator), as those of collinit.go on a Comm: every rank of
// both groups makes the Init calls in the same order as its Dup, Split,
// Create and Merge calls on ic; Init fixes the arguments and a context of
// the collective's own; each Start runs the nonblocking form once.

// collInit makes the persistent request whose Start calls start on a
// duplicate of ic, made now.
func (ic *Intercomm) collInit(start func(own *Intercomm) (*Request, error)) *Request {
	own, _ := ic.Dup(context.Background()) // local: it draws a context id, sends nothing
	return ic.local.persistentColl(func() (*Request, error) { return start(own) })
}

// rootedInit is collInit for a rooted collective: it draws the context
// first and checks root after, as Comm's does.
func (ic *Intercomm) rootedInit(name string, root int, start func(own *Intercomm) (*Request, error)) (*Request, error) {
	q := ic.collInit(start)
	if root != Root && root != ProcNull && (root < 0 || root >= ic.RemoteSize()) {
		return nil, fmt.Errorf("adi: intercomm %s init: root: %w: %d is neither Root, ProcNull nor a remote rank in [0,%d)", name, ErrRank, root, ic.RemoteSize())
	}
	return q, nil
}

// BarrierInit makes a persistent Barrier.
func (ic *Intercomm) BarrierInit() (*Request, error) {
	return ic.collInit((*Intercomm).Ibarrier), nil
}

// BcastInit makes a persistent Bcast.
func (ic *Intercomm) BcastInit(buf []byte, root int) (*Request, error) {
	return ic.rootedInit("bcast", root, func(own *Intercomm) (*Request, error) { return own.Ibcast(buf, root) })
}

// GatherInit makes a persistent Gather.
func (ic *Intercomm) GatherInit(send, recv []byte, root int) (*Request, error) {
	return ic.rootedInit("gather", root, func(own *Intercomm) (*Request, error) { return own.Igather(send, recv, root) })
}

// GathervInit makes a persistent Gatherv.
func (ic *Intercomm) GathervInit(send []byte, recv [][]byte, root int) (*Request, error) {
	return ic.rootedInit("gatherv", root, func(own *Intercomm) (*Request, error) { return own.Igatherv(send, recv, root) })
}

// ScatterInit makes a persistent Scatter.
func (ic *Intercomm) ScatterInit(send, recv []byte, root int) (*Request, error) {
	return ic.rootedInit("scatter", root, func(own *Intercomm) (*Request, error) { return own.Iscatter(send, recv, root) })
}

// ScattervInit makes a persistent Scatterv.
func (ic *Intercomm) ScattervInit(send [][]byte, recv []byte, root int) (*Request, error) {
	return ic.rootedInit("scatterv", root, func(own *Intercomm) (*Request, error) { return own.Iscatterv(send, recv, root) })
}

// AllgatherInit makes a persistent Allgather.
func (ic *Intercomm) AllgatherInit(send, recv []byte) (*Request, error) {
	return ic.collInit(func(own *Intercomm) (*Request, error) { return own.Iallgather(send, recv) }), nil
}

// AllgathervInit makes a persistent Allgatherv.
func (ic *Intercomm) AllgathervInit(send []byte, recv [][]byte) (*Request, error) {
	return ic.collInit(func(own *Intercomm) (*Request, error) { return own.Iallgatherv(send, recv) }), nil
}

// AlltoallInit makes a persistent Alltoall.
func (ic *Intercomm) AlltoallInit(send, recv []byte) (*Request, error) {
	return ic.collInit(func(own *Intercomm) (*Request, error) { return own.Ialltoall(send, recv) }), nil
}

// AlltoallvInit makes a persistent Alltoallv.
func (ic *Intercomm) AlltoallvInit(send, recv [][]byte) (*Request, error) {
	return ic.collInit(func(own *Intercomm) (*Request, error) { return own.Ialltoallv(send, recv) }), nil
}

// InterReduceInit makes a persistent InterReduce.
func InterReduceInit[T Elem](ic *Intercomm, send, recv []T, op Op[T], root int) (*Request, error) {
	return ic.rootedInit("reduce", root, func(own *Intercomm) (*Request, error) { return IinterReduce(own, send, recv, op, root) })
}

// InterAllreduceInit makes a persistent InterAllreduce.
func InterAllreduceInit[T Elem](ic *Intercomm, send, recv []T, op Op[T]) (*Request, error) {
	return ic.collInit(func(own *Intercomm) (*Request, error) { return IinterAllreduce(own, send, recv, op) }), nil
}

// InterReduceScatterInit makes a persistent InterReduceScatter.
func InterReduceScatterInit[T Elem](ic *Intercomm, send, recv []T, counts []int, op Op[T]) (*Request, error) {
	return ic.collInit(func(own *Intercomm) (*Request, error) { return IinterReduceScatter(own, send, recv, counts, op) }), nil
}

// InterReduceScatterBlockInit makes a persistent InterReduceScatterBlock.
func InterReduceScatterBlockInit[T Elem](ic *Intercomm, send, recv []T, op Op[T]) (*Request, error) {
	return ic.collInit(func(own *Intercomm) (*Request, error) { return IinterReduceScatterBlock(own, send, recv, op) }), nil
}
