package mdconfig

import (
	"math"
	"slices"
)

// The graph has a vertex per host and one per network ("hub"): a host is
// joined to each network it is on, so a network of n hosts costs n edges
// instead of the n² of a clique. Leaving a host onto a network costs the
// network's link cost for the class; arriving from a network costs nothing;
// leaving a host that is neither the source nor the destination also costs
// that host's penalty. Vertex v < len(hosts) is a host, v >= len(hosts) the
// network v-len(hosts).
//
// The penalty is charged at every intermediate host, not only where the
// subdevice changes. A forwarded message always changes network there (one
// network is never worth crossing twice: the direct link on it is cheaper),
// and forwarding costs a receive, a system-message handler and a send even
// between two tcp networks, as a relay between private-address clusters
// does. Charging it per host also keeps the cost of the rest of a path
// independent of how the message arrived, which is what lets a table hold
// one next hop per destination and still be exact hop by hop.

// hop is the first step of a route: the network taken out of the source and
// the host it reaches first (-1 while only the network is known).
type hop struct{ net, host int32 }

// choice is one route from a source to a destination: its first step and
// the cost of the whole path for the class's typical size.
type choice struct {
	hop  hop
	cost float64
}

// netMode says which networks a run may use.
type netMode uint8

const (
	allNets  netMode = iota // every network
	noSpares                // every network but those on standby
)

// router computes routes from one source at a time. It owns scratch space
// sized to the graph and is not safe for concurrent use.
type router struct {
	d     *Description
	nh    int32
	src   int32
	class int
	mode  netMode // set before run
	// shortest paths (pass 1)
	dist  []float64
	hops  []int32
	first []hop
	done  []bool
	pq    heap
	cost  []float64 // per network, for the current class
	// near-shortest paths with distinct first steps (pass 2): the labels
	// kept at vertex v, cheapest first, are the list from labHead[v]
	// through labNext (-1 ends it); labTail[v] is its last.
	labHead []int32
	labTail []int32
	labNext []int32
	labCost []float64
	labHop  []int32
	hopIDs  map[hop]int32
	hopList []hop
	hopOver []float64  // per first step: its link cost plus its host's penalty
	keys    []routeKey // scratch for keep
}

// routeKey is what a route is written as in a table: routes that share it
// are one route (sameRoute).
type routeKey struct {
	sub  int
	host int32
}

func newRouter(d *Description) *router {
	nv := len(d.hosts) + len(d.nets)
	return &router{
		d:       d,
		nh:      int32(len(d.hosts)),
		dist:    make([]float64, nv),
		hops:    make([]int32, nv),
		first:   make([]hop, nv),
		done:    make([]bool, nv),
		labHead: make([]int32, nv),
		labTail: make([]int32, nv),
		hopIDs:  map[hop]int32{},
		cost:    make([]float64, len(d.nets)),
	}
}

// run computes the routes from src for one size class.
func (r *router) run(src int32, class int) {
	r.src, r.class = src, class
	for i := range r.d.nets {
		r.cost[i] = r.d.nets[i].cost[class]
		if r.mode == noSpares && r.d.nets[i].standby {
			r.cost[i] = math.Inf(1)
		}
	}
	r.shortest()
	if r.d.maxRoutes > 1 {
		r.nearShortest()
	}
}

func (r *router) shortest() {
	d := r.d
	cost := r.cost
	for i := range r.dist {
		r.dist[i] = math.Inf(1)
		r.hops[i] = 0
		r.first[i] = hop{-1, -1}
		r.done[i] = false
	}
	r.pq.reset()
	r.dist[r.src] = 0
	r.pq.push(item{0, 0, r.src, 0, 0})
	for r.pq.len() > 0 {
		it := r.pq.pop()
		v := it.v
		if r.done[v] {
			continue
		}
		r.done[v] = true
		if v < r.nh {
			extra := 0.0
			if v != r.src {
				extra = d.penalty[v]
				if math.IsInf(extra, 1) {
					continue
				}
			}
			for _, n := range d.hostNets[v] {
				f := r.first[v]
				if v == r.src {
					f = hop{n, -1}
				}
				r.relax(r.nh+n, r.dist[v]+extra+cost[n], r.hops[v]+1, f)
			}
			continue
		}
		for _, h := range d.nets[v-r.nh].members {
			if h == r.src {
				continue
			}
			f := r.first[v]
			if f.host < 0 {
				f.host = h
			}
			r.relax(h, r.dist[v], r.hops[v], f)
		}
	}
}

// relax records a better way to u. Ties go to fewer hops, then to the lower
// network and host index, so that every run picks the same route.
func (r *router) relax(u int32, nd float64, hops int32, f hop) {
	if r.done[u] {
		return
	}
	old := r.dist[u]
	if nd < old || nd == old && (hops < r.hops[u] || hops == r.hops[u] && hopLess(f, r.first[u])) {
		r.dist[u], r.hops[u], r.first[u] = nd, hops, f
		r.pq.push(item{nd, hops, u, 0, hopKey(f)})
	}
}

func hopLess(a, b hop) bool {
	if a.net != b.net {
		return a.net < b.net
	}
	return a.host < b.host
}

// nearShortest finds, for every vertex, the cheapest paths that start with
// distinct first steps and cost at most slack more than the shortest, as
// many of them as routes can use there or beyond. The slack is absolute
// (the alternatives fraction of the longest shortest path) because an
// absolute bound is safe to prune with: a label more than slack above the
// best at one vertex stays more than slack above the best at every vertex
// beyond it. Paths never return to the source.
func (r *router) nearShortest() {
	d := r.d
	cost := r.cost
	longest := 0.0
	for h := int32(0); h < r.nh; h++ {
		if !math.IsInf(r.dist[h], 1) {
			longest = max(longest, r.dist[h])
		}
	}
	slack := d.alternatives*longest + longest*1e-9
	for v := range r.labHead {
		r.labHead[v] = -1
	}
	r.labNext, r.labCost, r.labHop = r.labNext[:0], r.labCost[:0], r.labHop[:0]
	clear(r.hopIDs)
	r.hopList, r.hopOver = r.hopList[:0], r.hopOver[:0]
	r.pq.reset()
	for _, n := range d.hostNets[r.src] {
		if !math.IsInf(cost[n], 1) {
			f := hop{n, -1}
			r.pq.push(item{cost[n], 0, r.nh + n, r.hopID(f), hopKey(f)})
		}
	}
	for r.pq.len() > 0 {
		it := r.pq.pop()
		v, c, id := it.v, it.dist, it.label
		if c > r.dist[v]+slack || !r.keep(v, c, id) {
			continue
		}
		l := int32(len(r.labCost))
		r.labCost, r.labHop, r.labNext = append(r.labCost, c), append(r.labHop, id), append(r.labNext, -1)
		if r.labHead[v] < 0 {
			r.labHead[v] = l
		} else {
			r.labNext[r.labTail[v]] = l
		}
		r.labTail[v] = l
		if v < r.nh {
			p := d.penalty[v]
			if math.IsInf(p, 1) {
				continue
			}
			for _, n := range d.hostNets[v] {
				if u, uc := r.nh+n, c+p+cost[n]; uc <= r.dist[u]+slack && r.keep(u, uc, id) {
					r.pq.push(item{uc, 0, u, id, it.tie})
				}
			}
			continue
		}
		f := r.hopList[id]
		for _, h := range d.nets[v-r.nh].members {
			if h == r.src {
				continue
			}
			hid, tie := id, it.tie
			if f.host < 0 {
				hid, tie = r.hopID(hop{f.net, h}), hopKey(hop{f.net, h})
			}
			if c <= r.dist[h]+slack && r.keep(h, c, hid) {
				r.pq.push(item{c, 0, h, hid, tie})
			}
		}
	}
}

// keep reports whether a label of cost c and first step id, popped at
// vertex v after every cheaper one, is worth keeping there.
//
// routes refuses a label at a host when its next hop is no closer to the
// host than the source, that is when the label's excess over the shortest
// path reaches its first step's overhead (link cost plus next hop
// penalty). The excess only grows along a path, so a label refused at v
// would be refused at every vertex beyond and is dropped here. It is also
// dropped once v keeps, from maxRoutes other next hops (or from its own),
// labels that arrived first and have at least its overhead: wherever it
// would be accepted those would be too, each as cheap or cheaper. Keeping
// simply the maxRoutes cheapest labels is not enough: labels about to be
// refused everywhere took a network's places and pushed out a real
// alternative to the hosts beyond it.
func (r *router) keep(v int32, c float64, id int32) bool {
	f := r.hopList[id]
	if f.host < 0 {
		// One of the source's own networks, before the host reached
		// first is known: the overhead is not known either.
		return true
	}
	over := r.hopOver[id]
	if f.host != v && c-over >= r.dist[v]*(1-1e-9) {
		return false
	}
	own := routeKey{r.d.nets[f.net].sub, f.host}
	r.keys = r.keys[:0]
	for l := r.labHead[v]; l >= 0; l = r.labNext[l] {
		j := r.labHop[l]
		g := r.hopList[j]
		if g.host < 0 || r.hopOver[j] < over {
			continue
		}
		key := routeKey{r.d.nets[g.net].sub, g.host}
		if key == own {
			return false
		}
		if !slices.Contains(r.keys, key) {
			r.keys = append(r.keys, key)
			if len(r.keys) == r.d.maxRoutes {
				return false
			}
		}
	}
	return true
}

func (r *router) hopID(h hop) int32 {
	if id, ok := r.hopIDs[h]; ok {
		return id
	}
	id := int32(len(r.hopList))
	r.hopIDs[h] = id
	r.hopList = append(r.hopList, h)
	over := math.Inf(1) // unknown until the host is; keep does not read it
	if h.host >= 0 {
		over = r.cost[h.net] + r.d.penalty[h.host]
	}
	r.hopOver = append(r.hopOver, over)
	return id
}

// routes appends to buf the routes from the source to host dst, best first:
// the shortest path, then alternatives within the alternatives fraction of
// it. An alternative through a next hop g is kept only if g's own shortest
// path to dst is strictly shorter than the source's (what remains of the
// alternative after g bounds it from above), so following any mix of
// primary and alternative next hops always gets closer and never loops.
// Alternatives that would give the same subdevice and next hop as an
// earlier route are dropped. It returns buf unchanged when dst is
// unreachable.
func (r *router) routes(dst int32, buf []choice) []choice {
	best := r.dist[dst]
	if dst == r.src || math.IsInf(best, 1) {
		return buf
	}
	start := len(buf)
	buf = append(buf, choice{r.first[dst], best})
	if r.d.maxRoutes == 1 {
		return buf
	}
	d := r.d
	limit := best*(1+d.alternatives) + best*1e-9
	for l := r.labHead[dst]; l >= 0; l = r.labNext[l] {
		c := r.labCost[l]
		if c > limit {
			break
		}
		h := r.hopList[r.labHop[l]]
		if h.host != dst {
			rest := c - d.nets[h.net].cost[r.class] - d.penalty[h.host]
			if rest >= best*(1-1e-9) {
				continue
			}
		}
		if r.sameRoute(buf[start:], h) {
			continue
		}
		buf = append(buf, choice{h, c})
		if len(buf)-start == d.maxRoutes {
			break
		}
	}
	return buf
}

// tableRoutes appends the routes the table of src gives for dst in class,
// best first: those over the networks not on standby or, where dst is
// reached only through networks on standby, those over every network.
// Either way, each next hop's own routes get strictly closer (a host
// whose table routes without the spares has next hops that do too), so
// following the tables never loops.
func (r *router) tableRoutes(src, dst int32, class int, buf []choice) []choice {
	if r.d.standby {
		r.mode = noSpares
		r.run(src, class)
		n := len(buf)
		if buf = r.routes(dst, buf); len(buf) > n {
			return buf
		}
	}
	r.mode = allNets
	r.run(src, class)
	return r.routes(dst, buf)
}

// sameRoute reports whether h would be written as a route already in have.
func (r *router) sameRoute(have []choice, h hop) bool {
	sub := r.d.nets[h.net].sub
	for _, c := range have {
		if r.d.nets[c.hop.net].sub == sub && c.hop.host == h.host {
			return true
		}
	}
	return false
}

// item is a heap entry: a tentative cost to vertex v. label is the first-step
// id in the near-shortest pass and unused in the shortest pass; tie orders
// entries of equal cost and hops by their first step (hopKey), in both
// passes: relax prefers the lower first step only until its vertex is
// popped, so the pop order must prefer it too.
type item struct {
	dist  float64
	hops  int32
	v     int32
	label int32
	tie   int64
}

// hopKey orders first steps as hopLess does, for the heap. Ties between
// labels of equal cost go by it, not by the order they were pushed in:
// that order follows the host numbering, which differs between two hosts
// that are interchangeable (tables.go), so a host's own search could keep
// another of two equal alternatives than its group's representative's did
// for it, and generate's table would differ from what route explains.
func hopKey(h hop) int64 { return int64(h.net)<<32 | int64(h.host+1) }

// heap is a binary min-heap on (dist, hops) with lazy deletion; written out
// rather than through container/heap to avoid an interface call per
// comparison on graphs of ten thousand hosts.
type heap struct{ a []item }

func (h *heap) reset()   { h.a = h.a[:0] }
func (h *heap) len() int { return len(h.a) }

func (h *heap) less(i, j int) bool {
	if h.a[i].dist != h.a[j].dist {
		return h.a[i].dist < h.a[j].dist
	}
	if h.a[i].hops != h.a[j].hops {
		return h.a[i].hops < h.a[j].hops
	}
	return h.a[i].tie < h.a[j].tie
}

func (h *heap) push(it item) {
	h.a = append(h.a, it)
	i := len(h.a) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			break
		}
		h.a[i], h.a[p] = h.a[p], h.a[i]
		i = p
	}
}

func (h *heap) pop() item {
	top := h.a[0]
	last := len(h.a) - 1
	h.a[0] = h.a[last]
	h.a = h.a[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= last {
			break
		}
		m := l
		if r := l + 1; r < last && h.less(r, l) {
			m = r
		}
		if !h.less(m, i) {
			break
		}
		h.a[i], h.a[m] = h.a[m], h.a[i]
		i = m
	}
	return top
}
