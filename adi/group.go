package adi

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
)

// Group is an ordered set of world ranks (MPI_Group): group rank i is
// world rank WorldRanks()[i]. Groups are values and never change; the
// operations on them make new ones, locally, without communication. The
// zero Group is the empty group (MPI_GROUP_EMPTY). A Group remembers the
// World it was taken from, so that Rank can say where this process is in
// it. It is safe for concurrent use.
type Group struct {
	w     *World
	ranks []int       // group rank -> world rank; never modified
	index map[int]int // world rank -> group rank
}

// Comparison is how two groups relate (MPI_Group_compare's result).
type Comparison int

// Results of Group.Compare.
const (
	// Ident: the same ranks in the same order (MPI_IDENT).
	Ident Comparison = iota
	// Similar: the same ranks in another order (MPI_SIMILAR).
	Similar
	// Unequal: not the same ranks (MPI_UNEQUAL).
	Unequal
)

// String returns the MPI name of the result, for messages.
func (r Comparison) String() string {
	switch r {
	case Ident:
		return "ident"
	case Similar:
		return "similar"
	case Unequal:
		return "unequal"
	}
	return fmt.Sprintf("Comparison(%d)", int(r))
}

// Range is a strided run of ranks for Group.RangeIncl and
// Group.RangeExcl: First, First+Stride, ... as far as Last, inclusive
// when the stride lands on it. Stride may be negative (then First >=
// Last) but not zero.
type Range struct{ First, Last, Stride int }

// newGroup makes a group of w from world ranks, which it keeps.
func newGroup(w *World, ranks []int) Group {
	index := make(map[int]int, len(ranks))
	for i, r := range ranks {
		index[r] = i
	}
	return Group{w: w, ranks: ranks, index: index}
}

// Group returns the group of c: its ranks in their order in c
// (MPI_Comm_group).
func (c *Comm) Group() Group {
	// c.ranks and c.index never change after newComm: the group shares them.
	return Group{w: c.w, ranks: c.ranks, index: c.index}
}

// Size is the number of ranks in g.
func (g Group) Size() int { return len(g.ranks) }

// Rank is this process's rank in g, or Undefined if it is not a member
// (MPI_Group_rank).
func (g Group) Rank() int {
	if g.w == nil {
		return Undefined
	}
	if r, ok := g.index[g.w.dev.Rank()]; ok {
		return r
	}
	return Undefined
}

// WorldRanks returns the world rank of each rank of g, in order.
func (g Group) WorldRanks() []int { return slices.Clone(g.ranks) }

// checkRanks checks that ranks are distinct ranks of g and returns them
// as a set of group ranks.
func (g Group) checkRanks(op string, ranks []int) (map[int]bool, error) {
	seen := make(map[int]bool, len(ranks))
	for i, r := range ranks {
		if r < 0 || r >= len(g.ranks) {
			return nil, fmt.Errorf("adi: group %s: ranks[%d]: %w: %d not in [0,%d)", op, i, ErrRank, r, len(g.ranks))
		}
		if seen[r] {
			return nil, fmt.Errorf("adi: group %s: ranks[%d]: rank %d appears twice", op, i, r)
		}
		seen[r] = true
	}
	return seen, nil
}

// Incl returns the group of the ranks of g listed, in the order listed
// (MPI_Group_incl). They must be distinct ranks of g.
func (g Group) Incl(ranks []int) (Group, error) {
	if _, err := g.checkRanks("incl", ranks); err != nil {
		return Group{}, err
	}
	out := make([]int, len(ranks))
	for i, r := range ranks {
		out[i] = g.ranks[r]
	}
	return newGroup(g.w, out), nil
}

// Excl returns g without the ranks listed, the others keeping their order
// (MPI_Group_excl). They must be distinct ranks of g.
func (g Group) Excl(ranks []int) (Group, error) {
	drop, err := g.checkRanks("excl", ranks)
	if err != nil {
		return Group{}, err
	}
	return g.keep(func(r int) bool { return !drop[r] }), nil
}

// keep returns the group of the ranks r of g for which f(r) holds.
func (g Group) keep(f func(r int) bool) Group {
	var out []int
	for r, wr := range g.ranks {
		if f(r) {
			out = append(out, wr)
		}
	}
	return newGroup(g.w, out)
}

// expand lists the ranks of ranges, in order, checking each range.
func (g Group) expand(op string, ranges []Range) ([]int, error) {
	var ranks []int
	for i, rg := range ranges {
		switch {
		case rg.Stride == 0:
			return nil, fmt.Errorf("adi: group %s: range %d %+v: stride 0", op, i, rg)
		case rg.Stride > 0 && rg.First > rg.Last, rg.Stride < 0 && rg.First < rg.Last:
			return nil, fmt.Errorf("adi: group %s: range %d %+v: a stride of %d never reaches %d from %d", op, i, rg, rg.Stride, rg.Last, rg.First)
		}
		for _, end := range []int{rg.First, rg.Last} {
			if end < 0 || end >= len(g.ranks) {
				return nil, fmt.Errorf("adi: group %s: range %d %+v: %w: %d not in [0,%d)", op, i, rg, ErrRank, end, len(g.ranks))
			}
		}
		// Both ends are ranks of g, so neither the count nor a rank can
		// overflow, whatever the stride; First + i*Stride could, if it
		// were stepped past Last.
		for i := range (rg.Last-rg.First)/rg.Stride + 1 {
			ranks = append(ranks, rg.First+i*rg.Stride)
		}
	}
	return ranks, nil
}

// RangeIncl is Incl of the ranks the ranges list, in order
// (MPI_Group_range_incl).
func (g Group) RangeIncl(ranges []Range) (Group, error) {
	ranks, err := g.expand("range incl", ranges)
	if err != nil {
		return Group{}, err
	}
	if _, err := g.checkRanks("range incl", ranks); err != nil {
		return Group{}, err
	}
	return g.Incl(ranks)
}

// RangeExcl is Excl of the ranks the ranges list (MPI_Group_range_excl).
func (g Group) RangeExcl(ranges []Range) (Group, error) {
	ranks, err := g.expand("range excl", ranges)
	if err != nil {
		return Group{}, err
	}
	return g.Excl(ranks)
}

// errOtherWorld is returned for groups of two Worlds in one operation: a
// process that runs several ranks (as tests do) must not mix them up.
var errOtherWorld = errors.New("the groups were taken from different Worlds")

// with returns the World of a result made from g and h.
func (g Group) with(op string, h Group) (*World, error) {
	switch {
	case g.w == nil:
		return h.w, nil
	case h.w != nil && h.w != g.w:
		return nil, fmt.Errorf("adi: group %s: %w", op, errOtherWorld)
	}
	return g.w, nil
}

// Union returns the ranks of g, then those of h that are not in g, each
// in its group's order (MPI_Group_union).
func (g Group) Union(h Group) (Group, error) {
	w, err := g.with("union", h)
	if err != nil {
		return Group{}, err
	}
	out := slices.Clone(g.ranks)
	for _, wr := range h.ranks {
		if _, ok := g.index[wr]; !ok {
			out = append(out, wr)
		}
	}
	return newGroup(w, out), nil
}

// Intersection returns the ranks of g that are also in h, in g's order
// (MPI_Group_intersection).
func (g Group) Intersection(h Group) (Group, error) {
	w, err := g.with("intersection", h)
	if err != nil {
		return Group{}, err
	}
	out := g.keep(func(r int) bool { _, ok := h.index[g.ranks[r]]; return ok })
	out.w = w
	return out, nil
}

// Difference returns the ranks of g that are not in h, in g's order
// (MPI_Group_difference).
func (g Group) Difference(h Group) (Group, error) {
	w, err := g.with("difference", h)
	if err != nil {
		return Group{}, err
	}
	out := g.keep(func(r int) bool { _, ok := h.index[g.ranks[r]]; return !ok })
	out.w = w
	return out, nil
}

// TranslateRanks returns the rank in to of each of ranks of g, Undefined
// for one that is not in to (MPI_Group_translate_ranks). ProcNull
// translates to ProcNull.
func (g Group) TranslateRanks(ranks []int, to Group) ([]int, error) {
	if _, err := g.with("translate ranks", to); err != nil {
		return nil, err
	}
	out := make([]int, len(ranks))
	for i, r := range ranks {
		switch {
		case r == ProcNull:
			out[i] = ProcNull
			continue
		case r < 0 || r >= len(g.ranks):
			return nil, fmt.Errorf("adi: group translate ranks: ranks[%d]: %w: %d not in [0,%d)", i, ErrRank, r, len(g.ranks))
		}
		t, ok := to.index[g.ranks[r]]
		if !ok {
			t = Undefined
		}
		out[i] = t
	}
	return out, nil
}

// Compare reports whether g and h hold the same world ranks in the same
// order (Ident), in another order (Similar), or not the same ranks
// (Unequal) (MPI_Group_compare). Groups of two Worlds are Unequal.
func (g Group) Compare(h Group) Comparison {
	if _, err := g.with("compare", h); err != nil || len(g.ranks) != len(h.ranks) {
		return Unequal
	}
	if slices.Equal(g.ranks, h.ranks) {
		return Ident
	}
	for _, wr := range g.ranks {
		if _, ok := h.index[wr]; !ok {
			return Unequal
		}
	}
	return Similar
}

// fingerprint sums up g's ranks in order, so that ranks can check
// cheaply that they passed the same group. It is never badGroup.
func (g Group) fingerprint() uint64 {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(len(g.ranks)))
	h.Write(b[:])
	for _, wr := range g.ranks {
		binary.LittleEndian.PutUint64(b[:], uint64(wr))
		h.Write(b[:])
	}
	if x := mix64(h.Sum64()); x != badGroup {
		return x
	}
	return 1
}

// badGroup is the fingerprint a rank contributes when its own arguments
// were wrong: it matches no group, so every rank that counts on this one
// finds a mismatch rather than waiting for it.
const badGroup uint64 = 0

// mix64 is splitmix64's finalizer: every bit of x affects every bit of
// the result.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// subgroup checks that g is a group of c's world whose ranks are all in c.
func (c *Comm) subgroup(op string, g Group) error {
	if g.w != nil && g.w != c.w {
		return fmt.Errorf("adi: %s: %w", op, errOtherWorld)
	}
	for i, wr := range g.ranks {
		if _, ok := c.index[wr]; !ok {
			return fmt.Errorf("adi: %s: group rank %d (world rank %d): %w: not in the communicator", op, i, wr, ErrRank)
		}
	}
	return nil
}

// Create returns a communicator of the ranks of g, in g's order
// (MPI_Comm_create). It is collective over c: every rank of c calls it,
// in the same order as c's other collectives and Dup and Split calls.
// Ranks pass either the same g, or, to make several communicators at
// once, disjoint groups, each rank one it belongs to or the empty Group.
// g must be a subgroup of c's group. A rank outside its g gets nil.
//
// Every rank checks that the members of its g passed the same g and that
// g is a subgroup of c; when any rank finds fault, every rank returns an
// error, wrapping ErrMismatch on the ranks that did not find it
// themselves. The checks cost an Allgather of one uint64 and an
// Allreduce of one int64.
func (c *Comm) Create(ctx context.Context, g Group) (*Comm, error) {
	n := c.derived.Add(1)
	bad := c.subgroup("comm create", g)
	fp := g.fingerprint()
	if bad != nil {
		fp = badGroup
	}
	all := make([]uint64, c.Size())
	if err := c.Allgather(ctx, Bytes([]uint64{fp}), Bytes(all)); err != nil {
		return nil, fmt.Errorf("adi: comm create: %w", err)
	}
	color := c.Size() // the least rank in c of g's members: the same on each, and another for each of disjoint groups
	if bad == nil {
		for i, wr := range g.ranks {
			r := c.index[wr]
			if all[r] != fp {
				bad = fmt.Errorf("adi: comm create: %w: rank %d of the communicator (group rank %d) passed another group", ErrMismatch, r, i)
				break
			}
			color = min(color, r)
		}
	}
	// A rank cannot tell from the fingerprints alone that another rank's
	// group overlaps its own (a member of one group passed another that
	// includes it too): one more step tells every rank that some rank
	// found fault, so that all return an error or none.
	if err := c.agree(ctx, "comm create", bad); err != nil {
		return nil, err
	}
	if g.Rank() == Undefined {
		return nil, nil
	}
	return newComm(c.w, deriveContext(c.context, n, uint64(color)+1), g.ranks), nil
}

// Context ids fall into three ranges told apart by their top two bits,
// so that an id of one kind never equals one of another:
//
//	0x  derived by all ranks of a parent alike from its id (world, Dup,
//	    Split, Create, and the topologies made with them): deriveContext
//	10  agreed among the members of a group alone: CreateGroup
//	11  CreateGroup's own messages, while the members agree
const (
	groupContext       uint64 = 1 << 63
	negotiationContext uint64 = 1 << 62
)

// CreateGroup returns a communicator of the ranks of g, in g's order,
// calling on the members of g only (MPI_Comm_create_group): ranks of c
// outside g take no part and need not call anything. Every member calls
// it with the same g, a subgroup of c's group that includes the caller,
// and the same tag (0..MaxTag). Calls by one rank on the same c that may
// run at the same time (from several goroutines) must pass different
// tags; calls one after the other may share one.
//
// The members exchange their arguments and return an error wrapping
// ErrMismatch when their groups differ. Members that disagree on tag, or
// on g so that they do not reach each other, wait for each other until
// ctx ends.
func (c *Comm) CreateGroup(ctx context.Context, g Group, tag int) (*Comm, error) {
	if err := checkTag(tag, false); err != nil {
		return nil, fmt.Errorf("adi: comm create group: %w", err)
	}
	if err := c.subgroup("comm create group", g); err != nil {
		return nil, err
	}
	if g.Rank() == Undefined {
		return nil, fmt.Errorf("adi: comm create group: %w: this rank (world rank %d) is not in the group", ErrRank, c.w.dev.Rank())
	}
	// The members talk on a context of their own, derived from c's and
	// the tag: in range 11, it is no communicator's, and concurrent calls
	// on c pass different tags. One call's messages cannot reach a later
	// call with the same tag either: the allgather receives every message
	// it sends before any member leaves it, and messages between two
	// ranks arrive in order.
	nc := newComm(c.w, negotiationID(c.context, tag), g.ranks)
	// This rank's nonce differs on each call on c, so two calls that
	// share a member never mix the same inputs into their ids.
	nonce := c.groupSeq.Add(1)
	fp := g.fingerprint()
	all := make([]uint64, 2*g.Size())
	if err := nc.Allgather(ctx, Bytes([]uint64{fp, nonce}), Bytes(all)); err != nil {
		return nil, fmt.Errorf("adi: comm create group: %w", err)
	}
	nonces := make([]uint64, g.Size())
	for r := range g.Size() {
		if all[2*r] != fp {
			return nil, fmt.Errorf("adi: comm create group: %w: group rank %d passed another group", ErrMismatch, r)
		}
		nonces[r] = all[2*r+1]
	}
	return newComm(c.w, groupID(c.context, tag, fp, nonces), g.ranks), nil
}

// negotiationID is the context CreateGroup's members talk on while they
// agree: derived from the parent's id and the tag, in range 11, and even
// (the odd id after it carries their allgather).
func negotiationID(parent uint64, tag int) uint64 {
	return mix64(mix64(parent)^uint64(tag))&^1 | groupContext | negotiationContext
}

// groupID is the context id of the communicator CreateGroup makes from
// the parent's id, the tag, the group's fingerprint and every member's
// nonce.
//
// Why it cannot collide with an id that Dup, Split or Create make: those
// come from deriveContext, whose ids have the top bit clear, and this one
// has it set; and it has bit 62 clear, so it is no call's negotiation
// context either. A communicator's collectives use the odd id after its
// even one, which stays in the same range. Among CreateGroup ids, two
// calls that a rank takes part in mix different inputs (that rank's
// nonces differ, or their parents' ids do), so they collide only as
// rarely as two 64-bit hashes, as deriveContext's ids do among
// themselves.
func groupID(parent uint64, tag int, fp uint64, nonces []uint64) uint64 {
	id := mix64(parent ^ uint64(tag)*0x9e3779b97f4a7c15)
	for r, x := range nonces {
		id = mix64(id ^ x ^ uint64(r)<<48)
	}
	return mix64(id^fp)&^(negotiationContext|1) | groupContext
}

// agree tells every rank of c whether any rank found fault with its
// arguments (bad), so that a collective that makes a communicator fails
// on every rank or on none: it returns bad, or an error wrapping
// ErrMismatch when only other ranks found fault. It costs an Allreduce
// of one int64.
func (c *Comm) agree(ctx context.Context, op string, bad error) error {
	faults := []int64{0}
	if bad != nil {
		faults[0] = 1
	}
	if err := Allreduce(ctx, c, faults, faults, Sum[int64]); err != nil {
		return fmt.Errorf("adi: %s: %w", op, err)
	}
	switch {
	case bad != nil:
		return bad
	case faults[0] > 0:
		return fmt.Errorf("adi: %s: %w: %d other ranks found their arguments wrong or disagreeing", op, ErrMismatch, faults[0])
	}
	return nil
}
