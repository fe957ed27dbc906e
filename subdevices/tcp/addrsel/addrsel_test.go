package addrsel

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
)

// ifc builds an interface from "name addr/len addr/len ...".
func ifc(spec string) Interface {
	f := strings.Fields(spec)
	i := Interface{Name: f[0]}
	for _, a := range f[1:] {
		i.Addrs = append(i.Addrs, netip.MustParsePrefix(a))
	}
	return i
}

func ep(host string, ifaces ...string) Endpoint {
	e := Endpoint{Host: host}
	for _, s := range ifaces {
		e.Ifaces = append(e.Ifaces, ifc(s))
	}
	return e
}

func TestScopeOf(t *testing.T) {
	tests := []struct {
		addr string
		want Scope
	}{
		{"127.0.0.1", ScopeLoopback},
		{"::1", ScopeLoopback},
		{"169.254.3.4", ScopeLinkLocal},
		{"fe80::1", ScopeLinkLocal},
		{"10.1.2.3", ScopePrivate},
		{"172.16.0.1", ScopePrivate},
		{"172.32.0.1", ScopePublic},
		{"192.168.1.1", ScopePrivate},
		{"100.64.0.1", ScopePrivate},
		{"fd00::2", ScopePrivate},
		{"193.175.13.2", ScopePublic},
		{"2001:906:638:aa01::2", ScopePublic},
		{"::ffff:10.0.0.1", ScopePrivate},
	}
	for _, tc := range tests {
		if got := ScopeOf(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("ScopeOf(%s) = %v, want %v", tc.addr, got, tc.want)
		}
	}
}

// The rows of the thesis's table 3.1, plus what the thesis leaves open
// (link-local, loopback, bridges that every host has), weighed between one
// interface of host a and one of host b. others are further hosts of the
// job, for collisions.
func TestWeight(t *testing.T) {
	tests := []struct {
		name   string
		a, b   Endpoint
		others []Endpoint
		want   Weight
		reason string // substring of the refusal when want is 0
	}{
		{"no common family", ep("a", "eth0 10.0.0.1/24"), ep("b", "eth0 2001:db8::2/64"), nil, 0, "no common address family"},
		{"private, different networks", ep("a", "eth0 10.0.0.1/24"), ep("b", "eth0 10.0.1.2/24"), nil, 0, "private addresses on different networks"},
		{"private, same network", ep("a", "eth0 192.168.1.2/24"), ep("b", "eth0 192.168.1.3/24"), nil, WeightPrivateSame, ""},
		{"private, same network, collision elsewhere", ep("a", "eth0 192.168.1.2/24"), ep("b", "eth0 192.168.1.3/24"),
			[]Endpoint{ep("c", "eth0 192.168.1.2/24")}, 0, "collides across the job"},
		{"ULA, same network", ep("a", "eth0 fd00:1::2/64"), ep("b", "eth0 fd00:1::3/64"), nil, WeightPrivateSame, ""},
		{"public IPv4, same network", ep("a", "eth0 193.175.13.2/24"), ep("b", "eth0 193.175.13.3/24"), nil, WeightPublicSame, ""},
		{"global IPv6, same network", ep("a", "eth0 2001:db8:1::2/64"), ep("b", "eth0 2001:db8:1::3/64"), nil, WeightPublicSame, ""},
		{"public IPv4, routed", ep("a", "eth0 193.175.13.2/24"), ep("b", "eth0 193.175.14.2/24"), nil, WeightPublicRouted, ""},
		{"global IPv6, routed", ep("a", "eth0 2001:db8:1::2/64"), ep("b", "eth0 2001:db8:2::2/64"), nil, WeightPublicRouted, ""},
		{"private facing public", ep("a", "eth0 10.0.0.1/24"), ep("b", "eth0 193.175.14.2/24"), nil, 0, "private address facing a public one"},
		{"best address pair wins", ep("a", "eth0 10.0.0.1/24 2001:db8:1::2/64"), ep("b", "eth0 10.0.0.2/24 2001:db8:2::2/64"), nil, WeightPublicRouted, ""},
		{"same bridge address on both hosts", ep("a", "docker0 172.17.0.1/16"), ep("b", "docker0 172.17.0.1/16"), nil, 0, "both hosts have 172.17.0.1"},
		{"bridge address on a third host", ep("a", "docker0 172.17.0.1/16"), ep("b", "docker0 172.17.0.2/16"),
			[]Endpoint{ep("c", "docker0 172.17.0.1/16")}, 0, "172.17.0.0/16 collides"},
		{"public address on two hosts", ep("a", "eth0 193.0.2.1/24"), ep("b", "eth0 193.0.3.2/24"),
			[]Endpoint{ep("c", "eth0 193.0.2.1/24")}, 0, "193.0.2.1 is on 2 hosts"},
		{"link-local on a shared link", ep("a", "eth0 fe80::1/64 10.0.0.1/24"), ep("b", "eth0 fe80::2/64 10.0.0.2/24"), nil, WeightPrivateSame, ""},
		{"link-local alone", ep("a", "eth0 fe80::1/64"), ep("b", "eth0 fe80::2/64"), nil, 0, "link may differ"},
		{"link-local with a routed network", ep("a", "eth0 fe80::1/64 2001:db8:1::2/64"), ep("b", "eth0 fe80::2/64 2001:db8:2::2/64"), nil, WeightPublicRouted, ""},
		{"loopback, same host", ep("h", "lo 127.0.0.1/8"), ep("h", "lo 127.0.0.1/8"), nil, WeightPrivateSame, ""},
		{"loopback, other host", ep("a", "lo 127.0.0.1/8"), ep("b", "lo 127.0.0.1/8"), nil, 0, "only its own host"},
		{"same host with loopback", ep("h", "lo 127.0.0.1/8", "eth0 10.0.0.1/24"), ep("h", "lo 127.0.0.1/8", "eth0 10.0.0.1/24"), nil, 0, "loopback is used"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			job := NewJob(append([]Endpoint{tc.a, tc.b}, tc.others...))
			i := len(tc.a.Ifaces) - 1 // the last interface is the one under test
			e := job.weigh(tc.a, i, tc.b, len(tc.b.Ifaces)-1)
			if e.w != tc.want {
				t.Fatalf("weight %d (%s), want %d", e.w, e.reason(false), tc.want)
			}
			if tc.want == 0 && !strings.Contains(e.reason(false), tc.reason) {
				t.Errorf("reason %q, want it to mention %q", e.reason(false), tc.reason)
			}
			// The weight does not depend on which side is left.
			if back := job.weigh(tc.b, len(tc.b.Ifaces)-1, tc.a, i); back.w != e.w {
				t.Errorf("reversed weight %d, want %d", back.w, e.w)
			}
		})
	}
}

// The thesis's example (section 2.4.3, figure 3.2): taking 193.175.15.2 for
// eth0 would leave no second connection; the matching takes 193.175.14.2 and
// the IPv6 address of B's eth1.
func TestThesisExample(t *testing.T) {
	a := ep("A", "eth0 193.175.13.2/24 2001:906:638:aa01::2/64", "eth1 2001:906:638:bb01::2/64")
	b := ep("B", "eth0 193.175.14.2/24", "eth1 193.175.15.2/24 2001:906:638:bb02::2/64")
	job := NewJob([]Endpoint{a, b})
	wantW := [][]Weight{{3, 3}, {0, 3}}
	for i := range 2 {
		for k := range 2 {
			if e := job.weigh(a, i, b, k); e.w != wantW[i][k] {
				t.Errorf("w[%d][%d] = %d, want %d", i, k, e.w, wantW[i][k])
			}
		}
	}
	for _, aLeft := range []bool{true, false} {
		res := Select(job, a, b, aLeft)
		got := fmt.Sprint(res.Pairs)
		want := "[eth0 193.175.13.2 -> eth0 193.175.14.2 (weight 3) eth1 2001:906:638:bb01::2 -> eth1 2001:906:638:bb02::2 (weight 3)]"
		if got != want {
			t.Errorf("aLeft=%v: pairs %s, want %s", aLeft, got, want)
		}
	}
}

// Figure 3.1 and test-bed scenario 3: two clusters number their private
// network alike (10.0.0.1 and 10.0.0.2 on both) and reach each other over
// routed IPv6. Inside a cluster both networks are used; across clusters only
// IPv6, never the colliding private one.
func TestTwoClustersSameRange(t *testing.T) {
	h := func(name, v6 string, v4 string) Endpoint {
		return ep(name, "eth0 "+v6, "eth1 "+v4)
	}
	c1a := h("c1a", "2001:db8:1::2/64", "10.0.0.1/24")
	c1b := h("c1b", "2001:db8:1::3/64", "10.0.0.2/24")
	c2a := h("c2a", "2001:db8:2::2/64", "10.0.0.1/24")
	c2b := h("c2b", "2001:db8:2::3/64", "10.0.0.2/24")
	job := NewJob([]Endpoint{c1a, c1b, c2a, c2b})
	if !job.sameSite("c1a", "c1b") || !job.sameSite("c2a", "c2b") || job.sameSite("c1a", "c2a") {
		t.Fatalf("sites: c1a %v c1b %v c2a %v c2b %v", job.sites["c1a"], job.sites["c1b"], job.sites["c2a"], job.sites["c2b"])
	}
	in := Select(job, c1a, c1b, true)
	if got, want := fmt.Sprint(in.Pairs), "[eth0 2001:db8:1::2 -> eth0 2001:db8:1::3 (weight 2) eth1 10.0.0.1 -> eth1 10.0.0.2 (weight 1)]"; got != want {
		t.Errorf("in-cluster pairs %s, want %s", got, want)
	}
	across := Select(job, c1b, c2a, true)
	if got, want := fmt.Sprint(across.Pairs), "[eth0 2001:db8:1::3 -> eth0 2001:db8:2::2 (weight 3)]"; got != want {
		t.Errorf("cross-cluster pairs %s, want %s", got, want)
	}
	if !strings.Contains(across.Explain(), "collides across the job") {
		t.Errorf("cross-cluster refusals do not name the collision: %s", across.Explain())
	}
	// Within one site a collision still forbids the network.
	c1c := h("c1c", "2001:db8:1::4/64", "10.0.0.2/24")
	job = NewJob([]Endpoint{c1a, c1b, c1c})
	if got := Select(job, c1a, c1b, true); len(got.Pairs) != 1 || got.Pairs[0].LocalName != "eth0" {
		t.Errorf("collision inside a site: pairs %v, want only eth0", got.Pairs)
	}
}

// examples/networks/relays.hcl: clusters p and q both number their LAN
// 10.0.0.0/24 and have no other network (IPv4 only); p-relay and q-relay
// also sit on a public WAN. No network the hosts share tells the sites
// apart (the WAN would put the two relays in one), so without the launcher
// naming sites no host may use the LAN at all. With sites named, the LAN
// is used inside each cluster and never across: p01 must not dial a q
// host's 10.0.0.x, which from p's LAN reaches a p host or nobody.
func TestNamedSites(t *testing.T) {
	hosts := []Endpoint{
		ep("p01", "lo 127.0.0.1/8", "eth0 10.0.0.1/24"),
		ep("p02", "lo 127.0.0.1/8", "eth0 10.0.0.2/24"),
		ep("p-relay", "lo 127.0.0.1/8", "eth0 10.0.0.254/24", "wan 198.51.100.1/24"),
		ep("q-relay", "lo 127.0.0.1/8", "eth0 10.0.0.254/24", "wan 198.51.100.2/24"),
		ep("q01", "lo 127.0.0.1/8", "eth0 10.0.0.1/24"),
		ep("q02", "lo 127.0.0.1/8", "eth0 10.0.0.2/24"),
	}
	bySite := make([]Endpoint, len(hosts))
	for i, h := range hosts {
		bySite[i] = sited(map[bool]string{true: "P", false: "Q"}[h.Host[0] == 'p'], h)
	}
	named := map[string]Endpoint{}
	for _, e := range bySite {
		named[e.Host] = e
	}
	unnamed := map[string]Endpoint{}
	for _, e := range hosts {
		unnamed[e.Host] = e
	}
	tests := []struct {
		name     string
		eps      []Endpoint
		by       map[string]Endpoint
		from, to string
		want     string // the pairs; "[]" for none
		refusal  string // substring of the refusals when want is "[]"
	}{
		{"named: same LAN in p", bySite, named, "p01", "p02", "[eth0 10.0.0.1 -> eth0 10.0.0.2 (weight 1)]", ""},
		{"named: p host to its relay", bySite, named, "p01", "p-relay", "[eth0 10.0.0.1 -> eth0 10.0.0.254 (weight 1)]", ""},
		{"named: q host to its relay", bySite, named, "q02", "q-relay", "[eth0 10.0.0.2 -> eth0 10.0.0.254 (weight 1)]", ""},
		{"named: relays over the WAN", bySite, named, "p-relay", "q-relay", "[wan 198.51.100.1 -> wan 198.51.100.2 (weight 2)]", ""},
		{"named: p host to a q host", bySite, named, "p01", "q02", "[]", "10.0.0.0/24 collides across the job"},
		{"named: p host to the q relay", bySite, named, "p01", "q-relay", "[]", "10.0.0.0/24 collides across the job"},
		{"unnamed: same LAN in p", hosts, unnamed, "p01", "p02", "[]", "10.0.0.0/24 collides across the job"},
		{"unnamed: p host to its relay", hosts, unnamed, "p01", "p-relay", "[]", "10.0.0.0/24 collides across the job"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			job := NewJob(tc.eps)
			a, b := tc.by[tc.from], tc.by[tc.to]
			for _, left := range []bool{true, false} {
				res := Select(job, a, b, left)
				if got := fmt.Sprint(res.Pairs); got != tc.want {
					t.Errorf("localLeft=%v: pairs %s, want %s (refused: %s)", left, got, tc.want, res.Explain())
				}
				if tc.want == "[]" && !strings.Contains(res.Explain(), tc.refusal) {
					t.Errorf("localLeft=%v: refusals %q lack %q", left, res.Explain(), tc.refusal)
				}
			}
		})
	}
}

// A site the launcher names decides alone: a host that names one joins no
// other site through a network it shares (here a public network every host
// is on), one host whose ranks name two sites shares each with its hosts
// without joining the two, and hosts that name none are still grouped by
// the networks they share.
func TestNamedSitesGrouping(t *testing.T) {
	eps := []Endpoint{
		sited("A", ep("a1", "eth0 193.0.2.1/24")),
		sited("A", ep("a2", "eth0 193.0.2.2/24")),
		sited("B", ep("b1", "eth0 193.0.2.3/24")),
		sited("C", ep("bc", "eth0 193.0.2.4/24")),
		sited("B", ep("bc", "eth0 193.0.2.4/24")), // another rank of bc
		ep("u1", "eth0 193.0.2.5/24", "eth1 2001:db8::1/64"),
		ep("u2", "eth0 2001:db8::2/64"),
		sited("C", ep("c1", "eth0 193.0.2.6/24")),
	}
	job := NewJob(eps)
	same := [][2]string{{"a1", "a2"}, {"b1", "bc"}, {"bc", "c1"}, {"u1", "u2"}}
	apart := [][2]string{{"a1", "b1"}, {"a1", "u1"}, {"b1", "u1"}, {"c1", "a2"}, {"b1", "c1"}}
	for _, p := range same {
		if !job.sameSite(p[0], p[1]) {
			t.Errorf("%s (sites %v) and %s (sites %v) should share a site", p[0], job.sites[p[0]], p[1], job.sites[p[1]])
		}
	}
	for _, p := range apart {
		if job.sameSite(p[0], p[1]) {
			t.Errorf("%s (sites %v) and %s (sites %v) should share no site", p[0], job.sites[p[0]], p[1], job.sites[p[1]])
		}
	}
}

// Test-bed scenario 4: private networks joined by a router. No pair
// qualifies, so the thesis's fallback tries the private addresses.
func TestFallbackRoutedPrivate(t *testing.T) {
	a := ep("a", "lo 127.0.0.1/8", "eth0 10.1.0.2/24")
	b := ep("b", "lo 127.0.0.1/8", "eth0 10.2.0.2/24")
	res := Select(nil, a, b, true)
	if !res.Fallback || fmt.Sprint(res.Pairs) != "[eth0 10.1.0.2 -> eth0 10.2.0.2 (weight 0)]" {
		t.Fatalf("fallback %v, pairs %v", res.Fallback, res.Pairs)
	}
	// An address several hosts publish is never tried, even as a fallback.
	c := ep("c", "eth0 10.2.0.2/24")
	res = Select(NewJob([]Endpoint{a, b, c}), a, b, true)
	if len(res.Pairs) != 0 {
		t.Fatalf("pairs %v with a duplicated peer address", res.Pairs)
	}
	for _, want := range []string{"lo - lo: 127.0.0.1/8 - 127.0.0.1/8: loopback reaches only its own host", "eth0 - eth0: 10.1.0.2/24 - 10.2.0.2/24: 10.2.0.2 is on 2 hosts"} {
		if !strings.Contains(res.Explain(), want) {
			t.Errorf("explanation %q lacks %q", res.Explain(), want)
		}
	}
	// From b's end the local interface and address come first too.
	back := Select(NewJob([]Endpoint{a, b, c}), b, a, false)
	if want := "eth0 - eth0: 10.2.0.2/24 - 10.1.0.2/24: 10.2.0.2 is on 2 hosts"; !strings.Contains(back.Explain(), want) {
		t.Errorf("explanation %q lacks %q", back.Explain(), want)
	}

	// Nor is a network that collides across the job, even when neither
	// address does: two sites number 10.0.0.0/24 alike (10.0.0.1 on a1
	// and b1), so from a1 the 10.0.0.3 of b3 is an address of a1's own
	// segment. The routed 192.168.1/24 - 192.168.2/24 pair is the one to
	// try; the fallback once dialed 10.0.0.3 from eth1.
	a1 := ep("a1", "eth0 10.0.0.1/24", "eth1 192.168.1.1/24")
	a2 := ep("a2", "eth0 10.0.0.2/24", "eth1 192.168.1.2/24")
	b1 := ep("b1", "eth0 10.0.0.1/24", "eth1 192.168.2.1/24")
	b3 := ep("b3", "eth0 10.0.0.3/24", "eth1 192.168.2.3/24")
	job := NewJob([]Endpoint{a1, a2, b1, b3})
	for _, left := range []bool{true, false} {
		res := Select(job, a1, b3, left)
		if got, want := fmt.Sprint(res.Pairs), "[eth1 192.168.1.1 -> eth1 192.168.2.3 (weight 0)]"; !res.Fallback || got != want {
			t.Errorf("colliding sites, localLeft=%v: fallback %v, pairs %s; want the fallback %s", left, res.Fallback, got, want)
		}
		if !strings.Contains(res.Explain(), "10.0.0.0/24 collides across the job") {
			t.Errorf("colliding sites: the refusals do not name the collision: %s", res.Explain())
		}
	}
}

// Link-local needs another network to show the link is shared; then it wins
// the tie at weight 1 and is dialed with the local interface as zone, at
// both ends of the connection.
func TestLinkLocal(t *testing.T) {
	a := ep("a", "eth0 10.9.0.1/24", "ib0 10.0.0.1/24 fe80::1/64")
	b := ep("b", "eth0 10.9.0.2/24", "ib1 10.0.0.2/24 fe80::2/64")
	res := Select(nil, a, b, true)
	if got, want := fmt.Sprint(res.Pairs), "[eth0 10.9.0.1 -> eth0 10.9.0.2 (weight 1) ib0 fe80::1%ib0 -> ib1 fe80::2%ib0 (weight 1)]"; got != want {
		t.Errorf("pairs %s, want %s", got, want)
	}
	back := Select(nil, b, a, false)
	if got, want := fmt.Sprint(back.Pairs), "[eth0 10.9.0.2 -> eth0 10.9.0.1 (weight 1) ib1 fe80::2%ib1 -> ib0 fe80::1%ib1 (weight 1)]"; got != want {
		t.Errorf("from the other end: pairs %s, want %s", got, want)
	}
	// A public network on the same link weighs more than link-local.
	pub := Select(nil, ep("a", "eth0 193.0.2.1/24 fe80::1/64"), ep("b", "eth0 193.0.2.2/24 fe80::2/64"), true)
	if len(pub.Pairs) != 1 || pub.Pairs[0].Weight != WeightPublicSame {
		t.Errorf("public and link-local: pairs %v", pub.Pairs)
	}
	// Without another network link-local is refused: a zone alone cannot
	// show that two hosts share the link.
	alone := Select(nil, ep("a", "eth0 fe80::1/64"), ep("b", "eth0 fe80::2/64"), true)
	if len(alone.Pairs) != 0 || !strings.Contains(alone.Explain(), "link may differ") {
		t.Errorf("link-local alone: pairs %v, refusals %s", alone.Pairs, alone.Explain())
	}
}

// Ranks on one host use loopback only, one connection. Two endpoints
// whose launcher gave them one host name (os.Hostname, in containers)
// but no address in common are two machines: loopback would reach
// neither's peer.
func TestSameHost(t *testing.T) {
	for _, tc := range []struct {
		name        string
		left, right Endpoint
		want        string
	}{
		{"one machine", ep("h", "lo 127.0.0.1/8 ::1/128", "eth0 10.0.0.1/24", "eth1 2001:db8::1/64"),
			ep("h", "lo 127.0.0.1/8 ::1/128", "eth0 10.0.0.1/24", "eth1 2001:db8::1/64"),
			"[lo 127.0.0.1 -> lo 127.0.0.1 (weight 1)]"},
		{"loopback only", ep("h", "lo 127.0.0.1/8"), ep("h", "lo 127.0.0.1/8"),
			"[lo 127.0.0.1 -> lo 127.0.0.1 (weight 1)]"},
		{"one name, two machines", ep("node", "lo 127.0.0.1/8", "eth0 10.0.0.1/24"),
			ep("node", "lo 127.0.0.1/8", "eth0 10.0.0.2/24"),
			"[eth0 10.0.0.1 -> eth0 10.0.0.2 (weight 1)]"},
		{"one name, two machines with docker", ep("node", "lo 127.0.0.1/8", "docker0 172.17.0.1/16", "eth0 10.0.0.1/24"),
			ep("node", "lo 127.0.0.1/8", "docker0 172.17.0.1/16", "eth0 10.0.0.2/24"),
			"[eth0 10.0.0.1 -> eth0 10.0.0.2 (weight 1)]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := Select(nil, tc.left, tc.right, true)
			if got := fmt.Sprint(res.Pairs); got != tc.want {
				t.Errorf("pairs %s, want %s", got, tc.want)
			}
		})
	}
}

// Both ends get the same pairs, mirrored, whatever the instance.
func TestAgreement(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	pool := []string{"10.0.0.%d/24", "10.0.1.%d/24", "192.168.5.%d/24", "193.175.13.%d/24", "193.175.14.%d/24",
		"2001:db8:1::%d/64", "2001:db8:2::%d/64", "fd00:1::%d/64", "fe80::%d/64", "172.17.0.1/16"}
	gen := func(host string, id int) Endpoint {
		e := Endpoint{Host: host}
		for i := range 1 + r.IntN(5) {
			var f Interface
			f.Name = fmt.Sprintf("eth%d", i)
			for range 1 + r.IntN(3) {
				s := pool[r.IntN(len(pool))]
				if strings.Contains(s, "%d") {
					s = fmt.Sprintf(s, id)
				}
				f.Addrs = append(f.Addrs, netip.MustParsePrefix(s))
			}
			e.Ifaces = append(e.Ifaces, f)
		}
		return e
	}
	for n := range 500 {
		a, b, c := gen("a", 2), gen("b", 3), gen("c", 4)
		job := NewJob([]Endpoint{a, b, c})
		x, y := Select(job, a, b, true), Select(job, b, a, false)
		if !mirrored(x, y) {
			t.Fatalf("instance %d: %v (fallback %v) at one end, %v (fallback %v) at the other", n, x.Pairs, x.Fallback, y.Pairs, y.Fallback)
		}
	}
}

// mirrored reports whether x and y, the two ends' Select of one pair of
// ranks, chose the same connections seen from either end.
func mirrored(x, y Result) bool {
	if len(x.Pairs) != len(y.Pairs) || x.Fallback != y.Fallback {
		return false
	}
	for k, p := range x.Pairs {
		q := y.Pairs[k]
		if p.Local != q.Peer || p.Peer != q.Local || p.LocalAddr.WithZone("") != q.PeerAddr.WithZone("") || p.PeerAddr.WithZone("") != q.LocalAddr.WithZone("") {
			return false
		}
	}
	return true
}

// bruteForce returns the best (cardinality, weight) over all matchings.
func bruteForce(w [][]Weight) (card int, weight Weight) {
	used := make([]bool, len(w[0]))
	var rec func(i, c int, s Weight)
	rec = func(i, c int, s Weight) {
		if i == len(w) {
			if c > card || (c == card && s > weight) {
				card, weight = c, s
			}
			return
		}
		rec(i+1, c, s)
		for j, x := range w[i] {
			if x > 0 && !used[j] {
				used[j] = true
				rec(i+1, c+1, s+x)
				used[j] = false
			}
		}
	}
	rec(0, 0, 0)
	return card, weight
}

func checkMatching(t *testing.T, w [][]Weight, m [][2]int) (int, Weight) {
	t.Helper()
	rows, cols := map[int]bool{}, map[int]bool{}
	var s Weight
	for _, p := range m {
		if rows[p[0]] || cols[p[1]] {
			t.Fatalf("%v: vertex used twice in %v", w, m)
		}
		rows[p[0]], cols[p[1]] = true, true
		if w[p[0]][p[1]] <= 0 {
			t.Fatalf("%v: zero edge in %v", w, m)
		}
		s += w[p[0]][p[1]]
	}
	return len(m), s
}

// Assign agrees with brute force on random small instances, square and not.
func TestAssignAgainstBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for n := range 3000 {
		rows, cols := 1+r.IntN(6), 1+r.IntN(6)
		density := r.Float64()
		w := make([][]Weight, rows)
		for i := range w {
			w[i] = make([]Weight, cols)
			for j := range w[i] {
				if r.Float64() < density {
					w[i][j] = Weight(1 + r.IntN(3))
				}
			}
		}
		m := Assign(w)
		c, s := checkMatching(t, w, m)
		bc, bs := bruteForce(w)
		if c != bc || s != bs {
			t.Fatalf("instance %d %v: Assign %v has cardinality %d weight %d, brute force %d %d", n, w, m, c, s, bc, bs)
		}
	}
}

// Cardinality beats weight: two weight-1 edges beat one weight-3 edge.
func TestAssignCardinalityFirst(t *testing.T) {
	w := [][]Weight{{3, 1}, {1, 0}}
	if got := fmt.Sprint(Assign(w)); got != "[[0 1] [1 0]]" {
		t.Errorf("Assign(%v) = %s, want [[0 1] [1 0]]", w, got)
	}
	if got := Assign([][]Weight{{0, 0}, {0, 0}}); len(got) != 0 {
		t.Errorf("empty graph matched %v", got)
	}
	if got := Assign(nil); len(got) != 0 {
		t.Errorf("nil matched %v", got)
	}
}

// 64 interfaces a side (the card's limit) is solved and checked against the
// size a complete bipartite graph must reach.
func TestAssignLarge(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const n = 64
	w := make([][]Weight, n)
	for i := range w {
		w[i] = make([]Weight, n)
		for j := range w[i] {
			w[i][j] = Weight(1 + r.IntN(3))
		}
	}
	if c, _ := checkMatching(t, w, Assign(w)); c != n {
		t.Fatalf("complete graph of %d: matched %d", n, c)
	}
}

func BenchmarkAssign16(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 8))
	w := make([][]Weight, 16)
	for i := range w {
		w[i] = make([]Weight, 16)
		for j := range w[i] {
			w[i][j] = Weight(r.IntN(4))
		}
	}
	for b.Loop() {
		Assign(w)
	}
}

// An IPv4-mapped IPv6 address (::ffff:10.0.0.1) is the IPv4 address it
// maps, for collisions as for scopes: a private network on which two hosts
// publish one address is refused in either form. The collision check once
// looked the mapped form up among owners that NewJob had recorded unmapped,
// found none, and chose the colliding network.
func TestMappedAddressesCollide(t *testing.T) {
	for _, tc := range []struct {
		name    string
		a, b, c string // c publishes a's address
	}{
		{"IPv4", "eth0 10.0.0.1/24", "eth0 10.0.0.2/24", "eth0 10.0.0.1/24"},
		{"IPv4-mapped", "eth0 ::ffff:10.0.0.1/120", "eth0 ::ffff:10.0.0.2/120", "eth0 ::ffff:10.0.0.1/120"},
		{"mixed", "eth0 ::ffff:10.0.0.1/120", "eth0 10.0.0.2/24", "eth0 10.0.0.1/24"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b, c := ep("a", tc.a), ep("b", tc.b), ep("c", tc.c)
			for _, job := range []*Job{NewJob([]Endpoint{a, b, c}), NewJob([]Endpoint{ep("a", "eth0 10.0.0.1/24"), b, c})} {
				res := Select(job, a, b, true)
				if len(res.Pairs) != 0 || !strings.Contains(res.Explain(), "collides across the job") {
					t.Errorf("chose %v on a network where 10.0.0.1 is on two hosts; refusals: %s", res.Pairs, res.Explain())
				}
			}
			// Unmapping leaves the caller's endpoints as they were.
			if got := a.Ifaces[0].Addrs[0].String(); got != strings.Fields(tc.a)[1] {
				t.Errorf("Select changed the caller's address to %s", got)
			}
		})
	}
}

// Every address pair of a chosen interface pair that would do is kept,
// best first, as the pair's alternates, for Connect to try when the first
// does not connect. On an IPv4 LAN every Linux interface also has an fe80::
// address, and the link-local pair wins the tie; a host that drops IPv6
// then left Connect with nothing to fall back on, although the IPv4 pair
// works.
func TestAlternates(t *testing.T) {
	tests := []struct {
		name   string
		a, b   Endpoint
		others []Endpoint
		want   string // the first pair, then its alternates, from a
	}{
		{
			name: "link-local backed by the IPv4 LAN",
			a:    ep("a", "eth0 10.1.0.1/24 fe80::1/64"), b: ep("b", "eth0 10.1.0.2/24 fe80::2/64"),
			want: "eth0 fe80::1%eth0 -> eth0 fe80::2%eth0 (weight 1) | eth0 10.1.0.1 -> eth0 10.1.0.2 (weight 1)",
		},
		{
			name: "best first",
			a:    ep("a", "eth0 10.1.0.1/24 fd00::1/64 2001:db8:1::1/64"), b: ep("b", "eth0 10.1.0.2/24 fd00::2/64 2001:db8:2::2/64"),
			want: "eth0 2001:db8:1::1 -> eth0 2001:db8:2::2 (weight 3) | eth0 10.1.0.1 -> eth0 10.1.0.2 (weight 1), eth0 fd00::1 -> eth0 fd00::2 (weight 1)",
		},
		{
			name: "only pairs that qualify back one that does",
			a:    ep("a", "eth0 10.1.0.1/24 192.168.1.1/24"), b: ep("b", "eth0 10.1.0.2/24 192.168.2.2/24"),
			want: "eth0 10.1.0.1 -> eth0 10.1.0.2 (weight 1) | ",
		},
		{
			name: "refused pairs are never alternates",
			a:    ep("a", "eth0 10.1.0.1/24 fe80::1/64"), b: ep("b", "eth0 10.1.0.2/24 fe80::2/64"),
			others: []Endpoint{ep("c", "eth0 10.1.0.1/24")},
			want:   "",
		},
		{
			// Across named sites the shared private network is the
			// likelier fallback; the routed one is still tried when it
			// fails.
			name: "fallbacks of every rank",
			a:    Endpoint{Host: "a", Site: "x", Ifaces: []Interface{ifc("eth0 fd00:1::1/64 10.1.0.1/24")}},
			b:    Endpoint{Host: "b", Site: "y", Ifaces: []Interface{ifc("eth0 fd00:2::2/64 10.1.0.2/24")}},
			want: "eth0 10.1.0.1 -> eth0 10.1.0.2 (weight 0) | eth0 fd00:1::1 -> eth0 fd00:2::2 (weight 0)",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			job := NewJob(append([]Endpoint{tc.a, tc.b}, tc.others...))
			for _, aLeft := range []bool{true, false} {
				res := Select(job, tc.a, tc.b, aLeft)
				got := ""
				if len(res.Pairs) > 0 {
					var alts []string
					for _, a := range res.Pairs[0].Alternates {
						alts = append(alts, a.String())
					}
					got = res.Pairs[0].String() + " | " + strings.Join(alts, ", ")
				}
				if got != tc.want {
					t.Errorf("aLeft=%v: got %q, want %q", aLeft, got, tc.want)
				}
			}
		})
	}
}

// TestAlternatesHaveNoAlternates: as Pair.Alternates says, an alternate
// has none of its own; built from the pair as its alternates grew, each
// carried those before it, and a caller following them dialed those
// pairs twice.
func TestAlternatesHaveNoAlternates(t *testing.T) {
	a := ep("a", "eth0 10.1.0.1/24 fd00::1/64 2001:db8:1::1/64")
	b := ep("b", "eth0 10.1.0.2/24 fd00::2/64 2001:db8:2::2/64")
	for _, left := range []bool{true, false} {
		res := Select(nil, a, b, left)
		alts := 0
		for _, p := range res.Pairs {
			alts += len(p.Alternates)
			for k, alt := range p.Alternates {
				if len(alt.Alternates) != 0 {
					t.Errorf("localLeft=%v: alternate %d (%v) has %d alternates of its own: %v", left, k, alt, len(alt.Alternates), alt.Alternates)
				}
			}
		}
		if alts < 2 {
			t.Errorf("localLeft=%v: %d alternates in %v; the test wants several", left, alts, res.Pairs)
		}
	}
}
