package mdconfig

import (
	"fmt"
	"iter"
	"slices"
	"sort"

	"github.com/hpc-multidevice/multidevice/conntable"
)

// tableBuilder computes tables one source host at a time, reusing its
// router and buffers; not safe for concurrent use.
type tableBuilder struct {
	d       *Description
	r       *router
	classes []conntable.Class
	byName  []int32    // host indices sorted by name
	res     [][]choice // per class: routes to every host, maxRoutes slots each
	resN    [][]uint8
}

func newTableBuilder(d *Description) *tableBuilder {
	t := &tableBuilder{d: d, r: newRouter(d), classes: d.conntableClasses()}
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

// compute fills res for one source host.
func (t *tableBuilder) compute(src int32) {
	k := t.d.maxRoutes
	var buf []choice
	for c := range t.d.classes {
		t.r.run(src, c)
		for h := range int32(len(t.d.hosts)) {
			buf = t.r.routes(h, buf[:0])
			t.resN[c][h] = uint8(copy(t.res[c][int(h)*k:int(h+1)*k], buf))
		}
	}
}

func (t *tableBuilder) table(src int32) *conntable.Table {
	d := t.d
	t.compute(src)
	tab := &conntable.Table{
		Version: conntable.Version,
		Host:    d.hosts[src],
		Classes: t.classes,
		Peers:   make([]conntable.Entry, 0, len(d.hosts)),
	}
	tab.Peers = append(tab.Peers, conntable.Entry{To: conntable.SelectLocal, Routes: t.localRoutes(src)})
	k := d.maxRoutes
	for _, h := range t.byName {
		if h == src || t.resN[0][h] == 0 {
			continue // self, or another island: no entry, so a job spanning it fails to resolve
		}
		perClass := make([][]conntable.Route, len(d.classes))
		for c := range d.classes {
			cs := t.res[c][int(h)*k : int(h)*k+int(t.resN[c][h])]
			rs := make([]conntable.Route, len(cs))
			for i, ch := range cs {
				rs[i] = conntable.Route{SubDevice: d.subdevices[d.nets[ch.hop.net].sub].name, Cost: round3(ch.cost)}
				if ch.hop.host != h {
					rs[i].Via = d.hosts[ch.hop.host]
				}
			}
			perClass[c] = rs
		}
		tab.Peers = append(tab.Peers, conntable.Entry{To: d.hosts[h], Routes: t.keyed(perClass)})
	}
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
// host has (shm), or if it has none the subdevices of its networks; per
// class the cheapest first, then those within the alternatives fraction.
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
			for _, n := range d.hostNets[src] {
				net := d.nets[n]
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
// another island get no entry.
func (d *Description) Table(host string) (*conntable.Table, error) {
	i, ok := d.hostIndex[host]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownHost, host)
	}
	return newTableBuilder(d).table(i), nil
}

// Tables yields the table of every host, in the order hosts were first
// named. Each table is built when it is asked for, so memory stays that of
// one table however many hosts there are.
func (d *Description) Tables() iter.Seq[*conntable.Table] {
	return func(yield func(*conntable.Table) bool) {
		t := newTableBuilder(d)
		for h := range int32(len(d.hosts)) {
			if !yield(t.table(h)) {
				return
			}
		}
	}
}
