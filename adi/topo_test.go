package adi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
)

// block is what rank src puts in its block number slot of n bytes (slot
// 255 for a neighbour allgather, which sends one block to all).
func block(src, slot, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(src*37 + slot*11 + i)
	}
	return b
}

// untouched fills the slots of ProcNull neighbours, which must keep it.
const untouched = 0xEE

// cartNeighbors computes, from the coordinates alone, the neighbours MPI
// gives rank r of a grid: for each dimension the rank at -1, then at +1,
// ProcNull past an edge that does not wrap.
func cartNeighbors(r int, dims []int, periodic []bool) []int {
	coords := make([]int, len(dims))
	for i, x := len(dims)-1, r; i >= 0; i-- {
		coords[i], x = x%dims[i], x/dims[i]
	}
	var nb []int
	for d := range dims {
		for _, step := range []int{-1, 1} {
			x := coords[d] + step
			if x < 0 || x >= dims[d] {
				if !periodic[d] {
					nb = append(nb, adi.ProcNull)
					continue
				}
				x = (x + dims[d]) % dims[d]
			}
			at := 0
			for i := range dims {
				c := coords[i]
				if i == d {
					c = x
				}
				at = at*dims[i] + c
			}
			nb = append(nb, at)
		}
	}
	return nb
}

// neighborCalls runs the four neighbour collectives on topology t, whose
// in-neighbours are in and out-neighbours out, and checks what each
// receives against want(slot) = (the sending rank, its block number):
// for MPI, the block of a Cart neighbour sent in the opposite direction,
// the block of a graph's k-th edge from that rank. base is a block's
// length in bytes; the v forms add its index to it.
type neighborTopo interface {
	NeighborAllgather(ctx context.Context, send, recv []byte) error
	NeighborAllgatherv(ctx context.Context, send []byte, recv [][]byte) error
	NeighborAlltoall(ctx context.Context, send, recv []byte) error
	NeighborAlltoallv(ctx context.Context, send, recv [][]byte) error
	Rank() int
}

// started is a topology whose neighbour collectives are its nonblocking
// ones, each started and waited for.
type started struct {
	t interface {
		IneighborAllgather(send, recv []byte) (*adi.Request, error)
		IneighborAllgatherv(send []byte, recv [][]byte) (*adi.Request, error)
		IneighborAlltoall(send, recv []byte) (*adi.Request, error)
		IneighborAlltoallv(send, recv [][]byte) (*adi.Request, error)
		Rank() int
	}
}

func wait(ctx context.Context, q *adi.Request, err error) error {
	if err != nil {
		return err
	}
	_, err = q.Wait(ctx)
	return err
}

func (s started) NeighborAllgather(ctx context.Context, send, recv []byte) error {
	q, err := s.t.IneighborAllgather(send, recv)
	return wait(ctx, q, err)
}

func (s started) NeighborAllgatherv(ctx context.Context, send []byte, recv [][]byte) error {
	q, err := s.t.IneighborAllgatherv(send, recv)
	return wait(ctx, q, err)
}

func (s started) NeighborAlltoall(ctx context.Context, send, recv []byte) error {
	q, err := s.t.IneighborAlltoall(send, recv)
	return wait(ctx, q, err)
}

func (s started) NeighborAlltoallv(ctx context.Context, send, recv [][]byte) error {
	q, err := s.t.IneighborAlltoallv(send, recv)
	return wait(ctx, q, err)
}

func (s started) Rank() int { return s.t.Rank() }

func checkNeighborCalls(ctx context.Context, t neighborTopo, in, out []int, want func(slot int) (src, blk int), base int) error {
	me := t.Rank()
	// Allgather: every in-neighbour's one block.
	recv := bytes.Repeat([]byte{untouched}, len(in)*base)
	if err := t.NeighborAllgather(ctx, block(me, 255, base), recv); err != nil {
		return err
	}
	for s, src := range in {
		got, exp := recv[s*base:(s+1)*base], block(src, 255, base)
		if src == adi.ProcNull {
			exp = bytes.Repeat([]byte{untouched}, base)
		}
		if !bytes.Equal(got, exp) {
			return fmt.Errorf("allgather slot %d from %d: %v, want %v", s, src, got, exp)
		}
	}
	// Allgatherv: rank r sends base+r bytes.
	vrecv := make([][]byte, len(in))
	for s, src := range in {
		vrecv[s] = []byte{}
		if src != adi.ProcNull {
			vrecv[s] = make([]byte, base+src)
		}
	}
	if err := t.NeighborAllgatherv(ctx, block(me, 255, base+me), vrecv); err != nil {
		return err
	}
	for s, src := range in {
		if src != adi.ProcNull && !bytes.Equal(vrecv[s], block(src, 255, base+src)) {
			return fmt.Errorf("allgatherv slot %d from %d: %v", s, src, vrecv[s])
		}
	}
	// Alltoall: block s to out-neighbour s.
	send := make([]byte, 0, len(out)*base)
	for s := range out {
		send = append(send, block(me, s, base)...)
	}
	recv = bytes.Repeat([]byte{untouched}, len(in)*base)
	if err := t.NeighborAlltoall(ctx, send, recv); err != nil {
		return err
	}
	for s, src := range in {
		exp := bytes.Repeat([]byte{untouched}, base)
		if src != adi.ProcNull {
			from, blk := want(s)
			exp = block(from, blk, base)
		}
		if got := recv[s*base : (s+1)*base]; !bytes.Equal(got, exp) {
			return fmt.Errorf("alltoall slot %d from %d: %v, want %v", s, src, got, exp)
		}
	}
	// Alltoallv: block s is base+s bytes long.
	vsend := make([][]byte, len(out))
	for s := range out {
		vsend[s] = block(me, s, base+s)
	}
	for s, src := range in {
		vrecv[s] = []byte{}
		if src != adi.ProcNull {
			_, blk := want(s)
			vrecv[s] = make([]byte, base+blk)
		}
	}
	if err := t.NeighborAlltoallv(ctx, vsend, vrecv); err != nil {
		return err
	}
	for s, src := range in {
		if src == adi.ProcNull {
			continue
		}
		from, blk := want(s)
		if exp := block(from, blk, base+blk); !bytes.Equal(vrecv[s], exp) {
			return fmt.Errorf("alltoallv slot %d from %d: %v, want %v", s, src, vrecv[s], exp)
		}
	}
	return nil
}

// TestCartNeighborCollectives checks the neighbour collectives on grids
// against MPI: slots 2d and 2d+1 belong to the -1 and +1 neighbours along
// dimension d, ProcNull slots are left alone, and the block a rank sends
// towards -1 lands in its neighbour's +1 slot and the other way round
// (block s in slot s^1), also where both neighbours are one rank: a
// periodic dimension of 2, or of 1, where a rank is its own neighbour
// twice over (mpi-forum/mpi-issues#153).
func TestCartNeighborCollectives(t *testing.T) {
	for _, tc := range []struct {
		ranks    int
		dims     []int
		periodic []bool
	}{
		{1, []int{1}, []bool{true}},
		{1, []int{1}, []bool{false}},
		{2, []int{2}, []bool{true}},
		{2, []int{2}, []bool{false}},
		{3, []int{3}, []bool{true}},
		{3, []int{3}, []bool{false}},
		{4, []int{1, 4}, []bool{true, true}},
		{4, []int{2, 2}, []bool{true, false}},
		{6, []int{2, 3}, []bool{true, false}},
		{6, []int{3, 2}, []bool{false, true}},
		{5, []int{2, 1, 2}, []bool{true, true, false}}, // rank 4 is off the grid
	} {
		t.Run(fmt.Sprintf("%d/%v/%v", tc.ranks, tc.dims, tc.periodic), func(t *testing.T) {
			cs := loopJob(t, tc.ranks)
			ctx := ctxT(t)
			each(t, cs, func(c *adi.Comm) error {
				grid, err := c.CartCreate(ctx, tc.dims, tc.periodic)
				if err != nil || grid == nil {
					return err
				}
				nb := cartNeighbors(grid.Rank(), tc.dims, tc.periodic)
				if got := grid.Neighbors(); !slices.Equal(got, nb) {
					return fmt.Errorf("neighbours %v, want %v", got, nb)
				}
				for _, base := range []int{0, 5, 700} { // 700: by rendezvous
					want := func(s int) (int, int) { return nb[s], s ^ 1 }
					if err := checkNeighborCalls(ctx, grid, nb, nb, want, base); err != nil {
						return fmt.Errorf("blocks of %d bytes: %w", base, err)
					}
					if err := checkNeighborCalls(ctx, started{grid}, nb, nb, want, base); err != nil {
						return fmt.Errorf("nonblocking, blocks of %d bytes: %w", base, err)
					}
				}
				return nil
			})
		})
	}
}

// graphEdges is a multigraph on 5 ranks, in the order each source lists
// its destinations: repeated edges (0->1 three times, 3->3 twice), self
// loops, and rank 4 without any edge.
var graphEdges = [][2]int{{0, 1}, {1, 2}, {0, 1}, {2, 0}, {3, 3}, {3, 0}, {2, 2}, {1, 0}, {0, 3}, {3, 3}, {0, 1}}

// graphLists returns rank r's sources and destinations in graphEdges; the
// sources are listed in reverse, so that the k-th edge between two ranks
// is not the k-th in either list by accident.
func graphLists(r int) (sources, dests []int) {
	for _, e := range graphEdges {
		if e[0] == r {
			dests = append(dests, e[1])
		}
		if e[1] == r {
			sources = append(sources, e[0])
		}
	}
	slices.Reverse(sources)
	return sources, dests
}

// TestDistGraphNeighborCollectives checks the neighbour collectives on a
// distributed graph against MPI: slot j gets the block of the k-th edge
// from its source to this rank, where this rank's source j is the k-th
// time that source appears among its sources.
func TestDistGraphNeighborCollectives(t *testing.T) {
	cs := loopJob(t, 5)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		sources, dests := graphLists(c.Rank())
		g, err := c.DistGraphCreateAdjacent(ctx, sources, dests)
		if err != nil {
			return err
		}
		if s, d := g.Neighbors(); !slices.Equal(s, sources) || !slices.Equal(d, dests) {
			return fmt.Errorf("neighbours %v %v, want %v %v", s, d, sources, dests)
		}
		want := graphWant(c.Rank(), sources)
		for _, base := range []int{0, 3, 700} {
			if err := checkNeighborCalls(ctx, g, sources, dests, want, base); err != nil {
				return fmt.Errorf("blocks of %d bytes: %w", base, err)
			}
			if err := checkNeighborCalls(ctx, started{g}, sources, dests, want, base); err != nil {
				return fmt.Errorf("nonblocking, blocks of %d bytes: %w", base, err)
			}
		}
		// The graph communicator is a communicator of its own.
		return g.Barrier(ctx)
	})
}

// graphWant says where the block in rank me's receive slot j comes from
// in graphEdges, me having sources: the rank that sends it and its block
// number there, the index in its dests of the edge, which is the k-th
// edge from it to me when sources[j] is the k-th time it is listed.
func graphWant(me int, sources []int) func(j int) (src, blk int) {
	return func(j int) (int, int) {
		src := sources[j]
		k := 0 // earlier appearances of src
		for _, s := range sources[:j] {
			if s == src {
				k++
			}
		}
		_, theirs := graphLists(src)
		for i, d := range theirs {
			if d == me {
				if k == 0 {
					return src, i
				}
				k--
			}
		}
		panic("no such edge") // the test's own graph is wrong
	}
}

// graphWeights weighs the edges of graphLists(r): edge i of graphEdges
// weighs i+1, so that no two edges between two ranks weigh the same, and
// each source's weight is that of the edge graphWant pairs it with.
func graphWeights(r int) (sources, dests []int) {
	out := func(r int) (dests []int) {
		for i, e := range graphEdges {
			if e[0] == r {
				dests = append(dests, i+1)
			}
		}
		return dests
	}
	in, _ := graphLists(r)
	from := graphWant(r, in)
	for j := range in {
		src, blk := from(j)
		sources = append(sources, out(src)[blk])
	}
	return sources, out(r)
}

// worldRanks sends each neighbour of t this rank's world rank and returns
// those its in-neighbours sent, -1 for ProcNull.
func worldRanks(ctx context.Context, t interface {
	NeighborAllgather(ctx context.Context, send, recv []byte) error
}, me, in int) ([]int, error) {
	recv := bytes.Repeat([]byte{0xFF}, in)
	if err := t.NeighborAllgather(ctx, []byte{byte(me)}, recv); err != nil {
		return nil, err
	}
	got := make([]int, in)
	for i, b := range recv {
		got[i] = int(int8(b))
	}
	return got, nil
}

// TestCartReorder: with Reorder, CartCreate gives the grid's positions to
// the ranks so that fewer grid edges join two hosts, and two sites, than
// the launcher's numbering does; every rank agrees on who sits where,
// Coords and RankOf fit the new ranks, and the neighbour collectives
// exchange with the processes at the neighbouring positions, checked by
// their world ranks.
func TestCartReorder(t *testing.T) {
	for _, tc := range []struct {
		name, hosts, sites string
		dims               []int
		periodic           []bool
		// grid edges between hosts and between sites, in the launcher's
		// numbering and reordered.
		before, after [2]int
	}{
		{"ring of 8 on 2 hosts round-robin", "abababab", "", []int{8}, []bool{true}, [2]int{8, 0}, [2]int{2, 0}},
		{"4x4 on 4 hosts round-robin", "abcdabcdabcdabcd", "", []int{4, 4}, []bool{false, false}, [2]int{12, 0}, [2]int{8, 0}},
		{"2x4 torus on 2 sites of 2 hosts", "abcdabcd", "XYXYXYXY", []int{2, 4}, []bool{true, true}, [2]int{8, 8}, [2]int{8, 4}},
		// Rank 6 is off the grid: the grid's 6 ranks share 2 hosts of 2
		// and 4, the ring cut twice.
		{"ring of 6 in a job of 7", "abbabbb", "", []int{6}, []bool{true}, [2]int{4, 0}, [2]int{2, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, cs := siteJob(t, tc.hosts, tc.sites)
			ctx := ctxT(t)
			n := 1
			for _, d := range tc.dims {
				n *= d
			}
			at := make([][]int, len(cs)) // each rank's view: position -> world rank
			each(t, cs, func(c *adi.Comm) error {
				grid, err := c.CartCreate(ctx, tc.dims, tc.periodic, adi.Reorder())
				if c.Rank() >= n {
					if grid != nil || err != nil {
						return fmt.Errorf("off the grid: %v, %v", grid, err)
					}
					return nil
				}
				if err != nil {
					return err
				}
				me := grid.Rank()
				if w, err := grid.WorldRank(me); err != nil || w != c.Rank() {
					return fmt.Errorf("rank %d of the grid is world rank %d (%v)", me, w, err)
				}
				coords, err := grid.Coords(me)
				if err != nil {
					return err
				}
				if r, err := grid.RankOf(coords); err != nil || r != me {
					return fmt.Errorf("coords %v of rank %d are rank %d's (%v)", coords, me, r, err)
				}
				all := make([]byte, n)
				if err := grid.Allgather(ctx, []byte{byte(c.Rank())}, all); err != nil {
					return err
				}
				for _, b := range all {
					at[c.Rank()] = append(at[c.Rank()], int(b))
				}
				nb := cartNeighbors(me, tc.dims, tc.periodic)
				if got := grid.Neighbors(); !slices.Equal(got, nb) {
					return fmt.Errorf("neighbours %v, want %v", got, nb)
				}
				got, err := worldRanks(ctx, grid, c.Rank(), len(nb))
				if err != nil {
					return err
				}
				for i, r := range nb {
					if want := -1; r != adi.ProcNull && got[i] != at[c.Rank()][r] || r == adi.ProcNull && got[i] != want {
						return fmt.Errorf("neighbour %d (rank %d) is world rank %d, want %v", i, r, got[i], at[c.Rank()])
					}
				}
				return checkNeighborCalls(ctx, grid, nb, nb, func(s int) (int, int) { return nb[s], s ^ 1 }, 5)
			})
			if t.Failed() {
				return
			}
			for r := 1; r < n; r++ {
				if !slices.Equal(at[r], at[0]) {
					t.Fatalf("rank %d sees the grid as %v, rank 0 as %v", r, at[r], at[0])
				}
			}
			if !isPerm(at[0]) {
				t.Fatalf("positions held by world ranks %v", at[0])
			}
			// Each grid edge once: a node's + neighbour along every dimension.
			plus := func(p int) []int {
				nb := cartNeighbors(p, tc.dims, tc.periodic)
				var out []int
				for d := range tc.dims {
					out = append(out, nb[2*d+1])
				}
				return out
			}
			checkCrossings(t, n, tc.hosts, tc.sites, plus, at[0], tc.before, tc.after)
		})
	}
}

// checkCrossings checks how many of the edges of n nodes (node v's
// neighbours are nb(v); ProcNull for none) join two hosts and two sites
// under the launcher's numbering (before) and under reordered, which
// holds the world rank of each node (after).
func checkCrossings(t *testing.T, n int, hosts, sites string, nb func(v int) []int, reordered []int, before, after [2]int) {
	t.Helper()
	cross := func(proc []int) (h, s int) {
		for v := range n {
			for _, u := range nb(v) {
				if u == adi.ProcNull || hosts[proc[v]] == hosts[proc[u]] {
					continue
				}
				h++
				if sites != "" && sites[proc[v]] != sites[proc[u]] {
					s++
				}
			}
		}
		return h, s
	}
	id := make([]int, n)
	for i := range id {
		id[i] = i
	}
	if h, s := cross(id); [2]int{h, s} != before {
		t.Errorf("launcher's numbering crosses hosts %d and sites %d times, want %v", h, s, before)
	}
	if h, s := cross(reordered); [2]int{h, s} != after {
		t.Errorf("reordered %v crosses hosts %d and sites %d times, want %v", reordered, h, s, after)
	}
}

// isPerm reports whether p holds 0..len(p)-1 once each.
func isPerm(p []int) bool {
	return slices.Equal(slices.Sorted(slices.Values(p)), func() []int {
		id := make([]int, len(p))
		for i := range id {
			id[i] = i
		}
		return id
	}())
}

// TestCartReorderArguments: Weights on a grid, and Reorder on some ranks
// only, fail on every rank.
func TestCartReorderArguments(t *testing.T) {
	_, cs := siteJob(t, "abab", "")
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		_, err := c.CartCreate(ctx, []int{4}, []bool{true}, adi.Reorder(), adi.Weights(nil, nil))
		if err == nil || errors.Is(err, adi.ErrMismatch) {
			return fmt.Errorf("with weights: %v, want an error of this rank's own", err)
		}
		var opts []adi.TopoOption
		if c.Rank() == 2 {
			opts = append(opts, adi.Reorder())
		}
		if _, err := c.CartCreate(ctx, []int{4}, []bool{true}, opts...); !errors.Is(err, adi.ErrMismatch) {
			return fmt.Errorf("reorder on rank 2 only: %v, want ErrMismatch", err)
		}
		_, err = c.CartCreate(ctx, []int{4}, []bool{true}, adi.Reorder())
		return err
	})
}

// TestDistGraphReorder: with Reorder, DistGraphCreateAdjacent numbers the
// ranks host by host, each process keeps the lists and weights it passed,
// renumbered, and the neighbour collectives deliver to the same processes
// as without Reorder, checked by their world ranks.
func TestDistGraphReorder(t *testing.T) {
	for _, tc := range []struct {
		name, hosts, sites string
		order              []int // world rank of each new rank
	}{
		{"2 hosts round-robin", "ababa", "", []int{0, 2, 4, 1, 3}},
		{"2 sites", "abcab", "XYXXY", []int{0, 3, 2, 1, 4}}, // a and c in X, b in Y
		{"in blocks already", "aabbb", "", []int{0, 1, 2, 3, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, cs := siteJob(t, tc.hosts, tc.sites)
			ctx := ctxT(t)
			each(t, cs, func(c *adi.Comm) error {
				sources, dests := graphLists(c.Rank())
				sw, dw := graphWeights(c.Rank())
				g, err := c.DistGraphCreateAdjacent(ctx, sources, dests, adi.Reorder(), adi.Weights(sw, dw))
				if err != nil {
					return err
				}
				if want := slices.Index(tc.order, c.Rank()); g.Rank() != want {
					return fmt.Errorf("new rank %d, want %d", g.Rank(), want)
				}
				for i, w := range tc.order {
					if got, err := g.WorldRank(i); err != nil || got != w {
						return fmt.Errorf("rank %d of the graph is world rank %d (%v), want %d", i, got, err, w)
					}
				}
				gs, gd := g.Neighbors()
				for _, l := range [][2][]int{{gs, sources}, {gd, dests}} {
					for i, r := range l[0] {
						if w, err := g.WorldRank(r); err != nil || w != l[1][i] {
							return fmt.Errorf("neighbours %v are world ranks ... %d at %d, want %v", l[0], w, i, l[1])
						}
					}
				}
				if s, d := g.Weights(); !slices.Equal(s, sw) || !slices.Equal(d, dw) {
					return fmt.Errorf("weights %v %v, want %v %v", s, d, sw, dw)
				}
				got, err := worldRanks(ctx, g, c.Rank(), len(gs))
				if err != nil {
					return err
				}
				if !slices.Equal(got, sources) {
					return fmt.Errorf("received from world ranks %v, want %v", got, sources)
				}
				old := graphWant(c.Rank(), sources)
				want := func(j int) (int, int) {
					_, blk := old(j)
					return gs[j], blk
				}
				if err := checkNeighborCalls(ctx, g, gs, gd, want, 3); err != nil {
					return err
				}
				return checkNeighborCalls(ctx, started{g}, gs, gd, want, 700)
			})
		})
	}
}

// TestDistGraphWeights: weights that the two ends of an edge do not give
// alike, or in another order, or Reorder on some ranks only, fail with
// ErrMismatch on every rank; weights that are wrong fail on their rank
// with an error of its own; weights of 1 agree with none.
func TestDistGraphWeights(t *testing.T) {
	_, cs := siteJob(t, "abab", "")
	ctx := ctxT(t)
	// A ring with a double edge from each rank to the next.
	ring := func(r int) (sources, dests []int) {
		return []int{(r + 3) % 4, (r + 3) % 4}, []int{(r + 1) % 4, (r + 1) % 4}
	}
	for _, tc := range []struct {
		name string
		opts func(r int) []adi.TopoOption
		own  int // the rank whose own arguments are wrong, -1 for none
		ok   bool
	}{
		{"alike", func(r int) []adi.TopoOption { return []adi.TopoOption{adi.Weights([]int{2, 3}, []int{2, 3})} }, -1, true},
		{"ones and none", func(r int) []adi.TopoOption {
			if r == 1 {
				return []adi.TopoOption{adi.Weights([]int{1, 1}, []int{1, 1})}
			}
			return nil
		}, -1, true},
		{"one weight differs", func(r int) []adi.TopoOption {
			if r == 2 {
				return []adi.TopoOption{adi.Weights([]int{2, 3}, []int{2, 4})}
			}
			return []adi.TopoOption{adi.Weights([]int{2, 3}, []int{2, 3})}
		}, -1, false},
		{"order differs", func(r int) []adi.TopoOption {
			if r == 0 {
				return []adi.TopoOption{adi.Weights([]int{2, 3}, []int{3, 2})}
			}
			return []adi.TopoOption{adi.Weights([]int{2, 3}, []int{2, 3})}
		}, -1, false},
		{"reorder on one rank", func(r int) []adi.TopoOption {
			if r == 3 {
				return []adi.TopoOption{adi.Reorder()}
			}
			return nil
		}, -1, false},
		{"negative", func(r int) []adi.TopoOption {
			if r == 1 {
				return []adi.TopoOption{adi.Weights([]int{-1, 1}, []int{1, 1})}
			}
			return nil
		}, 1, false},
		{"too few", func(r int) []adi.TopoOption {
			if r == 3 {
				return []adi.TopoOption{adi.Weights([]int{1, 1}, []int{1})}
			}
			return nil
		}, 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			each(t, cs, func(c *adi.Comm) error {
				s, d := ring(c.Rank())
				g, err := c.DistGraphCreateAdjacent(ctx, s, d, tc.opts(c.Rank())...)
				switch {
				case tc.ok && err != nil:
					return err
				case tc.ok:
					if _, dw := g.Weights(); len(dw) != 2 {
						return fmt.Errorf("weights %v", dw)
					}
				case c.Rank() == tc.own && (err == nil || errors.Is(err, adi.ErrMismatch)):
					return fmt.Errorf("own weights wrong: %v, want an error of its own", err)
				case c.Rank() != tc.own && !errors.Is(err, adi.ErrMismatch):
					return fmt.Errorf("%v, want ErrMismatch", err)
				}
				return nil
			})
		})
	}
}

// TestDistGraphSelfEdges: a rank's edges to itself that its two lists
// weigh otherwise, or list another number of times, are its own error,
// not ErrMismatch (no other rank disagrees), and ErrMismatch on the
// others; weighed alike they go through. The first case is the ring of
// ExampleReorder on one rank, whose left and right are itself.
func TestDistGraphSelfEdges(t *testing.T) {
	ring := func(c *adi.Comm) (sources, dests []int) {
		n, me := c.Size(), c.Rank()
		left, right := (me+n-1)%n, (me+1)%n
		return []int{left, right}, []int{left, right}
	}
	for _, tc := range []struct {
		name  string
		ranks int
		// lists and weights of rank r; own is the rank whose own
		// arguments are wrong, -1 for none.
		args func(c *adi.Comm) (sources, dests []int, opts []adi.TopoOption)
		own  int
	}{
		{"weighted ring on one rank", 1, func(c *adi.Comm) ([]int, []int, []adi.TopoOption) {
			s, d := ring(c)
			return s, d, []adi.TopoOption{adi.Weights([]int{2, 1}, []int{1, 2}), adi.Reorder()}
		}, 0},
		{"self-edge weighed otherwise", 3, func(c *adi.Comm) ([]int, []int, []adi.TopoOption) {
			s, d := ring(c)
			sw, dw := []int{1, 1}, []int{1, 1}
			if c.Rank() == 1 {
				s, d = append(s, 1, 1), append(d, 1, 1)
				sw, dw = append(sw, 5, 6), append(dw, 6, 5)
			}
			return s, d, []adi.TopoOption{adi.Weights(sw, dw)}
		}, 1},
		{"self-edge among dests only", 3, func(c *adi.Comm) ([]int, []int, []adi.TopoOption) {
			s, d := ring(c)
			if c.Rank() == 2 {
				d = append(d, 2)
			}
			return s, d, nil
		}, 2},
		{"self-edges weighed alike", 3, func(c *adi.Comm) ([]int, []int, []adi.TopoOption) {
			s, d := ring(c)
			sw, dw := []int{1, 1}, []int{1, 1}
			if c.Rank() == 0 {
				s, d = append(s, 0, 0), append(d, 0, 0)
				sw, dw = append(sw, 5, 6), append(dw, 5, 6)
			}
			return s, d, []adi.TopoOption{adi.Weights(sw, dw)}
		}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := loopJob(t, tc.ranks)
			ctx := ctxT(t)
			each(t, cs, func(c *adi.Comm) error {
				s, d, opts := tc.args(c)
				_, err := c.DistGraphCreateAdjacent(ctx, s, d, opts...)
				switch {
				case tc.own < 0:
					return err
				case c.Rank() == tc.own && (err == nil || errors.Is(err, adi.ErrMismatch)):
					return fmt.Errorf("own self-edges wrong: %v, want an error of its own", err)
				case c.Rank() != tc.own && !errors.Is(err, adi.ErrMismatch):
					return fmt.Errorf("%v, want ErrMismatch", err)
				}
				return nil
			})
		})
	}
}

// TestDistGraphDisagree: lists that do not fit together, or name a rank
// outside the communicator, fail on every rank.
func TestDistGraphDisagree(t *testing.T) {
	cs := loopJob(t, 4)
	ctx := ctxT(t)
	ring := func(r int) (sources, dests []int) { return []int{(r + 3) % 4}, []int{(r + 1) % 4} }
	for _, tc := range []struct {
		name  string
		lists func(r int) (sources, dests []int)
		own   int // the rank whose own lists are wrong, -1 for none
	}{
		{"edge not received", func(r int) ([]int, []int) {
			s, d := ring(r)
			if r == 0 {
				d = append(d, 2) // rank 2 does not list 0 among its sources
			}
			return s, d
		}, -1},
		{"edge counted twice", func(r int) ([]int, []int) {
			s, d := ring(r)
			if r == 2 {
				s = append(s, 1) // rank 1 sends to 2 only once
			}
			return s, d
		}, -1},
		{"rank outside", func(r int) ([]int, []int) {
			s, d := ring(r)
			if r == 3 {
				d = append(d, 4)
			}
			return s, d
		}, 3},
		{"negative rank", func(r int) ([]int, []int) {
			s, d := ring(r)
			if r == 1 {
				s = append(s, adi.ProcNull)
			}
			return s, d
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			each(t, cs, func(c *adi.Comm) error {
				s, d := tc.lists(c.Rank())
				_, err := c.DistGraphCreateAdjacent(ctx, s, d)
				switch {
				case c.Rank() == tc.own && !errors.Is(err, adi.ErrRank):
					return fmt.Errorf("own lists wrong: %v, want ErrRank", err)
				case c.Rank() != tc.own && !errors.Is(err, adi.ErrMismatch):
					return fmt.Errorf("%v, want ErrMismatch", err)
				}
				return nil
			})
		})
	}
	// The ring itself is fine, after all that.
	each(t, cs, func(c *adi.Comm) error {
		s, d := ring(c.Rank())
		_, err := c.DistGraphCreateAdjacent(ctx, s, d)
		return err
	})
}

// TestNeighborArguments: buffers that do not fit the neighbourhood are
// refused on every rank, and the next call goes through.
func TestNeighborArguments(t *testing.T) {
	cs := loopJob(t, 3)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		grid, err := c.CartCreate(ctx, []int{3}, []bool{true})
		if err != nil {
			return err
		}
		for name, call := range map[string]func() error{
			"allgather short":   func() error { return grid.NeighborAllgather(ctx, make([]byte, 4), make([]byte, 7)) },
			"alltoall uneven":   func() error { return grid.NeighborAlltoall(ctx, make([]byte, 5), make([]byte, 5)) },
			"alltoall lengths":  func() error { return grid.NeighborAlltoall(ctx, make([]byte, 4), make([]byte, 6)) },
			"allgatherv slots":  func() error { return grid.NeighborAllgatherv(ctx, nil, make([][]byte, 3)) },
			"alltoallv blocks":  func() error { return grid.NeighborAlltoallv(ctx, make([][]byte, 1), make([][]byte, 2)) },
			"alltoallv to many": func() error { return grid.NeighborAlltoallv(ctx, make([][]byte, 3), make([][]byte, 2)) },
		} {
			if err := call(); err == nil {
				return fmt.Errorf("%s: no error", name)
			}
		}
		// A rank that receives a block of another length than its slot
		// says so.
		n := 4
		if c.Rank() == 1 {
			n = 2
		}
		err = grid.NeighborAllgather(ctx, make([]byte, n), make([]byte, 2*n))
		if !errors.Is(err, adi.ErrMismatch) {
			return fmt.Errorf("blocks of %d bytes on rank 1, 4 elsewhere: %v, want ErrMismatch", n, err)
		}
		if err := grid.NeighborAllgather(ctx, []byte{byte(c.Rank())}, make([]byte, 2)); err != nil {
			return err
		}
		// Rank 0 alone passes buffers that do not fit; the others give up
		// waiting for it. Its call still counts as a collective, so the
		// next one finds every rank in step.
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		recv := 2
		if c.Rank() == 0 {
			recv = 3
		}
		if err := grid.NeighborAllgather(short, []byte{1}, make([]byte, recv)); err == nil {
			return errors.New("neighbour allgather with rank 0's buffers wrong: no error")
		}
		all := make([]byte, 3)
		if err := grid.Allgather(ctx, []byte{byte(c.Rank())}, all); err != nil {
			return fmt.Errorf("allgather after a neighbour collective that failed: %w", err)
		}
		if !bytes.Equal(all, []byte{0, 1, 2}) {
			return fmt.Errorf("allgather after a neighbour collective that failed: %v", all)
		}
		return nil
	})
}

// TestNeighborNonblockingTogether: nonblocking neighbour collectives in
// flight together each get their own blocks.
func TestNeighborNonblockingTogether(t *testing.T) {
	cs := loopJob(t, 3)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		ring, err := c.CartCreate(ctx, []int{3}, []bool{true})
		if err != nil {
			return err
		}
		me := byte(c.Rank())
		left, right := (me+2)%3, (me+1)%3
		gathered, swapped := make([]byte, 2), make([]byte, 2)
		q1, err1 := ring.IneighborAllgather([]byte{me}, gathered)
		q2, err2 := ring.IneighborAlltoall([]byte{10 + me, 20 + me}, swapped) // to the left, to the right
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		if _, err := adi.WaitAll(ctx, q2, q1); err != nil {
			return err
		}
		// From the left its block for the right, from the right its block for the left.
		if want := []byte{left, right, 20 + left, 10 + right}; !bytes.Equal(append(gathered, swapped...), want) {
			return fmt.Errorf("allgather %v and alltoall %v, want %v", gathered, swapped, want)
		}
		return nil
	})
}
