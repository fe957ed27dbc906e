package adi

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"slices"
)

// Neighbour collectives (MPI_Neighbor_allgather and the rest) on a
// topology communicator, a Cart, a Graph or a DistGraph: each rank sends to its
// out-neighbours and receives from its in-neighbours only. Receive slot i
// belongs to in-neighbour i and send block i to out-neighbour i, in the
// order the topology lists them (Cart.Neighbors, Graph.Neighbors of the
// rank, both lists at once, DistGraph.Neighbors).
// ProcNull neighbours, past the edge of a Cart dimension that does not
// wrap, move nothing, and their slots are left as they were.
//
// A rank may be a neighbour more than once: on both sides along a
// periodic dimension of one or two ranks (itself, with one), or listed
// several times in a Graph or a DistGraph. The standard says which block lands in
// which slot then (MPI-4.1 section 8.6, the erratum of mpi-forum issue
// 153), and since messages between two ranks arrive in the order they were
// sent, the order the receives are posted in decides it:
//   - in a DistGraph the k-th edge from a rank to another carries the
//     k-th block, so receives are posted in list order;
//   - in a Graph, the k-th time a rank lists another is the k-th edge
//     both ways (MPI needs both to list each other as often), so list
//     order again;
//   - in a Cart, the block sent in the -1 direction of dimension d
//     arrives from the receiver's +1 side and goes to its slot 2d+1, and
//     the other way round: block s of the sender lands in slot s^1 of the
//     receiver. Sends go -1 then +1 in each dimension, so receives are
//     posted +1 then -1: the n-th message from a rank then meets the n-th
//     receive from it, which is the slot the standard names.
//
// They are collectives like the others (collective.go): every rank of the
// communicator calls them in the same order, and a block of another
// length than its slot is reported as ErrMismatch by its receiver.

// TopoOption changes how CartCreate, GraphCreate and
// DistGraphCreateAdjacent make their communicator: Reorder, Weights. The ranks must agree on them as
// on the other arguments: each option's doc says how.
type TopoOption func(*topoConfig)

// topoConfig is what the options asked for.
type topoConfig struct {
	reorder bool
	// weighted is set by Weights; sourceWeights and destWeights are its
	// copies of the caller's lists.
	weighted                   bool
	sourceWeights, destWeights []int
}

// topoOptions applies opts.
func topoOptions(opts []TopoOption) topoConfig {
	var cfg topoConfig
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	return cfg
}

// Reorder lets CartCreate, GraphCreate and DistGraphCreateAdjacent number
// the ranks of the new communicator otherwise than the old one's, to fit
// the topology to where the ranks live (World.Host, World.Site); the
// reorder argument of MPI_Cart_create, MPI_Graph_create and
// MPI_Dist_graph_create_adjacent. Every rank
// passes it or none does. What each does with it is in its doc; a rank
// learns its new number from the communicator's Rank, as in MPI.
//
// The two aim at different things. A Cart's positions go to the
// processes so that grid neighbours share a host where they can: fewer
// halo messages cross between hosts, but a host's ranks are then a box
// of the grid, not consecutive ranks, and Reduce and Allreduce on the
// Cart, which go host by host only where each host's ranks are
// consecutive (hostcoll.go), go flat. A Graph's nodes go to processes as
// a Cart's positions do, cut by its edges. A DistGraph's ranks are numbered
// host by host, which keeps its reductions going by hosts; its edges
// are the lists' and stay where they are, and its weights (Weights) are
// checked but steer nothing.
func Reorder() TopoOption { return func(c *topoConfig) { c.reorder = true } }

// Weights gives DistGraphCreateAdjacent the weights of this rank's edges,
// sourceWeights[i] for the edge from sources[i] and destWeights[i] for the
// edge to dests[i] (MPI's sourceweights and destweights): numbers
// meaning how much the edge carries, non-negative, as many as the lists
// have ranks. An edge's two ends give it the same weight: the k-th edge
// from a to b is weighed alike in a's destWeights and b's sourceWeights.
// Without Weights every edge weighs 1 (MPI_UNWEIGHTED), and
// DistGraph.Weights returns 1 for each edge. So some ranks may pass
// Weights and others not when all the weights passed are 1: the ends of
// each edge agree. MPI calls mixing MPI_UNWEIGHTED with weights
// erroneous; a portable program passes Weights on every rank or on none.
// The lists are copied. CartCreate and GraphCreate refuse it: a grid's
// edges are all alike, and MPI's graph has no weights.
//
// The weights are stored (DistGraph.Weights) and checked, but they do
// not steer the numbering that Reorder gives a DistGraph: each process
// keeps the edges it passed, so no numbering changes which processes
// talk to which, nor so which edges join two hosts; only placing the
// processes, which the launcher does, could.
func Weights(sourceWeights, destWeights []int) TopoOption {
	sw, dw := slices.Clone(sourceWeights), slices.Clone(destWeights)
	return func(c *topoConfig) {
		c.weighted, c.sourceWeights, c.destWeights = true, sw, dw
	}
}

// neighbors are the in- and out-neighbours of a rank, and whether they
// are a Cart's, which receives in pairs swapped (see above). refused, if
// set, is why no neighbour collective may run on them: a Graph whose
// adjacency is not symmetric (graphtopo.go), which every rank knows alike.
type neighbors struct {
	sources, dests []int
	cart           bool
	refused        error
}

// exchange runs a neighbour collective: send[i] to dests[i], recv[i] from
// sources[i]. A caller that found its buffers wrong passes why as bad:
// the collective still takes its tag, as every rank's does, so that this
// rank's later collectives keep in step with the others'.
func (nb neighbors) exchange(ctx context.Context, c *Comm, name string, send, recv [][]byte, bad error) error {
	k, err := c.begin(ctx, name)
	if err != nil {
		return err
	}
	defer k.done()
	if nb.refused != nil {
		bad = nb.refused
	}
	if bad != nil {
		return k.errorf("%w", bad)
	}
	if err := nb.blocksArgs(len(send), len(recv)); err != nil {
		return k.errorf("%w", err)
	}
	for i := range nb.sources {
		slot := i
		if nb.cart {
			slot ^= 1
		}
		if src := nb.sources[slot]; src != ProcNull {
			if err := k.recv(recv[slot], src); err != nil {
				return err
			}
		}
	}
	for i, dst := range nb.dests {
		if dst != ProcNull {
			if err := k.send(send[i], dst); err != nil {
				return err
			}
		}
	}
	return k.end()
}

// allgather cuts recv into a slot of len(send) bytes per in-neighbour and
// sends send to every out-neighbour.
func (nb neighbors) allgather(ctx context.Context, c *Comm, send, recv []byte) error {
	const name = "neighbor_allgather"
	if err := nb.allgatherArgs(send, recv); err != nil {
		return nb.exchange(ctx, c, name, nil, nil, err)
	}
	out := make([][]byte, len(nb.dests))
	for i := range out {
		out[i] = send
	}
	return nb.exchange(ctx, c, name, out, cut(recv, len(nb.sources), len(send)), nil)
}

// allgatherv sends send to every out-neighbour and receives into recv[i]
// from in-neighbour i.
func (nb neighbors) allgatherv(ctx context.Context, c *Comm, send []byte, recv [][]byte) error {
	out := make([][]byte, len(nb.dests))
	for i := range out {
		out[i] = send
	}
	return nb.exchange(ctx, c, "neighbor_allgatherv", out, recv, nil)
}

// alltoall cuts send and recv into blocks of one length, one per out- and
// in-neighbour.
func (nb neighbors) alltoall(ctx context.Context, c *Comm, send, recv []byte) error {
	const name = "neighbor_alltoall"
	n, err := nb.alltoallArgs(send, recv)
	if err != nil {
		return nb.exchange(ctx, c, name, nil, nil, err)
	}
	return nb.exchange(ctx, c, name, cut(send, len(nb.dests), n), cut(recv, len(nb.sources), n), nil)
}

// Local argument checks of the neighbour collectives, which their
// persistent forms' Init calls too (collinit_topo.go), as a Comm's do
// (collective.go).

// blocksArgs checks the numbers of send blocks and receive slots.
func (nb neighbors) blocksArgs(send, recv int) error {
	if send != len(nb.dests) || recv != len(nb.sources) {
		return fmt.Errorf("%d send blocks for %d out-neighbours and %d receive slots for %d in-neighbours", send, len(nb.dests), recv, len(nb.sources))
	}
	return nil
}

// allgatherArgs checks a NeighborAllgather's buffers.
func (nb neighbors) allgatherArgs(send, recv []byte) error {
	if in := len(nb.sources); len(recv) != in*len(send) {
		return fmt.Errorf("receive buffer of %d bytes for %d in-neighbours of %d bytes", len(recv), in, len(send))
	}
	return nil
}

// alltoallArgs checks a NeighborAlltoall's buffers and returns the
// length of their blocks.
func (nb neighbors) alltoallArgs(send, recv []byte) (int, error) {
	in, out := len(nb.sources), len(nb.dests)
	n := 0 // bytes per block
	switch {
	case out > 0:
		n = len(send) / out
	case in > 0:
		n = len(recv) / in
	}
	if len(send) != out*n || len(recv) != in*n {
		return 0, fmt.Errorf("buffers of %d and %d bytes do not hold blocks of one length for %d out- and %d in-neighbours", len(send), len(recv), out, in)
	}
	return n, nil
}

// cut cuts b into k blocks of n bytes; b holds k*n.
func cut(b []byte, k, n int) [][]byte {
	blocks := make([][]byte, k)
	for i := range blocks {
		blocks[i] = b[i*n : (i+1)*n : (i+1)*n]
	}
	return blocks
}

// Neighbors returns t's neighbours: for each dimension the rank one step
// back (-1) and the rank one step ahead (+1), as Shift(d, 1) gives them,
// ProcNull past an edge that does not wrap. A Cart's in- and
// out-neighbours are the same list, of 2*len(Dims()) ranks.
func (t *Cart) Neighbors() []int { return append([]int(nil), t.nb.dests...) }

// NeighborAllgather sends send to each of t's neighbours and receives
// theirs into recv, the block of neighbour i at recv[i*len(send):]
// (MPI_Neighbor_allgather). recv holds 2*len(Dims())*len(send) bytes; the
// blocks of ProcNull neighbours are left as they were. Every rank sends
// the same length.
func (t *Cart) NeighborAllgather(ctx context.Context, send, recv []byte) error {
	return t.nb.allgather(ctx, t.Comm, send, recv)
}

// NeighborAllgatherv sends send to each of t's neighbours and receives
// from neighbour i into recv[i], which is as long as what it sends
// (MPI_Neighbor_allgatherv).
func (t *Cart) NeighborAllgatherv(ctx context.Context, send []byte, recv [][]byte) error {
	return t.nb.allgatherv(ctx, t.Comm, send, recv)
}

// NeighborAlltoall sends block i of send to neighbour i and receives
// block i of recv from it, all blocks of one length, len(send) divided
// by the 2*len(Dims()) neighbours (MPI_Neighbor_alltoall). The block sent
// to the -1 neighbour along a dimension lands in that neighbour's block
// of its +1 neighbour, and the other way round, even where both are the
// same rank.
func (t *Cart) NeighborAlltoall(ctx context.Context, send, recv []byte) error {
	return t.nb.alltoall(ctx, t.Comm, send, recv)
}

// NeighborAlltoallv sends send[i] to neighbour i and receives recv[i]
// from it (MPI_Neighbor_alltoallv), each as long as its counterpart.
func (t *Cart) NeighborAlltoallv(ctx context.Context, send, recv [][]byte) error {
	return t.nb.exchange(ctx, t.Comm, "neighbor_alltoallv", send, recv, nil)
}

// cartNeighbors lists t's neighbours in the order of Neighbors.
func cartNeighbors(t *Cart) (neighbors, error) {
	nb := make([]int, 0, 2*len(t.dims))
	for d := range t.dims {
		src, dst, err := t.Shift(d, 1)
		if err != nil {
			return neighbors{}, err
		}
		nb = append(nb, src, dst)
	}
	return neighbors{sources: nb, dests: nb, cart: true}, nil
}

// splitAgreed is Split after a check that every rank of c passed the same
// arguments, summed up in check (nonzero; zero stands for arguments this
// rank found wrong, in bad). Every rank sees every rank's check, so all
// of them return ErrMismatch or none. With bad set, the rank takes part
// in the check, so that the others do not wait for it, and returns bad.
func (c *Comm) splitAgreed(ctx context.Context, op string, color, key int, check uint64, bad error) (*Comm, error) {
	if bad != nil {
		check = 0
	}
	all := make([]uint64, c.Size())
	if err := c.Allgather(ctx, Bytes([]uint64{check}), Bytes(all)); err != nil {
		return nil, fmt.Errorf("adi: %s: %w", op, err)
	}
	if bad != nil {
		return nil, bad
	}
	for r, x := range all {
		switch {
		case x == 0: // sumInts is never zero
			return nil, fmt.Errorf("adi: %s: %w: rank %d failed its part (wrong arguments, or a reorder its ctx cut short)", op, ErrMismatch, r)
		case x != check:
			return nil, fmt.Errorf("adi: %s: %w: rank %d passed other arguments than rank %d", op, ErrMismatch, r, c.Rank())
		}
	}
	return c.Split(ctx, color, key)
}

// sumInts sums up lists of ints for splitAgreed: never zero, and the
// same only for the same lists (as rarely otherwise as 64-bit hashes).
func sumInts(lists ...[]int) uint64 {
	h := fnv.New64a()
	var b [8]byte
	for _, l := range lists {
		binary.LittleEndian.PutUint64(b[:], uint64(len(l)))
		h.Write(b[:])
		for _, x := range l {
			binary.LittleEndian.PutUint64(b[:], uint64(x))
			h.Write(b[:])
		}
	}
	if x := mix64(h.Sum64()); x != 0 {
		return x
	}
	return 1
}

// bits01 turns flags into 0s and 1s for sumInts.
func bits01(flags []bool) []int {
	out := make([]int, len(flags))
	for i, f := range flags {
		if f {
			out[i] = 1
		}
	}
	return out
}

// IneighborAllgather starts a NeighborAllgather (MPI_Ineighbor_allgather):
// see the nonblocking collectives in nbcoll.go.
func (t *Cart) IneighborAllgather(send, recv []byte) (*Request, error) {
	return t.Comm.nonblocking("neighbor_allgather", func(ctx context.Context, c *Comm) error { return t.nb.allgather(ctx, c, send, recv) })
}

// IneighborAllgatherv starts a NeighborAllgatherv.
func (t *Cart) IneighborAllgatherv(send []byte, recv [][]byte) (*Request, error) {
	return t.Comm.nonblocking("neighbor_allgatherv", func(ctx context.Context, c *Comm) error { return t.nb.allgatherv(ctx, c, send, recv) })
}

// IneighborAlltoall starts a NeighborAlltoall.
func (t *Cart) IneighborAlltoall(send, recv []byte) (*Request, error) {
	return t.Comm.nonblocking("neighbor_alltoall", func(ctx context.Context, c *Comm) error { return t.nb.alltoall(ctx, c, send, recv) })
}

// IneighborAlltoallv starts a NeighborAlltoallv.
func (t *Cart) IneighborAlltoallv(send, recv [][]byte) (*Request, error) {
	return t.Comm.nonblocking("neighbor_alltoallv", func(ctx context.Context, c *Comm) error {
		return t.nb.exchange(ctx, c, "neighbor_alltoallv", send, recv, nil)
	})
}
