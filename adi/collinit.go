package adi

import (
	"cmp"
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
// Init checks what the blocking form checks of this rank's own arguments
// (the root; buffer and slice lengths against each other, the counts and
// the number of ranks; the op) and returns the error, naming the call
// and the argument, where the wrong call is made. A rank whose Init
// failed still took the context the other ranks' Init took, so its later
// Dups and Inits stay in step with theirs; the other ranks' requests are
// made, and a Start of them waits for the failed rank as a blocking
// collective waits for a rank that never calls it. What only the ranks
// together can tell, whether their arguments agree, is found at each
// Start as a nonblocking collective's is: ranks whose arguments disagree
// get ErrMismatch from Wait. A persistent collective cannot be
// cancelled, and Start of one still running is refused with
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

// initChecked ends the Init of collective name: q, made with its context
// already drawn (collInit), unless check, the blocking form's checks of
// this rank's arguments, found one wrong. Every Init draws its context
// whatever its arguments, as every rank does, so that a rank whose Init
// fails keeps its later Dups and Inits in step with the other ranks'.
// The checks have no effects, so the order Go evaluates them in does not
// matter.
func initChecked(q *Request, name string, check error) (*Request, error) {
	if check != nil {
		return nil, fmt.Errorf("adi: %s init: %w", name, check)
	}
	return q, nil
}

// BarrierInit makes a persistent Barrier (MPI_Barrier_init).
func (c *Comm) BarrierInit() (*Request, error) {
	return c.collInit((*Comm).Ibarrier), nil
}

// BcastInit makes a persistent Bcast of buf from root (MPI_Bcast_init).
func (c *Comm) BcastInit(buf []byte, root int) (*Request, error) {
	q := c.collInit(func(own *Comm) (*Request, error) { return own.Ibcast(buf, root) })
	return initChecked(q, "bcast", rootArg(root, c.Size()))
}

// GatherInit makes a persistent Gather (MPI_Gather_init).
func (c *Comm) GatherInit(send, recv []byte, root int) (*Request, error) {
	q := c.collInit(func(own *Comm) (*Request, error) { return own.Igather(send, recv, root) })
	return initChecked(q, "gather", cmp.Or(rootArg(root, c.Size()), c.gatherArgs(send, recv, root)))
}

// GathervInit makes a persistent Gatherv (MPI_Gatherv_init).
func (c *Comm) GathervInit(send []byte, recv [][]byte, root int) (*Request, error) {
	q := c.collInit(func(own *Comm) (*Request, error) { return own.Igatherv(send, recv, root) })
	return initChecked(q, "gatherv", cmp.Or(rootArg(root, c.Size()), c.gathervArgs(recv, root)))
}

// ScatterInit makes a persistent Scatter (MPI_Scatter_init).
func (c *Comm) ScatterInit(send, recv []byte, root int) (*Request, error) {
	q := c.collInit(func(own *Comm) (*Request, error) { return own.Iscatter(send, recv, root) })
	return initChecked(q, "scatter", cmp.Or(rootArg(root, c.Size()), c.scatterArgs(send, recv, root)))
}

// ScattervInit makes a persistent Scatterv (MPI_Scatterv_init).
func (c *Comm) ScattervInit(send [][]byte, recv []byte, root int) (*Request, error) {
	q := c.collInit(func(own *Comm) (*Request, error) { return own.Iscatterv(send, recv, root) })
	return initChecked(q, "scatterv", cmp.Or(rootArg(root, c.Size()), c.scattervArgs(send, root)))
}

// AllgatherInit makes a persistent Allgather (MPI_Allgather_init).
func (c *Comm) AllgatherInit(send, recv []byte) (*Request, error) {
	q := c.collInit(func(own *Comm) (*Request, error) { return own.Iallgather(send, recv) })
	return initChecked(q, "allgather", c.allgatherArgs(send, recv))
}

// AllgathervInit makes a persistent Allgatherv (MPI_Allgatherv_init).
func (c *Comm) AllgathervInit(send []byte, recv [][]byte) (*Request, error) {
	q := c.collInit(func(own *Comm) (*Request, error) { return own.Iallgatherv(send, recv) })
	return initChecked(q, "allgatherv", c.allgathervArgs(recv))
}

// AlltoallInit makes a persistent Alltoall (MPI_Alltoall_init).
func (c *Comm) AlltoallInit(send, recv []byte) (*Request, error) {
	q := c.collInit(func(own *Comm) (*Request, error) { return own.Ialltoall(send, recv) })
	return initChecked(q, "alltoall", c.alltoallArgs(send, recv))
}

// AlltoallvInit makes a persistent Alltoallv (MPI_Alltoallv_init).
func (c *Comm) AlltoallvInit(send, recv [][]byte) (*Request, error) {
	q := c.collInit(func(own *Comm) (*Request, error) { return own.Ialltoallv(send, recv) })
	return initChecked(q, "alltoallv", c.alltoallvArgs(send, recv))
}

// ReduceInit makes a persistent Reduce (MPI_Reduce_init).
func ReduceInit[T Elem](c *Comm, send, recv []T, op Op[T], root int) (*Request, error) {
	q := c.collInit(func(own *Comm) (*Request, error) { return Ireduce(own, send, recv, op, root) })
	return initChecked(q, "reduce", cmp.Or(rootArg(root, c.Size()), reduceArgs(c, send, recv, op, root)))
}

// AllreduceInit makes a persistent Allreduce (MPI_Allreduce_init).
func AllreduceInit[T Elem](c *Comm, send, recv []T, op Op[T]) (*Request, error) {
	q := c.collInit(func(own *Comm) (*Request, error) { return Iallreduce(own, send, recv, op) })
	return initChecked(q, "allreduce", allreduceArgs(send, recv, op))
}

// ScanInit makes a persistent Scan (MPI_Scan_init).
func ScanInit[T Elem](c *Comm, send, recv []T, op Op[T]) (*Request, error) {
	q := c.collInit(func(own *Comm) (*Request, error) { return Iscan(own, send, recv, op) })
	return initChecked(q, "scan", allreduceArgs(send, recv, op))
}

// ExscanInit makes a persistent Exscan (MPI_Exscan_init).
func ExscanInit[T Elem](c *Comm, send, recv []T, op Op[T]) (*Request, error) {
	q := c.collInit(func(own *Comm) (*Request, error) { return Iexscan(own, send, recv, op) })
	return initChecked(q, "exscan", allreduceArgs(send, recv, op))
}

// ReduceScatterInit makes a persistent ReduceScatter
// (MPI_Reduce_scatter_init).
func ReduceScatterInit[T Elem](c *Comm, send, recv []T, counts []int, op Op[T]) (*Request, error) {
	q := c.collInit(func(own *Comm) (*Request, error) { return IreduceScatter(own, send, recv, counts, op) })
	return initChecked(q, "reduce_scatter", reduceScatterArgs(c, send, recv, counts, op))
}

// ReduceScatterBlockInit makes a persistent ReduceScatterBlock
// (MPI_Reduce_scatter_block_init).
func ReduceScatterBlockInit[T Elem](c *Comm, send, recv []T, op Op[T]) (*Request, error) {
	q := c.collInit(func(own *Comm) (*Request, error) { return IreduceScatterBlock(own, send, recv, op) })
	return initChecked(q, "reduce_scatter_block", reduceScatterArgs(c, send, recv, blockCounts(c.Size(), len(recv)), op))
}
