package mdconfig

import (
	"fmt"
	"slices"
	"strings"
)

// RouteHop is one link of a path.
type RouteHop struct {
	From, To  string
	Network   string
	SubDevice string
	Link      float64 // microseconds for the class's typical size
	Penalty   float64 // charged at From when From forwards; 0 at the source
}

// Path is a route from a source to a destination as the tables send it:
// the first hop from the source's table, every further hop from the table
// of the host reached.
type Path struct {
	Hops     []RouteHop
	Cost     float64 // microseconds for the class's typical size
	SizeCost float64 // microseconds for the size asked for (0 when none was)
}

// RouteReport explains the route between two hosts for one size class.
type RouteReport struct {
	From, To     string
	Class        SizeClass
	Size         int64 // the size asked for, or 0
	Best         Path
	Alternatives []Path // within the description's alternatives fraction, best first
	// Standby is the direct link over a network on standby that the
	// tables add as a spare route, carrying traffic only once the others
	// fail; nil if there is none.
	Standby *Path
}

// Route explains how a message from one host to another travels. With size
// 0 it reports every size class; otherwise the class size falls in, with
// the path's cost also computed for that exact size.
func (d *Description) Route(from, to string, size int64) ([]RouteReport, error) {
	src, ok := d.hostIndex[from]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownHost, from)
	}
	dst, ok := d.hostIndex[to]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownHost, to)
	}
	if src == dst {
		return nil, fmt.Errorf("mdconfig: %s and %s are the same host; its ranks use the @local entry", from, to)
	}
	if d.island[src] != d.island[dst] {
		return nil, fmt.Errorf("%w from %s to %s: they are in separate islands", ErrUnreachable, from, to)
	}
	classes := make([]int, 0, len(d.classes))
	if size > 0 {
		classes = append(classes, d.Class(size))
	} else {
		for c := range d.classes {
			classes = append(classes, c)
		}
	}
	r := newRouter(d)
	var out []RouteReport
	for _, c := range classes {
		rep := RouteReport{From: from, To: to, Class: d.classes[c], Size: size}
		chs := r.tableRoutes(src, dst, c, nil)
		for i, ch := range chs {
			p, err := d.walk(src, dst, c, ch, size)
			if err != nil {
				return nil, err
			}
			if i == 0 {
				rep.Best = p
			} else {
				rep.Alternatives = append(rep.Alternatives, p)
			}
		}
		if n, ok := d.spare(src, dst, c, chs); ok {
			h := RouteHop{From: from, To: to, Network: d.nets[n].name, SubDevice: d.subdevices[d.nets[n].sub].name, Link: d.nets[n].cost[c]}
			p := Path{Hops: []RouteHop{h}, Cost: h.Link}
			if size > 0 {
				p.SizeCost = linkCost(d.nets[n].lat[c], d.nets[n].bw[c], size)
			}
			rep.Standby = &p
		}
		out = append(out, rep)
	}
	return out, nil
}

// walk follows a route the way the tables do: the given first step, then
// each host's own best next hop.
func (d *Description) walk(src, dst int32, class int, first choice, size int64) (Path, error) {
	var p Path
	r := newRouter(d)
	cur, ch := src, first
	for step := 0; ; step++ {
		if step > len(d.hosts) {
			return Path{}, fmt.Errorf("mdconfig: route from %s to %s loops; this is a bug", d.hosts[src], d.hosts[dst])
		}
		net := d.nets[ch.hop.net]
		h := RouteHop{From: d.hosts[cur], To: d.hosts[ch.hop.host], Network: net.name, SubDevice: d.subdevices[net.sub].name, Link: net.cost[class]}
		if cur != src {
			h.Penalty = d.penalty[cur]
		}
		p.Hops = append(p.Hops, h)
		p.Cost += h.Link + h.Penalty
		if size > 0 {
			p.SizeCost += linkCost(net.lat[class], net.bw[class], size) + h.Penalty
		}
		cur = ch.hop.host
		if cur == dst {
			return p, nil
		}
		rs := r.tableRoutes(cur, dst, class, nil)
		if len(rs) == 0 {
			return Path{}, fmt.Errorf("mdconfig: %s has no route to %s; this is a bug", d.hosts[cur], d.hosts[dst])
		}
		ch = rs[0]
	}
}

// String renders the report for people, one hop per line.
func (rep RouteReport) String() string {
	var b strings.Builder
	bound := "unbounded"
	if rep.Class.MaxBytes > 0 {
		bound = "up to " + FormatSize(rep.Class.MaxBytes)
	}
	fmt.Fprintf(&b, "%s -> %s, class %s (%s; costs for %s)\n", rep.From, rep.To, rep.Class.Name, bound, FormatSize(rep.Class.Typical))
	writePath(&b, rep.Best, rep.Size)
	if len(rep.Alternatives) == 0 {
		b.WriteString("  no alternatives within the alternatives fraction\n")
	}
	for i, p := range rep.Alternatives {
		fmt.Fprintf(&b, "  alternative %d (+%.1f%%):\n", i+1, 100*(p.Cost/rep.Best.Cost-1))
		writePath(&b, p, rep.Size)
	}
	if rep.Standby != nil {
		b.WriteString("  on standby (carries traffic once the others fail):\n")
		writePath(&b, *rep.Standby, rep.Size)
	}
	return b.String()
}

func writePath(b *strings.Builder, p Path, size int64) {
	for i, h := range p.Hops {
		pen := ""
		if h.Penalty > 0 {
			pen = " + penalty " + formatMicros(h.Penalty) + " at " + h.From
		}
		fmt.Fprintf(b, "    %d. %-10s -> %-10s %-6s on %-10s %s%s\n", i+1, h.From, h.To, h.SubDevice, h.Network, formatMicros(h.Link), pen)
	}
	fmt.Fprintf(b, "    cost %s", formatMicros(p.Cost))
	if size > 0 {
		fmt.Fprintf(b, " (%s for %s)", formatMicros(p.SizeCost), FormatSize(size))
	}
	fmt.Fprintf(b, ", %d hop(s)\n", len(p.Hops))
}

// spare returns the network on standby that src's table adds for dst in
// class as a route on standby: the cheapest one both hosts are on, unless
// the description asks for no failover or routes already holds a direct
// route over its subdevice. Only direct links are spares: a spare route
// through a gateway would leave the hop after it to the gateway's own
// routes, which may lead back over the network that failed.
func (d *Description) spare(src, dst int32, class int, routes []choice) (int32, bool) {
	if !d.standby || !d.failover {
		return 0, false
	}
	best, found := int32(0), false
	for _, n := range d.hostNets[src] {
		net := &d.nets[n]
		if !net.standby || !slices.Contains(d.hostNets[dst], n) {
			continue
		}
		if !found || net.cost[class] < d.nets[best].cost[class] {
			best, found = n, true
		}
	}
	if !found {
		return 0, false
	}
	for _, ch := range routes {
		if ch.hop.host == dst && d.nets[ch.hop.net].sub == d.nets[best].sub {
			return 0, false
		}
	}
	return best, true
}
