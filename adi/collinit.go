package adi

import (
	"context"
	"fmt"
)

// Persistent collectives (MPI 4.0's MPI_Barrier_init, MPI_Bcast_init and
// the rest). Each Init call fixes a collective's arguments and returns an
// inactive persistent Request; every Start (or StartAll) starts that
// collective once more as a nonblocking one, with the buffers' contents
// then, and Wait or Test completes it, as with SendInit. A program that
// repeats a collective in a loop states it once.
//
// As in MPI, the Init calls are the collective ones: every rank makes
// them in the same order as its other calls that make communicators from
// c (Dup, Split, Create, ...). Each persistent collective runs on a
// context of its own, made at Init without a message, so the ranks may
// start different ones in different orders; the n-th Start of one is one
// collective with the n-th Start of it on every other rank. The buffers
// belong to the collective from Start until its request completes.
//
// Init checks the root. The other arguments are checked at each Start as
// a nonblocking collective's are: a rank whose own arguments are wrong
// (a receive slice shorter than its send slice, say) gets the error from
// Wait while the others wait for it, as with the blocking forms; ranks
// whose arguments disagree get ErrMismatch. A persistent collective
// cannot be cancelled, and Start of one still running is refused with
// ErrRequestBusy.

// collInit makes the persistent request whose Start calls start on a
// duplicate of c, made now, so that its messages match only those of the
// same persistent collective on the other ranks.
func (c *Comm) collInit(start func(own *Comm) (*Request, error)) *Request {
	own := c.dupLocal()
	return c.persistentColl(func() (*Request, error) { return start(own) })
}

// persistentColl makes an inactive persistent request on c whose Start
// calls start.
func (c *Comm) persistentColl(start func() (*Request, error)) *Request {
	return &Request{c: c, local: inactive, persist: &persistent{coll: start}}
}

// dupLocal is Dup, which sends nothing and so needs no ctx.
func (c *Comm) dupLocal() *Comm {
	own, _ := c.Dup(context.Background())
	return own
}

// rootedInit is collInit for a rooted collective. It draws the context
// first, as every rank does, and checks root after: a rank with a bad
// root still draws, so its later Dups and Inits stay those of the other
// ranks.
func (c *Comm) rootedInit(name string, root int, start func(own *Comm) (*Request, error)) (*Request, error) {
	q := c.collInit(start)
	if root < 0 || root >= c.Size() {
		return nil, fmt.Errorf("adi: %s init: root: %w: %d not in [0,%d)", name, ErrRank, root, c.Size())
	}
	return q, nil
}

// BarrierInit makes a persistent Barrier (MPI_Barrier_init).
func (c *Comm) BarrierInit() (*Request, error) {
	return c.collInit((*Comm).Ibarrier), nil
}

// BcastInit makes a persistent Bcast of buf from root (MPI_Bcast_init).
func (c *Comm) BcastInit(buf []byte, root int) (*Request, error) {
	return c.rootedInit("bcast", root, func(own *Comm) (*Request, error) { return own.Ibcast(buf, root) })
}

// GatherInit makes a persistent Gather (MPI_Gather_init).
func (c *Comm) GatherInit(send, recv []byte, root int) (*Request, error) {
	return c.rootedInit("gather", root, func(own *Comm) (*Request, error) { return own.Igather(send, recv, root) })
}

// GathervInit makes a persistent Gatherv (MPI_Gatherv_init).
func (c *Comm) GathervInit(send []byte, recv [][]byte, root int) (*Request, error) {
	return c.rootedInit("gatherv", root, func(own *Comm) (*Request, error) { return own.Igatherv(send, recv, root) })
}

// ScatterInit makes a persistent Scatter (MPI_Scatter_init).
func (c *Comm) ScatterInit(send, recv []byte, root int) (*Request, error) {
	return c.rootedInit("scatter", root, func(own *Comm) (*Request, error) { return own.Iscatter(send, recv, root) })
}

// ScattervInit makes a persistent Scatterv (MPI_Scatterv_init).
func (c *Comm) ScattervInit(send [][]byte, recv []byte, root int) (*Request, error) {
	return c.rootedInit("scatterv", root, func(own *Comm) (*Request, error) { return own.Iscatterv(send, recv, root) })
}

// AllgatherInit makes a persistent Allgather (MPI_Allgather_init).
func (c *Comm) AllgatherInit(send, recv []byte) (*Request, error) {
	return c.collInit(func(own *Comm) (*Request, error) { return own.Iallgather(send, recv) }), nil
}

// AllgathervInit makes a persistent Allgatherv (MPI_Allgatherv_init).
func (c *Comm) AllgathervInit(send []byte, recv [][]byte) (*Request, error) {
	return c.collInit(func(own *Comm) (*Request, error) { return own.Iallgatherv(send, recv) }), nil
}

// AlltoallInit makes a persistent Alltoall (MPI_Alltoall_init).
func (c *Comm) AlltoallInit(send, recv []byte) (*Request, error) {
	return c.collInit(func(own *Comm) (*Request, error) { return own.Ialltoall(send, recv) }), nil
}

// AlltoallvInit makes a persistent Alltoallv (MPI_Alltoallv_init).
func (c *Comm) AlltoallvInit(send, recv [][]byte) (*Request, error) {
	return c.collInit(func(own *Comm) (*Request, error) { return own.Ialltoallv(send, recv) }), nil
}

// ReduceInit makes a persistent Reduce (MPI_Reduce_init).
func ReduceInit[T Elem](c *Comm, send, recv []T, op Op[T], root int) (*Request, error) {
	return c.rootedInit("reduce", root, func(own *Comm) (*Request, error) { return Ireduce(own, send, recv, op, root) })
}

// AllreduceInit makes a persistent Allreduce (MPI_Allreduce_init).
func AllreduceInit[T Elem](c *Comm, send, recv []T, op Op[T]) (*Request, error) {
	return c.collInit(func(own *Comm) (*Request, error) { return Iallreduce(own, send, recv, op) }), nil
}

// ScanInit makes a persistent Scan (MPI_Scan_init).
func ScanInit[T Elem](c *Comm, send, recv []T, op Op[T]) (*Request, error) {
	return c.collInit(func(own *Comm) (*Request, error) { return Iscan(own, send, recv, op) }), nil
}

// ExscanInit makes a persistent Exscan (MPI_Exscan_init).
func ExscanInit[T Elem](c *Comm, send, recv []T, op Op[T]) (*Request, error) {
	return c.collInit(func(own *Comm) (*Request, error) { return Iexscan(own, send, recv, op) }), nil
}

// ReduceScatterInit makes a persistent ReduceScatter
// (MPI_Reduce_scatter_init).
func ReduceScatterInit[T Elem](c *Comm, send, recv []T, counts []int, op Op[T]) (*Request, error) {
	return c.collInit(func(own *Comm) (*Request, error) { return IreduceScatter(own, send, recv, counts, op) }), nil
}

// ReduceScatterBlockInit makes a persistent ReduceScatterBlock
// (MPI_Reduce_scatter_block_init).
func ReduceScatterBlockInit[T Elem](c *Comm, send, recv []T, op Op[T]) (*Request, error) {
	return c.collInit(func(own *Comm) (*Request, error) { return IreduceScatterBlock(own, send, recv, op) }), nil
}
