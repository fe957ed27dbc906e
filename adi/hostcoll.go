package adi

import "slices"

// Host-aware collectives. Between hosts a message costs one or two orders
// of magnitude more than over shared memory within one (tcp over a
// network, or a gateway between clusters, against a ring in memory), and
// the flat algorithms cross between hosts in most of their steps: on two
// hosts of eight ranks, every one of the sixteen ranks sends its whole
// vector across in one step of a recursive-doubling allreduce. When a
// communicator spans several hosts and some host holds more than one of
// its ranks, Barrier, Bcast, Reduce and Allreduce work in phases, as
// MPICH's SMP-aware collectives and IMPI's "short" algorithms between
// clusters (Takano et al.) do: within each host towards its leader (its
// first rank in the communicator), among the leaders, and within each host
// from its leader. Only leaders send between hosts, and each leader's
// share of the flat algorithm's traffic is what it moves.
//
// Where ranks name the sites (clusters) their hosts are in (WithSite,
// MD_SITE), the hosts' leaders do the same by sites: within each site
// towards the site's leader (its first host's leader), among the sites'
// leaders, and back; only they then send between sites. Each grouping is
// a level, kept only where it changes something: at least two groups,
// and fewer groups than members.
//
// Reductions promise rank order (op need not commute). Combining within
// each host first keeps that order only when every host's ranks are
// consecutive in the communicator, as block placement makes them
// (mdrun's, and most launchers' default), and within each site only when
// its hosts are. Reduce and Allreduce go by the levels up to the first
// that is not so: by hosts and sites, by hosts alone, or flat. Barrier
// and Bcast go by every level whatever the placement.
//
// The phases' views (the ranks of this rank's host; the leaders of its
// site's hosts; the leaders at the top) are lists of the communicator's
// ranks, not communicators of their own: they draw no sequence number and
// need no agreement, and every phase runs on the collective's own tag and
// context. That is safe because no two ranks share two kinds of view (a
// level's members lead different groups of the level below, so they share
// none of its groups), and a rank ends each phase, its sends included,
// before it starts the next: between two ranks of one group, the messages
// of the phase up and the phase down follow one another in the order both
// post them, and the device keeps each sender's messages in order.
// Which ranks take part in a phase every rank works out alike. Hosts are
// the launcher's names (World.Host) and sites the ranks' (World.Site),
// known to every rank since Init: the views need no communication.
//
// MD_HOST_COLLECTIVES=0 in the environment, or WithHostCollectives(false),
// keeps every collective flat, to compare the two. Every rank of a job
// must have the same setting: ranks that go by hosts and ranks that do not
// wait for each other's messages until their ctx ends.

// hostMap is where a communicator's ranks live: computed once when the
// communicator is made, shared by the copies its nonblocking collectives
// run on, never changed. A communicator has none when going by hosts
// would change nothing: all its ranks on one host, or each on its own,
// and as many sites. A communicator has two: one for Barrier and Bcast,
// and one for the reductions, whose levels stop before the first whose
// groups' members are not consecutive (hostMaps).
type hostMap struct {
	// levels group the members of each level, from hosts outwards; the
	// members of the first are every rank, those of each next one the
	// leaders of the groups of the one before.
	levels []level
	top    []int // the last level's leaders, who run the flat algorithm
}

// level is one grouping of a hostMap. Its slices are indexed by the
// communicator's ranks; for ranks that are not members, group is -1.
type level struct {
	group   []int // member -> its group, numbered in order of each group's first member
	local   []int // member -> its index among its group's members
	leaders []int // group -> its first member
	// blocks is set when every group's members are consecutive among
	// the level's members.
	blocks bool
}

// hostMaps maps the ranks (world ranks, in communicator order) onto their
// hosts and sites, for Barrier and Bcast and for the reductions; either is
// nil where going by hosts would change nothing. A host's site is the one
// its first rank names.
func hostMaps(w *World, ranks []int) (all, ordered *hostMap) {
	if !w.hostColl || len(ranks) < 3 {
		return nil, nil
	}
	siteOf := make(map[string]string) // host -> its first rank's site
	for _, r := range ranks {
		h := w.dev.Host(r)
		if _, ok := siteOf[h]; !ok {
			siteOf[h] = w.dev.Site(r)
		}
	}
	site := func(r int) string { return siteOf[w.dev.Host(r)] }
	var levels []level
	members := make([]int, len(ranks))
	for i := range members {
		members[i] = i
	}
	for _, where := range []func(r int) string{w.dev.Host, site} {
		l := level{group: make([]int, len(ranks)), local: make([]int, len(ranks)), blocks: true}
		for i := range l.group {
			l.group[i] = -1
		}
		ids := make(map[string]int)
		var counts []int
		for j, i := range members {
			key := where(ranks[i])
			id, ok := ids[key]
			if !ok {
				id = len(l.leaders)
				ids[key] = id
				l.leaders = append(l.leaders, i)
				counts = append(counts, 0)
			}
			l.group[i], l.local[i] = id, counts[id]
			counts[id]++
			// Groups are numbered as first met, so consecutive members
			// per group means a group number never falls back.
			l.blocks = l.blocks && (j == 0 || id >= l.group[members[j-1]])
		}
		if len(l.leaders) >= 2 && len(l.leaders) < len(members) {
			levels = append(levels, l)
			members = l.leaders
		}
	}
	n := 0 // levels whose groups are consecutive, from the first
	for n < len(levels) && levels[n].blocks {
		n++
	}
	all, ordered = newHostMap(levels), newHostMap(levels[:n])
	if n == len(levels) {
		ordered = all
	}
	return all, ordered
}

// newHostMap makes a hostMap of levels, nil if there are none.
func newHostMap(levels []level) *hostMap {
	if len(levels) == 0 {
		return nil
	}
	return &hostMap{levels: levels, top: levels[len(levels)-1].leaders}
}

// up returns the rank that stands for rank r at level i: r itself at
// level 0, at each next level the leader of its group at the one before;
// at len(levels), its member of top.
func (m *hostMap) up(r, i int) int {
	for _, l := range m.levels[:i] {
		r = l.leaders[l.group[r]]
	}
	return r
}

// topOf is the index in top of the rank that stands for root there.
func (m *hostMap) topOf(root int) int { return slices.Index(m.top, m.up(root, len(m.levels))) }

// stands reports whether r stands for root at some level.
func (m *hostMap) stands(root, r int) bool {
	for i := range len(m.levels) + 1 {
		if m.up(root, i) == r {
			return true
		}
	}
	return false
}

// hostViews are the communicator's ranks as a collective's phases see
// them: this rank's group at each level it is a member of (nil at the
// others), and the top if it is one of it. A view is a Comm only so that
// the algorithms run on it unchanged; it shares the communicator's
// context, sends on the tag of the call it serves, and keeps requests and
// scratch space of its own. Each Comm (a nonblocking collective's copy
// too) has its own views, used by the goroutine running its collective.
type hostViews struct {
	levels []*Comm
	top    *Comm // nil on a rank that is not one of the top
}

// views returns c's views of m (c.hosts or c.ordered), making them the
// first time.
func (c *Comm) views(m *hostMap) *hostViews {
	cache := &c.hviews
	if m != c.hosts {
		cache = &c.oviews
	}
	if *cache != nil {
		return *cache
	}
	me := c.rank
	v := &hostViews{levels: make([]*Comm, len(m.levels))}
	for i, l := range m.levels {
		if l.group[me] < 0 {
			break // not a member here, nor above
		}
		var group []int
		for r, g := range l.group {
			if g == l.group[me] {
				group = append(group, r)
			}
		}
		v.levels[i] = c.view(group, l.local[me])
	}
	if i := slices.Index(m.top, me); i >= 0 {
		v.top = c.view(m.top, i)
	}
	*cache = v
	return v
}

// view is a Comm of the ranks of c listed in in, in that order, where
// this rank is the rank-th.
func (c *Comm) view(in []int, rank int) *Comm {
	ranks := make([]int, len(in))
	for i, r := range in {
		ranks[i] = c.ranks[r]
	}
	return &Comm{w: c.w, context: c.context, rank: rank, ranks: ranks, of: in}
}

// phase runs part of collective k on view v: run starts its messages on
// s, which has k's tag and context and the mismatch k met so far, and
// phase completes them. A mismatch met in the phase carries on to k.
func (k *collective) phase(v *Comm, run func(s *collective) error) error {
	s := &v.coll.k
	*s = collective{c: v, ctx: k.ctx, name: k.name, where: k.where, tag: k.tag, reqs: s.reqs[:0], mismatch: k.mismatch}
	err := run(s)
	if err == nil {
		err = s.wait()
	}
	k.mismatch = s.mismatch
	s.ctx = nil
	return err
}

// climb runs up on this rank's group at each level it is a member of,
// from hosts outwards, then top on the top if this rank is one of it,
// then down on its groups from the outermost level in.
func (k *collective) climb(m *hostMap, up, top, down func(s *collective) error) error {
	v := k.c.views(m)
	for _, g := range v.levels {
		if g == nil {
			break
		}
		if err := k.phase(g, up); err != nil {
			return err
		}
	}
	if v.top != nil {
		if err := k.phase(v.top, top); err != nil {
			return err
		}
	}
	for i := len(v.levels) - 1; i >= 0; i-- {
		if g := v.levels[i]; g != nil {
			if err := k.phase(g, down); err != nil {
				return err
			}
		}
	}
	return nil
}

// hostBarrier: each group's members report to their leader up a binomial
// tree, level by level, the top runs the dissemination barrier, and each
// leader releases its group's members down the tree.
func (k *collective) hostBarrier() error {
	return k.climb(k.c.hosts, (*collective).fanIn, (*collective).dissemination, func(s *collective) error {
		return s.binomial(0, func(int, int) []byte { return nil })
	})
}

// fanIn sends an empty message up a binomial tree to rank 0: a rank
// hears from every rank of its subtree before it reports to its parent.
func (k *collective) fanIn() error {
	p, r := k.c.Size(), k.c.Rank()
	mask := 1
	for ; mask < p && r&mask == 0; mask <<= 1 {
		if r+mask < p {
			if err := k.recv(nil, r+mask); err != nil {
				return err
			}
		}
	}
	if err := k.wait(); err != nil {
		return err
	}
	if r == 0 {
		return nil
	}
	return k.send(nil, r-mask)
}

// hostBcast: the buffer climbs from the root to the rank that stands for
// it at the top, one message per level where the two differ (the root to
// its host's leader, that to its site's leader), the top broadcasts it,
// and each group gets it from the member that has it: its leader, or in
// the groups on the root's way up, the root's stand-in (so the leaders
// on that way get it twice, and no other group waits for the root's).
// MPICH's SMP broadcast goes the same way.
func (k *collective) hostBcast(buf []byte, root int) error {
	m, me := k.c.hosts, k.c.rank
	v := k.c.views(m)
	for i, l := range m.levels {
		from, to := m.up(root, i), m.up(root, i+1)
		if from == to || me != from && me != to {
			continue
		}
		err := k.phase(v.levels[i], func(s *collective) error {
			if me == from {
				return s.send(buf, 0)
			}
			return s.recv(buf, l.local[from])
		})
		if err != nil {
			return err
		}
	}
	if v.top != nil {
		top := m.topOf(root)
		if err := k.phase(v.top, func(s *collective) error { return s.bcast(buf, top) }); err != nil {
			return err
		}
	}
	for i := len(m.levels) - 1; i >= 0; i-- {
		l := m.levels[i]
		if v.levels[i] == nil {
			continue
		}
		from := 0
		if stand := m.up(root, i); l.group[stand] == l.group[me] {
			from = l.local[stand]
		}
		if err := k.phase(v.levels[i], func(s *collective) error { return s.bcast(buf, from) }); err != nil {
			return err
		}
	}
	return nil
}

// hostReduce: each group combines its members' vectors at its leader,
// level by level, the top combines its members' at the root's stand-in,
// and the result goes down the root's way to the root. Groups' members
// must be consecutive (c.ordered's levels are) for this to combine in
// rank order.
func hostReduce[T Elem](k *collective, send, recv []T, op Op[T], root int) error {
	m, me := k.c.ordered, k.c.rank
	v := k.c.views(m)
	// in is what this rank contributes at a level: its send, then what
	// its group combined; each level's result goes to the other scratch
	// slot (recv need not exist on ranks other than the root).
	in := send
	slot := 0
	for _, g := range v.levels {
		if g == nil {
			break
		}
		out := scratch[T](k, slot, len(send))
		if err := k.phase(g, func(s *collective) error { return reduce(s, in, out, op, 0) }); err != nil {
			return err
		}
		in, slot = out, 1-slot
	}
	// The result, on the root's stand-ins from the top in.
	var res []T
	if me == root {
		res = recv
	} else if v.top != nil || m.stands(root, me) {
		res = scratch[T](k, slot, len(send))
	}
	if v.top != nil {
		top := m.topOf(root)
		if err := k.phase(v.top, func(s *collective) error { return reduce(s, in, res, op, top) }); err != nil {
			return err
		}
	}
	for i := len(m.levels) - 1; i >= 0; i-- {
		holder, to := m.up(root, i+1), m.up(root, i)
		if holder == to || me != holder && me != to {
			continue
		}
		err := k.phase(v.levels[i], func(s *collective) error {
			if me == holder {
				return s.send(Bytes(res), m.levels[i].local[to])
			}
			return s.recv(Bytes(res), 0)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// hostAllreduce: each group combines its members' vectors at its leader,
// level by level, the top combines theirs, and each leader broadcasts the
// result to its group, from the outermost level in. Groups' members must
// be consecutive (c.ordered's levels are).
func hostAllreduce[T Elem](k *collective, send, recv []T, op Op[T]) error {
	in := send // what this rank contributes: its send, then its group's result in recv
	return k.climb(k.c.ordered, func(s *collective) error {
		err := reduce(s, in, recv, op, 0)
		in = recv
		return err
	}, func(s *collective) error {
		return allreduce(s, recv, recv, op)
	}, func(s *collective) error {
		return s.bcast(Bytes(recv), 0)
	})
}
