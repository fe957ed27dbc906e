package adi

import (
	"context"
	"fmt"
	"slices"
)

// DistGraph is a communicator with a distributed graph topology
// (MPI_Dist_graph_create_adjacent): each rank knows the ranks it receives
// from (its sources, in-neighbours) and sends to (its destinations,
// out-neighbours), and the neighbour collectives (topo.go) move data
// along those edges only. Its ranks are those of the communicator it was
// made from, in the same order (no reordering). All the methods of Comm
// apply to it. It is safe for concurrent use as a Comm is.
type DistGraph struct {
	*Comm
	nb neighbors
}

// DistGraphCreateAdjacent makes a distributed graph communicator of the
// ranks of c in which this rank receives from sources and sends to dests,
// ranks of c listed in the order the neighbour collectives use; a rank
// may appear more than once (a multigraph) and may be this rank. It is
// collective: every rank of c calls it, and the ranks' lists must agree:
// rank a lists b among its dests as many times as b lists a among its
// sources. Every rank checks this: when any rank's lists disagree with
// another's, or are wrong (a rank outside c), every rank returns an
// error, wrapping ErrMismatch on the ranks whose own lists were not
// wrong. The check costs an Alltoall of one int64 per rank and an
// Allreduce of one.
func (c *Comm) DistGraphCreateAdjacent(ctx context.Context, sources, dests []int) (*DistGraph, error) {
	const op = "dist graph create adjacent"
	p := c.Size()
	var bad error
	for _, l := range []struct {
		name  string
		ranks []int
	}{{"sources", sources}, {"dests", dests}} {
		for i, r := range l.ranks {
			if (r < 0 || r >= p) && bad == nil {
				bad = fmt.Errorf("adi: %s: %s[%d]: %w: %d not in [0,%d)", op, l.name, i, ErrRank, r, p)
			}
		}
	}
	// out[r]: how many edges this rank has to r; in[r]: how many edges
	// r has to this rank, as r sees it.
	out, in := make([]int64, p), make([]int64, p)
	if bad == nil {
		for _, r := range dests {
			out[r]++
		}
	}
	if err := c.Alltoall(ctx, Bytes(out), Bytes(in)); err != nil {
		return nil, fmt.Errorf("adi: %s: %w", op, err)
	}
	if bad == nil {
		want := make([]int64, p) // edges from each rank, as this rank lists them
		for _, r := range sources {
			want[r]++
		}
		for r := range p {
			if want[r] != in[r] {
				bad = fmt.Errorf("adi: %s: %w: rank %d has %d edges to rank %d, which lists it %d times among its sources", op, ErrMismatch, r, in[r], c.Rank(), want[r])
				break
			}
		}
	}
	if err := c.agree(ctx, op, bad); err != nil {
		return nil, err
	}
	dup, err := c.Dup(ctx)
	if err != nil {
		return nil, fmt.Errorf("adi: %s: %w", op, err)
	}
	return &DistGraph{Comm: dup, nb: neighbors{sources: slices.Clone(sources), dests: slices.Clone(dests)}}, nil
}

// Neighbors returns the ranks g receives from and sends to, as passed to
// DistGraphCreateAdjacent (MPI_Dist_graph_neighbors).
func (g *DistGraph) Neighbors() (sources, dests []int) {
	return slices.Clone(g.nb.sources), slices.Clone(g.nb.dests)
}

// NeighborAllgather sends send to each destination of g and receives from
// source i into recv[i*len(send):] (MPI_Neighbor_allgather). recv holds
// len(sources)*len(send) bytes. Every rank sends the same length.
func (g *DistGraph) NeighborAllgather(ctx context.Context, send, recv []byte) error {
	return g.nb.allgather(ctx, g.Comm, send, recv)
}

// NeighborAllgatherv sends send to each destination of g and receives
// from source i into recv[i], which is as long as what it sends
// (MPI_Neighbor_allgatherv).
func (g *DistGraph) NeighborAllgatherv(ctx context.Context, send []byte, recv [][]byte) error {
	return g.nb.allgatherv(ctx, g.Comm, send, recv)
}

// NeighborAlltoall sends block i of send to destination i and receives
// block i of recv from source i, all blocks of one length
// (MPI_Neighbor_alltoall). Where a rank is listed several times, the k-th
// edge from a rank to this one carries the block for the k-th time it is
// listed among the sources.
func (g *DistGraph) NeighborAlltoall(ctx context.Context, send, recv []byte) error {
	return g.nb.alltoall(ctx, g.Comm, send, recv)
}

// NeighborAlltoallv sends send[i] to destination i and receives recv[i]
// from source i (MPI_Neighbor_alltoallv), each as long as its
// counterpart.
func (g *DistGraph) NeighborAlltoallv(ctx context.Context, send, recv [][]byte) error {
	return g.nb.exchange(ctx, g.Comm, "neighbor_alltoallv", send, recv, nil)
}

// IneighborAllgather starts a NeighborAllgather (MPI_Ineighbor_allgather):
// see the nonblocking collectives in nbcoll.go.
func (g *DistGraph) IneighborAllgather(send, recv []byte) (*Request, error) {
	return g.Comm.nonblocking("neighbor_allgather", func(ctx context.Context, c *Comm) error { return g.nb.allgather(ctx, c, send, recv) })
}

// IneighborAllgatherv starts a NeighborAllgatherv.
func (g *DistGraph) IneighborAllgatherv(send []byte, recv [][]byte) (*Request, error) {
	return g.Comm.nonblocking("neighbor_allgatherv", func(ctx context.Context, c *Comm) error { return g.nb.allgatherv(ctx, c, send, recv) })
}

// IneighborAlltoall starts a NeighborAlltoall.
func (g *DistGraph) IneighborAlltoall(send, recv []byte) (*Request, error) {
	return g.Comm.nonblocking("neighbor_alltoall", func(ctx context.Context, c *Comm) error { return g.nb.alltoall(ctx, c, send, recv) })
}

// IneighborAlltoallv starts a NeighborAlltoallv.
func (g *DistGraph) IneighborAlltoallv(send, recv [][]byte) (*Request, error) {
	return g.Comm.nonblocking("neighbor_alltoallv", func(ctx context.Context, c *Comm) error {
		return g.nb.exchange(ctx, c, "neighbor_alltoallv", send, recv, nil)
	})
}
