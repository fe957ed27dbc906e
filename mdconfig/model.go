package mdconfig

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/hashicorp/hcl/v2"
	"github.com/hpc-multidevice/multidevice/conntable"
)

// Defaults applied when a description leaves a setting out.
const (
	defaultAlternatives = 0.05
	defaultMaxRoutes    = 4
	maxMaxRoutes        = 16
	// minLinkCost keeps every link strictly positive (1 ns), which is what
	// makes hop-by-hop routing loop-free: each next hop is strictly closer.
	minLinkCost = 0.001
)

// defaultClasses are the paper's three message-size ranges.
var defaultClasses = []SizeClass{
	{Name: "small", MaxBytes: 1 << 10, Typical: 256},
	{Name: "medium", MaxBytes: 128 << 10, Typical: 16 << 10},
	{Name: "large", Typical: 1 << 20},
}

// SizeClass is a range of message sizes that share routes: messages of at
// most MaxBytes (0 for the last, unbounded class). Routes are chosen by the
// cost of a message of Typical bytes.
type SizeClass struct {
	Name     string
	MaxBytes int64
	Typical  int64
}

type subdevice struct {
	name      string
	hostLocal bool
	lat, bw   []float64 // per class: microseconds, bytes per microsecond
	rng       hcl.Range
	onHosts   []bool // for host-local subdevices: the hosts that have it; nil means all
}

type network struct {
	name    string
	sub     int
	standby bool // a spare: see Description.standby
	members []int32
	cost    []float64 // per class, microseconds for a message of the class's typical size
	lat, bw []float64
	rng     hcl.Range
}

// Description is a checked network description compiled into a graph:
// hosts and networks are vertices, each host is joined to the networks it is
// on. It is immutable once built and safe for concurrent use; the methods
// that compute routes allocate their own scratch space.
type Description struct {
	classes      []SizeClass
	subdevices   []subdevice
	nets         []network
	hosts        []string
	hostIndex    map[string]int32
	hostRng      []hcl.Range // where each host was first named
	hostNets     [][]int32
	penalty      []float64 // per host; +Inf: never forwards
	penaltyRng   []hcl.Range
	island       []int32 // per host: its connected component
	alternatives float64
	maxRoutes    int
	failover     bool // entries with alternatives ask for failover
	// standby: some network is a spare. Routes are then computed without
	// the spares; a host that reaches another only through them gets
	// routes over every network, and a spare network both are on is added
	// as a route on standby (tables.go).
	standby bool
}

// Hosts returns the host names in the order they were first named.
func (d *Description) Hosts() []string { return append([]string(nil), d.hosts...) }

// Classes returns the size classes, ascending.
func (d *Description) Classes() []SizeClass { return append([]SizeClass(nil), d.classes...) }

// Class returns the index of the size class a message of n bytes falls in.
func (d *Description) Class(n int64) int {
	for i, c := range d.classes[:len(d.classes)-1] {
		if n <= c.MaxBytes {
			return i
		}
	}
	return len(d.classes) - 1
}

func (d *Description) conntableClasses() []conntable.Class {
	out := make([]conntable.Class, len(d.classes))
	for i, c := range d.classes {
		out[i] = conntable.Class{Name: c.Name, MaxBytes: c.MaxBytes}
	}
	return out
}

// linkCost is what one traversal of a network costs for n bytes.
func linkCost(lat, bw float64, n int64) float64 {
	return math.Max(lat+float64(n)/bw, minLinkCost)
}

// builder turns a rawDoc into a Description, collecting every problem
// rather than stopping at the first.
type builder struct {
	diags hcl.Diagnostics
	d     *Description
}

func (b *builder) errorf(rng hcl.Range, summary, detail string, args ...any) {
	b.diags = append(b.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: fmt.Sprintf(detail, args...), Subject: rng.Ptr()})
}

func (b *builder) warnf(rng hcl.Range, summary, detail string, args ...any) {
	b.diags = append(b.diags, &hcl.Diagnostic{Severity: hcl.DiagWarning, Summary: summary, Detail: fmt.Sprintf(detail, args...), Subject: rng.Ptr()})
}

// Parse parses and checks a network description. filename is used in
// diagnostics only. The Description is nil when the diagnostics hold an
// error; warnings (such as separate islands of hosts) come with a usable
// Description.
func Parse(src []byte, filename string) (*Description, hcl.Diagnostics) {
	raw, diags := decode(src, filename)
	if diags.HasErrors() {
		return nil, diags
	}
	b := &builder{diags: diags, d: &Description{hostIndex: map[string]int32{}}}
	b.settings(raw)
	b.sizeClasses(raw.classes)
	if b.diags.HasErrors() {
		// Everything below refers to size classes by name.
		return nil, b.diags
	}
	subIndex := b.subdevices(raw.subdevices)
	b.networks(raw.networks, subIndex)
	b.hostBlocks(raw, subIndex)
	if b.diags.HasErrors() {
		return nil, b.diags
	}
	b.connectivity()
	if b.diags.HasErrors() {
		return nil, b.diags
	}
	return b.d, b.diags
}

func (b *builder) settings(raw *rawDoc) {
	d := b.d
	d.alternatives = defaultAlternatives
	d.maxRoutes = defaultMaxRoutes
	if v := raw.alternatives; v != nil {
		f, err := parseFraction(v.s)
		if err != nil {
			b.errorf(v.rng, "invalid alternatives", "%v.", err)
		}
		d.alternatives = f
	}
	if v := raw.maxRoutes; v != nil {
		n, err := strconv.Atoi(v.s)
		if err != nil || n < 1 || n > maxMaxRoutes {
			b.errorf(v.rng, "invalid max_routes", "max_routes is %q; write a whole number from 1 (no alternatives) to %d.", v.s, maxMaxRoutes)
		}
		d.maxRoutes = n
	}
	if v := raw.failover; v != nil {
		f, err := strconv.ParseBool(v.s)
		if err != nil {
			b.errorf(v.rng, "invalid failover", "failover is %q; write true or false.", v.s)
		}
		d.failover = f
	}
}

func (b *builder) sizeClasses(raw []rawClass) {
	if len(raw) == 0 {
		b.d.classes = append([]SizeClass(nil), defaultClasses...)
		return
	}
	seen := map[string]hcl.Range{}
	var prev int64
	for i, rc := range raw {
		c := SizeClass{Name: rc.name.s}
		last := i == len(raw)-1
		if c.Name == "" || c.Name == conntable.AllClasses {
			b.errorf(rc.name.rng, "invalid size class name", "%q is empty or reserved; name it e.g. \"small\".", c.Name)
		}
		if r, dup := seen[c.Name]; dup {
			b.errorf(rc.name.rng, "duplicate size class", "size_class %q is already declared at %s; rename or remove one.", c.Name, posString(r))
		}
		seen[c.Name] = rc.name.rng
		switch {
		case last && rc.max != nil:
			b.errorf(rc.max.rng, "last size class is bounded", "size_class %q is the last one and takes every larger message; remove max.", c.Name)
		case !last && rc.max == nil:
			b.errorf(rc.name.rng, "size class needs max", "size_class %q is not the last one; add max = \"64KiB\" (or whatever bound you want); only the last class is unbounded.", c.Name)
		case !last:
			n, err := ParseSize(rc.max.s)
			if err != nil {
				b.errorf(rc.max.rng, "invalid max", "%v.", err)
			} else if n <= prev {
				b.errorf(rc.max.rng, "size classes out of order", "max %s of size_class %q must be larger than the previous class's %s; list classes from small to large.", FormatSize(n), c.Name, FormatSize(prev))
			}
			c.MaxBytes = n
		}
		switch {
		case rc.typical != nil:
			n, err := ParseSize(rc.typical.s)
			switch {
			case err != nil:
				b.errorf(rc.typical.rng, "invalid typical size", "%v.", err)
			case n <= prev || !last && c.MaxBytes > 0 && n > c.MaxBytes:
				b.errorf(rc.typical.rng, "typical size outside its class", "typical %s is not within size_class %q (%s); pick a size inside the class.", FormatSize(n), c.Name, describeRange(prev, c.MaxBytes))
			}
			c.Typical = n
		case !last:
			c.Typical = c.MaxBytes
		default:
			// Capped where ParseSize stops, as prev*8 would wrap past
			// MaxInt64 for a previous class above 1EiB.
			c.Typical = max(min(prev, 1<<62/8)*8, 1<<20)
		}
		b.d.classes = append(b.d.classes, c)
		prev = c.MaxBytes
	}
}

func describeRange(lo, hi int64) string {
	if hi == 0 {
		return "above " + FormatSize(lo)
	}
	return fmt.Sprintf("%s < size <= %s", FormatSize(lo), FormatSize(hi))
}

func (b *builder) classIndex(v value) (int, bool) {
	for i, c := range b.d.classes {
		if c.Name == v.s {
			return i, true
		}
	}
	names := make([]string, len(b.d.classes))
	for i, c := range b.d.classes {
		names[i] = c.Name
	}
	b.errorf(v.rng, "unknown size class", "%q is not a size class%s; the classes are %s.", v.s, suggest(v.s, names), strings.Join(names, ", "))
	return 0, false
}

// perfTable resolves latency and bandwidth per class from a base and its
// class overrides; fallback supplies the values a network inherits from its
// subdevice (nil for a subdevice itself).
func (b *builder) perfTable(what string, base perf, overrides []classPerf, fallbackLat, fallbackBw []float64, where hcl.Range) (lat, bw []float64) {
	n := len(b.d.classes)
	lat, bw = make([]float64, n), make([]float64, n)
	baseLat, baseBw := math.NaN(), math.NaN()
	bad := false // already reported; do not also call it missing
	if base.latency != nil {
		if v, err := parseLatency(base.latency.s); err != nil {
			b.errorf(base.latency.rng, "invalid latency", "%v.", err)
			bad = true
		} else {
			baseLat = v
		}
	}
	if base.bandwidth != nil {
		if v, err := parseBandwidth(base.bandwidth.s); err != nil {
			b.errorf(base.bandwidth.rng, "invalid bandwidth", "%v.", err)
			bad = true
		} else {
			baseBw = v
		}
	}
	for i := range lat {
		lat[i], bw[i] = baseLat, baseBw
		if fallbackLat != nil && base.latency == nil {
			lat[i] = fallbackLat[i]
		}
		if fallbackBw != nil && base.bandwidth == nil {
			bw[i] = fallbackBw[i]
		}
	}
	seen := map[int]hcl.Range{}
	for _, o := range overrides {
		ci, ok := b.classIndex(o.class)
		if !ok {
			continue
		}
		if r, dup := seen[ci]; dup {
			b.errorf(o.class.rng, "duplicate class override", "%s already overrides class %q at %s; merge the two blocks.", what, o.class.s, posString(r))
			continue
		}
		seen[ci] = o.class.rng
		if o.latency != nil {
			if v, err := parseLatency(o.latency.s); err != nil {
				b.errorf(o.latency.rng, "invalid latency", "%v.", err)
				bad = true
			} else {
				lat[ci] = v
			}
		}
		if o.bandwidth != nil {
			if v, err := parseBandwidth(o.bandwidth.s); err != nil {
				b.errorf(o.bandwidth.rng, "invalid bandwidth", "%v.", err)
				bad = true
			} else {
				bw[ci] = v
			}
		}
	}
	if fallbackLat == nil && !bad {
		for i := range lat {
			if math.IsNaN(lat[i]) {
				b.errorf(where, "missing latency", "%s has no latency for size class %q; add latency = \"50us\" (or a class %q block with one).", what, b.d.classes[i].Name, b.d.classes[i].Name)
				break
			}
		}
		for i := range bw {
			if math.IsNaN(bw[i]) {
				b.errorf(where, "missing bandwidth", "%s has no bandwidth for size class %q; add bandwidth = \"1Gbit/s\" (or a class %q block with one).", what, b.d.classes[i].Name, b.d.classes[i].Name)
				break
			}
		}
	}
	return lat, bw
}

func (b *builder) subdevices(raw []rawSubdevice) map[string]int {
	index := map[string]int{}
	for _, rs := range raw {
		if j, dup := index[rs.name.s]; dup {
			b.errorf(rs.name.rng, "duplicate subdevice", "subdevice %q is already declared at %s; rename or remove one.", rs.name.s, posString(b.d.subdevices[j].rng))
			continue
		}
		if err := checkName(rs.name.s); err != nil {
			b.errorf(rs.name.rng, "invalid subdevice name", "%v.", err)
		}
		s := subdevice{name: rs.name.s, rng: rs.name.rng}
		if rs.reach != nil {
			switch rs.reach.s {
			case "host":
				s.hostLocal = true
			case "network":
			default:
				b.errorf(rs.reach.rng, "invalid reach", "reach is %q; write \"host\" for a subdevice that only joins ranks on one host (shm) or \"network\" (the default) for one that joins hosts.", rs.reach.s)
			}
		}
		if rs.hostsAttr != nil && !s.hostLocal {
			b.errorf(*rs.hostsAttr, "hosts on a network subdevice", "subdevice %q reaches other hosts, so its hosts come from the networks that use it; remove hosts here, or set reach = \"host\".", s.name)
		}
		s.lat, s.bw = b.perfTable(fmt.Sprintf("subdevice %q", s.name), rs.perf, rs.classes, nil, nil, rs.name.rng)
		index[s.name] = len(b.d.subdevices)
		b.d.subdevices = append(b.d.subdevices, s)
	}
	return index
}

// checkName refuses names that conntable or dot could not carry.
func checkName(s string) error {
	if s == "" {
		return fmt.Errorf("the name is empty")
	}
	for i := 0; i < len(s); i++ {
		if !isNameByte(s[i]) {
			// The whole character, not its first byte: 'Ã' for 'ä'
			// would name a character the user never wrote.
			r, _ := utf8.DecodeRuneInString(s[i:])
			return fmt.Errorf("%q contains %q; use letters, digits, '.', '-' and '_'", s, r)
		}
	}
	return nil
}

func (b *builder) addHost(name string, rng hcl.Range) int32 {
	if i, ok := b.d.hostIndex[name]; ok {
		return i
	}
	i := int32(len(b.d.hosts))
	b.d.hostIndex[name] = i
	b.d.hosts = append(b.d.hosts, name)
	b.d.hostRng = append(b.d.hostRng, rng)
	b.d.hostNets = append(b.d.hostNets, nil)
	return i
}

// expand expands a host pattern, reporting a bad one at its range.
func (b *builder) expand(v value) []string {
	names, err := expandHosts(v.s)
	if err != nil {
		b.errorf(v.rng, "invalid host pattern", "%v.", err)
		return nil
	}
	return names
}

func (b *builder) networks(raw []rawNetwork, subIndex map[string]int) {
	seen := map[string]hcl.Range{}
	subNames := make([]string, 0, len(subIndex))
	for n := range subIndex {
		subNames = append(subNames, n)
	}
	sort.Strings(subNames)
	for _, rn := range raw {
		if r, dup := seen[rn.name.s]; dup {
			b.errorf(rn.name.rng, "duplicate network", "network %q is already declared at %s; rename or remove one.", rn.name.s, posString(r))
			continue
		}
		seen[rn.name.s] = rn.name.rng
		if err := checkName(rn.name.s); err != nil {
			b.errorf(rn.name.rng, "invalid network name", "%v.", err)
		}
		si, ok := subIndex[rn.subdevice.s]
		if !ok {
			b.errorf(rn.subdevice.rng, "unknown subdevice", "network %q uses subdevice %q, which is not declared%s; declare it with subdevice %q { latency = ..., bandwidth = ... } or use one of: %s.",
				rn.name.s, rn.subdevice.s, suggest(rn.subdevice.s, subNames), rn.subdevice.s, strings.Join(subNames, ", "))
			continue
		}
		sub := &b.d.subdevices[si]
		if sub.hostLocal {
			b.errorf(rn.subdevice.rng, "host-local subdevice on a network", "subdevice %q has reach = \"host\" and cannot join hosts; use a network subdevice such as tcp here.", sub.name)
			continue
		}
		if len(rn.hosts) == 0 {
			b.errorf(rn.name.rng, "network without hosts", "network %q lists no hosts; add hosts = [\"a[01-16]\"].", rn.name.s)
			continue
		}
		n := network{name: rn.name.s, sub: si, rng: rn.name.rng}
		if v := rn.standby; v != nil {
			f, err := strconv.ParseBool(v.s)
			switch {
			case err != nil:
				b.errorf(v.rng, "invalid standby", "standby is %q; write true or false.", v.s)
			case f && !b.d.failover:
				b.errorf(v.rng, "standby without failover", "network %q is a spare, which only carries traffic once the other routes fail; add failover = true at the top of the description, or drop standby to use it like any network.", n.name)
			}
			n.standby = f
			b.d.standby = b.d.standby || f
		}
		n.lat, n.bw = b.perfTable(fmt.Sprintf("network %q", n.name), rn.perf, rn.classes, sub.lat, sub.bw, rn.name.rng)
		netIdx := int32(len(b.d.nets))
		member := map[string]hcl.Range{}
		for _, hv := range rn.hosts {
			for _, h := range b.expand(hv) {
				if _, known := b.d.hostIndex[h]; !known && len(b.d.hosts) == maxHosts {
					b.errorf(hv.rng, "too many hosts", "the description names more than %d hosts; split it.", maxHosts)
					return
				}
				if r, dup := member[h]; dup {
					b.errorf(hv.rng, "host listed twice", "host %q is already in network %q at %s; remove one of the two.", h, n.name, posString(r))
					continue
				}
				member[h] = hv.rng
				hi := b.addHost(h, hv.rng)
				n.members = append(n.members, hi)
				b.d.hostNets[hi] = append(b.d.hostNets[hi], netIdx)
			}
		}
		if len(n.members) == 1 {
			b.warnf(rn.name.rng, "network with one host", "network %q joins only %s to nothing; add the hosts it connects or remove it.", n.name, b.d.hosts[n.members[0]])
		}
		n.cost = make([]float64, len(b.d.classes))
		for ci, c := range b.d.classes {
			n.cost[ci] = linkCost(n.lat[ci], n.bw[ci], c.Typical)
		}
		b.d.nets = append(b.d.nets, n)
	}
}

// hostBlocks applies per-host penalties and host-local subdevice host lists,
// both of which may only name hosts that some network joins.
func (b *builder) hostBlocks(raw *rawDoc, subIndex map[string]int) {
	d := b.d
	global := 0.0
	globalRng := hcl.Range{}
	if v := raw.penalty; v != nil {
		p, err := parsePenalty(v.s)
		if err != nil {
			b.errorf(v.rng, "invalid penalty", "%v.", err)
		}
		global, globalRng = p, v.rng
	}
	d.penalty = make([]float64, len(d.hosts))
	d.penaltyRng = make([]hcl.Range, len(d.hosts))
	for i := range d.penalty {
		d.penalty[i], d.penaltyRng[i] = global, globalRng
	}
	setBy := map[int32]hcl.Range{}
	for _, rh := range raw.hosts {
		p, err := parsePenalty(rh.penalty.s)
		if err != nil {
			b.errorf(rh.penalty.rng, "invalid penalty", "%v.", err)
			continue
		}
		for _, h := range b.expand(rh.pattern) {
			hi, ok := d.hostIndex[h]
			if !ok {
				b.errorf(rh.pattern.rng, "host in no network", "host %q is not on any network; add it to a network's hosts or remove it here.", h)
				continue
			}
			if r, dup := setBy[hi]; dup {
				b.errorf(rh.pattern.rng, "duplicate host block", "host %q already has a host block at %s; each host may be named by one host block only.", h, posString(r))
				continue
			}
			setBy[hi] = rh.pattern.rng
			d.penalty[hi], d.penaltyRng[hi] = p, rh.penalty.rng
		}
	}
	for _, rs := range raw.subdevices {
		si, ok := subIndex[rs.name.s]
		if !ok || rs.hostsAttr == nil || !d.subdevices[si].hostLocal {
			continue
		}
		on := make([]bool, len(d.hosts))
		for _, hv := range rs.hosts {
			for _, h := range b.expand(hv) {
				hi, ok := d.hostIndex[h]
				if !ok {
					b.errorf(hv.rng, "host in no network", "host %q is not on any network; add it to a network's hosts or remove it from subdevice %q.", h, rs.name.s)
					continue
				}
				on[hi] = true
			}
		}
		d.subdevices[si].onHosts = on
	}
}

// connectivity finds islands (hosts no chain of networks joins: a warning,
// since a job may never span them) and hosts that a chain of networks does
// join but only through hosts whose penalty is "off" (an error: the
// description contradicts itself).
func (b *builder) connectivity() {
	d := b.d
	nh, nn := len(d.hosts), len(d.nets)
	// Union-find over networks; vertex nn stands for nothing.
	islands := newUnionFind(nn)
	forward := newUnionFind(nn)
	for h := range nh {
		nets := d.hostNets[h]
		for _, n := range nets[1:] {
			islands.union(int(nets[0]), int(n))
			if !math.IsInf(d.penalty[h], 1) {
				forward.union(int(nets[0]), int(n))
			}
		}
	}
	d.island = make([]int32, nh)
	members := map[int][]string{}
	var order []int
	for h := range nh {
		r := islands.find(int(d.hostNets[h][0]))
		d.island[h] = int32(r)
		if _, ok := members[r]; !ok {
			order = append(order, r)
		}
		members[r] = append(members[r], d.hosts[h])
	}
	if len(order) > 1 {
		var parts []string
		for _, r := range order {
			parts = append(parts, compactHosts(members[r]))
		}
		b.warnf(d.hostRng[0], "separate islands", "%d groups of hosts share no network and no gateway: {%s}. A job spanning two groups cannot run; join them with a network if it should.", len(order), strings.Join(parts, "} {"))
	}
	// Within an island, two hosts reach each other iff their networks meet
	// in one forwarding component. Hosts with the same set of components
	// behave alike, so pairs of sets are compared rather than pairs of hosts.
	type sig struct {
		island int32
		comps  string
	}
	first := map[sig]int{}
	var sigs []sig
	var sets [][]int
	for h := range nh {
		var comps []int
		for _, n := range d.hostNets[h] {
			comps = append(comps, forward.find(int(n)))
		}
		sort.Ints(comps)
		comps = compactInts(comps)
		s := sig{d.island[h], fmt.Sprint(comps)}
		if _, ok := first[s]; !ok {
			first[s] = h
			sigs = append(sigs, s)
			sets = append(sets, comps)
		}
	}
	for i := range sigs {
		for j := i + 1; j < len(sigs); j++ {
			if sigs[i].island != sigs[j].island || intersects(sets[i], sets[j]) {
				continue
			}
			a, c := first[sigs[i]], first[sigs[j]]
			b.errorf(d.penaltyRng[b.blockingGateway(a, c)], "unreachable host",
				"host %q cannot reach host %q: every path between them passes a host whose penalty is \"off\". Give a gateway between them (e.g. %q) a finite penalty, or add a network joining them.",
				d.hosts[a], d.hosts[c], d.hosts[b.blockingGateway(a, c)])
			return
		}
	}
}

// blockingGateway names a host on a path from a to c that refuses to
// forward, for the unreachable-host message. It searches the graph ignoring
// penalties; such a host exists whenever connectivity reports the pair.
func (b *builder) blockingGateway(a, c int) int {
	d := b.d
	prev := make([]int, len(d.hosts))
	for i := range prev {
		prev[i] = -1
	}
	prev[a] = a
	queue := []int{a}
	seenNet := make([]bool, len(d.nets))
	for len(queue) > 0 {
		h := queue[0]
		queue = queue[1:]
		for _, n := range d.hostNets[h] {
			if seenNet[n] {
				continue
			}
			seenNet[n] = true
			for _, m := range d.nets[n].members {
				if prev[m] < 0 {
					prev[m] = h
					queue = append(queue, int(m))
				}
			}
		}
	}
	for h := prev[c]; h >= 0 && h != a; h = prev[h] {
		if math.IsInf(d.penalty[h], 1) {
			return h
		}
	}
	return a
}

func compactInts(s []int) []int {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

func intersects(a, b []int) bool {
	for i, j := 0, 0; i < len(a) && j < len(b); {
		switch {
		case a[i] == b[j]:
			return true
		case a[i] < b[j]:
			i++
		default:
			j++
		}
	}
	return false
}

type unionFind []int

func newUnionFind(n int) unionFind {
	u := make(unionFind, n)
	for i := range u {
		u[i] = i
	}
	return u
}

func (u unionFind) find(x int) int {
	for u[x] != x {
		u[x] = u[u[x]]
		x = u[x]
	}
	return x
}

func (u unionFind) union(a, b int) { u[u.find(a)] = u.find(b) }

func posString(r hcl.Range) string {
	return fmt.Sprintf("%s:%d:%d", r.Filename, r.Start.Line, r.Start.Column)
}

// suggest returns ` (did you mean "x"?)` for the closest candidate within a
// small edit distance, or "".
func suggest(s string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		if dist := editDistance(s, c); dist < bestD {
			best, bestD = c, dist
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
