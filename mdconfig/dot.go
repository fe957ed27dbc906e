package mdconfig

import (
	"fmt"
	"math"
	"strings"
)

// DotOptions selects what [Description.Dot] highlights besides gateways.
type DotOptions struct {
	From, To string // highlight the route between these hosts; both or neither
	Size     int64  // message size of that route; 0 for the first class
}

var dotColors = []string{"#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"}

// Dot draws the description for Graphviz: networks as boxes (dashed when
// on standby), hosts as ellipses joined to their networks in the colour of
// the network's subdevice. Hosts that sit on one set of networks and do not forward are
// drawn as one node ("a[01-14]") so that large clusters stay readable;
// gateways (hosts on two or more networks that may forward) are drawn alone
// and filled; the optional route is drawn in red.
func (d *Description) Dot(o DotOptions) ([]byte, error) {
	type edge struct{ host, net int32 }
	onRoute := map[edge]int{} // edge -> hop number
	special := map[int32]bool{}
	if o.From != "" || o.To != "" {
		reps, err := d.Route(o.From, o.To, o.Size)
		if err != nil {
			return nil, err
		}
		rep := reps[0]
		netIdx := map[string]int32{}
		for i, n := range d.nets {
			netIdx[n.name] = int32(i)
		}
		for i, h := range rep.Best.Hops {
			from, to, n := d.hostIndex[h.From], d.hostIndex[h.To], netIdx[h.Network]
			onRoute[edge{from, n}] = i + 1
			onRoute[edge{to, n}] = i + 1
			special[from], special[to] = true, true
		}
	}
	gateway := func(h int32) bool { return len(d.hostNets[h]) > 1 && !math.IsInf(d.penalty[h], 1) }

	var b strings.Builder
	b.WriteString("graph network {\n  graph [rankdir=LR, fontname=\"Helvetica\"];\n  node [fontname=\"Helvetica\"];\n  edge [fontname=\"Helvetica\"];\n")
	for _, n := range d.nets {
		s := d.subdevices[n.sub]
		style, label := "rounded,bold", fmt.Sprintf("%s\n%s, %d hosts", n.name, s.name, len(n.members))
		if n.standby {
			style, label = "rounded,dashed", label+"\non standby"
		}
		fmt.Fprintf(&b, "  %q [shape=box, style=%q, color=%q, label=%q];\n",
			"net:"+n.name, style, dotColors[n.sub%len(dotColors)], label)
	}
	// Group ordinary hosts by the exact list of networks they are on.
	groups := map[string][]int32{}
	var order []string
	for h := range int32(len(d.hosts)) {
		if gateway(h) || special[h] {
			continue
		}
		key := fmt.Sprint(d.hostNets[h])
		if _, ok := groups[key]; !ok {
			order = append(order, key)
		}
		groups[key] = append(groups[key], h)
	}
	edgeAttrs := func(h, n int32) string {
		if hopNo, ok := onRoute[edge{h, n}]; ok {
			return fmt.Sprintf("color=red, penwidth=3, label=\"%d\"", hopNo)
		}
		return fmt.Sprintf("color=%q", dotColors[d.nets[n].sub%len(dotColors)])
	}
	for _, key := range order {
		hs := groups[key]
		names := make([]string, len(hs))
		for i, h := range hs {
			names[i] = d.hosts[h]
		}
		id := "hosts:" + compactHosts(names)
		fmt.Fprintf(&b, "  %q [shape=ellipse, label=%q];\n", id, compactHosts(names))
		for _, n := range d.hostNets[hs[0]] {
			fmt.Fprintf(&b, "  %q -- %q [%s];\n", id, "net:"+d.nets[n].name, edgeAttrs(hs[0], n))
		}
	}
	for h := range int32(len(d.hosts)) {
		if !gateway(h) && !special[h] {
			continue
		}
		attrs := "shape=ellipse"
		label := d.hosts[h]
		if gateway(h) {
			attrs = "shape=doubleoctagon, style=filled, fillcolor=gold"
			label += "\npenalty " + formatMicros(d.penalty[h])
		}
		if special[h] && (d.hosts[h] == o.From || d.hosts[h] == o.To) {
			attrs += ", color=red, penwidth=3"
		}
		fmt.Fprintf(&b, "  %q [%s, label=%q];\n", "host:"+d.hosts[h], attrs, label)
		for _, n := range d.hostNets[h] {
			fmt.Fprintf(&b, "  %q -- %q [%s];\n", "host:"+d.hosts[h], "net:"+d.nets[n].name, edgeAttrs(h, n))
		}
	}
	b.WriteString("}\n")
	return []byte(b.String()), nil
}
