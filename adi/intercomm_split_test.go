package adi_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/hpc-multidevice/multidevice/adi"
)

// icWant is what a rank expects of an intercommunicator: its groups'
// world ranks in order; a nil local group for none (nil).
type icWant struct{ local, remote []int }

// checkIC compares got, on world rank me, with want.
func checkIC(me int, got *adi.Intercomm, want icWant) error {
	switch {
	case want.local == nil && got == nil:
		return nil
	case want.local == nil:
		return fmt.Errorf("got %v | %v, want nil", got.Group().WorldRanks(), got.RemoteGroup().WorldRanks())
	case got == nil:
		return fmt.Errorf("got nil, want %v | %v", want.local, want.remote)
	}
	l, r := got.Group().WorldRanks(), got.RemoteGroup().WorldRanks()
	if !slices.Equal(l, want.local) || !slices.Equal(r, want.remote) || got.Rank() != slices.Index(want.local, me) || got.Local().Rank() != got.Rank() {
		return fmt.Errorf("got %v | %v as rank %d, want %v | %v as rank %d", l, r, got.Rank(), want.local, want.remote, slices.Index(want.local, me))
	}
	return nil
}

// traffic runs, on world rank me, messages on every intercommunicator of
// ics at once (the nil ones left out): with the same tag on all, one from
// every rank to every remote rank, received with wildcards posted before
// any is sent. Each message names the intercommunicator it was sent on
// (its index in ics), so one that reaches another's receive shows. Then
// an Allgather of world ranks on each, in the order of ics, which must
// bring the remote group's.
func traffic(ctx context.Context, me int, ics []*adi.Intercomm, wants []icWant) error {
	const tag = 6
	type recv struct {
		ic  int
		q   *adi.Request
		buf []byte
	}
	var recvs []recv
	var sends []*adi.Request
	for i, ic := range ics {
		if ic == nil {
			continue
		}
		for range ic.RemoteSize() {
			b := make([]byte, 64)
			q, err := ic.Irecv(b, adi.AnySource, adi.AnyTag)
			if err != nil {
				return fmt.Errorf("intercomm %d: %w", i, err)
			}
			recvs = append(recvs, recv{i, q, b})
		}
	}
	for i, ic := range ics {
		if ic == nil {
			continue
		}
		for j, wr := range wants[i].remote {
			q, err := ic.Isend(msg(me, wr, i), j, tag)
			if err != nil {
				return fmt.Errorf("intercomm %d: %w", i, err)
			}
			sends = append(sends, q)
		}
	}
	for _, rc := range recvs {
		st, err := rc.q.Wait(ctx)
		if err != nil {
			return fmt.Errorf("intercomm %d: %w", rc.ic, err)
		}
		remote := wants[rc.ic].remote
		if st.Source < 0 || st.Source >= len(remote) || st.Tag != tag || !bytes.Equal(rc.buf[:st.Count], msg(remote[st.Source], me, rc.ic)) {
			return fmt.Errorf("intercomm %d: received %+v %q from remote group %v", rc.ic, st, rc.buf[:st.Count], remote)
		}
	}
	if _, err := adi.WaitAll(ctx, sends...); err != nil {
		return err
	}
	for i, ic := range ics {
		if ic == nil {
			continue
		}
		all := make([]int64, ic.RemoteSize())
		if err := ic.Allgather(ctx, adi.Bytes([]int64{int64(me)}), adi.Bytes(all)); err != nil {
			return fmt.Errorf("intercomm %d: %w", i, err)
		}
		for j, wr := range all {
			if int(wr) != wants[i].remote[j] {
				return fmt.Errorf("intercomm %d: allgather %v, want %v", i, all, wants[i].remote)
			}
		}
	}
	return nil
}

// splitArgs is what the rank of local rank i of group g (0 or 1, as the
// test's split names them) passes to Intercomm.Split.
type splitArgs func(g, i int) (color, key int)

// wantSplit is the reference for Split: what each world rank of s gets
// when its ranks pass args, computed from MPI's definition.
func wantSplit(s split, args splitArgs) map[int]icWant {
	type rank struct{ world, i, color, key int }
	var groups [2][]rank
	for g := range 2 {
		for i, wr := range s.members(g) {
			c, k := args(g, i)
			groups[g] = append(groups[g], rank{wr, i, c, k})
		}
	}
	members := func(g, color int) []int {
		var rs []rank
		for _, r := range groups[g] {
			if r.color == color {
				rs = append(rs, r)
			}
		}
		slices.SortFunc(rs, func(a, b rank) int { return cmp.Or(cmp.Compare(a.key, b.key), cmp.Compare(a.i, b.i)) })
		var out []int
		for _, r := range rs {
			out = append(out, r.world)
		}
		return out
	}
	want := make(map[int]icWant)
	for g := range 2 {
		for _, r := range groups[g] {
			if r.color == adi.Undefined {
				continue
			}
			if remote := members(1-g, r.color); remote != nil {
				want[r.world] = icWant{members(g, r.color), remote}
			}
		}
	}
	return want
}

// TestIntercommSplit: Split joins the ranks of each color in one group to
// those of the same color in the other, ordered by key, then by rank;
// ranks that pass Undefined, or a color the other group does not pass,
// get nil. Every result carries point-to-point messages and a collective
// between the right ranks, at the same time as its parent and with the
// same tag, without the two mixing.
func TestIntercommSplit(t *testing.T) {
	cases := []struct {
		name string
		args splitArgs
	}{
		{"one color, rank order", func(g, i int) (int, int) { return 0, 0 }},
		{"one color, keys reversed", func(g, i int) (int, int) { return 3, -i }},
		{"keys reversed in one group only", func(g, i int) (int, int) { return 0, i * (1 - 2*g) }},
		{"parity", func(g, i int) (int, int) { return i % 2, i }},
		{"parity, keys reversed", func(g, i int) (int, int) { return i % 2, -i }},
		// Group 0 passes 1 and 2, group 1 passes 2 and 3: 1 and 3 are on
		// one side only.
		{"colors on one side only", func(g, i int) (int, int) { return 1 + g + i%2, 0 }},
		{"disjoint colors", func(g, i int) (int, int) { return 10 + g, i }},
		{"undefined", func(g, i int) (int, int) {
			if i%2 == 1 {
				return adi.Undefined, 0
			}
			return 4, -i
		}},
		{"everyone undefined in one group", func(g, i int) (int, int) {
			if g == 1 {
				return adi.Undefined, 0
			}
			return 0, 0
		}},
		{"large colors and keys", func(g, i int) (int, int) { return math.MaxInt - 1 + i%2, math.MinInt + 1<<20 - i }},
	}
	for _, s := range []split{splits[0], splits[1], splits[3], splits[4], splits[6]} {
		t.Run(s.name, func(t *testing.T) {
			xs := intercomms(t, s)
			ctx := ctxT(t)
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					want := wantSplit(s, tc.args)
					eachIC(t, xs, func(x *icRank) error {
						color, key := tc.args(x.color, x.ic.Rank())
						got, err := x.ic.Split(ctx, color, key)
						if err != nil {
							return err
						}
						if err := checkIC(x.me, got, want[x.me]); err != nil {
							return err
						}
						return traffic(ctx, x.me, []*adi.Intercomm{x.ic, got}, []icWant{{x.local, x.remote}, want[x.me]})
					})
				})
			}
		})
	}
}

// TestIntercommCreateSubgroups: Create joins the two groups' subgroups,
// each in the order its group passed; ranks outside their group's
// subgroup get nil, and everyone does when a subgroup is empty. Results
// carry messages and a collective alongside their parent's.
func TestIntercommCreateSubgroups(t *testing.T) {
	all := func(n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	reversed := func(n int) []int { out := all(n); slices.Reverse(out); return out }
	first := func(n int) []int { return []int{0} }
	last := func(n int) []int { return []int{n - 1} }
	none := func(n int) []int { return []int{} }
	evens := func(n int) []int {
		var out []int
		for i := 0; i < n; i += 2 {
			out = append(out, i)
		}
		return out
	}
	cases := []struct {
		name string
		sub  [2]func(n int) []int // local ranks of each group's subgroup, from its size
	}{
		{"whole groups", [2]func(int) []int{all, all}},
		{"whole and reversed", [2]func(int) []int{all, reversed}},
		{"one rank and the whole other group", [2]func(int) []int{first, all}},
		{"last of each", [2]func(int) []int{last, last}},
		{"evens and reversed", [2]func(int) []int{evens, reversed}},
		{"empty on one side", [2]func(int) []int{none, all}},
		{"empty on the other side", [2]func(int) []int{evens, none}},
		{"empty on both", [2]func(int) []int{none, none}},
	}
	for _, s := range []split{splits[1], splits[3], splits[6]} {
		t.Run(s.name, func(t *testing.T) {
			xs := intercomms(t, s)
			ctx := ctxT(t)
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					var world [2][]int // each subgroup's world ranks
					for g := range 2 {
						m := s.members(g)
						world[g] = []int{}
						for _, i := range tc.sub[g](len(m)) {
							world[g] = append(world[g], m[i])
						}
					}
					eachIC(t, xs, func(x *icRank) error {
						g, err := x.ic.Group().Incl(tc.sub[x.color](x.ic.Size()))
						if err != nil {
							return err
						}
						got, err := x.ic.Create(ctx, g)
						if err != nil {
							return err
						}
						var want icWant
						if slices.Contains(world[x.color], x.me) && len(world[1-x.color]) > 0 {
							want = icWant{world[x.color], world[1-x.color]}
						}
						if err := checkIC(x.me, got, want); err != nil {
							return err
						}
						return traffic(ctx, x.me, []*adi.Intercomm{x.ic, got}, []icWant{{x.local, x.remote}, want})
					})
				})
			}
			// Two Creates in a row whose subgroups overlap (group 0's first
			// two ranks, then its last two; group 1's leader, then its
			// whole group), used at once with their parent.
			t.Run("overlapping subgroups in a row", func(t *testing.T) {
				subs := func(g, call int) []int {
					n := len(s.members(g))
					switch {
					case g == 0 && call == 0:
						return slices.Compact([]int{0, min(1, n-1)})
					case g == 0:
						return slices.Compact([]int{max(0, n-2), n - 1})
					case call == 0:
						return []int{0}
					}
					return all(n)
				}
				worldOf := func(g, call int) []int {
					var out []int
					for _, i := range subs(g, call) {
						out = append(out, s.members(g)[i])
					}
					return out
				}
				eachIC(t, xs, func(x *icRank) error {
					ics := []*adi.Intercomm{x.ic}
					wants := []icWant{{x.local, x.remote}}
					for call := range 2 {
						g, err := x.ic.Group().Incl(subs(x.color, call))
						if err != nil {
							return err
						}
						got, err := x.ic.Create(ctx, g)
						if err != nil {
							return err
						}
						var want icWant
						if g.Rank() != adi.Undefined {
							want = icWant{worldOf(x.color, call), worldOf(1-x.color, call)}
						}
						if err := checkIC(x.me, got, want); err != nil {
							return fmt.Errorf("create %d: %w", call, err)
						}
						ics, wants = append(ics, got), append(wants, want)
					}
					return traffic(ctx, x.me, ics, wants)
				})
			})
		})
	}
}

// TestIntercommSplitCreateErrors: a rank's bad arguments to Split or
// Create fail on every rank of both groups, none waiting for another:
// the rank at fault with its own error, the others with ErrMismatch.
// The intercommunicator goes on working afterwards.
func TestIntercommSplitCreateErrors(t *testing.T) {
	s := splits[3] // 2|3: world ranks 0 and 1 against 2, 3 and 4
	other := loopJob(t, 2)[0].Group()
	for _, tc := range []struct {
		name string
		call func(ctx context.Context, x *icRank) (*adi.Intercomm, error)
		// want is the sentinel world rank r's error wraps; nil: an error
		// that does not wrap ErrMismatch (its own arguments' fault).
		want func(r int) error
	}{
		{"split: a bad color on one rank", func(ctx context.Context, x *icRank) (*adi.Intercomm, error) {
			c := 0
			if x.me == 3 {
				c = -7
			}
			return x.ic.Split(ctx, c, 0)
		}, func(r int) error {
			if r == 3 {
				return nil
			}
			return adi.ErrMismatch
		}},
		{"create: one rank passes a remote rank", func(ctx context.Context, x *icRank) (*adi.Intercomm, error) {
			if x.me == 1 {
				return x.ic.Create(ctx, x.ic.RemoteGroup())
			}
			return x.ic.Create(ctx, x.ic.Group())
		}, func(r int) error {
			if r == 1 {
				return adi.ErrRank
			}
			return adi.ErrMismatch
		}},
		{"create: a whole group passes a rank outside it", func(ctx context.Context, x *icRank) (*adi.Intercomm, error) {
			g := x.ic.Group()
			if x.color == 1 {
				var err error
				if g, err = g.Union(x.ic.RemoteGroup()); err != nil {
					return nil, err
				}
			}
			return x.ic.Create(ctx, g)
		}, func(r int) error {
			if r >= 2 {
				return adi.ErrRank
			}
			return adi.ErrMismatch
		}},
		{"create: a group's ranks pass different subgroups", func(ctx context.Context, x *icRank) (*adi.Intercomm, error) {
			g := x.ic.Group()
			if x.me == 4 {
				var err error
				if g, err = g.Incl([]int{0, 2}); err != nil {
					return nil, err
				}
			}
			return x.ic.Create(ctx, g)
		}, func(int) error { return adi.ErrMismatch }},
		// Both records are two words after their kind: without it, the
		// Create side read colors as fingerprints and made an
		// intercommunicator while the Split side got nil.
		{"split on one side, create on the other", func(ctx context.Context, x *icRank) (*adi.Intercomm, error) {
			if x.color == 0 {
				return x.ic.Split(ctx, 5, x.ic.Rank())
			}
			return x.ic.Create(ctx, x.ic.Group())
		}, func(int) error { return adi.ErrMismatch }},
		{"create: a group of another World", func(ctx context.Context, x *icRank) (*adi.Intercomm, error) {
			if x.me == 0 {
				return x.ic.Create(ctx, other)
			}
			return x.ic.Create(ctx, x.ic.Group())
		}, func(r int) error {
			if r == 0 {
				return nil
			}
			return adi.ErrMismatch
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			xs := intercomms(t, s)
			ctx := ctxT(t)
			eachIC(t, xs, func(x *icRank) error {
				got, err := tc.call(ctx, x)
				want := tc.want(x.me)
				switch {
				case err == nil:
					return fmt.Errorf("no error (%v)", got)
				case want == nil && errors.Is(err, adi.ErrMismatch):
					return fmt.Errorf("%v, want this rank's own fault, not ErrMismatch", err)
				case want != nil && !errors.Is(err, want):
					return fmt.Errorf("%v, want %v", err, want)
				}
				t.Logf("world rank %d: %v", x.me, err)
				// The parent is still in step: messages and a collective.
				return traffic(ctx, x.me, []*adi.Intercomm{x.ic}, []icWant{{x.local, x.remote}})
			})
		})
	}
}

// TestIntercommSplitIsolation: intercommunicators of the same groups
// from a Split, a Dup, two Splits in a row, a Split of a Split, a Create
// and a Create on a Split carry messages with the same tag at once without
// mixing, and the collectives on some of them do not take the messages
// the others' wildcard receives wait for.
func TestIntercommSplitIsolation(t *testing.T) {
	for _, s := range []split{splits[3], splits[6]} {
		t.Run(s.name, func(t *testing.T) {
			xs := intercomms(t, s)
			ctx := ctxT(t)
			eachIC(t, xs, func(x *icRank) error {
				me := x.ic.Rank()
				// s1 and s11 are the first Split, with the same color, on
				// their parents; the Dup comes between two Splits.
				s1, err := x.ic.Split(ctx, 0, me)
				if err != nil {
					return err
				}
				dup, err := x.ic.Dup(ctx)
				if err != nil {
					return err
				}
				s2, err := x.ic.Split(ctx, 0, me)
				if err != nil {
					return err
				}
				s3, err := x.ic.Split(ctx, 0, me)
				if err != nil {
					return err
				}
				s11, err := s1.Split(ctx, 0, me)
				if err != nil {
					return err
				}
				c1, err := x.ic.Create(ctx, x.ic.Group())
				if err != nil {
					return err
				}
				c11, err := s1.Create(ctx, s1.Group())
				if err != nil {
					return err
				}
				ics := []*adi.Intercomm{x.ic, dup, s1, s2, s3, s11, c1, c11}
				wants := make([]icWant, len(ics))
				for i, ic := range ics {
					wants[i] = icWant{x.local, x.remote}
					if err := checkIC(x.me, ic, wants[i]); err != nil {
						return fmt.Errorf("intercomm %d: %w", i, err)
					}
				}
				// Wildcard receives on the parent, then collectives on the
				// children: none may complete one of the receives.
				var reqs []*adi.Request
				for range x.ic.RemoteSize() {
					q, err := x.ic.Irecv(make([]byte, 64), adi.AnySource, adi.AnyTag)
					if err != nil {
						return err
					}
					reqs = append(reqs, q)
				}
				for i, ic := range ics[1:] {
					if err := ic.Barrier(ctx); err != nil {
						return fmt.Errorf("intercomm %d: %w", i+1, err)
					}
				}
				for _, q := range reqs {
					if st, done, _ := q.Test(); done {
						return fmt.Errorf("a wildcard receive on the parent took a child's collective message: %+v", st)
					}
				}
				if err := x.world.Barrier(ctx); err != nil {
					return err
				}
				for j, wr := range x.remote {
					if err := x.ic.Send(ctx, msg(x.me, wr, -1), j, 9); err != nil {
						return err
					}
				}
				if _, err := adi.WaitAll(ctx, reqs...); err != nil {
					return err
				}
				// Not before every rank has its message: traffic's would
				// match the wildcards.
				if err := x.world.Barrier(ctx); err != nil {
					return err
				}
				return traffic(ctx, x.me, ics, wants)
			})
		})
	}
}
