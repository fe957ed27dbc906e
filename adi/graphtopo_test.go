package adi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
)

// graphCase is a graph as GraphCreate takes it.
type graphCase struct {
	name         string
	index, edges []int
}

// adjacency is node r's list in the graph of index and edges.
func adjacency(index, edges []int, r int) []int {
	lo := 0
	if r > 0 {
		lo = index[r-1]
	}
	return edges[lo:index[r]]
}

// graphOfLists makes index and edges of the adjacency lists of the nodes.
func graphOfLists(lists ...[]int) (index, edges []int) {
	for _, l := range lists {
		edges = append(edges, l...)
		index = append(index, len(edges))
	}
	return index, edges
}

// graphTopoWant says, for rank me of a graph of index and edges, where
// the block in its receive slot j comes from: its neighbour j, and that
// neighbour's block number, the place in its list of its k-th listing of
// me when j is me's k-th listing of it (MPI's pairing of multi-edges).
func graphTopoWant(index, edges []int, me int) func(j int) (src, blk int) {
	mine := adjacency(index, edges, me)
	return func(j int) (int, int) {
		src := mine[j]
		k := 0
		for _, s := range mine[:j] {
			if s == src {
				k++
			}
		}
		for i, d := range adjacency(index, edges, src) {
			if d == me {
				if k == 0 {
					return src, i
				}
				k--
			}
		}
		panic("asymmetric test graph") // the test's own graph is wrong
	}
}

// ringGraph is a ring of n nodes, each listing its left then its right.
func ringGraph(n int) (index, edges []int) {
	lists := make([][]int, n)
	for r := range lists {
		lists[r] = []int{(r + n - 1) % n, (r + 1) % n}
	}
	return graphOfLists(lists...)
}

// The graphs the collectives are checked on, in jobs of graphRanks ranks.
const graphRanks = 5

var graphCases = func() []graphCase {
	var cs []graphCase
	add := func(name string, index, edges []int) {
		cs = append(cs, graphCase{name, index, edges})
	}
	i, e := ringGraph(4)
	add("ring of 4, rank 4 outside", i, e)
	i, e = ringGraph(5)
	add("ring of 5", i, e)
	i, e = ringGraph(2) // each node lists the other twice
	add("ring of 2", i, e)
	// A star: the centre lists the leaves, each leaf the centre; node 4
	// has no edge.
	i, e = graphOfLists([]int{1, 2, 3}, []int{0}, []int{0}, []int{0}, nil)
	add("star and a lonely node", i, e)
	// Self-loops (0 once, 1 twice, 2 once) and multi-edges (0-1 and 2-3
	// twice), listed in orders where the k-th listing of a pair is not at
	// the same place at both ends.
	i, e = graphOfLists([]int{1, 0, 3, 1, 2}, []int{1, 0, 2, 1, 0}, []int{3, 0, 2, 1, 3}, []int{2, 0, 2})
	add("self-loops and multi-edges", i, e)
	add("one node with a loop", []int{1}, []int{0})
	add("no nodes", nil, nil)
	return cs
}()

// inited is a Graph whose neighbour collectives are its persistent ones,
// each made, started twice (the first round into scratch buffers of the
// same lengths, so that a second Start is what fills the caller's) and
// waited for.
type inited struct{ g *adi.Graph }

// startTwice starts q, waits, runs between, and starts and waits again.
func startTwice(ctx context.Context, q *adi.Request, err error, between func()) error {
	if err != nil {
		return err
	}
	for round := range 2 {
		if round == 1 {
			between()
		}
		if err := q.Start(); err != nil {
			return err
		}
		if _, err := q.Wait(ctx); err != nil {
			return err
		}
	}
	return nil
}

// The persistent request's buffers are the caller's throughout: the
// first round fills them, they are wiped, and the second must fill them
// again.
func wipe(bufs ...[]byte) func() {
	return func() {
		for _, b := range bufs {
			copy(b, bytes.Repeat([]byte{untouched}, len(b)))
		}
	}
}

func (s inited) NeighborAllgather(ctx context.Context, send, recv []byte) error {
	q, err := s.g.NeighborAllgatherInit(send, recv)
	return startTwice(ctx, q, err, wipe(recv))
}

func (s inited) NeighborAllgatherv(ctx context.Context, send []byte, recv [][]byte) error {
	q, err := s.g.NeighborAllgathervInit(send, recv)
	return startTwice(ctx, q, err, wipe(recv...))
}

func (s inited) NeighborAlltoall(ctx context.Context, send, recv []byte) error {
	q, err := s.g.NeighborAlltoallInit(send, recv)
	return startTwice(ctx, q, err, wipe(recv))
}

func (s inited) NeighborAlltoallv(ctx context.Context, send, recv [][]byte) error {
	q, err := s.g.NeighborAlltoallvInit(send, recv)
	return startTwice(ctx, q, err, wipe(recv...))
}

func (s inited) Rank() int { return s.g.Rank() }

// checkGraphQueries checks g's Dims, Topo, Neighbors and NeighborsCount
// against the graph it was made of.
func checkGraphQueries(g *adi.Graph, index, edges []int) error {
	if n, m := g.Dims(); n != len(index) || m != len(edges) {
		return fmt.Errorf("dims %d, %d; want %d, %d", n, m, len(index), len(edges))
	}
	gi, ge := g.Topo()
	if !slices.Equal(gi, index) || !slices.Equal(ge, edges) {
		return fmt.Errorf("topo %v %v, want %v %v", gi, ge, index, edges)
	}
	if len(gi) > 0 {
		gi[0]++ // a copy: g keeps its own
		if again, _ := g.Topo(); !slices.Equal(again, index) {
			return fmt.Errorf("Topo's index is g's own: %v after a change to a copy", again)
		}
	}
	for r := range index {
		want := adjacency(index, edges, r)
		nb, err := g.Neighbors(r)
		if err != nil || !slices.Equal(nb, want) {
			return fmt.Errorf("neighbours of %d: %v (%v), want %v", r, nb, err, want)
		}
		if n, err := g.NeighborsCount(r); err != nil || n != len(want) {
			return fmt.Errorf("neighbours count of %d: %d (%v), want %d", r, n, err, len(want))
		}
	}
	for _, r := range []int{-1, len(index)} {
		if _, err := g.Neighbors(r); !errors.Is(err, adi.ErrRank) {
			return fmt.Errorf("neighbours of %d: %v, want ErrRank", r, err)
		}
		if _, err := g.NeighborsCount(r); !errors.Is(err, adi.ErrRank) {
			return fmt.Errorf("neighbours count of %d: %v, want ErrRank", r, err)
		}
	}
	return nil
}

// TestGraphNeighborCollectives: on a ring, a star, and a graph with
// self-loops and multi-edges, GraphCreate gives nil beyond the nodes, the
// queries return the graph, and every neighbour collective, blocking,
// nonblocking and persistent, delivers every byte to MPI's slot: neighbour
// j's block for its k-th listing of this rank, where j is this rank's
// k-th listing of it.
func TestGraphNeighborCollectives(t *testing.T) {
	for _, tc := range graphCases {
		t.Run(tc.name, func(t *testing.T) {
			cs := loopJob(t, graphRanks)
			ctx := ctxT(t)
			each(t, cs, func(c *adi.Comm) error {
				g, err := c.GraphCreate(ctx, tc.index, tc.edges)
				if c.Rank() >= len(tc.index) {
					if g != nil || err != nil {
						return fmt.Errorf("beyond the graph: %v, %v; want nil and no error", g, err)
					}
					return nil
				}
				if err != nil {
					return err
				}
				if g.Rank() != c.Rank() || g.Size() != len(tc.index) {
					return fmt.Errorf("rank %d of %d, want %d of %d", g.Rank(), g.Size(), c.Rank(), len(tc.index))
				}
				if err := checkGraphQueries(g, tc.index, tc.edges); err != nil {
					return err
				}
				nb := adjacency(tc.index, tc.edges, g.Rank())
				want := graphTopoWant(tc.index, tc.edges, g.Rank())
				for _, base := range []int{0, 3, 700} { // 700: by rendezvous
					for _, form := range []struct {
						name string
						t    neighborTopo
					}{{"blocking", g}, {"nonblocking", started{g}}, {"persistent", inited{g}}} {
						if err := checkNeighborCalls(ctx, form.t, nb, nb, want, base); err != nil {
							return fmt.Errorf("%s, blocks of %d bytes: %w", form.name, base, err)
						}
					}
				}
				// The graph communicator is a communicator of its own.
				return g.Barrier(ctx)
			})
		})
	}
}

// TestGraphPersistentRounds: a persistent neighbour alltoall and
// allgather on the multigraph, started in different orders on different
// ranks, carry each round's data.
func TestGraphPersistentRounds(t *testing.T) {
	tc := graphCases[4]
	cs := loopJob(t, graphRanks)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		g, err := c.GraphCreate(ctx, tc.index, tc.edges)
		if err != nil || g == nil {
			return err
		}
		me := g.Rank()
		nb := adjacency(tc.index, tc.edges, me)
		want := graphTopoWant(tc.index, tc.edges, me)
		mine, gathered := make([]byte, 1), make([]byte, len(nb))
		out, in := make([]byte, len(nb)), make([]byte, len(nb))
		qa, err := g.NeighborAllgatherInit(mine, gathered)
		if err != nil {
			return err
		}
		qb, err := g.NeighborAlltoallInit(out, in)
		if err != nil {
			return err
		}
		for round := range 4 {
			mine[0] = byte(10*round + me)
			for j := range out {
				out[j] = byte(100 + 20*round + 4*me + j)
			}
			order := []*adi.Request{qa, qb}
			if (me+round)%2 == 1 {
				order = []*adi.Request{qb, qa}
			}
			if err := startWait(ctx, order...); err != nil {
				return err
			}
			for j, src := range nb {
				if exp := byte(10*round + src); gathered[j] != exp {
					return fmt.Errorf("round %d: allgather slot %d %d, want %d", round, j, gathered[j], exp)
				}
				from, blk := want(j)
				if exp := byte(100 + 20*round + 4*from + blk); in[j] != exp {
					return fmt.Errorf("round %d: alltoall slot %d %d, want %d", round, j, in[j], exp)
				}
			}
		}
		return nil
	})
}

// TestGraphPersistentInitArguments: a persistent neighbour collective
// whose buffers do not fit this rank's neighbours fails at Init, naming
// the call; the Inits that failed still drew their contexts, so the next
// Init's requests meet on every rank.
func TestGraphPersistentInitArguments(t *testing.T) {
	cs := loopJob(t, 3)
	ctx := ctxT(t)
	index, edges := ringGraph(3) // two neighbours each
	each(t, cs, func(c *adi.Comm) error {
		g, err := c.GraphCreate(ctx, index, edges)
		if err != nil {
			return err
		}
		for _, tc := range []struct {
			name, says string
			init       func() (*adi.Request, error)
		}{
			{"allgather short", "neighbor_allgather init", func() (*adi.Request, error) { return g.NeighborAllgatherInit(make([]byte, 4), make([]byte, 7)) }},
			{"allgatherv slots", "neighbor_allgatherv init", func() (*adi.Request, error) { return g.NeighborAllgathervInit(nil, make([][]byte, 3)) }},
			{"alltoall uneven", "neighbor_alltoall init", func() (*adi.Request, error) { return g.NeighborAlltoallInit(make([]byte, 5), make([]byte, 5)) }},
			{"alltoall lengths", "neighbor_alltoall init", func() (*adi.Request, error) { return g.NeighborAlltoallInit(make([]byte, 4), make([]byte, 6)) }},
			{"alltoallv blocks", "neighbor_alltoallv init", func() (*adi.Request, error) { return g.NeighborAlltoallvInit(make([][]byte, 1), make([][]byte, 2)) }},
		} {
			q, err := tc.init()
			if err == nil || q != nil || !strings.Contains(err.Error(), tc.says) {
				return fmt.Errorf("%s: %v, %v; want no request and an error saying %q", tc.name, q, err, tc.says)
			}
		}
		got := make([]byte, 2)
		q, err := g.NeighborAllgatherInit([]byte{byte(10 + g.Rank())}, got)
		if err := startTwice(ctx, q, err, func() {}); err != nil {
			return err
		}
		left, right := (g.Rank()+2)%3, (g.Rank()+1)%3
		if want := []byte{byte(10 + left), byte(10 + right)}; !bytes.Equal(got, want) {
			return fmt.Errorf("allgather after the failed Inits: %v, want %v", got, want)
		}
		return nil
	})
}

// TestGraphCreateArguments: every fault of index, edges or the options
// is an error on every rank that passed it, naming the argument and
// where, and not ErrMismatch, which would blame another rank; GraphMap
// checks alike. After them all, the graph goes through: the failed calls
// left the ranks in step.
func TestGraphCreateArguments(t *testing.T) {
	const ranks = 4
	cs := loopJob(t, ranks)
	ctx := ctxT(t)
	ring, ringEdges := ringGraph(ranks)
	for _, tc := range []struct {
		name         string
		index, edges []int
		opts         []adi.TopoOption
		says         string // in the error
		rank         bool   // wraps ErrRank
	}{
		{"more nodes than ranks", []int{0, 0, 0, 0, 0}, nil, nil, "index: 5 nodes for a communicator of 4 ranks", false},
		{"negative index", []int{1, -1, 2}, []int{1, 0}, nil, "index[1] is -1, negative", false},
		{"negative first index", []int{-2, 0}, nil, nil, "index[0] is -2, negative", false},
		{"falling index", []int{2, 1, 3}, []int{1, 2, 0}, nil, "index[1] is 1, less than index[0] = 2", false},
		{"too few edges", []int{1, 2}, []int{1}, nil, "edges: 1 entries, but index[1] = 2", false},
		{"too many edges", []int{1, 2}, []int{1, 0, 0}, nil, "edges: 3 entries, but index[1] = 2", false},
		{"edges without nodes", nil, []int{0}, nil, "edges: 1 entries for a graph of no nodes", false},
		{"edge past the nodes", []int{1, 2}, []int{1, 2}, nil, "edges[1], a neighbour of node 1", true},
		{"edge past the nodes, not past the ranks", []int{0, 0, 1}, []int{3}, nil, "edges[0], a neighbour of node 2", true},
		{"negative edge", []int{1, 2}, []int{-1, 0}, nil, "edges[0], a neighbour of node 0", true},
		{"ProcNull edge", []int{1, 2}, []int{1, adi.ProcNull}, nil, "edges[1], a neighbour of node 1", true},
		{"weights", ring, ringEdges, []adi.TopoOption{adi.Weights(nil, nil)}, "weights are for a dist graph", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			each(t, cs, func(c *adi.Comm) error {
				check := func(call string, err error) error {
					switch {
					case err == nil:
						return fmt.Errorf("%s: no error", call)
					case errors.Is(err, adi.ErrMismatch):
						return fmt.Errorf("%s: %v: ErrMismatch blames another rank", call, err)
					case !strings.Contains(err.Error(), tc.says):
						return fmt.Errorf("%s: %q does not say %q", call, err, tc.says)
					case errors.Is(err, adi.ErrRank) != tc.rank:
						return fmt.Errorf("%s: %v: wraps ErrRank %v, want %v", call, err, !tc.rank, tc.rank)
					}
					return nil
				}
				g, err := c.GraphCreate(ctx, tc.index, tc.edges, tc.opts...)
				if g != nil {
					return fmt.Errorf("a graph from bad arguments")
				}
				if err := check("graph create", err); err != nil {
					return err
				}
				if tc.opts != nil {
					return nil // GraphMap takes no options
				}
				_, err = adi.GraphMap(c, tc.index, tc.edges)
				return check("graph map", err)
			})
		})
	}
	each(t, cs, func(c *adi.Comm) error {
		if _, err := adi.GraphMap(nil, ring, ringEdges); err == nil {
			return errors.New("graph map on a nil communicator: no error")
		}
		g, err := c.GraphCreate(ctx, ring, ringEdges)
		if err != nil {
			return err
		}
		return checkNeighborCalls(ctx, g, adjacency(ring, ringEdges, c.Rank()), adjacency(ring, ringEdges, c.Rank()), graphTopoWant(ring, ringEdges, c.Rank()), 2)
	})
}

// TestGraphCreateDisagree: ranks that pass other graphs, or Reorder on
// one rank only, or a graph of fewer nodes (so that the rank thinks the
// others outside it), all fail, none hanging, with ErrMismatch on the
// ranks whose own arguments were right and an error of its own on a rank
// whose arguments were wrong; the next call goes through.
func TestGraphCreateDisagree(t *testing.T) {
	const ranks = 4
	cs := loopJob(t, ranks)
	ctx := ctxT(t)
	ring, ringEdges := ringGraph(ranks)
	type args struct {
		index, edges []int
		opts         []adi.TopoOption
	}
	good := args{ring, ringEdges, nil}
	for _, tc := range []struct {
		name string
		odd  int // the rank that passes other arguments
		args args
		own  bool // its arguments are wrong in themselves
	}{
		{"other edges", 2, args{ring, []int{3, 1, 0, 2, 1, 3, 0, 2}, nil}, false},
		{"edges moved between nodes", 1, args{[]int{1, 4, 6, 8}, ringEdges, nil}, false},
		{"fewer nodes", 3, args{[]int{1, 2}, []int{1, 0}, nil}, false},
		{"reorder on one rank", 3, args{ring, ringEdges, []adi.TopoOption{adi.Reorder()}}, false},
		{"bad edges on one rank", 1, args{ring, []int{3, 1, 0, 2, 1, 3, 0, 9}, nil}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			each(t, cs, func(c *adi.Comm) error {
				a := good
				if c.Rank() == tc.odd {
					a = tc.args
				}
				g, err := c.GraphCreate(ctx, a.index, a.edges, a.opts...)
				switch {
				case g != nil:
					return errors.New("a graph from disagreeing arguments")
				case c.Rank() == tc.odd && tc.own && (err == nil || errors.Is(err, adi.ErrMismatch)):
					return fmt.Errorf("own arguments wrong: %v, want an error of its own", err)
				case (c.Rank() != tc.odd || !tc.own) && !errors.Is(err, adi.ErrMismatch):
					return fmt.Errorf("%v, want ErrMismatch", err)
				}
				return nil
			})
		})
	}
	each(t, cs, func(c *adi.Comm) error {
		g, err := c.GraphCreate(ctx, ring, ringEdges)
		if err != nil {
			return err
		}
		return g.Barrier(ctx)
	})
}

// TestGraphAsymmetric: a graph whose adjacency is not symmetric is made,
// as MPI makes it, and its queries answer, but every neighbour
// collective, in every form, fails with ErrMismatch on every rank, none
// hanging; the Graph's other collectives still go through after.
func TestGraphAsymmetric(t *testing.T) {
	for _, tc := range []graphCase{
		{"a directed ring", []int{1, 2, 3}, []int{1, 2, 0}},
		// 0 and 1 list each other twice and once.
		{"a multi-edge at one end", []int{2, 3, 4}, []int{1, 1, 0, 2}},
		// Nodes 0 and 1 are fine together; node 2 lists 1, which does
		// not list it.
		{"one node's edge", []int{1, 2, 3}, []int{1, 0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := loopJob(t, 3)
			ctx := ctxT(t)
			each(t, cs, func(c *adi.Comm) error {
				g, err := c.GraphCreate(ctx, tc.index, tc.edges)
				if err != nil {
					return err
				}
				if err := checkGraphQueries(g, tc.index, tc.edges); err != nil {
					return err
				}
				nb := adjacency(tc.index, tc.edges, g.Rank())
				k := len(nb)
				for _, form := range []struct {
					name string
					t    neighborTopo
				}{{"blocking", g}, {"nonblocking", started{g}}, {"persistent", inited{g}}} {
					calls := map[string]func() error{
						"allgather":  func() error { return form.t.NeighborAllgather(ctx, []byte{1}, make([]byte, k)) },
						"allgatherv": func() error { return form.t.NeighborAllgatherv(ctx, []byte{1}, cut(make([]byte, k), k)) },
						"alltoall":   func() error { return form.t.NeighborAlltoall(ctx, make([]byte, k), make([]byte, k)) },
						"alltoallv":  func() error { return form.t.NeighborAlltoallv(ctx, cut(make([]byte, k), k), cut(make([]byte, k), k)) },
					}
					for _, name := range []string{"allgather", "allgatherv", "alltoall", "alltoallv"} {
						if err := calls[name](); !errors.Is(err, adi.ErrMismatch) || !strings.Contains(err.Error(), "symmetric") {
							return fmt.Errorf("%s %s: %v, want ErrMismatch saying the adjacency is not symmetric", form.name, name, err)
						}
					}
				}
				all := make([]byte, g.Size())
				if err := g.Allgather(ctx, []byte{byte(g.Rank())}, all); err != nil {
					return fmt.Errorf("allgather after the refused neighbour collectives: %w", err)
				}
				if !bytes.Equal(all, []byte{0, 1, 2}) {
					return fmt.Errorf("allgather after the refused neighbour collectives: %v", all)
				}
				return nil
			})
		})
	}
}

// cut is b in k blocks of one byte each; b holds k.
func cut(b []byte, k int) [][]byte {
	out := make([][]byte, k)
	for i := range out {
		out[i] = b[i : i+1]
	}
	return out
}

// TestGraphReorder: with Reorder, GraphCreate gives the nodes to the
// first ranks' processes so that fewer edges join two hosts, and two
// sites, than the launcher's numbering does, as GraphMap says
// beforehand; every rank sees the same numbering, and the neighbour
// collectives exchange with the processes of the neighbouring nodes,
// checked by their world ranks. On one host the numbering stays.
func TestGraphReorder(t *testing.T) {
	ring8, ring8Edges := ringGraph(8)
	ring6, ring6Edges := ringGraph(6)
	// Two triangles joined by one edge (2-3), with a double edge in each.
	pairI, pairE := graphOfLists([]int{1, 2, 1}, []int{0, 2, 0}, []int{0, 1, 3}, []int{2, 4, 5, 5}, []int{3, 5}, []int{3, 4, 3})
	for _, tc := range []struct {
		name, hosts, sites string
		index, edges       []int
		// adjacency entries whose ends are on two hosts and two sites,
		// in the launcher's numbering and reordered.
		before, after [2]int
	}{
		{"ring of 8 on 2 hosts round-robin", "abababab", "", ring8, ring8Edges, [2]int{16, 0}, [2]int{4, 0}},
		{"ring of 8 on 2 sites of 2 hosts", "abcdabcd", "XXYYXXYY", ring8, ring8Edges, [2]int{16, 8}, [2]int{8, 4}},
		{"ring of 6 in a job of 7", "abbabbb", "", ring6, ring6Edges, [2]int{8, 0}, [2]int{4, 0}},
		{"two triangles round-robin", "ababab", "", pairI, pairE, [2]int{12, 0}, [2]int{2, 0}},
		{"one host", "aaaaaa", "", pairI, pairE, [2]int{0, 0}, [2]int{0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, cs := siteJob(t, tc.hosts, tc.sites)
			ctx := ctxT(t)
			n := len(tc.index)
			at := make([][]int, len(cs)) // each rank's view: node -> world rank
			each(t, cs, func(c *adi.Comm) error {
				mapped, err := adi.GraphMap(c, tc.index, tc.edges)
				if err != nil {
					return err
				}
				g, err := c.GraphCreate(ctx, tc.index, tc.edges, adi.Reorder())
				if c.Rank() >= n {
					if g != nil || err != nil || mapped != adi.Undefined {
						return fmt.Errorf("beyond the graph: %v, %v, mapped to %d", g, err, mapped)
					}
					return nil
				}
				if err != nil {
					return err
				}
				me := g.Rank()
				// Checked last, so that a rank that finds it wrong does
				// not leave the others waiting in the collectives below.
				var wrongMap error
				if mapped != me {
					wrongMap = fmt.Errorf("GraphMap said %d, GraphCreate made it %d", mapped, me)
				}
				if w, err := g.WorldRank(me); err != nil || w != c.Rank() {
					return fmt.Errorf("rank %d of the graph is world rank %d (%v)", me, w, err)
				}
				if err := checkGraphQueries(g, tc.index, tc.edges); err != nil {
					return err
				}
				all := make([]byte, n)
				if err := g.Allgather(ctx, []byte{byte(c.Rank())}, all); err != nil {
					return err
				}
				for _, b := range all {
					at[c.Rank()] = append(at[c.Rank()], int(b))
				}
				nb := adjacency(tc.index, tc.edges, me)
				got, err := worldRanks(ctx, g, c.Rank(), len(nb))
				if err != nil {
					return err
				}
				for i, r := range nb {
					if got[i] != at[c.Rank()][r] {
						return fmt.Errorf("neighbour %d (node %d) is world rank %d, want %d", i, r, got[i], at[c.Rank()][r])
					}
				}
				return errors.Join(checkNeighborCalls(ctx, g, nb, nb, graphTopoWant(tc.index, tc.edges, me), 5), wrongMap)
			})
			if t.Failed() {
				return
			}
			for r := 1; r < n; r++ {
				if !slices.Equal(at[r], at[0]) {
					t.Fatalf("rank %d sees the graph as %v, rank 0 as %v", r, at[r], at[0])
				}
			}
			if !isPerm(at[0]) {
				t.Fatalf("nodes held by world ranks %v", at[0])
			}
			adj := func(v int) []int { return adjacency(tc.index, tc.edges, v) }
			checkCrossings(t, n, tc.hosts, tc.sites, adj, at[0], tc.before, tc.after)
			if tc.after == tc.before && !slices.IsSorted(at[0]) { // a permutation (above): sorted is the identity
				t.Errorf("reordered %v where the launcher's numbering does as well", at[0])
			}
		})
	}
}

// TestTopoReorderCutShort: a CartCreate or GraphCreate with Reorder whose
// ctx has ended fails on every rank, and the ranks stay in step on c: a
// rank whose reorder stopped still takes part in the agreement, so the
// next collective matches its own messages. Ranks on two hosts, so that
// the reorder has work to do and checks ctx.
func TestTopoReorderCutShort(t *testing.T) {
	index, edges := ringGraph(4) // rank 4 is beyond the graph
	for _, tc := range []struct {
		name   string
		create func(ctx context.Context, c *adi.Comm) (any, error)
	}{
		{"cart", func(ctx context.Context, c *adi.Comm) (any, error) {
			return c.CartCreate(ctx, []int{4}, []bool{true}, adi.Reorder())
		}},
		{"graph", func(ctx context.Context, c *adi.Comm) (any, error) {
			return c.GraphCreate(ctx, index, edges, adi.Reorder())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, cs := siteJob(t, "ababa", "")
			each(t, cs, func(c *adi.Comm) error {
				ended, cancel := context.WithCancel(t.Context())
				cancel()
				if _, err := tc.create(ended, c); err == nil {
					return fmt.Errorf("create on an ended ctx succeeded")
				}
				ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
				defer cancel()
				all := make([]byte, c.Size())
				if err := c.Allgather(ctx, []byte{byte(c.Rank())}, all); err != nil {
					return fmt.Errorf("allgather after the failed create: %w", err)
				}
				if !bytes.Equal(all, []byte{0, 1, 2, 3, 4}) {
					return fmt.Errorf("allgather after the failed create: %v", all)
				}
				return nil
			})
		})
	}
}
