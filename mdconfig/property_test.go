package mdconfig

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/hpc-multidevice/multidevice/conntable"
)

// randomDescription writes a description of n hosts on a few random
// networks over random subdevices, with random penalties (some "off");
// with spares, some networks are on standby (and failover is on).
func randomDescription(rng *rand.Rand, penalty string, hostBlocks, spares bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "penalty = %q\nalternatives = \"%d%%\"\nmax_routes = %d\n", penalty, rng.IntN(15), 1+rng.IntN(4))
	if spares {
		b.WriteString("failover = true\n")
	}
	b.WriteString("subdevice \"shm\" {\n  reach = \"host\"\n  latency = \"0.5us\"\n  bandwidth = \"5GB/s\"\n}\n")
	subs := []string{"tcp", "verbs", "udapl"}
	for _, s := range subs {
		fmt.Fprintf(&b, "subdevice %q {\n  latency = \"%dus\"\n  bandwidth = \"%dMB/s\"\n", s, 1+rng.IntN(80), 10+rng.IntN(2000))
		if rng.IntN(2) == 0 {
			fmt.Fprintf(&b, "  class \"large\" {\n    bandwidth = \"%dMB/s\"\n  }\n", 10+rng.IntN(2000))
		}
		b.WriteString("}\n")
	}
	n := 4 + rng.IntN(20)
	for i := range 1 + rng.IntN(6) {
		fmt.Fprintf(&b, "network \"n%d\" {\n  subdevice = %q\n  hosts = [", i, subs[rng.IntN(len(subs))])
		for _, h := range rng.Perm(n)[:2+rng.IntN(n-1)] {
			fmt.Fprintf(&b, "\"h%02d\", ", h)
		}
		b.WriteString("]\n")
		if rng.IntN(3) == 0 {
			fmt.Fprintf(&b, "  latency = \"%dus\"\n", rng.IntN(100))
		}
		if spares && rng.IntN(3) == 0 {
			b.WriteString("  standby = true\n")
		}
		b.WriteString("}\n")
	}
	if hostBlocks {
		for _, h := range rng.Perm(n)[:rng.IntN(n)] {
			p := []string{"off", "0us", "3us", "40us"}[rng.IntN(4)]
			fmt.Fprintf(&b, "host \"h%02d\" {\n  penalty = %q\n}\n", h, p)
		}
	}
	return b.String()
}

// descriptions returns the examples and random descriptions that parse.
func descriptions(t *testing.T) map[string]*Description {
	t.Helper()
	out := map[string]*Description{}
	files, _ := filepath.Glob("../examples/networks/*.hcl")
	for _, f := range files {
		out[filepath.Base(f)] = mustLoad(t, f)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; len(out) < len(files)+80 && i < 1000; i++ {
		src := randomDescription(rng, []string{"0us", "10us", "200us"}[i%3], true, i%4 == 3)
		if d, diags := Parse([]byte(src), fmt.Sprintf("random%d.hcl", i)); !diags.HasErrors() {
			out[fmt.Sprintf("random%d", i)] = d
		}
	}
	return out
}

func mustLoad(t testing.TB, path string) *Description {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d, diags := Parse(src, path)
	if diags.HasErrors() {
		t.Fatalf("%s:\n%s", path, FormatDiagnostics(diags, src))
	}
	return d
}

func allTables(t testing.TB, d *Description) map[string]*conntable.Table {
	t.Helper()
	out := map[string]*conntable.Table{}
	for tab := range d.Tables() {
		if err := tab.Validate(); err != nil {
			t.Fatalf("table of %s: %v", tab.Host, err)
		}
		out[tab.Host] = tab
	}
	if len(out) != len(d.hosts) {
		t.Fatalf("%d tables for %d hosts", len(out), len(d.hosts))
	}
	return out
}

// routesTo returns the routes a table gives for a host and class.
func routesTo(tab *conntable.Table, host, class string) []conntable.Route {
	for _, e := range tab.Peers {
		if e.To == host {
			if rs, ok := e.Routes[class]; ok {
				return rs
			}
			return e.Routes[conntable.AllClasses]
		}
	}
	return nil
}

// A network on standby bounds nothing: routes avoid it while they can.
func TestPropertyNoRouteCostsMoreThanDirect(t *testing.T) {
	for name, d := range descriptions(t) {
		tabs := allTables(t, d)
		for _, n := range d.nets {
			if n.standby {
				continue
			}
			for _, a := range n.members {
				for _, b := range n.members {
					if a == b {
						continue
					}
					for c, cl := range d.classes {
						rs := routesTo(tabs[d.hosts[a]], d.hosts[b], cl.Name)
						if len(rs) == 0 || rs[0].Cost > round3(n.cost[c])+0.001 {
							t.Errorf("%s: %s->%s class %s: %v, but network %s costs %v directly", name, d.hosts[a], d.hosts[b], cl.Name, rs, n.name, n.cost[c])
						}
					}
				}
			}
		}
	}
}

// TestPropertyLoopFree follows tables hop by hop, from every host to every
// host, starting with each of the source's routes (best and alternatives)
// and going on with each next hop's best route: every walk must arrive
// without visiting a host twice.
func TestPropertyLoopFree(t *testing.T) {
	for name, d := range descriptions(t) {
		tabs := allTables(t, d)
		for src, tab := range tabs {
			for _, e := range tab.Peers[1:] {
				for _, cl := range d.classes {
					for _, first := range routesTo(tab, e.To, cl.Name) {
						seen := map[string]bool{src: true}
						cur, r := src, first
						for cur != e.To {
							next := r.Via
							if next == "" {
								next = e.To
							}
							if seen[next] {
								t.Fatalf("%s: %s->%s class %s starting %v: loops at %s", name, src, e.To, cl.Name, first, next)
							}
							seen[next] = true
							cur = next
							if cur != e.To {
								rs := routesTo(tabs[cur], e.To, cl.Name)
								if len(rs) == 0 {
									t.Fatalf("%s: %s forwards to %s, which has no route to %s", name, src, cur, e.To)
								}
								r = rs[0]
							}
						}
					}
				}
			}
		}
	}
}

// TestPropertyHopByHopCost checks that a source's cost for an indirect
// route is what the next hop adds to its own best route: the link there
// plus the next hop's penalty, so the tables agree with each other. With
// networks on standby they need not: a host reached only through a spare
// routes over every network, and its next hop may reach the destination
// without spares at a higher cost (TestPropertyLoopFree still holds).
func TestPropertyHopByHopCost(t *testing.T) {
	for name, d := range descriptions(t) {
		if d.standby {
			continue
		}
		tabs := allTables(t, d)
		for src, tab := range tabs {
			s := d.hostIndex[src]
			for _, e := range tab.Peers[1:] {
				for c, cl := range d.classes {
					rs := routesTo(tab, e.To, cl.Name)
					for _, r := range rs {
						if r.Via == "" {
							continue
						}
						g := d.hostIndex[r.Via]
						rest := routesTo(tabs[r.Via], e.To, cl.Name)[0].Cost
						ok := false
						for _, n := range d.hostNets[s] {
							net := d.nets[n]
							if d.subdevices[net.sub].name == r.SubDevice && contains(net.members, g) &&
								math.Abs(net.cost[c]+d.penalty[g]+rest-r.Cost) <= 0.003 {
								ok = true
							}
						}
						if !ok {
							t.Errorf("%s: %s->%s class %s: %v does not add up with %s's cost %v", name, src, e.To, cl.Name, r, r.Via, rest)
						}
						if rest >= r.Cost {
							t.Errorf("%s: %s->%s: next hop %s is not closer (%v >= %v)", name, src, e.To, r.Via, rest, r.Cost)
						}
					}
				}
			}
		}
	}
}

func contains(s []int32, v int32) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestPropertyHugePenaltyMeansDirect: with a penalty far above any link
// cost, hosts that share a network never route through a third; with
// penalty "off", a description either has only direct routes or is refused
// as having unreachable hosts.
func TestPropertyHugePenaltyMeansDirect(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var huge, off, refused int
	for i := range 300 {
		penalty := "1000s"
		if i%2 == 1 {
			penalty = "off"
		}
		src := randomDescription(rng, penalty, false, false)
		d, diags := Parse([]byte(src), "random.hcl")
		if diags.HasErrors() {
			if penalty == "1000s" || !strings.Contains(FormatDiagnostics(diags, nil), "unreachable host") {
				t.Fatalf("unexpected errors:\n%s\n%s", FormatDiagnostics(diags, nil), src)
			}
			refused++
			continue
		}
		if penalty == "off" {
			off++
		} else {
			huge++
		}
		for tab := range d.Tables() {
			a := d.hostIndex[tab.Host]
			for _, e := range tab.Peers[1:] {
				b := d.hostIndex[e.To]
				shared := false
				for _, n := range d.hostNets[a] {
					shared = shared || contains(d.nets[n].members, b)
				}
				if !shared && penalty == "off" {
					t.Fatalf("penalty off, yet %s has an entry for %s with which it shares no network", tab.Host, e.To)
				}
				for _, rs := range e.Routes {
					for _, r := range rs {
						if shared && r.Via != "" {
							t.Errorf("penalty %s: %s->%s goes via %s", penalty, tab.Host, e.To, r.Via)
						}
					}
				}
			}
		}
	}
	if huge == 0 || off == 0 || refused == 0 {
		t.Errorf("weak sample: %d huge, %d off, %d refused", huge, off, refused)
	}
}

// TestPropertyGroupedTablesMatch checks the shortcut Tables takes for
// interchangeable hosts against computing every host's table on its own.
func TestPropertyGroupedTablesMatch(t *testing.T) {
	descs := descriptions(t)
	descs["synthetic"] = mustParse(t, SyntheticClusters(4, 6))
	for name, d := range descs {
		for tab := range d.Tables() {
			own, err := d.Table(tab.Host)
			if err != nil {
				t.Fatal(err)
			}
			if len(own.Peers) != len(tab.Peers) {
				t.Fatalf("%s: %s has %d entries grouped, %d alone", name, tab.Host, len(tab.Peers), len(own.Peers))
			}
			for i, e := range tab.Peers {
				if own.Peers[i].To != e.To {
					t.Fatalf("%s: %s entry %d is for %s grouped, %s alone", name, tab.Host, i, e.To, own.Peers[i].To)
				}
				// Every route, not only the best: two hosts of a group
				// once kept different ones of two equal alternatives.
				if !reflect.DeepEqual(own.Peers[i], e) {
					t.Errorf("%s: %s->%s: grouped %+v, alone %+v", name, tab.Host, e.To, e, own.Peers[i])
				}
			}
		}
	}
}

func mustParse(t testing.TB, src []byte) *Description {
	t.Helper()
	d, diags := Parse(src, "test.hcl")
	if diags.HasErrors() {
		t.Fatal(FormatDiagnostics(diags, src))
	}
	return d
}

// TestTablesResolve checks that every generated table compiles for a job
// with a rank on every host, the way the multidevice will use it.
func TestTablesResolve(t *testing.T) {
	for name, d := range descriptions(t) {
		hosts := d.Hosts()
		for tab := range d.Tables() {
			self := int(d.hostIndex[tab.Host])
			var job []string
			for _, h := range hosts {
				if d.island[d.hostIndex[h]] == d.island[self] {
					job = append(job, h)
				}
			}
			me := 0
			for i, h := range job {
				if h == tab.Host {
					me = i
				}
			}
			res, err := tab.Resolve(me, job)
			if err != nil {
				t.Fatalf("%s: %s: %v", name, tab.Host, err)
			}
			for peer := range job {
				if peer != me && len(res.Lookup(peer, 100)) == 0 {
					t.Errorf("%s: %s has no hop to %s", name, tab.Host, job[peer])
				}
			}
		}
	}
}

// TestPropertyStandby: a route on standby is direct, comes after every
// route not on standby, goes over a network on standby both hosts are on,
// and only in an entry that asks for failover.
func TestPropertyStandby(t *testing.T) {
	withSpares := 0
	for name, d := range descriptions(t) {
		if !d.standby {
			continue
		}
		withSpares++
		for tab := range d.Tables() {
			a := d.hostIndex[tab.Host]
			for _, e := range tab.Peers[1:] {
				b := d.hostIndex[e.To]
				for class, rs := range e.Routes {
					for i, r := range rs {
						if !r.Standby {
							continue
						}
						spare := false
						for _, n := range d.hostNets[a] {
							net := d.nets[n]
							spare = spare || net.standby && d.subdevices[net.sub].name == r.SubDevice && contains(net.members, b)
						}
						if r.Via != "" || i != len(rs)-1 || i == 0 || !e.Failover || !spare {
							t.Errorf("%s: %s->%s class %s: route %d of %v is on standby", name, tab.Host, e.To, class, i, rs)
						}
					}
				}
			}
		}
	}
	if withSpares < 5 {
		t.Fatalf("only %d descriptions have networks on standby: the property is barely tested", withSpares)
	}
}
