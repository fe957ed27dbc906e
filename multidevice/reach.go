package multidevice

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/hpc-multidevice/multidevice/conntable"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// Routes through gateways come from two places. A connection table may name
// them (mdconfig writes "via" hops; every route of a class's list that has
// a next hop is a trunk). Without one, they are found automatically: a peer
// that the subdevices its routes name report unreachable
// (sdi.ErrPeerUnreachable, e.g. two sites using the same private range)
// is tried on the other subdevices when the table was derived (a table
// given lists its own stand-ins), and one that none of them reaches
// either is reached through other ranks. Each rank publishes which ranks it reaches directly under the
// bootstrap key "reach" and, after a second fence, every rank computes the
// same shortest paths over those rows; the next hops that lie on a shortest
// path (all ranks that reach both ends, for two hops) become the trunks.
// Every rank computes its own next hop the same way, so a chain of
// gateways never loops.

// linker connects each (subdevice, peer) pair once and remembers how it
// went.
type linker struct {
	d     *Device
	hosts []string
	tried map[[2]int]error
	ok    [][]int // [peer] subdevices connected to it
	// cards are the business cards of the connections made, which the
	// trunks among them keep (keepCards).
	cards map[trunkKey][]byte
	// standIns are the peers a later route of their list carries because
	// a subdevice that reaches only this host could not connect them,
	// with the first such error: see warnStandIns.
	standIns []int
	standWhy error
}

// warnStandIns logs, once per rank, the peers a host-local subdevice
// could not connect and a later route took. That is never expected (the
// peer is on this host, and the subdevice made it), and its price is
// high: shm with a full /dev/shm leaves tcp through loopback carrying the
// host's traffic, several times slower, so the reason must be seen. A
// network subdevice that cannot connect a peer is left to the table: a
// cluster's own network often reaches only the cluster.
func (lk *linker) warnStandIns() {
	if len(lk.standIns) > 0 {
		lk.d.log.Warn("a subdevice of this host could not connect some peers on it; later routes carry them",
			"peers", lk.standIns, "first_error", lk.standWhy)
	}
}

func newLinker(d *Device, hosts []string) *linker {
	return &linker{d: d, hosts: hosts, tried: make(map[[2]int]error), ok: make([][]int, d.size), cards: make(map[trunkKey][]byte)}
}

// keepCards keeps the card of every trunk's first hop in the forwarder,
// for trying the trunk again once it died (trunk.go).
func (lk *linker) keepCards() {
	f := &lk.d.fwd
	for _, classes := range f.paths {
		for _, trunks := range classes {
			for _, t := range trunks {
				if c, ok := lk.cards[t.key()]; ok {
					f.cards[t.key()] = c
				}
			}
		}
	}
}

func (lk *linker) connect(ctx context.Context, s *subdev, peer int) error {
	key := [2]int{s.idx, peer}
	if err, done := lk.tried[key]; done {
		return err
	}
	card, err := lk.d.connect(ctx, s, peer, lk.hosts[peer])
	lk.tried[key] = err
	if err == nil {
		lk.ok[peer] = append(lk.ok[peer], s.idx)
		lk.cards[trunkKey{int32(peer), s.idx}] = card
	}
	return err
}

// tableTrunks turns a class's route list from the table into trunks and
// connects to each gateway. With failover, a direct route is a trunk too,
// to the peer itself, and one whose subdevice cannot reach the peer is
// left out; without it, direct routes are not trunks.
func (d *Device) tableTrunks(ctx context.Context, lk *linker, byName map[string]*subdev, peer int, hops []conntable.Hop, failover bool) ([]trunk, error) {
	var trunks []trunk
	for _, hop := range hops {
		if hop.Via < 0 {
			if !failover {
				continue
			}
			t, err := d.directTrunk(ctx, lk, byName, peer, hop.SubDevice)
			if err != nil {
				return nil, err
			}
			t.standby = hop.Standby
			if t.sub != nil && !slices.ContainsFunc(trunks, t.same) {
				trunks = append(trunks, t)
			}
			continue
		}
		s, ok := byName[hop.SubDevice]
		if !ok {
			return nil, fmt.Errorf("%w: the table routes rank %d via rank %d over subdevice %q, which is not loaded (loaded: %s)",
				ErrNoRoute, peer, hop.Via, hop.SubDevice, d.subNames())
		}
		if int(hop.Via) == int(d.rank) || int(hop.Via) >= d.size {
			return nil, fmt.Errorf("%w: the table routes rank %d via rank %d, which cannot forward for this rank", ErrNoRoute, peer, hop.Via)
		}
		t := trunk{sub: s, via: hop.Via, standby: failover && hop.Standby}
		if slices.ContainsFunc(trunks, t.same) {
			continue
		}
		if err := lk.connect(ctx, s, int(hop.Via)); err != nil {
			return nil, fmt.Errorf("multidevice: gateway towards rank %d: %w", peer, err)
		}
		trunks = append(trunks, t)
	}
	return trunks, nil
}

// directTrunk connects to peer over the named subdevice for a failover
// route; a subdevice that finds the peer unreachable yields no trunk (a
// zero one) and no error.
func (d *Device) directTrunk(ctx context.Context, lk *linker, byName map[string]*subdev, peer int, name string) (trunk, error) {
	s, ok := byName[name]
	if !ok {
		return trunk{}, d.missingSubDevice(peer, lk.hosts[peer], name)
	}
	if s.caps.Reach == sdi.ReachHost && lk.hosts[peer] != lk.hosts[d.rank] {
		return trunk{}, fmt.Errorf("%w: the table routes rank %d on host %q over %q, which only reaches host %q",
			ErrNoRoute, peer, lk.hosts[peer], s.name, lk.hosts[d.rank])
	}
	if s.matcher != nil {
		return trunk{}, fmt.Errorf("%w: the table asks failover for rank %d over %q, a subdevice that matches on its own and so cannot carry forwarded blocks", ErrNoRoute, peer, s.name)
	}
	if err := lk.connect(ctx, s, peer); err != nil {
		if errors.Is(err, sdi.ErrPeerUnreachable) {
			d.log.Debug("failover route unreachable, left out", "peer", peer, "subdevice", s.name, "error", err)
			return trunk{}, nil
		}
		return trunk{}, err
	}
	return trunk{sub: s, via: int32(peer)}, nil
}

// autoRoute finds gateways for the classes of peers no subdevice reached.
// Every rank calls it, whether it needs gateways or not: it takes part in
// the fence that exchanges reachability.
func (d *Device) autoRoute(ctx context.Context, lk *linker, needVia [][]bool, hosts []string, fallBack bool) error {
	var lost, fell []int
	over := map[string]bool{}
	var whyFell error
	for peer, classes := range needVia {
		if classes == nil {
			continue
		}
		if len(lk.ok[peer]) == 0 && fallBack {
			if s := d.connectAny(ctx, lk, peer); s != nil {
				fell = append(fell, peer)
				over[s.name] = true
				if whyFell == nil {
					whyFell = lk.tried[[2]int{d.routes[peer][0], peer}]
				}
			}
		}
		if len(lk.ok[peer]) > 0 {
			// Another subdevice reached it: carry those classes there.
			for ci, need := range classes {
				if need {
					d.routes[peer][ci] = lk.ok[peer][0]
				}
			}
			continue
		}
		lost = append(lost, peer)
	}
	if len(fell) > 0 {
		d.log.Warn("the routes to some peers failed; their traffic goes over other subdevices",
			"peers", fell, "over", slices.Sorted(maps.Keys(over)), "first_error", whyFell)
	}
	row := make([]bool, d.size)
	for peer := range row {
		row[peer] = peer == int(d.rank) || len(lk.ok[peer]) > 0
	}
	if err := d.boot.Put("reach", encodeReach(row)); err != nil {
		return fmt.Errorf("multidevice: publish reachability: %w", err)
	}
	if err := d.boot.Fence(ctx); err != nil {
		return fmt.Errorf("multidevice: exchange reachability: %w", err)
	}
	if len(lost) == 0 {
		return nil
	}
	rows := make([][]bool, d.size)
	for r := range rows {
		b, err := d.boot.Get(ctx, r, "reach")
		if err != nil {
			return fmt.Errorf("multidevice: reachability of rank %d: %w", r, err)
		}
		if rows[r], err = decodeReach(b, d.size); err != nil {
			return fmt.Errorf("multidevice: reachability of rank %d: %w", r, err)
		}
	}
	for _, peer := range lost {
		gws := nextHops(rows, int(d.rank), peer)
		if len(gws) == 0 {
			return fmt.Errorf("%w: rank %d (host %q) is unreachable from rank %d (host %q) on every subdevice, and no chain of ranks reaches it%s",
				ErrNoRoute, peer, hosts[peer], d.rank, hosts[d.rank], lk.why(peer))
		}
		for ci, need := range needVia[peer] {
			if !need {
				continue
			}
			trunks := make([]trunk, 0, len(gws))
			for _, g := range gws {
				trunks = append(trunks, trunk{sub: d.subs[d.firstHopSub(lk, g, ci)], via: int32(g)})
			}
			d.fwd.setPath(peer, ci, trunks)
			d.routes[peer][ci] = trunks[0].sub.idx
		}
		d.log.Debug("no direct link, routing through gateways", "peer", peer, "gateways", gws)
	}
	return nil
}

// connectAny tries, for a peer that no subdevice its routes name could
// reach, the other subdevices that may reach it, in the order plugins.hcl
// lists them, as an MPI library falls back to another transport: the
// shared memory of a host whose /dev/shm is full, say, leaves TCP over
// loopback. A subdevice that matches on its own is left out (it must
// carry all of a peer's traffic from the start), and so is one that
// reaches only its host for a peer on another. It returns the subdevice
// that connected, or nil; failures stay in lk.tried for the error that
// follows when none connects.
func (d *Device) connectAny(ctx context.Context, lk *linker, peer int) *subdev {
	for _, s := range d.subs[1:] {
		if _, tried := lk.tried[[2]int{s.idx, peer}]; tried ||
			s.matcher != nil || s.caps.Reach == sdi.ReachHost && lk.hosts[peer] != lk.hosts[d.rank] {
			continue
		}
		if lk.connect(ctx, s, peer) == nil {
			return s
		}
	}
	return nil
}

// why lists how each subdevice tried for peer failed, for an error that
// says it is unreachable.
func (lk *linker) why(peer int) string {
	var b strings.Builder
	for _, s := range lk.d.subs[1:] {
		if err, tried := lk.tried[[2]int{s.idx, peer}]; tried && err != nil {
			fmt.Fprintf(&b, "; %s: %v", s.name, err)
		}
	}
	return b.String()
}

// firstHopSub is the subdevice that carries class ci to gateway g: its own
// route if that connected, else any subdevice that did.
func (d *Device) firstHopSub(lk *linker, g, ci int) int {
	idx := d.routes[g][ci]
	if d.fwd.paths[g][ci] == nil {
		if err, tried := lk.tried[[2]int{idx, g}]; tried && err == nil {
			return idx
		}
	}
	return lk.ok[g][0]
}

// nextHops returns, in rank order, the ranks self reaches directly that lie
// on a shortest path to dst in the graph where rows[u][v] means u reaches
// v; nil when dst cannot be reached.
func nextHops(rows [][]bool, self, dst int) []int {
	n := len(rows)
	dist := make([]int, n)
	for i := range dist {
		dist[i] = -1
	}
	dist[dst] = 0
	queue := []int{dst}
	for len(queue) > 0 {
		x := queue[0]
		queue = queue[1:]
		for u := range n {
			if dist[u] < 0 && rows[u][x] {
				dist[u] = dist[x] + 1
				queue = append(queue, u)
			}
		}
	}
	if dist[self] <= 0 {
		return nil
	}
	var hops []int
	for g := range n {
		if g != self && rows[self][g] && dist[g] == dist[self]-1 {
			hops = append(hops, g)
		}
	}
	return hops
}

// A reachability row: a version byte, then one bit per rank (LSB first),
// set when the publishing rank connected to that rank directly.
const reachVersion = 1

var errBadReach = errors.New("multidevice: malformed reachability row")

func encodeReach(row []bool) []byte {
	b := make([]byte, 1+(len(row)+7)/8)
	b[0] = reachVersion
	for i, ok := range row {
		if ok {
			b[1+i/8] |= 1 << (i % 8)
		}
	}
	return b
}

// decodeReach parses a row for a job of size ranks. It never panics.
func decodeReach(b []byte, size int) ([]bool, error) {
	want := 1 + (size+7)/8
	switch {
	case len(b) != want:
		return nil, fmt.Errorf("%w: %d bytes, a job of %d ranks needs %d", errBadReach, len(b), size, want)
	case b[0] != reachVersion:
		return nil, fmt.Errorf("%w: version %d, this build reads %d", errBadReach, b[0], reachVersion)
	}
	if size%8 != 0 && b[len(b)-1]>>(size%8) != 0 {
		return nil, fmt.Errorf("%w: bits set beyond rank %d", errBadReach, size-1)
	}
	row := make([]bool, size)
	for i := range row {
		row[i] = b[1+i/8]&(1<<(i%8)) != 0
	}
	return row, nil
}
