package adi

import (
	"cmp"
	"context"
	"fmt"
	"slices"
)

// Graph is a communicator with a graph topology (MPI_Graph_create): every
// rank knows the whole graph, its nodes being the ranks of the Graph, and
// the neighbours of a node are those its adjacency list names, in that
// order, repeated where an edge is (a multigraph) and the node itself
// where it has a loop. The neighbour collectives (topo.go) exchange with
// those neighbours, each in and out at once: send block i goes to
// neighbour i and receive slot i comes from it. Where a node lists
// another k times, the k-th time pairs with the k-th time the other lists
// it: the block a rank sends for its k-th listing of a neighbour lands in
// that neighbour's slot of its k-th listing of the rank. MPI allows the
// collectives only on a graph whose adjacency is symmetric, each node
// listing each other as often as that one lists it; on any other they
// return an error wrapping ErrMismatch on every rank, as every rank knows
// the graph.
//
// Its ranks are those of the communicator it was made from, in the same
// order unless it was made with Reorder. All the methods of Comm apply
// to it. It is safe for concurrent use as a Comm is. DistGraph describes
// a graph without any rank knowing all of it.
type Graph struct {
	*Comm
	index, edges []int // as passed to GraphCreate, this Graph's own copies
	nb           neighbors
}

// GraphCreate makes a graph communicator of the first len(index) ranks
// of c (MPI_Graph_create): node i of the graph is rank i of the Graph,
// index[i] is the number of adjacency entries of nodes 0 to i, and the
// neighbours of node i are edges[index[i-1]:index[i]] (from edges[0] for
// node 0), so index[len(index)-1] is len(edges). A node may list itself
// and may list a node several times; the lists need not be symmetric,
// but the neighbour collectives need them to be (see Graph).
//
// It is collective: every rank of c calls it with the same index and
// edges, and every rank or none passes Reorder. Ranks beyond the graph
// get nil and no error. Arguments that are wrong (more nodes than c has
// ranks, a negative or falling entry of index, an index whose last
// entry is not len(edges), an entry of edges that is no node) are an
// error on every rank that passed them, naming the argument and the
// position; ranks that pass other arguments than the others all get an
// error wrapping ErrMismatch. The check costs an Allgather of one uint64
// per rank before the Split.
//
// With Reorder, the graph's nodes go to the same processes, but which
// process takes which node (which rank of the Graph it gets) is chosen
// so that few edges join two hosts, and fewer two sites: the graph,
// every adjacency entry an edge of weight 1, is cut into parts of the
// sizes of the hosts as Cart's Reorder cuts a grid, and the numbering of
// c is kept where it does at least as well. Every rank computes it alike
// from where the ranks live, so it costs no message; it checks ctx as it
// goes. GraphMap tells a rank its node beforehand. Unlike a DistGraph,
// whose edges are each process's own, the edges here are between nodes,
// so where the nodes go decides which edges cross between hosts. Weights
// is refused: MPI's graph has none.
func (c *Comm) GraphCreate(ctx context.Context, index, edges []int, opts ...TopoOption) (*Graph, error) {
	const op = "graph create"
	cfg := topoOptions(opts)
	bad := checkGraph(op, index, edges, c.Size())
	if bad == nil && cfg.weighted {
		bad = fmt.Errorf("adi: %s: weights are for a dist graph; MPI's graph has none", op)
	}
	color, key := 0, c.Rank()
	switch {
	case bad != nil:
	case c.Rank() >= len(index):
		color = Undefined
	case cfg.reorder:
		// Cut short, it fails this rank's part, which still takes part
		// in the agreement (see CartCreate).
		procOf, err := placementOf(c, len(index)).mapGraph(ctx, index, edges)
		if err != nil {
			bad = fmt.Errorf("adi: %s: reorder: %w", op, err)
			break
		}
		key = slices.Index(procOf, c.Rank())
	}
	sub, err := c.splitAgreed(ctx, op, color, key, sumInts(index, edges, bits01([]bool{cfg.reorder, cfg.weighted})), bad)
	if err != nil || sub == nil {
		return nil, err
	}
	return graphOf(sub, slices.Clone(index), slices.Clone(edges)), nil
}

// GraphMap returns the rank that this rank of c would have in the Graph
// that c.GraphCreate(ctx, index, edges, Reorder()) makes, or Undefined
// if this rank is beyond its nodes (MPI_Graph_map). It sends nothing:
// the numbering is computed from where the ranks live, as GraphCreate
// computes it, and the arguments are checked as GraphCreate checks them.
func GraphMap(c *Comm, index, edges []int) (int, error) {
	const op = "graph map"
	if c == nil {
		return 0, fmt.Errorf("adi: %s: nil communicator", op)
	}
	if err := checkGraph(op, index, edges, c.Size()); err != nil {
		return 0, err
	}
	if c.Rank() >= len(index) {
		return Undefined, nil
	}
	procOf, err := placementOf(c, len(index)).mapGraph(context.Background(), index, edges)
	if err != nil {
		return 0, fmt.Errorf("adi: %s: %w", op, err)
	}
	return slices.Index(procOf, c.Rank()), nil
}

// checkGraph checks index and edges as GraphCreate takes them, for a
// communicator of size ranks; op names the call in the error.
func checkGraph(op string, index, edges []int, size int) error {
	n := len(index)
	if n > size {
		return fmt.Errorf("adi: %s: index: %d nodes for a communicator of %d ranks", op, n, size)
	}
	prev := 0
	for i, x := range index {
		switch {
		case x < 0:
			return fmt.Errorf("adi: %s: index[%d] is %d, negative", op, i, x)
		case x < prev:
			return fmt.Errorf("adi: %s: index[%d] is %d, less than index[%d] = %d: index counts the entries of edges up to each node, which never fall", op, i, x, i-1, prev)
		}
		prev = x
	}
	if len(edges) != prev {
		if n == 0 {
			return fmt.Errorf("adi: %s: edges: %d entries for a graph of no nodes", op, len(edges))
		}
		return fmt.Errorf("adi: %s: edges: %d entries, but index[%d] = %d", op, len(edges), n-1, prev)
	}
	node := 0 // whose list edges[j] is in
	for j, e := range edges {
		for index[node] <= j {
			node++
		}
		if e < 0 || e >= n {
			return fmt.Errorf("adi: %s: edges[%d], a neighbour of node %d: %w: %d not in [0,%d)", op, j, node, ErrRank, e, n)
		}
	}
	return nil
}

// graphOf lays sub out on the graph of index and edges, which it keeps
// and which checkGraph has passed.
func graphOf(sub *Comm, index, edges []int) *Graph {
	g := &Graph{Comm: sub, index: index, edges: edges}
	mine := g.adjacent(sub.Rank())
	g.nb = neighbors{sources: mine, dests: mine, refused: g.asymmetry()}
	return g
}

// adjacent is node r's list in edges; r is a node.
func (g *Graph) adjacent(r int) []int {
	lo := 0
	if r > 0 {
		lo = g.index[r-1]
	}
	return g.edges[lo:g.index[r]:g.index[r]]
}

// asymmetry says why the neighbour collectives cannot run on g, the
// first node in edges' order that lists another more or fewer times than
// that one lists it, or returns nil: then the k-th time a lists b and the
// k-th time b lists a are one edge, and messages between two ranks
// arriving in the order they were sent pair them.
func (g *Graph) asymmetry() error {
	type pair struct{ from, to int }
	count := make(map[pair]int, len(g.edges))
	for a := range g.index {
		for _, b := range g.adjacent(a) {
			count[pair{a, b}]++
		}
	}
	for a := range g.index {
		for _, b := range g.adjacent(a) {
			if ab, ba := count[pair{a, b}], count[pair{b, a}]; ab != ba {
				return fmt.Errorf("%w: node %d lists node %d %d times and node %d lists node %d %d times: neighbour collectives need a symmetric adjacency", ErrMismatch, a, b, ab, b, a, ba)
			}
		}
	}
	return nil
}

// graphEdgesOf are the edges of the graph of index and edges for the
// placement code: one of weight 1 per adjacency entry, whichever way.
func graphEdgesOf(index, edges []int) []topoEdge {
	out := make([]topoEdge, 0, len(edges))
	node := 0
	for j, e := range edges {
		for index[node] <= j {
			node++
		}
		out = append(out, topoEdge{node, e, 1})
	}
	return out
}

// mapGraph chooses which process takes each node of the graph of index
// and edges: procOf[v] is the process of node v, a permutation of the
// processes that pl places, as many as the graph has nodes. It is
// mapGrid without the grid's boxes: the partition of the graph into
// pl's hosts and sites, or the identity where that costs no more.
func (pl placement) mapGraph(ctx context.Context, index, edges []int) ([]int, error) {
	id := identity(len(pl.host))
	te := graphEdgesOf(index, edges)
	if len(pl.site) < 2 || len(te) == 0 {
		return id, nil
	}
	part, err := pl.partition(ctx, te, pl.bins())
	if err != nil {
		return nil, err
	}
	return pl.cheapest(te, id, part), nil
}

// Dims returns the number of nodes and of adjacency entries of g
// (MPI_Graphdims_get): len(index) and len(edges) as GraphCreate got them.
func (g *Graph) Dims() (nnodes, nedges int) { return len(g.index), len(g.edges) }

// Topo returns copies of the index and edges g was made with
// (MPI_Graph_get).
func (g *Graph) Topo() (index, edges []int) {
	return slices.Clone(g.index), slices.Clone(g.edges)
}

// NeighborsCount returns the number of neighbours of node r of g,
// repeated ones as often as they are listed (MPI_Graph_neighbors_count).
func (g *Graph) NeighborsCount(r int) (int, error) {
	if r < 0 || r >= len(g.index) {
		return 0, fmt.Errorf("adi: graph neighbors count: %w: %d not in [0,%d)", ErrRank, r, len(g.index))
	}
	return len(g.adjacent(r)), nil
}

// Neighbors returns the neighbours of node r of g in the order of its
// adjacency list (MPI_Graph_neighbors), which is the order of the
// neighbour collectives' blocks and slots on rank r.
func (g *Graph) Neighbors(r int) ([]int, error) {
	if r < 0 || r >= len(g.index) {
		return nil, fmt.Errorf("adi: graph neighbors: %w: %d not in [0,%d)", ErrRank, r, len(g.index))
	}
	return slices.Clone(g.adjacent(r)), nil
}

// NeighborAllgather sends send to each neighbour of this rank and
// receives from neighbour i into recv[i*len(send):]
// (MPI_Neighbor_allgather). recv holds len(neighbours)*len(send) bytes.
// Every rank sends the same length.
func (g *Graph) NeighborAllgather(ctx context.Context, send, recv []byte) error {
	return g.nb.allgather(ctx, g.Comm, send, recv)
}

// NeighborAllgatherv sends send to each neighbour and receives from
// neighbour i into recv[i], which is as long as what it sends
// (MPI_Neighbor_allgatherv).
func (g *Graph) NeighborAllgatherv(ctx context.Context, send []byte, recv [][]byte) error {
	return g.nb.allgatherv(ctx, g.Comm, send, recv)
}

// NeighborAlltoall sends block i of send to neighbour i and receives
// block i of recv from it, all blocks of one length
// (MPI_Neighbor_alltoall). Where a rank is listed several times, the
// block for its k-th listing goes to that rank's slot of its k-th
// listing of this one (see Graph).
func (g *Graph) NeighborAlltoall(ctx context.Context, send, recv []byte) error {
	return g.nb.alltoall(ctx, g.Comm, send, recv)
}

// NeighborAlltoallv sends send[i] to neighbour i and receives recv[i]
// from it (MPI_Neighbor_alltoallv), each as long as its counterpart.
func (g *Graph) NeighborAlltoallv(ctx context.Context, send, recv [][]byte) error {
	return g.nb.exchange(ctx, g.Comm, "neighbor_alltoallv", send, recv, nil)
}

// IneighborAllgather starts a NeighborAllgather (MPI_Ineighbor_allgather):
// see the nonblocking collectives in nbcoll.go.
func (g *Graph) IneighborAllgather(send, recv []byte) (*Request, error) {
	return g.Comm.nonblocking("neighbor_allgather", func(ctx context.Context, c *Comm) error { return g.nb.allgather(ctx, c, send, recv) })
}

// IneighborAllgatherv starts a NeighborAllgatherv.
func (g *Graph) IneighborAllgatherv(send []byte, recv [][]byte) (*Request, error) {
	return g.Comm.nonblocking("neighbor_allgatherv", func(ctx context.Context, c *Comm) error { return g.nb.allgatherv(ctx, c, send, recv) })
}

// IneighborAlltoall starts a NeighborAlltoall.
func (g *Graph) IneighborAlltoall(send, recv []byte) (*Request, error) {
	return g.Comm.nonblocking("neighbor_alltoall", func(ctx context.Context, c *Comm) error { return g.nb.alltoall(ctx, c, send, recv) })
}

// IneighborAlltoallv starts a NeighborAlltoallv.
func (g *Graph) IneighborAlltoallv(send, recv [][]byte) (*Request, error) {
	return g.Comm.nonblocking("neighbor_alltoallv", func(ctx context.Context, c *Comm) error {
		return g.nb.exchange(ctx, c, "neighbor_alltoallv", send, recv, nil)
	})
}

// The persistent forms, as Cart's and DistGraph's (collinit_topo.go):
// Init fixes the arguments and a context of the Graph's own, and each
// Start runs the nonblocking form once. Init checks this rank's
// arguments as the blocking form does (initChecked), and the graph's
// symmetry, which every rank finds alike.

// dup returns g on a duplicate of its communicator, made now.
func (g *Graph) dup() *Graph {
	c := *g
	c.Comm = g.Comm.dupLocal()
	return &c
}

// NeighborAllgatherInit makes a persistent NeighborAllgather
// (MPI_Neighbor_allgather_init).
func (g *Graph) NeighborAllgatherInit(send, recv []byte) (*Request, error) {
	own := g.dup()
	q := g.persistentColl(func() (*Request, error) { return own.IneighborAllgather(send, recv) })
	return initChecked(q, "neighbor_allgather", cmp.Or(g.nb.refused, g.nb.allgatherArgs(send, recv)))
}

// NeighborAllgathervInit makes a persistent NeighborAllgatherv.
func (g *Graph) NeighborAllgathervInit(send []byte, recv [][]byte) (*Request, error) {
	own := g.dup()
	q := g.persistentColl(func() (*Request, error) { return own.IneighborAllgatherv(send, recv) })
	return initChecked(q, "neighbor_allgatherv", cmp.Or(g.nb.refused, g.nb.blocksArgs(len(g.nb.dests), len(recv))))
}

// NeighborAlltoallInit makes a persistent NeighborAlltoall.
func (g *Graph) NeighborAlltoallInit(send, recv []byte) (*Request, error) {
	own := g.dup()
	q := g.persistentColl(func() (*Request, error) { return own.IneighborAlltoall(send, recv) })
	return initChecked(q, "neighbor_alltoall", cmp.Or(g.nb.refused, neighborAlltoallArgs(g.nb, send, recv)))
}

// NeighborAlltoallvInit makes a persistent NeighborAlltoallv.
func (g *Graph) NeighborAlltoallvInit(send, recv [][]byte) (*Request, error) {
	own := g.dup()
	q := g.persistentColl(func() (*Request, error) { return own.IneighborAlltoallv(send, recv) })
	return initChecked(q, "neighbor_alltoallv", cmp.Or(g.nb.refused, g.nb.blocksArgs(len(send), len(recv))))
}
