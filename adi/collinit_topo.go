package adi

// Persistent neighbour collectives (MPI 4.0's MPI_Neighbor_allgather_init
// and the rest), as the persistent collectives of collinit.go: Init fixes
// the arguments and a context of the topology's own, and checks this
// rank's arguments as the blocking form does (initChecked); each Start
// runs the nonblocking form once.

// dup returns t on a duplicate of its communicator, made now.
func (t *Cart) dup() *Cart {
	c := *t
	c.Comm = t.Comm.dupLocal()
	return &c
}

// NeighborAllgatherInit makes a persistent NeighborAllgather.
func (t *Cart) NeighborAllgatherInit(send, recv []byte) (*Request, error) {
	own := t.dup()
	q := t.persistentColl(func() (*Request, error) { return own.IneighborAllgather(send, recv) })
	return initChecked(q, "neighbor_allgather", t.nb.allgatherArgs(send, recv))
}

// NeighborAllgathervInit makes a persistent NeighborAllgatherv.
func (t *Cart) NeighborAllgathervInit(send []byte, recv [][]byte) (*Request, error) {
	own := t.dup()
	q := t.persistentColl(func() (*Request, error) { return own.IneighborAllgatherv(send, recv) })
	return initChecked(q, "neighbor_allgatherv", t.nb.blocksArgs(len(t.nb.dests), len(recv)))
}

// NeighborAlltoallInit makes a persistent NeighborAlltoall.
func (t *Cart) NeighborAlltoallInit(send, recv []byte) (*Request, error) {
	own := t.dup()
	q := t.persistentColl(func() (*Request, error) { return own.IneighborAlltoall(send, recv) })
	return initChecked(q, "neighbor_alltoall", neighborAlltoallArgs(t.nb, send, recv))
}

// NeighborAlltoallvInit makes a persistent NeighborAlltoallv.
func (t *Cart) NeighborAlltoallvInit(send, recv [][]byte) (*Request, error) {
	own := t.dup()
	q := t.persistentColl(func() (*Request, error) { return own.IneighborAlltoallv(send, recv) })
	return initChecked(q, "neighbor_alltoallv", t.nb.blocksArgs(len(send), len(recv)))
}

// dup returns g on a duplicate of its communicator, made now.
func (g *DistGraph) dup() *DistGraph {
	c := *g
	c.Comm = g.Comm.dupLocal()
	return &c
}

// NeighborAllgatherInit makes a persistent NeighborAllgather.
func (g *DistGraph) NeighborAllgatherInit(send, recv []byte) (*Request, error) {
	own := g.dup()
	q := g.persistentColl(func() (*Request, error) { return own.IneighborAllgather(send, recv) })
	return initChecked(q, "neighbor_allgather", g.nb.allgatherArgs(send, recv))
}

// NeighborAllgathervInit makes a persistent NeighborAllgatherv.
func (g *DistGraph) NeighborAllgathervInit(send []byte, recv [][]byte) (*Request, error) {
	own := g.dup()
	q := g.persistentColl(func() (*Request, error) { return own.IneighborAllgatherv(send, recv) })
	return initChecked(q, "neighbor_allgatherv", g.nb.blocksArgs(len(g.nb.dests), len(recv)))
}

// NeighborAlltoallInit makes a persistent NeighborAlltoall.
func (g *DistGraph) NeighborAlltoallInit(send, recv []byte) (*Request, error) {
	own := g.dup()
	q := g.persistentColl(func() (*Request, error) { return own.IneighborAlltoall(send, recv) })
	return initChecked(q, "neighbor_alltoall", neighborAlltoallArgs(g.nb, send, recv))
}

// NeighborAlltoallvInit makes a persistent NeighborAlltoallv.
func (g *DistGraph) NeighborAlltoallvInit(send, recv [][]byte) (*Request, error) {
	own := g.dup()
	q := g.persistentColl(func() (*Request, error) { return own.IneighborAlltoallv(send, recv) })
	return initChecked(q, "neighbor_alltoallv", g.nb.blocksArgs(len(send), len(recv)))
}

// neighborAlltoallArgs is nb.alltoallArgs without the block length.
func neighborAlltoallArgs(nb neighbors, send, recv []byte) error {
	_, err := nb.alltoallArgs(send, recv)
	return err
}
