package mdconfig

import (
	"encoding/binary"
	"fmt"
	"iter"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/hpc-multidevice/multidevice/conntable"
)

// Hosts on the same networks with the same penalty are interchangeable:
// swapping two of them, R and S, maps the graph onto itself. So S's routes
// are R's, except that S's routes to R are R's routes to S with S and R
// swapped. R never routes through S (S reaches nothing R does not reach
// directly, and the alternatives rule refuses a next hop no closer to the
// destination), so no other entry changes. Tables are therefore computed
// once per such group and patched per host: a cluster of a hundred
// identical nodes costs one routing run instead of a hundred.

// tableBuilder computes tables, reusing its router and buffers; not safe
// for concurrent use.
type tableBuilder struct {
	d       *Description
	r       *router
	src     int32 // the host compute ran for
	classes []conntable.Class
	byName  []int32    // host indices sorted by name
	res     [][]choice // per class: routes to every host, maxRoutes slots each
	resN    [][]uint8
	intern  map[string]map[string][]conntable.Route
	key     []byte
	spares  []int32 // per class, entry's spare network or -1
}

func newTableBuilder(d *Description) *tableBuilder {
	t := &tableBuilder{d: d, r: newRouter(d), classes: d.conntableClasses(), intern: map[string]map[string][]conntable.Route{}}
	t.byName = make([]int32, len(d.hosts))
	for i := range t.byName {
		t.byName[i] = int32(i)
	}
	sort.Slice(t.byName, func(i, j int) bool { return d.hosts[t.byName[i]] < d.hosts[t.byName[j]] })
	for range d.classes {
		t.res = append(t.res, make([]choice, len(d.hosts)*d.maxRoutes))
		t.resN = append(t.resN, make([]uint8, len(d.hosts)))
	}
	return t
}

// compute fills res with the routes from src, as router.tableRoutes
// gives them: without the networks on standby where that reaches the
// host, else over every network.
func (t *tableBuilder) compute(src int32) {
	k := t.d.maxRoutes
	t.src = src
	var buf []choice
	for c := range t.d.classes {
		// fill runs the router in mode and keeps its routes to every host,
		// or to those with none yet (a second pass); it reports whether
		// some host still has none.
		fill := func(mode netMode, second bool) (missing bool) {
			t.r.mode = mode
			t.r.run(src, c)
			for h := range int32(len(t.d.hosts)) {
				if second && t.resN[c][h] != 0 {
					continue
				}
				buf = t.r.routes(h, buf[:0])
				t.resN[c][h] = uint8(copy(t.res[c][int(h)*k:int(h+1)*k], buf))
				missing = missing || len(buf) == 0 && h != src
			}
			return missing
		}
		if !t.d.standby {
			fill(allNets, false)
		} else if fill(noSpares, false) {
			fill(allNets, true)
		}
	}
}

// entry builds the entry for the routes computed to host from, written as
// the entry for host to, with host swapFrom read as swapTo; ok is false
// when from is unreachable.
func (t *tableBuilder) entry(from, to, swapFrom, swapTo int32) (conntable.Entry, bool) {
	d, k := t.d, t.d.maxRoutes
	if t.resN[0][from] == 0 {
		return conntable.Entry{}, false
	}
	t.key = t.key[:0]
	t.spares = t.spares[:0]
	for c := range d.classes {
		t.key = append(t.key, t.resN[c][from])
		cs := t.res[c][int(from)*k : int(from)*k+int(t.resN[c][from])]
		sp, ok := d.spare(t.src, from, c, cs)
		if !ok {
			sp = -1
		}
		t.spares = append(t.spares, sp)
		t.key = binary.LittleEndian.AppendUint32(t.key, uint32(sp))
		for _, ch := range cs {
			via := ch.hop.host
			if via == swapFrom {
				via = swapTo
			}
			if via == to {
				via = -1
			}
			t.key = binary.LittleEndian.AppendUint32(t.key, uint32(d.nets[ch.hop.net].sub))
			t.key = binary.LittleEndian.AppendUint32(t.key, uint32(via))
			t.key = binary.LittleEndian.AppendUint64(t.key, math.Float64bits(round3(ch.cost)))
		}
	}
	// Failover needs a second route to fail over to in some class.
	failover := false
	for c := range d.classes {
		failover = failover || (d.failover && (t.resN[c][from] > 1 || t.spares[c] >= 0))
	}
	if m, ok := t.intern[string(t.key)]; ok {
		return conntable.Entry{To: d.hosts[to], Routes: m, Failover: failover}, true
	}
	perClass := make([][]conntable.Route, len(d.classes))
	for c := range d.classes {
		cs := t.res[c][int(from)*k : int(from)*k+int(t.resN[c][from])]
		rs := make([]conntable.Route, len(cs))
		for i, ch := range cs {
			rs[i] = conntable.Route{SubDevice: d.subdevices[d.nets[ch.hop.net].sub].name, Cost: round3(ch.cost)}
			via := ch.hop.host
			if via == swapFrom {
				via = swapTo
			}
			if via != to {
				rs[i].Via = d.hosts[via]
			}
		}
		if sp := t.spares[c]; sp >= 0 {
			net := d.nets[sp]
			rs = append(rs, conntable.Route{SubDevice: d.subdevices[net.sub].name, Cost: round3(net.cost[c]), Standby: true})
		}
		perClass[c] = rs
	}
	m := t.keyed(perClass)
	t.intern[string(t.key)] = m
	return conntable.Entry{To: d.hosts[to], Routes: m, Failover: failover}, true
}

// peers computes the routes from src and returns its entries for every
// other host it reaches, sorted by host name. Hosts in another island get
// no entry, so that a job spanning islands fails to resolve rather than
// routing nowhere.
func (t *tableBuilder) peers(src int32) []conntable.Entry {
	t.compute(src)
	clear(t.intern)
	out := make([]conntable.Entry, 0, len(t.d.hosts))
	for _, h := range t.byName {
		if h == src {
			continue
		}
		if e, ok := t.entry(h, h, -1, -1); ok {
			out = append(out, e)
		}
	}
	return out
}

// swapped returns the table of host s, which is interchangeable with rep,
// from rep's entries (computed by peers): the same entries, except that the
// one for s becomes one for rep. Entries share their route maps with rep's.
func (t *tableBuilder) swapped(repPeers []conntable.Entry, rep, s int32) *conntable.Table {
	d := t.d
	e, _ := t.entry(s, rep, s, rep)
	find := func(name string) int {
		return sort.Search(len(repPeers), func(i int) bool { return repPeers[i].To >= name })
	}
	iS, iR := find(d.hosts[s]), find(d.hosts[rep])
	tab := t.table(s, nil)
	p := slices.Grow(tab.Peers, len(repPeers))
	if iR <= iS {
		p = append(p, repPeers[:iR]...)
		p = append(p, e)
		p = append(p, repPeers[iR:iS]...)
	} else {
		p = append(p, repPeers[:iS]...)
		p = append(p, repPeers[iS+1:iR]...)
		p = append(p, e)
		iS = iR - 1
	}
	tab.Peers = append(p, repPeers[iS+1:]...)
	return tab
}

// table starts the table of src with its "@local" entry, then peers.
func (t *tableBuilder) table(src int32, peers []conntable.Entry) *conntable.Table {
	tab := &conntable.Table{
		Version: conntable.Version,
		Host:    t.d.hosts[src],
		Classes: t.classes,
		Peers:   make([]conntable.Entry, 0, len(peers)+1),
	}
	tab.Peers = append(tab.Peers, conntable.Entry{To: conntable.SelectLocal, Routes: t.localRoutes(src)})
	tab.Peers = append(tab.Peers, peers...)
	return tab
}

// keyed names each class's routes, folding them into one "*" list when all
// classes agree.
func (t *tableBuilder) keyed(perClass [][]conntable.Route) map[string][]conntable.Route {
	same := true
	for _, rs := range perClass[1:] {
		if !slices.Equal(rs, perClass[0]) {
			same = false
			break
		}
	}
	if same {
		return map[string][]conntable.Route{conntable.AllClasses: perClass[0]}
	}
	m := make(map[string][]conntable.Route, len(perClass))
	for c, rs := range perClass {
		m[t.classes[c].Name] = rs
	}
	return m
}

// localRoutes gives ranks on the same host the host-local subdevices the
// host has (shm), or if it has none the subdevices of its networks (those
// not on standby, if it has any); per class the cheapest first, then those
// within the alternatives fraction.
func (t *tableBuilder) localRoutes(src int32) map[string][]conntable.Route {
	d := t.d
	perClass := make([][]conntable.Route, len(d.classes))
	for c, cl := range d.classes {
		type cand struct {
			name string
			cost float64
		}
		var cands []cand
		for _, s := range d.subdevices {
			if s.hostLocal && (s.onHosts == nil || s.onHosts[src]) {
				cands = append(cands, cand{s.name, linkCost(s.lat[c], s.bw[c], cl.Typical)})
			}
		}
		if len(cands) == 0 {
			best := map[string]float64{}
			spares := true // only networks on standby: use them
			for _, n := range d.hostNets[src] {
				spares = spares && d.nets[n].standby
			}
			for _, n := range d.hostNets[src] {
				net := d.nets[n]
				if net.standby && !spares {
					continue
				}
				name := d.subdevices[net.sub].name
				if old, ok := best[name]; !ok || net.cost[c] < old {
					best[name] = net.cost[c]
				}
			}
			for name, cost := range best {
				cands = append(cands, cand{name, cost})
			}
		}
		sort.Slice(cands, func(i, j int) bool {
			if cands[i].cost != cands[j].cost {
				return cands[i].cost < cands[j].cost
			}
			return cands[i].name < cands[j].name
		})
		limit := cands[0].cost * (1 + d.alternatives)
		for i, cd := range cands {
			if i == d.maxRoutes || i > 0 && cd.cost > limit {
				break
			}
			perClass[c] = append(perClass[c], conntable.Route{SubDevice: cd.name, Cost: round3(cd.cost)})
		}
	}
	return t.keyed(perClass)
}

// Table returns the connection table for one host: an "@local" entry for
// ranks on the host itself and an entry per other host it can reach, each
// with routes per size class: the subdevice to use and, for indirect
// routes, the next host ("via"), best first, alternatives after. Hosts in
// another island get no entry. Entries with identical routes share one
// routes map; copy before modifying.
func (d *Description) Table(host string) (*conntable.Table, error) {
	i, ok := d.hostIndex[host]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownHost, host)
	}
	t := newTableBuilder(d)
	return t.table(i, t.peers(i)), nil
}

// Tables yields the table of every host (see [Description.Table]), hosts
// that share their networks and penalty one after the other, because their
// routes are computed once for all of them. Each table is built when it is
// asked for; tables share route maps with each other, so a caller that
// keeps and modifies them must copy first.
func (d *Description) Tables() iter.Seq[*conntable.Table] {
	return func(yield func(*conntable.Table) bool) {
		t := newTableBuilder(d)
		for _, group := range d.interchangeable() {
			rep := group[0]
			repPeers := t.peers(rep)
			if !yield(t.table(rep, repPeers)) {
				return
			}
			for _, s := range group[1:] {
				if !yield(t.swapped(repPeers, rep, s)) {
					return
				}
			}
		}
	}
}

// interchangeable groups hosts by the networks they are on and their
// penalty, groups in the order their first host was named.
func (d *Description) interchangeable() [][]int32 {
	index := map[string]int{}
	var groups [][]int32
	var key strings.Builder
	for h := range int32(len(d.hosts)) {
		key.Reset()
		fmt.Fprint(&key, d.penalty[h], d.hostNets[h])
		i, ok := index[key.String()]
		if !ok {
			i = len(groups)
			index[key.String()] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], h)
	}
	return groups
}
