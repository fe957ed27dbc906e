package adi

// Host-aware collectives. Between hosts a message costs one or two orders
// of magnitude more than over shared memory within one (tcp over a
// network, or a gateway between clusters, against a ring in memory), and
// the flat algorithms cross between hosts in most of their steps: on two
// hosts of eight ranks, every one of the sixteen ranks sends its whole
// vector across in one step of a recursive-doubling allreduce. When a
// communicator spans several hosts and some host holds more than one of
// its ranks, Barrier, Bcast, Reduce and Allreduce work in three phases,
// as MPICH's SMP-aware collectives and IMPI's "short" algorithms between
// clusters (Takano et al.) do: within each host towards its leader (its
// first rank in the communicator), among the leaders, and within each host
// from its leader. Only leaders send between hosts, and each leader's
// share of the flat algorithm's traffic is what it moves.
//
// Reductions promise rank order (op need not commute). Combining within
// each host first keeps that order only when every host's ranks are
// consecutive in the communicator, as block placement makes them
// (mdrun's, and most launchers' default); Reduce and Allreduce go by hosts
// only then, and are flat otherwise. Barrier and Bcast go by hosts
// whatever the placement.
//
// The phases' views (the ranks of this rank's host; the leaders) are
// lists of the communicator's ranks, not communicators of their own: they
// draw no sequence number and need no agreement, and every phase runs on
// the collective's own tag and context. That is safe because no two ranks
// share both a host and the leaders' view (leaders are on different
// hosts), and a rank ends each phase, its sends included, before it
// starts the next: between two ranks of a host, the messages of the first
// and the last phase follow one another in the order both post them, and
// the device keeps each sender's messages in order. Which ranks take part
// in a phase every rank works out alike. Hosts are the launcher's names
// (World.Host), known to every rank since Init: the views need no
// communication.
//
// MD_HOST_COLLECTIVES=0 in the environment, or WithHostCollectives(false),
// keeps every collective flat, to compare the two. Every rank of a job
// must have the same setting: ranks that go by hosts and ranks that do not
// wait for each other's messages until their ctx ends.

// hostMap is where a communicator's ranks live: computed once when the
// communicator is made, shared by the copies its nonblocking collectives
// run on, never changed. A communicator has none when going by hosts
// would change nothing: all its ranks on one host, or each on its own.
type hostMap struct {
	host    []int // communicator rank -> its host, numbered in order of each host's first rank
	local   []int // communicator rank -> its rank among its host's ranks
	leaders []int // host -> its first rank
	// blocks is set when every host's ranks are consecutive: reductions
	// by hosts then combine in rank order.
	blocks bool
}

// newHostMap maps the ranks (world ranks, in communicator order) onto
// their hosts, or returns nil when that would change nothing.
func newHostMap(w *World, ranks []int) *hostMap {
	if !w.hostColl || len(ranks) < 3 {
		return nil
	}
	m := &hostMap{host: make([]int, len(ranks)), local: make([]int, len(ranks)), blocks: true}
	ids := make(map[string]int)
	var counts []int
	for i, r := range ranks {
		h := w.dev.Host(r)
		id, ok := ids[h]
		if !ok {
			id = len(m.leaders)
			ids[h] = id
			m.leaders = append(m.leaders, i)
			counts = append(counts, 0)
		}
		m.host[i], m.local[i] = id, counts[id]
		counts[id]++
		// Hosts are numbered as first met, so consecutive ranks per host
		// means a host number never falls back.
		m.blocks = m.blocks && (i == 0 || id >= m.host[i-1])
	}
	if len(m.leaders) < 2 || len(m.leaders) == len(ranks) {
		return nil
	}
	return m
}

// hostViews are the communicator's ranks as a collective's phases see
// them: this rank's host, and the leaders if this rank is one. A view is
// a Comm only so that the algorithms run on it unchanged; it shares the
// communicator's context, sends on the tag of the call it serves, and
// keeps requests and scratch space of its own. Each Comm (a nonblocking
// collective's copy too) has its own views, used by the goroutine running
// its collective.
type hostViews struct {
	host    *Comm
	leaders *Comm // nil on a rank that leads no host
}

// views returns c's views, making them the first time.
func (c *Comm) views() *hostViews {
	if c.hviews != nil {
		return c.hviews
	}
	m, me := c.hosts, c.rank
	var host []int
	for r, h := range m.host {
		if h == m.host[me] {
			host = append(host, r)
		}
	}
	v := &hostViews{host: c.view(host, m.local[me])}
	if m.leaders[m.host[me]] == me {
		v.leaders = c.view(m.leaders, m.host[me])
	}
	c.hviews = v
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
	*s = collective{c: v, ctx: k.ctx, name: k.name, tag: k.tag, reqs: s.reqs[:0], mismatch: k.mismatch}
	err := run(s)
	if err == nil {
		err = s.wait()
	}
	k.mismatch = s.mismatch
	s.ctx = nil
	return err
}

// hostBarrier: each host's ranks report to their leader up a binomial
// tree, the leaders run the dissemination barrier, and each leader
// releases its host's ranks down the tree.
func (k *collective) hostBarrier() error {
	v := k.c.views()
	if err := k.phase(v.host, (*collective).fanIn); err != nil {
		return err
	}
	if v.leaders != nil {
		if err := k.phase(v.leaders, (*collective).dissemination); err != nil {
			return err
		}
	}
	return k.phase(v.host, func(s *collective) error {
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

// hostBcast: a root that does not lead its host hands the buffer to its
// leader first, the leaders broadcast it, and each host gets it from its
// leader, the root's from the root (its leader gets it twice: the other
// hosts need not wait for the root's host, as MPICH's SMP broadcast
// does it).
func (k *collective) hostBcast(buf []byte, root int) error {
	m, v, me := k.c.hosts, k.c.views(), k.c.rank
	home := m.host[root]
	leader := m.leaders[home]
	if root != leader && (me == root || me == leader) {
		err := k.phase(v.host, func(s *collective) error {
			if me == root {
				return s.send(buf, 0)
			}
			return s.recv(buf, m.local[root])
		})
		if err != nil {
			return err
		}
	}
	if v.leaders != nil {
		if err := k.phase(v.leaders, func(s *collective) error { return s.bcast(buf, home) }); err != nil {
			return err
		}
	}
	from := 0
	if m.host[me] == home {
		from = m.local[root]
	}
	return k.phase(v.host, func(s *collective) error { return s.bcast(buf, from) })
}

// hostReduce: each host combines its ranks' vectors at its leader, the
// leaders combine theirs at the root's leader, which hands the result to
// the root if it is not the root. Hosts' ranks must be consecutive
// (hostMap.blocks) for this to combine in rank order.
func hostReduce[T Elem](k *collective, send, recv []T, op Op[T], root int) error {
	m, v, me := k.c.hosts, k.c.views(), k.c.rank
	home := m.host[root]
	// part is this rank's host's result, on its leader; whole is every
	// host's, on the root's leader.
	var part, whole []T
	if v.leaders != nil {
		part = scratch[T](k, 0, len(send))
		whole = part
		if me == root {
			whole = recv
		} else if m.host[me] == home {
			whole = scratch[T](k, 1, len(send))
		}
	}
	if err := k.phase(v.host, func(s *collective) error { return reduce(s, send, part, op, 0) }); err != nil {
		return err
	}
	if v.leaders != nil {
		if err := k.phase(v.leaders, func(s *collective) error { return reduce(s, part, whole, op, home) }); err != nil {
			return err
		}
	}
	leader := m.leaders[home]
	if leader == root || me != root && me != leader {
		return nil // the result is where it belongs, or this rank has no part of it
	}
	return k.phase(v.host, func(s *collective) error {
		if me == root {
			return s.recv(Bytes(recv), 0)
		}
		return s.send(Bytes(whole), m.local[root])
	})
}

// hostAllreduce: each host combines its ranks' vectors at its leader, the
// leaders combine theirs, and each leader broadcasts the result to its
// host. Hosts' ranks must be consecutive (hostMap.blocks).
func hostAllreduce[T Elem](k *collective, send, recv []T, op Op[T]) error {
	v := k.c.views()
	if err := k.phase(v.host, func(s *collective) error { return reduce(s, send, recv, op, 0) }); err != nil {
		return err
	}
	if v.leaders != nil {
		if err := k.phase(v.leaders, func(s *collective) error { return allreduce(s, recv, recv, op) }); err != nil {
			return err
		}
	}
	return k.phase(v.host, func(s *collective) error { return s.bcast(Bytes(recv), 0) })
}
