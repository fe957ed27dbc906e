package adi

// Persistent neighbour collectives (MPI 4.0's MPI_Neighbor_allgather_init
// and the rest), as the persistent collectives of collinit.go: Init fixes
// the arguments and a context of the topology's own, and each Start runs
// the nonblocking form once.

// dup returns t on a duplicate of its communicator, made now.
func (t *Cart) dup() *Cart {
	c := *t
	c.Comm = t.Comm.dupLocal()
	return &c
}

// NeighborAllgatherInit makes a persistent NeighborAllgather.
func (t *Cart) NeighborAllgatherInit(send, recv []byte) (*Request, error) {
	own := t.dup()
	return t.persistentColl(func() (*Request, error) { return own.IneighborAllgather(send, recv) }), nil
}

// NeighborAllgathervInit makes a persistent NeighborAllgatherv.
func (t *Cart) NeighborAllgathervInit(send []byte, recv [][]byte) (*Request, error) {
	own := t.dup()
	return t.persistentColl(func() (*Request, error) { return own.IneighborAllgatherv(send, recv) }), nil
}

// NeighborAlltoallInit makes a persistent NeighborAlltoall.
func (t *Cart) NeighborAlltoallInit(send, recv []byte) (*Request, error) {
	own := t.dup()
	return t.persistentColl(func() (*Request, error) { return own.IneighborAlltoall(send, recv) }), nil
}

// NeighborAlltoallvInit makes a persistent NeighborAlltoallv.
func (t *Cart) NeighborAlltoallvInit(send, recv [][]byte) (*Request, error) {
	own := t.dup()
	return t.persistentColl(func() (*Request, error) { return own.IneighborAlltoallv(send, recv) }), nil
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
	return g.persistentColl(func() (*Request, error) { return own.IneighborAllgather(send, recv) }), nil
}

// NeighborAllgathervInit makes a persistent NeighborAllgatherv.
func (g *DistGraph) NeighborAllgathervInit(send []byte, recv [][]byte) (*Request, error) {
	own := g.dup()
	return g.persistentColl(func() (*Request, error) { return own.IneighborAllgatherv(send, recv) }), nil
}

// NeighborAlltoallInit makes a persistent NeighborAlltoall.
func (g *DistGraph) NeighborAlltoallInit(send, recv []byte) (*Request, error) {
	own := g.dup()
	return g.persistentColl(func() (*Request, error) { return own.IneighborAlltoall(send, recv) }), nil
}

// NeighborAlltoallvInit makes a persistent NeighborAlltoallv.
func (g *DistGraph) NeighborAlltoallvInit(send, recv [][]byte) (*Request, error) {
	own := g.dup()
	return g.persistentColl(func() (*Request, error) { return own.IneighborAlltoallv(send, recv) }), nil
}
