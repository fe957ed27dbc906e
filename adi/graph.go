package adi

import (
	"context"
	"fmt"
	"slices"
)

// DistGraph is a communicator with a distributed graph topology
// (MPI_Dist_graph_create_adjacent): each rank knows the ranks it receives
// from (its sources, in-neighbours) and sends to (its destinations,
// out-neighbours), with a weight for each edge, and the neighbour
// collectives (topo.go) move data along those edges only. Its ranks are
// those of the communicator it was made from, in the same order unless it
// was made with Reorder. All the methods of Comm apply to it. It is safe
// for concurrent use as a Comm is.
type DistGraph struct {
	*Comm
	nb     neighbors
	sw, dw []int // the edges' weights, as nb lists them
}

// DistGraphCreateAdjacent makes a distributed graph communicator of the
// ranks of c in which this rank receives from sources and sends to dests,
// ranks of c listed in the order the neighbour collectives use; a rank
// may appear more than once (a multigraph) and may be this rank. Weights
// weighs the edges. It is collective: every rank of c calls it, and the
// ranks' lists must agree: rank a lists b among its dests as many times
// as b lists a among its sources, and with the same weights in the same
// order. Every rank checks this: when any rank's lists disagree with
// another's, or are wrong (a rank outside c, a weight below 0, weights
// that are not one per rank listed, edges to itself that its sources
// and dests do not list as many times or weigh alike), every rank
// returns an error, wrapping ErrMismatch on the ranks whose own lists
// were not wrong, as it does when some ranks pass Reorder and others do
// not. The check costs
// an Alltoall of three int64 per rank and an Allreduce of one.
//
// With Reorder the ranks are numbered anew, so that each host's ranks are
// consecutive, the hosts of a site too, sites in the order of their
// first rank in c, hosts in a site likewise, and the ranks of a host in
// their order in c; the numbering of c is kept where it is so already.
// As in MPI, the process that passed the lists keeps them: its
// neighbours are the same processes, and Neighbors names them by their
// new numbers. Which processes talk to which, and so which edges join
// two hosts, is the lists' and no numbering changes it; what the new
// numbering brings is ranks in blocks by host and site, which the
// reductions need to go host by host (hostcoll.go) and which a program
// that lays out its data by rank finds host by host too. The weights
// (Weights) play no part in it: they are stored and checked, but no
// numbering would change which processes talk. It costs a Split instead
// of a Dup, where the numbering changes.
func (c *Comm) DistGraphCreateAdjacent(ctx context.Context, sources, dests []int, opts ...TopoOption) (*DistGraph, error) {
	const op = "dist graph create adjacent"
	cfg := topoOptions(opts)
	sw, dw, bad := c.graphWeights(op, sources, dests, cfg)
	// out[r]: how many edges this rank has to r, a sum of their weights
	// in order and whether this rank reorders; in[r]: the same from r to
	// this rank, as r sees it.
	p := c.Size()
	out, in := make([]int64, 3*p), make([]int64, 3*p)
	reorder := int64(0)
	if cfg.reorder {
		reorder = 1
	}
	for r := range p {
		out[3*r+1], out[3*r+2] = int64(weightSum0), reorder
	}
	if bad == nil {
		for i, r := range dests {
			out[3*r]++
			out[3*r+1] = int64(weightSum(uint64(out[3*r+1]), dw[i]))
		}
	}
	if err := c.Alltoall(ctx, Bytes(out), Bytes(in)); err != nil {
		return nil, fmt.Errorf("adi: %s: %w", op, err)
	}
	if bad == nil {
		// want: edges from each rank and the sum of their weights, as
		// this rank lists them.
		want := make([]int64, 2*p)
		for r := range p {
			want[2*r+1] = int64(weightSum0)
		}
		for i, r := range sources {
			want[2*r]++
			want[2*r+1] = int64(weightSum(uint64(want[2*r+1]), sw[i]))
		}
		for r := range p {
			switch {
			case want[2*r] != in[3*r]:
				bad = fmt.Errorf("adi: %s: %w: rank %d has %d edges to rank %d, which lists it %d times among its sources", op, ErrMismatch, r, in[3*r], c.Rank(), want[2*r])
			case want[2*r+1] != in[3*r+1]:
				bad = fmt.Errorf("adi: %s: %w: rank %d weighs its %d edges to rank %d otherwise than rank %d's source weights do", op, ErrMismatch, r, in[3*r], c.Rank(), c.Rank())
			case in[3*r+2] != reorder:
				bad = fmt.Errorf("adi: %s: %w: rank %d passed Reorder and rank %d did not, or the other way round", op, ErrMismatch, r, c.Rank())
			}
			if bad != nil {
				break
			}
		}
	}
	if err := c.agree(ctx, op, bad); err != nil {
		return nil, err
	}
	// order[i] is the rank of c that becomes rank i: the same on every
	// rank, computed from the hosts and sites every rank knows.
	order := identity(p)
	if cfg.reorder {
		order = placementOf(c, p).blocks()
	}
	var sub *Comm
	var err error
	if slices.Equal(order, identity(p)) {
		sub, err = c.Dup(ctx)
	} else {
		sub, err = c.Split(ctx, 0, slices.Index(order, c.Rank()))
	}
	if err != nil {
		return nil, fmt.Errorf("adi: %s: %w", op, err)
	}
	newRank := make([]int, p) // rank of c -> its rank in sub
	for i, r := range order {
		newRank[r] = i
	}
	renumber := func(ranks []int) []int {
		out := make([]int, len(ranks))
		for i, r := range ranks {
			out[i] = newRank[r]
		}
		return out
	}
	return &DistGraph{Comm: sub, nb: neighbors{sources: renumber(sources), dests: renumber(dests)}, sw: sw, dw: dw}, nil
}

// graphWeights checks DistGraphCreateAdjacent's lists and weights and
// returns the weights, all 1 where Weights was not passed; bad says what
// is wrong with them.
func (c *Comm) graphWeights(op string, sources, dests []int, cfg topoConfig) (sw, dw []int, bad error) {
	p := c.Size()
	for _, l := range []struct {
		name    string
		ranks   []int
		weights []int
	}{{"sources", sources, cfg.sourceWeights}, {"dests", dests, cfg.destWeights}} {
		for i, r := range l.ranks {
			if r < 0 || r >= p {
				return nil, nil, fmt.Errorf("adi: %s: %s[%d]: %w: %d not in [0,%d)", op, l.name, i, ErrRank, r, p)
			}
		}
		if !cfg.weighted {
			continue
		}
		if len(l.weights) != len(l.ranks) {
			return nil, nil, fmt.Errorf("adi: %s: %d weights for %d %s", op, len(l.weights), len(l.ranks), l.name)
		}
		for i, w := range l.weights {
			if w < 0 {
				return nil, nil, fmt.Errorf("adi: %s: weight %d of %s[%d] is negative", op, w, l.name, i)
			}
		}
	}
	sw, dw = cfg.sourceWeights, cfg.destWeights
	if !cfg.weighted {
		sw, dw = ones(len(sources)), ones(len(dests))
	}
	return sw, dw, c.selfEdges(op, sources, dests, sw, dw)
}

// selfEdges checks this rank's edges to itself: the k-th time it lists
// itself among its dests and among its sources are one edge, which must
// be there in both and weigh the same in both. Both ends are this rank's,
// so a fault here is its own and no other rank's (not ErrMismatch): the
// ring of ExampleReorder on one rank, whose left and right are itself,
// weighs its edge to the right 2 as a dest and 1 as a source.
func (c *Comm) selfEdges(op string, sources, dests, sw, dw []int) error {
	me := c.Rank()
	var in, out []int // indices of the self-edges in sources and in dests
	for i, r := range sources {
		if r == me {
			in = append(in, i)
		}
	}
	for i, r := range dests {
		if r == me {
			out = append(out, i)
		}
	}
	if len(in) != len(out) {
		return fmt.Errorf("adi: %s: rank %d lists itself %d times among its dests and %d among its sources", op, me, len(out), len(in))
	}
	for k := range in {
		if sw[in[k]] != dw[out[k]] {
			return fmt.Errorf("adi: %s: edge %d of rank %d to itself weighs %d as dests[%d] and %d as sources[%d]", op, k, me, dw[out[k]], out[k], sw[in[k]], in[k])
		}
	}
	return nil
}

// ones is n weights of 1.
func ones(n int) []int {
	w := make([]int, n)
	for i := range w {
		w[i] = 1
	}
	return w
}

// weightSum0 starts a sum of weights for weightSum.
const weightSum0 uint64 = 0x6a09e667f3bcc908

// weightSum adds weight w to sum, in order: the same only for the same
// weights in the same order (as rarely otherwise as 64-bit hashes).
func weightSum(sum uint64, w int) uint64 { return mix64(sum*0x9e3779b97f4a7c15 + uint64(w)) }

// Neighbors returns the ranks g receives from and sends to, as passed to
// DistGraphCreateAdjacent and numbered in g (MPI_Dist_graph_neighbors).
func (g *DistGraph) Neighbors() (sources, dests []int) {
	return slices.Clone(g.nb.sources), slices.Clone(g.nb.dests)
}

// Weights returns the weights of the edges from g's sources and to its
// dests, in the order of Neighbors: as passed with the Weights option,
// or all 1 on a graph made without it (MPI_UNWEIGHTED). Nothing in
// the library reads them; they are the program's, checked at creation.
func (g *DistGraph) Weights() (sources, dests []int) {
	return slices.Clone(g.sw), slices.Clone(g.dw)
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
