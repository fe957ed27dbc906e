package adi

import "fmt"

// Persistent collectives (MPI 4.0's MPI_Barrier_init, MPI_Bcast_init and
// the rest). Each Init call fixes a collective's arguments and returns an
// inactive persistent Request; every Start (or StartAll) starts that
// collective once more as a nonblocking one, with the buffers' contents
// then, and Wait or Test completes it, as with SendInit. A program that
// repeats a collective in a loop states it once.
//
// Init is local: it checks what one rank can (the root), and takes no
// place in the communicator's sequence of collectives. Start does: every
// rank starts its persistent collectives in the same order relative to
// its other collectives, as MPI requires, and each Start is one
// collective call on every rank. The buffers belong to the collective
// from Start until its request completes. Arguments that disagree between
// ranks surface at Wait, as a nonblocking collective's do. A persistent
// collective cannot be cancelled, and Start of one still running is
// refused with ErrRequestBusy.

// collInit makes the persistent request whose Start calls start.
func (c *Comm) collInit(start func() (*Request, error)) *Request {
	return &Request{c: c, local: inactive, persist: &persistent{coll: start}}
}

// rootInit checks a persistent rooted collective's root.
func (c *Comm) rootInit(name string, root int) error {
	if root < 0 || root >= c.Size() {
		return fmt.Errorf("adi: %s init: root: %w: %d not in [0,%d)", name, ErrRank, root, c.Size())
	}
	return nil
}

// BarrierInit makes a persistent Barrier (MPI_Barrier_init).
func (c *Comm) BarrierInit() (*Request, error) {
	return c.collInit(c.Ibarrier), nil
}

// BcastInit makes a persistent Bcast of buf from root (MPI_Bcast_init).
func (c *Comm) BcastInit(buf []byte, root int) (*Request, error) {
	if err := c.rootInit("bcast", root); err != nil {
		return nil, err
	}
	return c.collInit(func() (*Request, error) { return c.Ibcast(buf, root) }), nil
}

// GatherInit makes a persistent Gather (MPI_Gather_init).
func (c *Comm) GatherInit(send, recv []byte, root int) (*Request, error) {
	if err := c.rootInit("gather", root); err != nil {
		return nil, err
	}
	return c.collInit(func() (*Request, error) { return c.Igather(send, recv, root) }), nil
}

// GathervInit makes a persistent Gatherv (MPI_Gatherv_init).
func (c *Comm) GathervInit(send []byte, recv [][]byte, root int) (*Request, error) {
	if err := c.rootInit("gatherv", root); err != nil {
		return nil, err
	}
	return c.collInit(func() (*Request, error) { return c.Igatherv(send, recv, root) }), nil
}

// ScatterInit makes a persistent Scatter (MPI_Scatter_init).
func (c *Comm) ScatterInit(send, recv []byte, root int) (*Request, error) {
	if err := c.rootInit("scatter", root); err != nil {
		return nil, err
	}
	return c.collInit(func() (*Request, error) { return c.Iscatter(send, recv, root) }), nil
}

// ScattervInit makes a persistent Scatterv (MPI_Scatterv_init).
func (c *Comm) ScattervInit(send [][]byte, recv []byte, root int) (*Request, error) {
	if err := c.rootInit("scatterv", root); err != nil {
		return nil, err
	}
	return c.collInit(func() (*Request, error) { return c.Iscatterv(send, recv, root) }), nil
}

// AllgatherInit makes a persistent Allgather (MPI_Allgather_init).
func (c *Comm) AllgatherInit(send, recv []byte) (*Request, error) {
	return c.collInit(func() (*Request, error) { return c.Iallgather(send, recv) }), nil
}

// AllgathervInit makes a persistent Allgatherv (MPI_Allgatherv_init).
func (c *Comm) AllgathervInit(send []byte, recv [][]byte) (*Request, error) {
	return c.collInit(func() (*Request, error) { return c.Iallgatherv(send, recv) }), nil
}

// AlltoallInit makes a persistent Alltoall (MPI_Alltoall_init).
func (c *Comm) AlltoallInit(send, recv []byte) (*Request, error) {
	return c.collInit(func() (*Request, error) { return c.Ialltoall(send, recv) }), nil
}

// AlltoallvInit makes a persistent Alltoallv (MPI_Alltoallv_init).
func (c *Comm) AlltoallvInit(send, recv [][]byte) (*Request, error) {
	return c.collInit(func() (*Request, error) { return c.Ialltoallv(send, recv) }), nil
}

// ReduceInit makes a persistent Reduce (MPI_Reduce_init).
func ReduceInit[T Elem](c *Comm, send, recv []T, op Op[T], root int) (*Request, error) {
	if err := c.rootInit("reduce", root); err != nil {
		return nil, err
	}
	return c.collInit(func() (*Request, error) { return Ireduce(c, send, recv, op, root) }), nil
}

// AllreduceInit makes a persistent Allreduce (MPI_Allreduce_init).
func AllreduceInit[T Elem](c *Comm, send, recv []T, op Op[T]) (*Request, error) {
	return c.collInit(func() (*Request, error) { return Iallreduce(c, send, recv, op) }), nil
}

// ScanInit makes a persistent Scan (MPI_Scan_init).
func ScanInit[T Elem](c *Comm, send, recv []T, op Op[T]) (*Request, error) {
	return c.collInit(func() (*Request, error) { return Iscan(c, send, recv, op) }), nil
}

// ExscanInit makes a persistent Exscan (MPI_Exscan_init).
func ExscanInit[T Elem](c *Comm, send, recv []T, op Op[T]) (*Request, error) {
	return c.collInit(func() (*Request, error) { return Iexscan(c, send, recv, op) }), nil
}

// ReduceScatterInit makes a persistent ReduceScatter
// (MPI_Reduce_scatter_init).
func ReduceScatterInit[T Elem](c *Comm, send, recv []T, counts []int, op Op[T]) (*Request, error) {
	return c.collInit(func() (*Request, error) { return IreduceScatter(c, send, recv, counts, op) }), nil
}

// ReduceScatterBlockInit makes a persistent ReduceScatterBlock
// (MPI_Reduce_scatter_block_init).
func ReduceScatterBlockInit[T Elem](c *Comm, send, recv []T, op Op[T]) (*Request, error) {
	return c.collInit(func() (*Request, error) { return IreduceScatterBlock(c, send, recv, op) }), nil
}
