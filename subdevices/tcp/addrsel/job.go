package addrsel

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
)

// Job is what the whole job's cards say about addresses: which ones several
// hosts publish, and which hosts share a site. It is immutable once made and
// safe for concurrent use.
type Job struct {
	owners map[netip.Addr][]string // non-loopback address -> hosts publishing it, sorted
	dups   []netip.Addr            // addresses with more than one owner, sorted
	sites  map[string][]int        // host -> the sites it is in, sorted; at least one
	named  map[string]bool         // hosts whose ranks name a site
}

// NewJob indexes the endpoints of every rank of a job. Ranks on one host
// (equal Host) count once; loopback addresses are ignored, since every host
// has them.
//
// Sites come from the launcher where it names them ([Endpoint.Site]): a
// host is in each site its ranks name and in no other, whatever networks
// it shares. A host whose ranks name two sites is in both without joining
// them: two hosts share a site only through a site they both name, as
// only then does the launcher say that their private networks are one.
// Hosts that name none are grouped by the networks they share without
// collisions, among themselves, each into one site.
func NewJob(eps []Endpoint) *Job {
	j := &Job{owners: map[netip.Addr][]string{}, sites: map[string][]int{}, named: map[string]bool{}}
	hosts := map[string][]netip.Prefix{}
	named := map[string][]string{} // host -> the sites its ranks name
	var order []string
	for _, ep := range eps {
		ep = unmapped(ep)
		if _, seen := hosts[ep.Host]; !seen {
			order = append(order, ep.Host)
			hosts[ep.Host] = nil
		}
		if ep.Site != "" && !slices.Contains(named[ep.Host], ep.Site) {
			named[ep.Host] = append(named[ep.Host], ep.Site)
		}
		for _, ifc := range ep.Ifaces {
			for _, p := range ifc.Addrs {
				a := p.Addr()
				if !a.IsValid() || ScopeOf(a) == ScopeLoopback {
					continue
				}
				hosts[ep.Host] = append(hosts[ep.Host], p)
				if !slices.Contains(j.owners[a], ep.Host) {
					j.owners[a] = append(j.owners[a], ep.Host)
				}
			}
		}
	}
	for a, hs := range j.owners {
		slices.Sort(hs)
		if len(hs) > 1 {
			j.dups = append(j.dups, a)
		}
	}
	slices.SortFunc(j.dups, netip.Addr.Compare)

	// Derived sites: hosts joined by a network they share that has no
	// collision (link-local and loopback say nothing about sites). Hosts
	// with a named site take no part: a network shared across two named
	// sites, such as the WAN between two clusters' relays, says nothing
	// about their private ranges.
	parent := map[string]string{}
	var find func(string) string
	find = func(h string) string {
		if parent[h] == h {
			return h
		}
		r := find(parent[h])
		parent[h] = r
		return r
	}
	first := map[netip.Prefix]string{} // network -> first host seen on it
	for _, h := range order {
		if len(named[h]) > 0 {
			continue
		}
		parent[h] = h
		for _, p := range hosts[h] {
			if ScopeOf(p.Addr()) == ScopeLinkLocal {
				continue
			}
			n := p.Masked()
			if j.collidingNet(n) {
				continue
			}
			if h0, ok := first[n]; ok {
				parent[find(h)] = find(h0)
			} else {
				first[n] = h
			}
		}
	}
	// Site numbers only say which hosts share a site; a named site and a
	// derived one never get the same number.
	ids := map[string]int{}
	id := func(key string) int {
		if _, ok := ids[key]; !ok {
			ids[key] = len(ids)
		}
		return ids[key]
	}
	for _, h := range order {
		if len(named[h]) == 0 {
			j.sites[h] = []int{id("derived " + find(h))}
			continue
		}
		j.named[h] = true
		for _, s := range named[h] {
			j.sites[h] = append(j.sites[h], id("named "+s))
		}
		slices.Sort(j.sites[h])
	}
	return j
}

// unmapped returns ep with every IPv4-mapped IPv6 address (::ffff:a.b.c.d)
// written as the IPv4 address it is. The owners, collisions and networks
// are looked up by address and prefix, so one form must hold throughout:
// a mapped address once escaped the collision check, NewJob counting it
// under one form and the weighing looking it up under the other. ep's
// slices are copied, not changed, when there is anything to unmap.
func unmapped(ep Endpoint) Endpoint {
	mapped := func(p netip.Prefix) bool { return p.Addr().Is4In6() }
	if !slices.ContainsFunc(ep.Ifaces, func(ifc Interface) bool { return slices.ContainsFunc(ifc.Addrs, mapped) }) {
		return ep
	}
	ifaces := slices.Clone(ep.Ifaces)
	for i, ifc := range ifaces {
		addrs := slices.Clone(ifc.Addrs)
		for k, p := range addrs {
			if mapped(p) {
				// A prefix shorter than /96 is no IPv4 network; the
				// address alone is all it says.
				bits := p.Bits() - 96
				if bits < 0 {
					bits = 32
				}
				addrs[k] = netip.PrefixFrom(p.Addr().Unmap(), bits)
			}
		}
		ifaces[i].Addrs = addrs
	}
	ep.Ifaces = ifaces
	return ep
}

// collidingNet returns whether several hosts publish some address in n.
func (j *Job) collidingNet(n netip.Prefix) bool {
	return j.collisionIn(n, nil).IsValid()
}

// collisionIn returns an address in n that two hosts publish, counting only
// hosts for which in returns true (all hosts when in is nil), or the zero
// Addr when there is none.
func (j *Job) collisionIn(n netip.Prefix, in func(host string) bool) netip.Addr {
	for _, d := range j.dups {
		if !n.Contains(d) {
			continue
		}
		k := 0
		for _, h := range j.owners[d] {
			if in == nil || in(h) {
				k++
			}
		}
		if k > 1 {
			return d
		}
	}
	return netip.Addr{}
}

// Knows reports whether host is one of the job's.
func (j *Job) Knows(host string) bool {
	_, ok := j.sites[host]
	return ok
}

// sharedSites returns the sites both a and b are in, nil if none.
func (j *Job) sharedSites(a, b string) []int {
	var s []int
	for _, x := range j.sites[a] {
		if slices.Contains(j.sites[b], x) {
			s = append(s, x)
		}
	}
	return s
}

// sameNet reports whether x and y sit on one network by both prefixes.
func sameNet(x, y netip.Prefix) bool { return x.Contains(y.Addr()) && y.Contains(x.Addr()) }

// weigh returns the best connection between interface i of left and
// interface k of right.
func (j *Job) weigh(left Endpoint, i int, right Endpoint, k int) edge {
	li, ri := left.Ifaces[i], right.Ifaces[k]
	c := addrCtx{job: j, lh: left.Host, rh: right.Host, sameHost: left.Host == right.Host && sameMachine(left, right)}
	c.loopback = c.sameHost && hasLoopback(left) && hasLoopback(right)

	var best edge
	var notes []note
	var tried []altAddrs // every pair that qualifies or may route, in the order weighed
	common := false
	// Non-link-local pairs first: a link-local pair is only usable when one
	// of them shows that the two interfaces share a link.
	shared := false
	for pass := range 2 {
		for _, x := range li.Addrs {
			for _, y := range ri.Addrs {
				if x.Addr().Is4() != y.Addr().Is4() {
					continue
				}
				common = true
				ll := ScopeOf(x.Addr()) == ScopeLinkLocal || ScopeOf(y.Addr()) == ScopeLinkLocal
				if ll != (pass == 1) {
					continue
				}
				w, reason, fb := c.weighAddrs(x, y, shared)
				if pass == 0 && (w == WeightPrivateSame || w == WeightPublicSame) {
					shared = true
				}
				if w > 0 || fb > 0 {
					tried = append(tried, altAddrs{l: x.Addr(), r: y.Addr(), w: w, fallback: fb})
				}
				switch {
				// Ties keep the first pair in card order, except that a
				// link-local pair beats the pair that showed its link is
				// shared: with its zone it is pinned to this interface,
				// whereas two interfaces on one subnet would both send
				// through whichever the routing table lists first. It
				// stays first although a host that firewalls IPv6 (on
				// an IPv4 LAN every Linux interface still has fe80::)
				// cannot use it: the pair that showed the link is shared
				// is its alternate, tried when it fails or stalls, which
				// costs a refused connect or the alternate's head start
				// (see the tcp subdevice's Connect), whereas a lane that
				// leaves by the wrong interface costs its bandwidth for
				// as long as it lives.
				case w > best.w || (pass == 1 && w > 0 && w == best.w && x.Addr().Is6()):
					best = edge{w: w, l: x.Addr(), r: y.Addr()}
				case w == 0:
					notes = append(notes, note{x, y, reason})
					if best.w == 0 && fb > best.fallback {
						best = edge{fallback: fb, l: x.Addr(), r: y.Addr()}
					}
				}
			}
		}
	}
	// The rest, best first, as the alternates of the pair chosen: a pair
	// the cards say works may not (a firewall, a route the cards do not
	// show), and another pair of the same interfaces may. A qualifying
	// pair is backed only by qualifying ones, a fallback by fallbacks of
	// every rank.
	for _, t := range tried {
		if (t.l != best.l || t.r != best.r) && (best.w > 0) == (t.w > 0) {
			best.alts = append(best.alts, t)
		}
	}
	slices.SortStableFunc(best.alts, func(a, b altAddrs) int {
		return cmp.Or(cmp.Compare(b.w, a.w), cmp.Compare(b.fallback, a.fallback))
	})
	switch {
	case best.w > 0:
	case !common:
		best.noFamily = [2]string{families(li), families(ri)}
	default:
		best.notes = notes
	}
	return best
}

// note is why one address pair of an edge was refused.
type note struct {
	x, y netip.Prefix // left, right
	why  string
}

// reason explains a refused edge, with the local end first: flip says the
// local end is the right one.
func (e edge) reason(flip bool) string {
	if e.noFamily[0] != "" {
		l, r := e.noFamily[0], e.noFamily[1]
		if flip {
			l, r = r, l
		}
		return fmt.Sprintf("no common address family (%s / %s)", l, r)
	}
	var parts []string
	for _, n := range e.notes {
		x, y := n.x, n.y
		if flip {
			x, y = y, x
		}
		parts = append(parts, fmt.Sprintf("%v - %v: %s", x, y, n.why))
	}
	return strings.Join(parts, ", ")
}

func families(ifc Interface) string {
	var has4, has6 bool
	for _, p := range ifc.Addrs {
		if p.Addr().Is4() {
			has4 = true
		} else {
			has6 = true
		}
	}
	switch {
	case has4 && has6:
		return "IPv4+IPv6"
	case has4:
		return "IPv4 only"
	case has6:
		return "IPv6 only"
	}
	return "no addresses"
}

// sameMachine reports whether two endpoints of one host name are one
// machine, as their cards show it: they list the same addresses besides
// loopback (the ranks of a machine publish its interfaces alike). A
// launcher that names hosts by os.Hostname gives one name to containers,
// or machines, that are not one, and their loopbacks do not meet; one
// address in common is not enough, as docker0's 172.17.0.1 is on every
// host that runs docker.
func sameMachine(a, b Endpoint) bool {
	addrs := func(ep Endpoint) map[netip.Addr]bool {
		m := map[netip.Addr]bool{}
		for _, ifc := range ep.Ifaces {
			for _, p := range ifc.Addrs {
				if ScopeOf(p.Addr()) != ScopeLoopback {
					m[p.Addr()] = true
				}
			}
		}
		return m
	}
	return maps.Equal(addrs(a), addrs(b))
}

func hasLoopback(ep Endpoint) bool {
	for _, ifc := range ep.Ifaces {
		for _, p := range ifc.Addrs {
			if ScopeOf(p.Addr()) == ScopeLoopback {
				return true
			}
		}
	}
	return false
}

// addrCtx is what weighing one address pair needs to know about its hosts.
type addrCtx struct {
	job      *Job
	lh, rh   string
	sameHost bool
	loopback bool // both ranks are on one host and both list loopback
}

// Fallback ranks (edge.fallback): where no pair qualifies, the likelier
// to route is tried first.
const (
	fallbackRouted      Weight = 1
	fallbackAcrossSites Weight = 2
)

// weighAddrs grades the address pair (x on the left, y on the right) of one
// family. sharedLink says whether the two interfaces share a network without
// collisions, which is what makes link-local usable. fallback ranks a
// refused pair that may still route (edge.fallback).
func (c addrCtx) weighAddrs(x, y netip.Prefix, sharedLink bool) (w Weight, reason string, fallback Weight) {
	a, b := x.Addr(), y.Addr()
	sa, sb := ScopeOf(a), ScopeOf(b)
	switch {
	case sa == ScopeLoopback || sb == ScopeLoopback:
		switch {
		case !c.sameHost:
			return 0, "loopback reaches only its own host", 0
		case sa != sb:
			return 0, "loopback facing a non-loopback address", 0
		}
		return WeightPrivateSame, "", 0
	case c.loopback:
		return 0, "same host: loopback is used", 0
	case a == b && !c.sameHost:
		return 0, fmt.Sprintf("both hosts have %v (a local bridge such as docker0?)", a), 0
	}
	// A private network is judged within the sites both hosts are in when
	// they share one; everything else against the whole job.
	var inSite func(string) bool
	shared := c.job.sharedSites(c.lh, c.rh)
	if shared != nil {
		inSite = func(h string) bool {
			return slices.ContainsFunc(c.job.sites[h], func(s int) bool { return slices.Contains(shared, s) })
		}
	}
	private := sa == ScopePrivate && sb == ScopePrivate
	if private && sameNet(x, y) {
		for _, n := range []netip.Prefix{x.Masked(), y.Masked()} {
			if d := c.job.collisionIn(n, inSite); d.IsValid() {
				return 0, fmt.Sprintf("private network %v collides across the job (%v is on several hosts)", n, d), 0
			}
		}
	}
	for _, d := range []netip.Addr{a, b} {
		hosts := c.job.owners[d]
		if private && inSite != nil {
			hosts = slices.DeleteFunc(slices.Clone(hosts), func(h string) bool { return !inSite(h) })
		}
		if len(hosts) > 1 {
			return 0, fmt.Sprintf("%v is on %d hosts of the job", d, len(hosts)), 0
		}
	}
	// Nor is a colliding network of use as a fallback between two: a
	// host of one site dialing 10.0.0.3 in another reaches its own
	// site's 10.0.0.3, if anybody.
	if private && !sameNet(x, y) {
		for _, n := range []netip.Prefix{x.Masked(), y.Masked()} {
			if d := c.job.collisionIn(n, inSite); d.IsValid() {
				return 0, fmt.Sprintf("private network %v collides across the job (%v is on several hosts)", n, d), 0
			}
		}
	}
	switch {
	case sa == ScopeLinkLocal || sb == ScopeLinkLocal:
		switch {
		case sa != sb:
			other := sa
			if sa == ScopeLinkLocal {
				other = sb
			}
			return 0, fmt.Sprintf("link-local facing a %v address", other), 0
		case !sharedLink:
			return 0, "link-local, and the interfaces share no other network, so the link may differ", 0
		}
		return WeightPrivateSame, "", 0
	case private:
		switch {
		case !sameNet(x, y):
			return 0, "private addresses on different networks", fallbackRouted
		// The launcher says these two are different clusters: their
		// private networks may be one (a routed campus network, a VPN)
		// or merely numbered alike, so this is tried when nothing else
		// is, never striped beside a pair that works.
		case inSite == nil && c.job.named[c.lh] && c.job.named[c.rh]:
			return 0, "private network across sites, tried only when no other pair qualifies", fallbackAcrossSites
		}
		return WeightPrivateSame, "", 0
	case sa == ScopePrivate || sb == ScopePrivate:
		return 0, "private address facing a public one", fallbackRouted
	case sameNet(x, y):
		return WeightPublicSame, "", 0
	}
	return WeightPublicRouted, "", 0
}
