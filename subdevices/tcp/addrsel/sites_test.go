package addrsel

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
)

// sited returns e with its site named.
func sited(site string, e Endpoint) Endpoint {
	e.Site = site
	return e
}

// sameSite reports whether hosts a and b share a site.
func (j *Job) sameSite(a, b string) bool { return len(j.sharedSites(a, b)) > 0 }

// Every rank builds its Job from the cards with its own first (tcp's
// SetJobCards), so two ranks index the job in different orders; they must
// still agree on the pairs, named sites and derived ones mixed, hosts with
// several ranks (and several named sites) included.
func TestSelectSymmetricWithSites(t *testing.T) {
	pool := []string{"10.0.0.1/24", "10.0.0.2/24", "10.0.0.3/24", "10.0.1.1/24", "192.168.0.1/24", "192.168.0.2/24",
		"fd00::1/64", "fd00::2/64", "fd00:1::1/64", "fe80::1/64", "fe80::2/64", "198.51.100.1/24", "198.51.100.2/24",
		"203.0.113.5/24", "127.0.0.1/8", "172.17.0.1/16", "169.254.0.1/16"}
	sites := []string{"", "", "A", "B"}
	for seed := range uint64(20000) {
		r := rand.New(rand.NewPCG(seed, 7))
		nh := 2 + r.IntN(4)
		hostIfs := make([][]Interface, nh)
		for h := range hostIfs {
			for k := range 1 + r.IntN(3) {
				f := Interface{Name: fmt.Sprintf("e%d", k)}
				for range 1 + r.IntN(2) {
					f.Addrs = append(f.Addrs, netip.MustParsePrefix(pool[r.IntN(len(pool))]))
				}
				hostIfs[h] = append(hostIfs[h], f)
			}
		}
		var eps []Endpoint
		for range 2 + r.IntN(5) {
			h := r.IntN(nh)
			eps = append(eps, Endpoint{Host: fmt.Sprintf("h%d", h), Site: sites[r.IntN(len(sites))], Ifaces: hostIfs[h]})
		}
		jobOf := func(i int) *Job { // i's own card first, then the others in rank order
			v := []Endpoint{eps[i]}
			for k, e := range eps {
				if k != i {
					v = append(v, e)
				}
			}
			return NewJob(v)
		}
		for i := range eps {
			for j := i + 1; j < len(eps); j++ {
				a := Select(jobOf(i), eps[i], eps[j], true)
				b := Select(jobOf(j), eps[j], eps[i], false)
				if !mirrored(a, b) {
					t.Fatalf("seed %d: rank %d chose %v (fallback %v), rank %d chose %v (fallback %v)\neps=%+v",
						seed, i, a.Pairs, a.Fallback, j, b.Pairs, b.Fallback, eps)
				}
			}
		}
	}
}

// Two hosts are in one site only through a site they both name. Clusters
// A, B and C all number their LAN 10.0.0.0/24: b1 of B must never dial
// c1's 10.0.0.2, which on B's LAN is not c1, and a host bc whose ranks
// name both B and C (PMI, or MD_SITE set per program) must not change
// that by joining B and C into one site in which the LAN shows no
// collision.
func TestTwoSiteHostKeepsSitesApart(t *testing.T) {
	base := []Endpoint{
		sited("A", ep("a1", "eth0 10.0.0.1/24")),
		sited("A", ep("a2", "eth0 10.0.0.2/24")),
		sited("B", ep("b1", "eth0 10.0.0.1/24")),
		sited("C", ep("c1", "eth0 10.0.0.2/24")),
		sited("B", ep("bc", "eth0 10.0.0.3/24")),
	}
	twoSites := append(base[:len(base):len(base)], sited("C", ep("bc", "eth0 10.0.0.3/24"))) // bc's second rank names C
	b1, c1, bc := base[2], base[3], base[4]
	tests := []struct {
		name     string
		eps      []Endpoint
		from, to Endpoint
		want     string
	}{
		{"b1 to c1", base, b1, c1, "[]"},
		{"b1 to c1, bc in B and C", twoSites, b1, c1, "[]"},
		{"bc to b1, sharing B", twoSites, bc, b1, "[eth0 10.0.0.3 -> eth0 10.0.0.1 (weight 1)]"},
		{"bc to c1, sharing C", twoSites, bc, c1, "[eth0 10.0.0.3 -> eth0 10.0.0.2 (weight 1)]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			job := NewJob(tc.eps)
			for _, left := range []bool{true, false} {
				if res := Select(job, tc.from, tc.to, left); fmt.Sprint(res.Pairs) != tc.want {
					t.Errorf("localLeft=%v: pairs %v, want %s (refused: %s)", left, res.Pairs, tc.want, res.Explain())
				}
			}
		})
	}
}

// Between two hosts that name different sites a private network is only a
// fallback, even when no address on it repeats: here cluster Q numbers its
// 10.0.0.0/24 from .101 (as examples/networks/relays.hcl might), and p01
// dialing q01's 10.0.0.101 from P's LAN reaches q01 only if the two LANs
// are one (a routed campus network, a VPN). So it is tried when nothing
// else is, and never striped beside a usable pair: p-relay must not add
// an eth0 lane to q-relay's 10.0.0.253 that would wait connect_timeout
// for nobody.
func TestNamedSitesNeverShareLAN(t *testing.T) {
	eps := map[string]Endpoint{}
	for _, e := range []Endpoint{
		sited("P", ep("p01", "eth0 10.0.0.1/24")),
		sited("P", ep("p-relay", "eth0 10.0.0.254/24", "wan 198.51.100.1/24")),
		sited("Q", ep("q01", "eth0 10.0.0.101/24")),
		sited("Q", ep("q-relay", "eth0 10.0.0.253/24", "wan 198.51.100.2/24")),
	} {
		eps[e.Host] = e
	}
	job := NewJob([]Endpoint{eps["p01"], eps["p-relay"], eps["q01"], eps["q-relay"]})
	tests := []struct {
		from, to string
		want     string
		fallback bool
	}{
		{"p-relay", "q-relay", "[wan 198.51.100.1 -> wan 198.51.100.2 (weight 2)]", false},
		{"p01", "q01", "[eth0 10.0.0.1 -> eth0 10.0.0.101 (weight 0)]", true},
		{"p01", "p-relay", "[eth0 10.0.0.1 -> eth0 10.0.0.254 (weight 1)]", false},
	}
	for _, tc := range tests {
		t.Run(tc.from+" to "+tc.to, func(t *testing.T) {
			for _, left := range []bool{true, false} {
				res := Select(job, eps[tc.from], eps[tc.to], left)
				if got := fmt.Sprint(res.Pairs); got != tc.want || res.Fallback != tc.fallback {
					t.Errorf("localLeft=%v: pairs %s (fallback %v), want %s (fallback %v); refused: %s",
						left, got, res.Fallback, tc.want, tc.fallback, res.Explain())
				}
			}
		})
	}
}

// TestFallbackPrefersSharedNetworkAcrossSites: two hosts of different
// sites with nothing but private networks, one of which they share (a
// VPN). The shared network's pair is the fallback tried, within an
// interface and across interfaces in either card order. Once such pairs
// were fallbacks at all, the first fallback in card order was kept, and
// matching interfaces gave every fallback edge one weight: the pair on
// different networks was dialed and the job that worked before failed.
func TestFallbackPrefersSharedNetworkAcrossSites(t *testing.T) {
	want := "192.168.5.1 -> "
	for _, tc := range []struct {
		name string
		p, q Endpoint
	}{
		{"one interface", sited("P", ep("p01", "eth0 10.1.0.1/16 192.168.5.1/24")), sited("Q", ep("q01", "eth0 10.2.0.1/16 192.168.5.2/24"))},
		{"two interfaces, crossed order", sited("P", ep("p01", "vpn0 192.168.5.1/24", "eth0 10.1.0.1/16")), sited("Q", ep("q01", "eth0 10.2.0.1/16", "vpn0 192.168.5.2/24"))},
	} {
		job := NewJob([]Endpoint{tc.p, tc.q})
		for _, left := range []bool{true, false} {
			res := Select(job, tc.p, tc.q, left)
			got := fmt.Sprint(res.Pairs)
			if !res.Fallback || !strings.Contains(got, want) || !strings.Contains(got, "192.168.5.2") || strings.Contains(got, "10.2.0.1") {
				t.Errorf("%s, localLeft=%v: pairs %s (fallback %v), want only the shared 192.168.5.0/24 as the fallback", tc.name, left, got, res.Fallback)
			}
		}
	}
}
