// Package addrsel chooses which local interface connects to which interface
// of a peer, and over which addresses, from what both hosts and the rest of
// the job publish. It does no I/O: callers describe interfaces and get pairs.
//
// It follows Peiselt, "Improved address selection for message passing in
// multi-domain cluster systems" (2007): local and peer interfaces are the two
// sides of a bipartite graph, each edge weighted by the best connection its
// addresses allow, and the pairs used are a maximum-cardinality,
// maximum-weight matching. Cardinality first gives the most independent
// connections for striping; no interface appears twice, so none is
// oversubscribed; weight then prefers the better kind of connection. Nothing
// is probed.
//
// # Weights
//
//	0  no connection: no common address family; private addresses on
//	   different networks; a private network whose addresses collide (the
//	   same address on two hosts of the job); a private network between
//	   hosts of different named sites; an address that several hosts
//	   publish (a docker0-like bridge); a private address facing a public one;
//	   loopback towards another host; link-local where the link is not known
//	   to be shared
//	1  private addresses (RFC 1918, 100.64/10, IPv6 ULA fc00::/7) on the same
//	   network without collisions; IPv6 link-local on a shared link;
//	   loopback between ranks on one host
//	2  public IPv4 or global IPv6 on the same network
//	3  public IPv4 or global IPv6 on different networks (routed)
//
// An edge's weight is the best over the address pairs of the two interfaces
// (one of each family), and that pair's addresses are the ones dialed first;
// the edge's other pairs that qualify follow, best first, as its
// alternates ([Pair.Alternates]), since the cards cannot show a firewall
// that drops one family.
//
// Collisions are found from every rank's interfaces ([NewJob]). As in the
// thesis a private network with a collision is refused, with one refinement
// so that two clusters that both number their private network 10.0.0.0/24
// still use it inside each cluster: hosts form sites, and a colliding
// private network is used between two hosts that share a site if it has no
// collision among the hosts of the sites they share. Two hosts that share
// no site never use a colliding network. The launcher names a host's site
// ([Endpoint.Site]); a host whose ranks name several is in each, and two
// hosts share a site only when both name it. For hosts it names none,
// hosts that share a network without collisions (a public or IPv6 subnet,
// say) form a site. Clusters with nothing but the colliding network (IPv4
// only, joined by relays) can only be told apart by named sites.
//
// Between two hosts that name different sites and share none, a private
// network is not known to be one network even where no address on it
// repeats: it may be the same numbering on two LANs, or a network the
// clusters really share (a routed campus network, a VPN). Such a pair is
// only a fallback (below): tried when no other pair between the two
// qualifies, never striped beside one that does.
//
// Link-local addresses (fe80::/10, 169.254/16) only reach their own link,
// which cards cannot show directly: they are used between two interfaces
// that also share a network without collisions (weight 1 or 2 on another
// address pair). At weight 1 they win the tie against that pair, because an
// IPv6 link-local address is dialed with the local interface as its zone,
// which pins the connection to that interface; two interfaces on one subnet
// would otherwise both send through whichever the routing table lists first.
// Where IPv6 is firewalled, the pair that showed the link is shared is the
// link-local pair's alternate.
// Loopback is used only between ranks on one host, and then it is the only
// pair.
//
// When no pair has a positive weight, [Select] falls back as the thesis does
// to private addresses on different networks (routed private networks, a VPN)
// or facing a public one, and to private networks between hosts of
// different named sites, hoping that routing is configured; addresses
// several hosts publish, and networks that collide, are never tried.
//
// # Agreement
//
// Both ends of a connection must choose the same pairs. [Select] takes the
// two endpoints in a canonical order that both ends compute alike (the
// caller puts the lower rank on the left) and is deterministic, so both get
// the same matching.
package addrsel

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Scope classifies an address by how far it reaches.
type Scope uint8

const (
	ScopeLoopback  Scope = iota + 1 // 127/8, ::1: this host only
	ScopeLinkLocal                  // 169.254/16, fe80::/10: one link
	ScopePrivate                    // RFC 1918, 100.64/10, fc00::/7: a site
	ScopePublic                     // everything else that is unicast
)

func (s Scope) String() string {
	switch s {
	case ScopeLoopback:
		return "loopback"
	case ScopeLinkLocal:
		return "link-local"
	case ScopePrivate:
		return "private"
	case ScopePublic:
		return "public"
	}
	return fmt.Sprintf("Scope(%d)", uint8(s))
}

var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// ScopeOf returns the scope of a unicast address.
func ScopeOf(a netip.Addr) Scope {
	a = a.Unmap()
	switch {
	case a.IsLoopback():
		return ScopeLoopback
	case a.IsLinkLocalUnicast():
		return ScopeLinkLocal
	case a.IsPrivate() || cgnat.Contains(a):
		return ScopePrivate
	}
	return ScopePublic
}

// Weight grades a possible connection; 0 means none.
type Weight int

// The weights of the thesis's table 3.1.
const (
	WeightNone          Weight = 0
	WeightPrivateSame   Weight = 1 // also link-local on a shared link, loopback on one host
	WeightPublicSame    Weight = 2
	WeightPublicRouted  Weight = 3
	maxWeight                  = WeightPublicRouted
	maxInterfacesPerEnd        = 256 // far beyond any host; bounds the matching's work
)

// Interface is one network interface of a host as its card lists it.
type Interface struct {
	Name  string
	Addrs []netip.Prefix // each address with its prefix length
	Speed uint32         // link speed in Mbit/s; 0 where the system does not report it
}

// Endpoint is one rank's side: its host and the interfaces it may use.
type Endpoint struct {
	// Host identifies the machine: endpoints with equal Host are ranks on
	// one host, which reach each other over loopback. It must not be empty.
	Host string
	// Site is the launcher's name for the cluster Host belongs to, "" if
	// it names none. Hosts that name one site share it, whatever their
	// networks; hosts that name different sites use a private network
	// between them only as a fallback; see [NewJob].
	Site   string
	Ifaces []Interface
}

// Pair is one chosen connection, seen from the local end.
type Pair struct {
	Local, Peer         int        // interface indexes in the local and peer Endpoint
	LocalName, PeerName string     // their names
	LocalAddr           netip.Addr // bind here; link-local carries the local interface as zone
	PeerAddr            netip.Addr // dial here; link-local carries the local interface as zone
	Weight              Weight     // 0 for a fallback pair
	// Speed is the slower end's link speed in Mbit/s, 0 when either end
	// does not report one.
	Speed uint32
	// Alternates are the other address pairs of the same two interfaces,
	// best first: the other pairs that qualify when this one does, the
	// other fallbacks of any rank when this one is a fallback. Each is a
	// Pair like this one but for LocalAddr, PeerAddr and Weight, and has
	// no Alternates of its own. A caller tries them in turn when this
	// pair does not connect: the cards cannot show a firewall that drops
	// IPv6, or a route that is missing.
	Alternates []Pair
}

func (p Pair) String() string {
	return fmt.Sprintf("%s %v -> %s %v (weight %d)", p.LocalName, p.LocalAddr, p.PeerName, p.PeerAddr, p.Weight)
}

// Refusal says why one pair of interfaces cannot connect.
type Refusal struct {
	Local, Peer         int
	LocalName, PeerName string
	Reason              string
}

func (r Refusal) String() string {
	return fmt.Sprintf("%s - %s: %s", r.LocalName, r.PeerName, r.Reason)
}

// Result is what [Select] chose.
type Result struct {
	// Pairs are the connections to open, in the left endpoint's interface
	// order (identical at both ends, up to the swap of Local and Peer).
	Pairs []Pair
	// Fallback is set when no pair qualified and Pairs are private
	// addresses that may not reach each other (on different networks,
	// facing a public one, or across named sites), tried in the hope that
	// they route.
	Fallback bool
	// Refused lists every interface pair with weight 0 and why.
	Refused []Refusal
}

// Explain renders the refusals for an error message: one entry per refused
// interface pair, naming both interfaces and why.
func (r Result) Explain() string {
	if len(r.Refused) == 0 {
		return "no interface pair refused"
	}
	s := make([]string, len(r.Refused))
	for i, f := range r.Refused {
		s[i] = f.String()
	}
	return strings.Join(s, "; ")
}

// edge is the best connection between two interfaces, in canonical
// orientation (left, right).
type edge struct {
	w    Weight
	l, r netip.Addr // the addresses that give w
	// fallback, when w is 0, ranks l, r as a pair that may still route:
	// 0 not at all, then fallbackRouted (private addresses on different
	// networks, or facing a public one), then fallbackAcrossSites (one
	// private network of two sites, which is likelier the same).
	fallback Weight
	// Why w is 0: the families of each side when they share none, or the
	// refused address pairs.
	noFamily [2]string
	notes    []note
	// alts are the other address pairs that qualify (w > 0) or, where
	// none does, that may route, best first.
	alts []altAddrs
}

// altAddrs is one address pair of an edge, weighed.
type altAddrs struct {
	l, r        netip.Addr
	w, fallback Weight
}

// Select chooses the pairs between local and peer. localLeft says whether
// local is the canonical left endpoint (the caller's rule, e.g. the lower
// rank); both ends must get opposite answers so they solve the same problem.
// job holds the collisions; nil means none are known beyond these two.
func Select(job *Job, local, peer Endpoint, localLeft bool) Result {
	local, peer = unmapped(local), unmapped(peer)
	if job == nil {
		job = NewJob([]Endpoint{local, peer})
	}
	left, right := local, peer
	if !localLeft {
		left, right = peer, local
	}
	nl, nr := min(len(left.Ifaces), maxInterfacesPerEnd), min(len(right.Ifaces), maxInterfacesPerEnd)
	edges := make([][]edge, nl)
	w := make([][]Weight, nl)
	var res Result
	for i := range nl {
		edges[i] = make([]edge, nr)
		w[i] = make([]Weight, nr)
		for j := range nr {
			e := job.weigh(left, i, right, j)
			edges[i][j] = e
			w[i][j] = e.w
			if e.w == 0 {
				res.Refused = append(res.Refused, Refusal{Local: i, Peer: j, LocalName: left.Ifaces[i].Name, PeerName: right.Ifaces[j].Name, Reason: e.reason(!localLeft)})
			}
		}
	}
	match := Assign(w)
	if len(match) == 0 {
		// Only the likeliest rank of fallback: a pair that probably does
		// not route, beside one that probably does, would cost its
		// connect_timeout for nothing.
		var top Weight
		for i := range nl {
			for j := range nr {
				top = max(top, edges[i][j].fallback)
			}
		}
		fw := make([][]Weight, nl)
		for i := range nl {
			fw[i] = make([]Weight, nr)
			for j := range nr {
				if edges[i][j].fallback == top {
					fw[i][j] = top
				}
			}
		}
		match = Assign(fw)
		res.Fallback = len(match) > 0
	}
	for _, m := range match {
		i, j := m[0], m[1]
		e := edges[i][j]
		li, ri := left.Ifaces[i], right.Ifaces[j]
		p := Pair{Local: i, Peer: j, LocalName: li.Name, PeerName: ri.Name, LocalAddr: e.l, PeerAddr: e.r, Weight: e.w}
		if li.Speed > 0 && ri.Speed > 0 {
			p.Speed = min(li.Speed, ri.Speed)
		}
		alt := p // before any alternates: they have none of their own
		for _, a := range e.alts {
			alt.LocalAddr, alt.PeerAddr, alt.Weight = a.l, a.r, a.w
			p.Alternates = append(p.Alternates, alt)
		}
		res.Pairs = append(res.Pairs, p)
	}
	// From the left side to the local end's: the local end first, and a
	// link-local address with the interface it leaves from as its zone,
	// as it means nothing without one; the local end's name is that zone
	// for both addresses.
	toLocal := func(p Pair) Pair {
		if !localLeft {
			p = Pair{Local: p.Peer, Peer: p.Local, LocalName: p.PeerName, PeerName: p.LocalName,
				LocalAddr: p.PeerAddr, PeerAddr: p.LocalAddr, Weight: p.Weight, Speed: p.Speed, Alternates: p.Alternates}
		}
		if ScopeOf(p.PeerAddr) == ScopeLinkLocal && p.PeerAddr.Is6() {
			p.LocalAddr = p.LocalAddr.WithZone(p.LocalName)
			p.PeerAddr = p.PeerAddr.WithZone(p.LocalName)
		}
		return p
	}
	for k, p := range res.Pairs {
		for a, alt := range p.Alternates {
			p.Alternates[a] = toLocal(alt)
		}
		res.Pairs[k] = toLocal(p)
	}
	if !localLeft {
		for k, f := range res.Refused {
			res.Refused[k] = Refusal{Local: f.Peer, Peer: f.Local, LocalName: f.PeerName, PeerName: f.LocalName, Reason: f.Reason}
		}
		slices.SortStableFunc(res.Refused, func(a, b Refusal) int {
			if a.Local != b.Local {
				return a.Local - b.Local
			}
			return a.Peer - b.Peer
		})
	}
	return res
}
