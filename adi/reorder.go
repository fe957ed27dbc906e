package adi

import (
	"context"
	"slices"
)

// Rank reordering for topologies: the reorder flag of MPI_Cart_create,
// here the Reorder option. Between hosts a message costs one or two orders
// of magnitude more than within one, and between sites more again
// (hostcoll.go), so a grid whose neighbours sit on one host exchanges its
// halos mostly through shared memory. A launcher places ranks without
// knowing the grid an application will lay over them: round-robin
// placement of a ring of 8 on two hosts puts every ring edge between the
// hosts, where a ring cut into two halves crosses twice.
//
// The code here is pure: from where the processes live (a placement, which
// every rank knows since Init) and a graph of vertices (grid positions),
// it chooses which process takes each vertex, the same on every rank, with
// no randomness and no map iteration. The cost of an assignment is the
// weight of its edges times hostCrossCost for an edge between two hosts of
// one site and siteCrossCost for one between sites; edges within a host
// cost nothing. Candidates are cut by recursive bisection, sites first and
// then hosts, into bins of the sizes the placement gives: by coordinates
// (the longest extent halved, boxes where sizes allow), and by growing
// and refining parts of the grid's graph, which ignores coordinates and
// beats the boxes on about half of small random placements, where host
// sizes do not fit the grid. The cheapest candidate wins, the identity on
// ties, so reordering never makes the cost worse. Both take about n log n
// per level of bins for n positions; every rank computes them.
//
// Cart and Graph (graphtopo.go, by the graph's partition alone) use
// this: a DistGraph's edges are the processes' own, so no numbering of it
// changes which of them cross between hosts (graph.go).

// Costs of a unit of edge weight by what the edge crosses. Their ratio is
// what matters: it makes one edge between sites worth cutting several
// between hosts to avoid. They are no measurement, only an order of
// magnitude: shared memory against a LAN against a WAN.
const (
	hostCrossCost = 1
	siteCrossCost = 16
)

// placement is where a communicator's processes live, indexed by their
// rank in it: hosts are numbered in order of their first process, and
// sites in order of their first host. A host's site is the one its first
// process names, as hostMaps takes it.
type placement struct {
	host []int // process -> host
	site []int // host -> site
}

// newPlacement numbers the hosts and sites that the processes name,
// hosts[p] and sites[p] for process p.
func newPlacement(hosts, sites []string) placement {
	pl := placement{host: make([]int, len(hosts))}
	hostID, siteID := make(map[string]int), make(map[string]int)
	for p, h := range hosts {
		id, ok := hostID[h]
		if !ok {
			id = len(pl.site)
			hostID[h] = id
			s, ok := siteID[sites[p]]
			if !ok {
				s = len(siteID)
				siteID[sites[p]] = s
			}
			pl.site = append(pl.site, s)
		}
		pl.host[p] = id
	}
	return pl
}

// placementOf is the placement of the first n ranks of c.
func placementOf(c *Comm, n int) placement {
	hosts, sites := make([]string, n), make([]string, n)
	for r := range n {
		hosts[r], sites[r] = c.w.dev.Host(c.ranks[r]), c.w.dev.Site(c.ranks[r])
	}
	return newPlacement(hosts, sites)
}

// topoEdge is an edge between vertices a and b of a topology, of weight w
// (non-negative). Its direction does not matter for the cost: a message
// costs the same either way.
type topoEdge struct {
	a, b int
	w    int64
}

// crossing sums the weights of the edges whose ends' processes, procOf[a]
// and procOf[b], are on different hosts (hosts) and on different sites
// (sites, which hosts includes).
func (pl placement) crossing(edges []topoEdge, procOf []int) (hosts, sites int64) {
	for _, e := range edges {
		ha, hb := pl.host[procOf[e.a]], pl.host[procOf[e.b]]
		if ha == hb {
			continue
		}
		hosts += e.w
		if pl.site[ha] != pl.site[hb] {
			sites += e.w
		}
	}
	return hosts, sites
}

// cost is what the edges cost with vertex v on process procOf[v].
func (pl placement) cost(edges []topoEdge, procOf []int) int64 {
	hosts, sites := pl.crossing(edges, procOf)
	return (hosts-sites)*hostCrossCost + sites*siteCrossCost
}

// identity places vertex v on process v.
func identity(n int) []int {
	id := make([]int, n)
	for i := range id {
		id[i] = i
	}
	return id
}

// cheapest returns the candidate of least cost, the earliest of those
// that tie.
func (pl placement) cheapest(edges []topoEdge, candidates ...[]int) []int {
	best, least := candidates[0], pl.cost(edges, candidates[0])
	for _, c := range candidates[1:] {
		if cost := pl.cost(edges, c); cost < least {
			best, least = c, cost
		}
	}
	return best
}

// gridEdges are the edges of a grid of dims, row-major, each position to
// the next along every dimension, wrapping where periodic: one edge per
// pair of neighbours, two between the ranks of a periodic dimension of 2
// (each is the other's neighbour on both sides), none along a dimension
// of 1 (a rank's own neighbour costs nothing).
func gridEdges(dims []int, periodic []bool) []topoEdge {
	n := 1
	for _, d := range dims {
		n *= d
	}
	var edges []topoEdge
	stride := n
	for d, size := range dims {
		stride /= size // of dimension d in row-major order
		for v := range n {
			x := v / stride % size
			switch {
			case x+1 < size:
				edges = append(edges, topoEdge{v, v + stride, 1})
			case periodic[d] && size > 1:
				edges = append(edges, topoEdge{v, v - x*stride, 1})
			}
		}
	}
	return edges
}

// mapGrid chooses which process takes each position of a grid of dims
// (row-major): procOf[v] is the process at position v, a permutation of
// the processes that pl places, as many as the grid has positions. It
// checks ctx between bisections and returns its error once it is done.
func (pl placement) mapGrid(ctx context.Context, dims []int, periodic []bool) ([]int, error) {
	n := len(pl.host)
	edges := gridEdges(dims, periodic)
	id := identity(n)
	if len(pl.site) < 2 || len(edges) == 0 {
		return id, nil
	}
	tree := pl.bins()
	boxes := make([]int, n)
	if err := spread(ctx, identity(n), tree, gridBisector(dims), boxes); err != nil {
		return nil, err
	}
	part, err := pl.partition(ctx, edges, tree)
	if err != nil {
		return nil, err
	}
	return pl.cheapest(edges, id, boxes, part), nil
}

// partition places the vertices of the graph of edges by bisecting the
// graph into tree's bins.
func (pl placement) partition(ctx context.Context, edges []topoEdge, tree *bin) ([]int, error) {
	n := len(pl.host)
	procOf := make([]int, n)
	if err := spread(ctx, identity(n), tree, newGraph(n, edges).bisect, procOf); err != nil {
		return nil, err
	}
	return procOf, nil
}

// blocks returns the processes in the order of their sites, of their
// hosts within a site, and of their numbers within a host: the order in
// which each host's processes are consecutive, and each site's hosts.
func (pl placement) blocks() []int {
	order := identity(len(pl.host))
	slices.SortStableFunc(order, func(p, q int) int {
		hp, hq := pl.host[p], pl.host[q]
		if s := pl.site[hp] - pl.site[hq]; s != 0 {
			return s
		}
		return hp - hq
	})
	return order
}

// bin is a group of processes to place vertices on: a host (procs, in
// ascending order) or a site or the whole communicator, made of the bins
// in kids. size is the number of processes in it.
type bin struct {
	size  int
	procs []int
	kids  []*bin
}

// bins groups the processes by hosts and the hosts by sites. A group of
// one member is that member: one site is no level of its own, and a site
// of one host is that host.
func (pl placement) bins() *bin {
	hosts := make([]*bin, len(pl.site))
	for h := range hosts {
		hosts[h] = &bin{}
	}
	for p, h := range pl.host {
		hosts[h].procs = append(hosts[h].procs, p)
		hosts[h].size++
	}
	var sites []*bin
	for h, s := range pl.site {
		if s == len(sites) {
			sites = append(sites, &bin{})
		}
		sites[s].kids = append(sites[s].kids, hosts[h])
		sites[s].size += hosts[h].size
	}
	for i, s := range sites {
		if len(s.kids) == 1 {
			sites[i] = s.kids[0]
		}
	}
	if len(sites) == 1 {
		return sites[0]
	}
	return &bin{size: len(pl.host), kids: sites}
}

// bisector splits verts into its first n0 and the rest, by its own
// measure of closeness. It may reorder verts.
type bisector func(verts []int, n0 int) (part0, part1 []int)

// spread places verts, as many as b has processes, on b's processes
// (procOf[v] for each v), halving them with cut. It checks ctx before
// each cut: a grid of many thousand positions takes many of them, and a
// rank whose ctx ends should not go on with work nobody will use.
func spread(ctx context.Context, verts []int, b *bin, cut bisector, procOf []int) error {
	if b.kids == nil {
		sorted := slices.Clone(verts)
		slices.Sort(sorted)
		for i, v := range sorted {
			procOf[v] = b.procs[i]
		}
		return nil
	}
	return spreadKids(ctx, verts, b.kids, cut, procOf)
}

// spreadKids places verts on the bins kids, halving the bins as evenly
// as their order allows and verts by cut, down to one bin.
func spreadKids(ctx context.Context, verts []int, kids []*bin, cut bisector, procOf []int) error {
	if len(kids) == 1 {
		return spread(ctx, verts, kids[0], cut, procOf)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	total := 0
	for _, k := range kids {
		total += k.size
	}
	m, n0, best := 1, 0, -1
	for i, sum := 1, kids[0].size; i < len(kids); i, sum = i+1, sum+kids[i].size {
		if d := abs(2*sum - total); best < 0 || d < best {
			m, n0, best = i, sum, d
		}
	}
	part0, part1 := cut(verts, n0)
	if err := spreadKids(ctx, part0, kids[:m], cut, procOf); err != nil {
		return err
	}
	return spreadKids(ctx, part1, kids[m:], cut, procOf)
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// gridBisector halves a set of grid positions across the dimension in
// which they extend furthest (the first of those that tie), the lower
// coordinates first; positions of one coordinate there go in row-major
// order. Sizes that fill whole slabs give boxes; others a box and part
// of a slab.
func gridBisector(dims []int) bisector {
	// coords[v*k+d] is position v's coordinate along dimension d, worked
	// out once: the sorts below ask for it n log n times per level.
	k, n := len(dims), 1
	for _, d := range dims {
		n *= d
	}
	coords := make([]int, n*k)
	for v := range n {
		x := v
		for d := k - 1; d >= 0; d-- {
			coords[v*k+d], x = x%dims[d], x/dims[d]
		}
	}
	coord := func(v, d int) int { return coords[v*k+d] }
	return func(verts []int, n0 int) ([]int, []int) {
		dim, extent := 0, -1
		for d := range dims {
			lo, hi := dims[d], -1
			for _, v := range verts {
				x := coord(v, d)
				lo, hi = min(lo, x), max(hi, x)
			}
			if hi-lo > extent {
				dim, extent = d, hi-lo
			}
		}
		slices.SortFunc(verts, func(u, v int) int {
			if d := coord(u, dim) - coord(v, dim); d != 0 {
				return d
			}
			return u - v
		})
		return verts[:n0:n0], verts[n0:]
	}
}

// arc is one end of an edge in a graph's adjacency lists.
type arc struct {
	to int
	w  int64
}

// graph is a topology's edges as adjacency lists, with scratch space for
// bisect: side marks each vertex 0 or 1 while a set of them is being
// halved, -1 outside the set; gain holds what moving a vertex to the
// other side would save. The vertices that may move next are kept in a
// heap per side, greatest gain on top, so that choosing one costs a
// logarithm of the set rather than a scan of it: a scan per move made
// bisecting quadratic, seconds for a grid of ten thousand positions.
// pos[v] is v's index in its side's heap, -1 when it is in none (outside
// the set, or locked: moved in this pass).
type graph struct {
	adj  [][]arc
	side []int8
	gain []int64
	pos  []int
	heap [2][]int
	// compared counts the comparisons of gains made so far: the work of
	// choosing what to move, which the tests bound.
	compared int
}

// newGraph makes a graph of n vertices from edges, dropping loops, which
// cost nothing wherever their vertex goes.
func newGraph(n int, edges []topoEdge) *graph {
	g := &graph{adj: make([][]arc, n), side: make([]int8, n), gain: make([]int64, n), pos: make([]int, n)}
	for _, e := range edges {
		if e.a != e.b {
			g.adj[e.a] = append(g.adj[e.a], arc{e.b, e.w})
			g.adj[e.b] = append(g.adj[e.b], arc{e.a, e.w})
		}
	}
	for v := range g.side {
		g.side[v], g.pos[v] = -1, -1
	}
	return g
}

// Bisecting tries a part grown from each vertex of a set of at most
// allSeeds vertices, from a few of a larger one.
const allSeeds = 32

// refinePasses bounds the refining passes of one bisection; a pass that
// saves nothing ends them sooner.
const refinePasses = 8

// refineStall ends a refining pass after that many swaps in a row that
// did not save more than the best point of the pass so far: a pass that
// went on to the last pair would swap every vertex of a large set, most
// of them far from the cut, to undo them all. Sets of up to twice as
// many vertices are refined by whole passes.
const refineStall = 64

// bisect splits verts into n0 vertices and the rest so that little
// weight joins the two parts. From each of a few seeds it grows the first
// part, taking each time the vertex that adds the most weight inside it
// against what it leaves outside, and refines the halves by passes of
// Kernighan and Lin: swap the pair that saves the most, or costs the
// least, lock it, go on until no pair is left (or refineStall swaps have
// saved nothing more), and keep the swaps up to the point where they had
// saved the most. The best split of all seeds wins, the first on ties.
// Edges to vertices outside verts cost the same whichever part a vertex
// goes to, and are left out. Vertices of equal gain go lowest first, so
// the result depends on nothing but the graph.
func (g *graph) bisect(verts []int, n0 int) ([]int, []int) {
	slices.Sort(verts)
	if n0 == 0 || n0 == len(verts) {
		return verts[:n0:n0], verts[n0:]
	}
	defer func() {
		for _, v := range verts {
			g.side[v] = -1
		}
	}()
	seeds := verts
	if len(verts) > allSeeds {
		for _, v := range verts {
			g.side[v] = 1
		}
		seeds = []int{g.farthest(verts[0]), verts[0]}
	}
	var best []int8 // the sides of verts in the best split so far
	least := int64(-1)
	for _, seed := range seeds {
		g.grow(verts, n0, seed)
		g.refine(verts)
		if cut := g.cut(verts); least < 0 || cut < least {
			least = cut
			best = best[:0]
			for _, v := range verts {
				best = append(best, g.side[v])
			}
		}
	}
	var part0, part1 []int
	for i, v := range verts {
		if best[i] == 0 {
			part0 = append(part0, v)
		} else {
			part1 = append(part1, v)
		}
	}
	return part0, part1
}

// grow puts seed and n0-1 more of verts on side 0, the rest on side 1:
// while growing, gain[v] for v on side 1 is its weight to side 0 less its
// weight to the rest of side 1, what moving it over saves, and the vertex
// of the greatest gain goes next.
func (g *graph) grow(verts []int, n0, seed int) {
	for _, v := range verts {
		g.side[v] = 1
	}
	for _, v := range verts {
		g.gain[v] = g.external(v)
	}
	g.fill(verts)
	g.remove(seed)
	for v := seed; ; v = g.pop(1) {
		g.move(v)
		if n0--; n0 == 0 {
			break
		}
	}
	g.empty()
}

// refine improves a split of verts by passes of swaps (see bisect). In a
// pass gain[v] is, on either side, v's weight to the other side less its
// weight to its own; swapping a and b saves their gains less twice the
// weight between them, which stays between the sides.
func (g *graph) refine(verts []int) {
	var swapped []int
	for range refinePasses {
		for _, v := range verts {
			g.gain[v] = g.external(v)
		}
		g.fill(verts)
		swapped = swapped[:0]
		var saved, most int64
		keep := 0
		for len(g.heap[0]) > 0 && len(g.heap[1]) > 0 && len(swapped)-keep < 2*refineStall {
			a, b := g.pop(0), g.pop(1)
			saved += g.gain[a] + g.gain[b] - 2*g.between(a, b)
			g.move(a)
			g.move(b)
			swapped = append(swapped, a, b)
			if saved > most {
				most, keep = saved, len(swapped)
			}
		}
		g.empty()
		for i := len(swapped) - 1; i >= keep; i-- {
			g.move(swapped[i])
		}
		if most == 0 {
			return
		}
	}
}

// cut is the weight of the edges between the two sides of verts.
func (g *graph) cut(verts []int) int64 {
	var w int64
	for _, v := range verts {
		if g.side[v] == 0 {
			for _, a := range g.adj[v] {
				if g.side[a.to] == 1 {
					w += a.w
				}
			}
		}
	}
	return w
}

// farthest returns the vertex of the set, all on side 1, that a
// breadth-first search from v, within the set, reaches last: one end of
// the set's longest path, a good seed for a part that should have few
// neighbours outside. It marks the vertices it has seen with side 0 while
// it searches, so that it costs the set and not the whole graph.
func (g *graph) farthest(v int) int {
	g.side[v] = 0
	queue := []int{v}
	for i := 0; i < len(queue); i++ {
		for _, a := range g.adj[queue[i]] {
			if g.side[a.to] == 1 {
				g.side[a.to] = 0
				queue = append(queue, a.to)
			}
		}
	}
	for _, u := range queue {
		g.side[u] = 1
	}
	return queue[len(queue)-1]
}

// move moves v to the other side and keeps the gains of v and of its
// neighbours in the set true to what they stand for, and the heaps in
// order of them. v is in no heap.
func (g *graph) move(v int) {
	from := g.side[v]
	g.side[v] = 1 - from
	for _, a := range g.adj[v] {
		switch g.side[a.to] {
		case from: // v left its side: its weight to a.to is now external
			g.gain[a.to] += 2 * a.w
		case 1 - from:
			g.gain[a.to] -= 2 * a.w
		default:
			continue
		}
		if g.pos[a.to] >= 0 {
			g.fix(a.to)
		}
	}
	g.gain[v] = -g.gain[v]
}

// external is v's weight to the other side less its weight to its own,
// within the set.
func (g *graph) external(v int) int64 {
	var x int64
	for _, a := range g.adj[v] {
		switch g.side[a.to] {
		case -1:
		case g.side[v]:
			x -= a.w
		default:
			x += a.w
		}
	}
	return x
}

// between is the weight of the edges between a and b.
func (g *graph) between(a, b int) int64 {
	var w int64
	for _, x := range g.adj[a] {
		if x.to == b {
			w += x.w
		}
	}
	return w
}

// The heaps: heap[s] holds vertices of side s, each u above its children
// in the order of above, so heap[s][0] is what a scan for the greatest
// gain, the lowest vertex among equals, would find.

// above orders the heaps: the greater gain first, then the lower vertex.
func (g *graph) above(u, v int) bool {
	g.compared++
	return g.gain[u] > g.gain[v] || g.gain[u] == g.gain[v] && u < v
}

// fill puts every vertex of verts in the heap of its side.
func (g *graph) fill(verts []int) {
	for _, v := range verts {
		s := g.side[v]
		g.pos[v] = len(g.heap[s])
		g.heap[s] = append(g.heap[s], v)
	}
	for s := range g.heap {
		for i := len(g.heap[s])/2 - 1; i >= 0; i-- {
			g.down(int8(s), i)
		}
	}
}

// empty takes every vertex out of the heaps.
func (g *graph) empty() {
	for s := range g.heap {
		for _, v := range g.heap[s] {
			g.pos[v] = -1
		}
		g.heap[s] = g.heap[s][:0]
	}
}

// pop takes the top of side s's heap out and returns it; the heap is not
// empty.
func (g *graph) pop(s int8) int {
	v := g.heap[s][0]
	g.remove(v)
	return v
}

// remove takes v out of its heap.
func (g *graph) remove(v int) {
	s, i := g.side[v], g.pos[v]
	h := g.heap[s]
	last := len(h) - 1
	g.swap(s, i, last)
	g.heap[s] = h[:last]
	g.pos[v] = -1
	if i < last {
		g.fix(h[i])
	}
}

// fix restores the heap order around v, whose gain has changed.
func (g *graph) fix(v int) {
	s, i := g.side[v], g.pos[v]
	for i > 0 {
		parent := (i - 1) / 2
		if !g.above(v, g.heap[s][parent]) {
			break
		}
		g.swap(s, i, parent)
		i = parent
	}
	g.down(s, i)
}

// down moves the vertex at index i of side s's heap down to its place.
func (g *graph) down(s int8, i int) {
	h := g.heap[s]
	for {
		top, l := i, 2*i+1
		if l < len(h) && g.above(h[l], h[top]) {
			top = l
		}
		if r := l + 1; r < len(h) && g.above(h[r], h[top]) {
			top = r
		}
		if top == i {
			return
		}
		g.swap(s, i, top)
		i = top
	}
}

// swap exchanges the vertices at indices i and j of side s's heap.
func (g *graph) swap(s int8, i, j int) {
	h := g.heap[s]
	h[i], h[j] = h[j], h[i]
	g.pos[h[i]], g.pos[h[j]] = i, j
}
