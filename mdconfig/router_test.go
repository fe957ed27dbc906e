package mdconfig

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// TestAlternativeBehindRefusedOnes: s reaches d directly over eth; through
// each of g1..g4 (on eth and ib with s) it reaches d for 1% more, but none
// of them is closer to d than s, so routes refuses them; through h (its
// own links) it is 3% more and h is closer. With two places per vertex the
// refused candidates once took both, and the table had no alternative.
func TestAlternativeBehindRefusedOnes(t *testing.T) {
	d := mustParse(t, []byte(`
max_routes = 2
subdevice "tcp" {
  latency   = "100us"
  bandwidth = "1000GB/s"
}
subdevice "verbs" {
  latency   = "1us"
  bandwidth = "1000GB/s"
}
network "eth" {
  subdevice = "tcp"
  hosts     = ["s", "d", "g[1-4]"]
}
network "ib" {
  subdevice = "verbs"
  hosts     = ["s", "g[1-4]"]
}
network "left" {
  subdevice = "verbs"
  hosts     = ["s", "h"]
  latency   = "50us"
}
network "right" {
  subdevice = "verbs"
  hosts     = ["h", "d"]
  latency   = "53us"
}
`))
	reps, err := d.Route("s", "d", 1)
	if err != nil {
		t.Fatal(err)
	}
	if alt := reps[0].Alternatives; len(alt) != 1 || alt[0].Hops[0].To != "h" {
		t.Errorf("alternatives %+v, want one through h", alt)
	}
	tab, err := d.Table("s")
	if err != nil {
		t.Fatal(err)
	}
	if rs := routesTo(tab, "d", "small"); len(rs) != 2 || rs[0].Via != "" || rs[1].Via != "h" {
		t.Errorf("table of s, routes to d: %+v, want tcp direct, then verbs via h", rs)
	}
}

// TestAlternativeBehindRefusedOnesAtNetwork: s reaches d directly over p
// (100us); g is closer to d (98us over z) and s -> g -> d costs 103us,
// within 5%: an alternative. f1..f4, one per max_routes place, reach z
// first (through k, 100.5us) but are no closer to d than s. The search
// kept only max_routes labels at a network and refused such labels only
// at hosts, so theirs filled z's places and g's was lost.
func TestAlternativeBehindRefusedOnesAtNetwork(t *testing.T) {
	d := mustParse(t, []byte(`
size_class "all" {
  typical = "1B"
}
subdevice "tcp" {
  latency   = "1us"
  bandwidth = "1000GB/s"
}
network "p" {
  subdevice = "tcp"
  hosts     = ["s", "d"]
  latency   = "100us"
}
network "a" {
  subdevice = "tcp"
  hosts     = ["s", "f[1-4]"]
  latency   = "0.5us"
}
network "m" {
  subdevice = "tcp"
  hosts     = ["f[1-4]", "k"]
  latency   = "1.5us"
}
network "z" {
  subdevice = "tcp"
  hosts     = ["k", "g", "d"]
  latency   = "98us"
}
network "b" {
  subdevice = "tcp"
  hosts     = ["s", "g"]
  latency   = "5us"
}
host "k" {
  penalty = "0.5us"
}
`))
	reps, err := d.Route("s", "d", 0)
	if err != nil {
		t.Fatal(err)
	}
	if alt := reps[0].Alternatives; len(alt) != 1 || alt[0].Hops[0].To != "g" {
		t.Errorf("alternatives %+v, want one through g", alt)
	}
	tab, err := d.Table("s")
	if err != nil {
		t.Fatal(err)
	}
	if rs := routesTo(tab, "d", "all"); len(rs) != 2 || rs[0].Via != "" || rs[1].Via != "g" {
		t.Errorf("table of s, routes to d: %+v, want direct, then via g", rs)
	}
}

// TestPropertyAlternativesMatchBruteForce checks the label search against
// the definition routes documents, computed the slow way: for every first
// step (network, next hop g) out of the source, the cheapest path through g
// that does not come back to the source; kept if g is strictly closer to
// the destination than the source and within the alternatives fraction;
// one per subdevice and next hop; max_routes of them, cheapest first. The
// search once kept too few labels at networks, so some lists came out
// short and adding a host could take an alternative away.
func TestPropertyAlternativesMatchBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 9))
	bad, total := 0, 0
	for i := range 300 {
		src := randomDescription(rng, []string{"0us", "10us", "200us"}[i%3], true, false)
		d, diags := Parse([]byte(src), "random.hcl")
		if diags.HasErrors() {
			continue
		}
		r := newRouter(d)
		r.mode = allNets
		for c := range d.classes {
			for s := range int32(len(d.hosts)) {
				r.run(s, c)
				rest := map[int32][]float64{} // from a next hop, avoiding s
				for dst := range int32(len(d.hosts)) {
					if dst == s {
						continue
					}
					want := bruteRoutes(d, c, s, dst, rest)
					if want == nil {
						continue
					}
					var got []float64
					for _, ch := range r.routes(dst, nil) {
						got = append(got, round3(ch.cost))
					}
					total++
					if fmt.Sprint(got) != fmt.Sprint(want) {
						if bad++; bad <= 5 {
							t.Errorf("random description %d, class %d, %s -> %s: route costs %v, want %v",
								i, c, d.hosts[s], d.hosts[dst], got, want)
						}
					}
				}
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d route lists differ from the brute force", bad, total)
	}
}

// bruteRoutes returns the costs of the routes from s to dst in class c, by
// the definition, or nil if dst is unreachable. rest caches distancesAvoiding
// per next hop.
func bruteRoutes(d *Description, c int, s, dst int32, rest map[int32][]float64) []float64 {
	type alt struct {
		sub        int
		g          int32
		cost, rest float64
	}
	var alts []alt
	best := math.Inf(1)
	for _, ni := range d.hostNets[s] {
		for _, g := range d.nets[ni].members {
			if g == s {
				continue
			}
			a := alt{d.nets[ni].sub, g, d.nets[ni].cost[c], 0}
			if g != dst {
				if math.IsInf(d.penalty[g], 1) {
					continue
				}
				if rest[g] == nil {
					rest[g] = distancesAvoiding(d, c, s, g)
				}
				a.rest = rest[g][dst]
				a.cost += d.penalty[g] + a.rest
			}
			if !math.IsInf(a.cost, 1) {
				best = min(best, a.cost)
				alts = append(alts, a)
			}
		}
	}
	if math.IsInf(best, 1) {
		return nil
	}
	slices.SortStableFunc(alts, func(a, b alt) int { return cmp.Compare(a.cost, b.cost) })
	limit := best*(1+d.alternatives) + best*1e-9
	var want []float64
	seen := map[[2]int]bool{}
	for _, a := range alts {
		if a.cost > limit || len(want) == d.maxRoutes {
			break
		}
		if a.g != dst && a.rest >= best*(1-1e-9) || seen[[2]int{a.sub, int(a.g)}] {
			continue
		}
		seen[[2]int{a.sub, int(a.g)}] = true
		want = append(want, round3(a.cost))
	}
	return want
}

// distancesAvoiding returns the cost of the shortest path in class c from
// host g to every host without passing through host s, by a plain O(n²)
// Dijkstra on hosts; g pays no penalty, every host after it does.
func distancesAvoiding(d *Description, c int, s, g int32) []float64 {
	n := len(d.hosts)
	dist := make([]float64, n)
	done := make([]bool, n)
	for i := range dist {
		dist[i] = math.Inf(1)
	}
	dist[g] = 0
	for {
		u := int32(-1)
		for i := range int32(n) {
			if !done[i] && !math.IsInf(dist[i], 1) && (u < 0 || dist[i] < dist[u]) {
				u = i
			}
		}
		if u < 0 {
			return dist
		}
		done[u] = true
		p := 0.0
		if u != g {
			if p = d.penalty[u]; math.IsInf(p, 1) {
				continue
			}
		}
		for _, ni := range d.hostNets[u] {
			for _, v := range d.nets[ni].members {
				if v != s && v != u {
					dist[v] = min(dist[v], dist[u]+p+d.nets[ni].cost[c])
				}
			}
		}
	}
}

// TestGroupedTablesEqualCostPrimary: h1 and h5 are interchangeable, so
// h5's table is h1's patched. h5 reaches h6 for the same cost through h3
// and through h0, and the shortest pass picks the primary. Its heap broke
// ties by push order, which follows the host numbering, so h5's own table
// and the grouped one disagreed on which was first.
func TestGroupedTablesEqualCostPrimary(t *testing.T) {
	d := mustParse(t, []byte(`
max_routes = 3
alternatives = 0.1
subdevice "tcp" {
  latency   = "1us"
  bandwidth = "1000GB/s"
}
subdevice "verbs" {
  latency   = "1us"
  bandwidth = "1000GB/s"
}
network "n0" {
  subdevice = "verbs"
  hosts     = ["h1", "h3", "h5"]
  latency   = "5us"
}
network "n1" {
  subdevice = "tcp"
  hosts     = ["h0", "h2", "h4", "h6"]
  latency   = "2us"
}
network "n2" {
  subdevice = "tcp"
  hosts     = ["h3", "h6"]
  latency   = "2us"
}
network "n3" {
  subdevice = "verbs"
  hosts     = ["h0", "h1", "h2", "h3", "h5"]
  latency   = "5us"
}
`))
	for tab := range d.Tables() {
		own, err := d.Table(tab.Host)
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range tab.Peers {
			if !reflect.DeepEqual(own.Peers[i], e) {
				t.Errorf("%s->%s: grouped %+v, alone %+v", tab.Host, e.To, e.Routes["small"], own.Peers[i].Routes["small"])
			}
		}
	}
}
