package adi

import (
	"cmp"
	"context"
	"fmt"
	"slices"
)

// Split and Create on an Intercomm (MPI_Comm_split and MPI_Comm_create
// on an intercommunicator). Both are collectives over both groups that
// make a smaller intercommunicator; each rank's part is one record of
// three int64s (which of the two it called, then for Split its color
// and key, for Create its group's fingerprint and its rank in its
// group's subgroup), and every rank learns every
// record of both groups: an Allgather within the local group, one
// exchange between the leaders, and a broadcast of the remote group's
// records within the local group. From these each rank computes its
// result alone, so that every rank of both groups agrees on it, on
// errors too: a rank that finds fault with its own arguments still takes
// part, and everybody else sees the fault in its record.
//
// The new intercommunicator's context id is derived, as Dup's and
// Merge's are, from ic's context and the count of ic's Dup, Merge,
// Split and Create calls, which every rank of both groups makes in the
// same order; Split mixes in the color's index among the colors of both
// groups (colorIndex), so that the intercommunicators one call makes for
// different colors have different ids too. No two of
// those calls on ic share a count, and a child derives its own
// children's ids from its own context, so neither two Splits in a row,
// nor a Split of a Split, nor a Dup share an id (up to 64-bit hash
// collisions, as deriveContext's ids among themselves).

// Split partitions both groups of ic by color and returns the
// intercommunicator that joins the ranks of the local group that passed
// this rank's color with the ranks of the remote group that passed the
// same color (MPI_Comm_split on an intercommunicator). Each of its
// groups is ordered by key, then by rank in ic's group. A rank that
// passes Undefined gets nil, and so do the ranks of a color that no rank
// of the other group passed. Colors are >= 0 or Undefined.
//
// It is collective over both groups of ic, in the same order as ic's
// collectives and its Dup, Merge and Create calls. Merge on the result
// orders two groups that pass the same high as Merge on ic does. A rank
// that passes a bad color returns an error saying so, and every other
// rank of both groups one wrapping ErrMismatch. It costs an Allgather of
// 24 bytes a rank within each group, one exchange between the leaders
// and a broadcast within each group.
func (ic *Intercomm) Split(ctx context.Context, color, key int) (*Intercomm, error) {
	n := ic.derived.Add(1)
	var bad error
	if color < Undefined {
		bad = fmt.Errorf("adi: intercomm split: color %d must be >= 0 or Undefined", color)
	}
	local, remote, err := ic.allRecords(ctx, recordSplit, int64(color), int64(key))
	if err != nil {
		return nil, err
	}
	if err := splitColors(local, remote); err != nil {
		if bad != nil {
			return nil, bad
		}
		return nil, fmt.Errorf("adi: intercomm split: %w: %w", ErrMismatch, err)
	}
	if color == Undefined {
		return nil, nil
	}
	mine, theirs := splitMembers(local, int64(color)), splitMembers(remote, int64(color))
	if len(theirs) == 0 {
		return nil, nil
	}
	id := deriveContext(ic.remote.context, n, colorIndex(append(local, remote...), 2, int64(color))+1)
	return newIntercomm(ic.remote.w, id, worldRanksAt(ic.local.ranks, mine), worldRanksAt(ic.remote.ranks, theirs), ic.lowLeader), nil
}

// Create returns the intercommunicator that joins the ranks of g in the
// local group with the ranks of the group the remote group passes, each
// in its group's order (MPI_Comm_create on an intercommunicator). Every
// rank of a group passes the same g, a subgroup of ic.Group() (possibly
// empty), and the two groups pass groups of their own. A rank that is
// not in its g gets nil, and every rank gets nil when either group's g
// is empty.
//
// It is collective over both groups of ic, in the same order as ic's
// collectives and its Dup, Merge and Split calls. Merge on the result
// orders two groups that pass the same high as Merge on ic does. When a
// rank passes a g that is not a subgroup of its local group, or the
// ranks of a group pass different groups, every rank of both groups
// returns an error: a rank whose g is not a subgroup one of its own
// (wrapping ErrRank, or saying g was taken from another World), every
// other rank one wrapping ErrMismatch. It costs what Split does.
func (ic *Intercomm) Create(ctx context.Context, g Group) (*Intercomm, error) {
	n := ic.derived.Add(1)
	bad := ic.subgroup(g)
	fp, at := g.fingerprint(), g.Rank()
	if bad != nil {
		fp, at = badGroup, Undefined
	}
	local, remote, err := ic.allRecords(ctx, recordCreate, int64(fp), int64(at))
	if err != nil {
		return nil, err
	}
	// The local records say whether this group's ranks all passed the
	// same g (a fingerprint stands for the g this rank holds); the remote
	// ones, whether the remote group's did, and in which order its
	// members stand in theirs, which this rank learns only from them.
	_, _, lerr := createMembers(local)
	_, theirs, rerr := createMembers(remote)
	switch {
	case bad != nil:
		return nil, bad
	case lerr != nil:
		return nil, fmt.Errorf("adi: intercomm create: %w: local group: %w", ErrMismatch, lerr)
	case rerr != nil:
		return nil, fmt.Errorf("adi: intercomm create: %w: remote group: %w", ErrMismatch, rerr)
	case at == Undefined || len(theirs) == 0:
		return nil, nil
	}
	id := deriveContext(ic.remote.context, n, 0)
	return newIntercomm(ic.remote.w, id, g.ranks, worldRanksAt(ic.remote.ranks, theirs), ic.lowLeader), nil
}

// subgroup checks that g is a group of ic's world whose ranks are all in
// the local group.
func (ic *Intercomm) subgroup(g Group) error {
	if g.w != nil && g.w != ic.local.w {
		return fmt.Errorf("adi: intercomm create: %w", errOtherWorld)
	}
	for i, wr := range g.ranks {
		if _, ok := ic.local.index[wr]; ok {
			continue
		}
		where := "not in the intercommunicator"
		if r, ok := ic.remote.index[wr]; ok {
			where = fmt.Sprintf("rank %d of the remote group, not of the local one", r)
		}
		return fmt.Errorf("adi: intercomm create: group rank %d (world rank %d): %w: %s", i, wr, ErrRank, where)
	}
	return nil
}

// The kinds of record, each record's first word: a Split on one side
// and a Create on the other, whose other words have the same shape,
// then fail alike on every rank instead of making an intercommunicator
// on one side only.
const (
	recordSplit int64 = 1 + iota
	recordCreate
)

// recordCall names the call that makes records of kind.
func recordCall(kind int64) string {
	switch kind {
	case recordSplit:
		return "intercomm split"
	case recordCreate:
		return "intercomm create"
	}
	return fmt.Sprintf("a call of unknown kind %d", kind)
}

// allRecords gives this rank the record (a, b) of every rank of both
// groups: local[2r:2r+2] rank r's of the local group, remote[2r:2r+2]
// rank r's of the remote group. It runs as ic's next collective, and
// fails with ErrMismatch on every rank when any rank made a record of
// another kind.
func (ic *Intercomm) allRecords(ctx context.Context, kind, a, b int64) (local, remote []int64, err error) {
	name := recordCall(kind)
	all, allRemote := make([]int64, 3*ic.Size()), make([]int64, 3*ic.RemoteSize())
	err = ic.collective(ctx, name, func(k *collective) error {
		if err := k.carry(ic.coll.Allgather(ctx, Bytes([]int64{kind, a, b}), Bytes(all))); err != nil {
			return err
		}
		if ic.leader() {
			if err := k.exchange(Bytes(all), 0, Bytes(allRemote), 0); err != nil {
				return err
			}
		}
		return ic.localBcast(k, Bytes(allRemote))
	})
	if err != nil {
		return nil, nil, err
	}
	for _, side := range []struct {
		name string
		recs []int64
	}{{"local", all}, {"remote", allRemote}} {
		for r := 0; r < len(side.recs); r += 3 {
			if k := side.recs[r]; k != kind {
				return nil, nil, fmt.Errorf("adi: %s: %w: rank %d of the %s group called %s", name, ErrMismatch, r/3, side.name, recordCall(k))
			}
		}
	}
	return dropKinds(all), dropKinds(allRemote), nil
}

// dropKinds returns the records of recs without their kinds.
func dropKinds(recs []int64) []int64 {
	out := make([]int64, 0, len(recs)/3*2)
	for r := 0; r+2 < len(recs); r += 3 {
		out = append(out, recs[r+1], recs[r+2])
	}
	return out
}

// splitColors checks every rank's color in Split's records of both
// groups.
func splitColors(local, remote []int64) error {
	for _, side := range []struct {
		name string
		recs []int64
	}{{"local", local}, {"remote", remote}} {
		for r := 0; r+1 < len(side.recs); r += 2 {
			if c := side.recs[r]; c < Undefined {
				return fmt.Errorf("rank %d of the %s group passed color %d", r/2, side.name, c)
			}
		}
	}
	return nil
}

// splitMembers returns the ranks whose Split record (color, key) in recs
// has color, ordered by key, then by rank.
func splitMembers(recs []int64, color int64) []int {
	var ranks []int
	for r := 0; r+1 < len(recs); r += 2 {
		if recs[r] == color {
			ranks = append(ranks, r/2)
		}
	}
	// The ranks are in increasing order: a stable sort by key leaves
	// equal keys in rank order.
	slices.SortStableFunc(ranks, func(i, j int) int { return cmp.Compare(recs[2*i+1], recs[2*j+1]) })
	return ranks
}

// createMembers decodes one group's Create records (fingerprint, rank in
// the subgroup or Undefined): every rank must have passed the same
// fingerprint, none badGroup, and the ranks that are in the subgroup
// must stand at distinct places 0, 1, ... in it. It returns the
// fingerprint and the ranks of the subgroup in its order.
func createMembers(recs []int64) (uint64, []int, error) {
	if len(recs) < 2 || len(recs)%2 != 0 {
		return 0, nil, fmt.Errorf("%d words of records, want two a rank", len(recs))
	}
	fp := uint64(recs[0])
	m := 0
	for r := 0; r < len(recs); r += 2 {
		switch f := uint64(recs[r]); {
		case f == badGroup:
			return 0, nil, fmt.Errorf("rank %d passed a group that is not a subgroup of its group", r/2)
		case f != fp:
			return 0, nil, fmt.Errorf("ranks 0 and %d passed different groups", r/2)
		}
		if recs[r+1] != Undefined {
			m++
		}
	}
	order := make([]int, m)
	placed := make([]bool, m)
	for r := 0; r < len(recs); r += 2 {
		at := recs[r+1]
		switch {
		case at == Undefined:
			continue
		case at < 0 || at >= int64(m) || placed[at]:
			return 0, nil, fmt.Errorf("rank %d says it is rank %d of a subgroup of %d", r/2, at, m)
		}
		order[at], placed[at] = r/2, true
	}
	return fp, order, nil
}

// worldRanksAt returns ranks[i] for each i of at, in order.
func worldRanksAt(ranks, at []int) []int {
	out := make([]int, len(at))
	for j, i := range at {
		out[j] = ranks[i]
	}
	return out
}
