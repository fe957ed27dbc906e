package adi_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/hpc-multidevice/multidevice/adi"
)

// TestGroupOperations checks the local group operations against the
// results the MPI standard gives, on the group of a world of 6 ranks.
func TestGroupOperations(t *testing.T) {
	cs := loopJob(t, 6)
	world := cs[2].Group() // seen from world rank 2
	must := func(g adi.Group, err error) adi.Group {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	a := must(world.Incl([]int{5, 1, 3, 2})) // world ranks 5 1 3 2
	b := must(world.Incl([]int{0, 2, 4, 1})) // world ranks 0 2 4 1
	for _, tc := range []struct {
		name string
		g    func() (adi.Group, error)
		want []int // world ranks; nil for an error
		rank int   // of world rank 2
	}{
		{"world", func() (adi.Group, error) { return world, nil }, []int{0, 1, 2, 3, 4, 5}, 2},
		{"incl", func() (adi.Group, error) { return a, nil }, []int{5, 1, 3, 2}, 3},
		{"incl of incl", func() (adi.Group, error) { return a.Incl([]int{3, 0}) }, []int{2, 5}, 0},
		{"incl none", func() (adi.Group, error) { return a.Incl(nil) }, []int{}, adi.Undefined},
		{"incl out of range", func() (adi.Group, error) { return a.Incl([]int{4}) }, nil, 0},
		{"incl negative", func() (adi.Group, error) { return a.Incl([]int{-1}) }, nil, 0},
		{"incl twice", func() (adi.Group, error) { return a.Incl([]int{1, 1}) }, nil, 0},
		{"excl", func() (adi.Group, error) { return a.Excl([]int{0, 3}) }, []int{1, 3}, adi.Undefined},
		{"excl twice", func() (adi.Group, error) { return a.Excl([]int{2, 2}) }, nil, 0},
		{"excl out of range", func() (adi.Group, error) { return a.Excl([]int{6}) }, nil, 0},
		// MPI: the first group's ranks, then the second's not in the first.
		{"union", func() (adi.Group, error) { return a.Union(b) }, []int{5, 1, 3, 2, 0, 4}, 3},
		{"union with empty", func() (adi.Group, error) { return adi.Group{}.Union(b) }, []int{0, 2, 4, 1}, 1},
		// MPI: the first group's ranks that are in the second, in the first's order.
		{"intersection", func() (adi.Group, error) { return a.Intersection(b) }, []int{1, 2}, 1},
		{"intersection other way", func() (adi.Group, error) { return b.Intersection(a) }, []int{2, 1}, 0},
		{"difference", func() (adi.Group, error) { return a.Difference(b) }, []int{5, 3}, adi.Undefined},
		{"difference other way", func() (adi.Group, error) { return b.Difference(a) }, []int{0, 4}, adi.Undefined},
		{"range", func() (adi.Group, error) { return world.RangeIncl([]adi.Range{{0, 5, 2}}) }, []int{0, 2, 4}, 1},
		{"range stride past last", func() (adi.Group, error) { return world.RangeIncl([]adi.Range{{1, 4, 2}}) }, []int{1, 3}, adi.Undefined},
		{"range down", func() (adi.Group, error) { return world.RangeIncl([]adi.Range{{5, 0, -2}, {0, 0, 1}}) }, []int{5, 3, 1, 0}, adi.Undefined},
		{"range stride 0", func() (adi.Group, error) { return world.RangeIncl([]adi.Range{{0, 3, 0}}) }, nil, 0},
		{"range wrong way", func() (adi.Group, error) { return world.RangeIncl([]adi.Range{{3, 0, 1}}) }, nil, 0},
		{"range out of range", func() (adi.Group, error) { return world.RangeIncl([]adi.Range{{0, 6, 3}}) }, nil, 0},
		{"ranges overlap", func() (adi.Group, error) { return world.RangeIncl([]adi.Range{{0, 2, 1}, {2, 4, 2}}) }, nil, 0},
		{"range excl", func() (adi.Group, error) { return world.RangeExcl([]adi.Range{{1, 5, 2}}) }, []int{0, 2, 4}, 1},
		{"range excl overlap", func() (adi.Group, error) { return world.RangeExcl([]adi.Range{{1, 5, 2}, {5, 5, 1}}) }, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := tc.g()
			if tc.want == nil {
				if err == nil {
					t.Fatalf("got %v, want an error", g.WorldRanks())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := g.WorldRanks(); !slices.Equal(got, tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
				t.Errorf("world ranks %v, want %v", got, tc.want)
			}
			if g.Size() != len(tc.want) || g.Rank() != tc.rank {
				t.Errorf("size %d, rank %d; want %d, %d", g.Size(), g.Rank(), len(tc.want), tc.rank)
			}
		})
	}
	if _, err := a.Incl([]int{9}); !errors.Is(err, adi.ErrRank) {
		t.Errorf("Incl of a rank outside: %v, want ErrRank", err)
	}
	if _, err := a.Union(cs[3].Group()); err == nil {
		t.Error("a union of groups of two Worlds succeeded")
	}
	if r := (adi.Group{}).Rank(); r != adi.Undefined {
		t.Errorf("rank in the empty group: %d", r)
	}

	t.Run("translate", func(t *testing.T) {
		// a's ranks 0..3 are world 5 1 3 2; in b (0 2 4 1): -, 3, -, 1.
		got, err := a.TranslateRanks([]int{0, 1, 2, 3, adi.ProcNull}, b)
		want := []int{adi.Undefined, 3, adi.Undefined, 1, adi.ProcNull}
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("TranslateRanks = %v, %v; want %v", got, err, want)
		}
		if _, err := a.TranslateRanks([]int{4}, b); !errors.Is(err, adi.ErrRank) {
			t.Errorf("TranslateRanks of a rank outside: %v, want ErrRank", err)
		}
	})

	t.Run("compare", func(t *testing.T) {
		for _, tc := range []struct {
			g, h adi.Group
			want adi.Comparison
		}{
			{a, a, adi.Ident},
			{a, must(world.Incl([]int{5, 1, 3, 2})), adi.Ident},
			{a, must(world.Incl([]int{1, 2, 3, 5})), adi.Similar},
			{a, b, adi.Unequal},
			{a, must(world.Incl([]int{5, 1, 3})), adi.Unequal},
			{must(world.Incl([]int{5, 1, 3, 0})), a, adi.Unequal}, // same size, one rank differs
			{adi.Group{}, must(world.Incl(nil)), adi.Ident},
		} {
			if got := tc.g.Compare(tc.h); got != tc.want {
				t.Errorf("Compare(%v, %v) = %v, want %v", tc.g.WorldRanks(), tc.h.WorldRanks(), got, tc.want)
			}
		}
	})
}

// disjoint is the group rank r of six passes in TestCommCreate's case of
// disjoint groups, and the ranks of the communicator it gets: the even
// ranks [4 2 0], the odd ones but 5 [1 3], rank 5 none.
func disjoint(r int) []int {
	switch {
	case r == 5:
		return nil
	case r%2 == 0:
		return []int{4, 2, 0}
	}
	return []int{1, 3}
}

// TestCommCreate: MPI_Comm_create with one group for all, with disjoint
// groups, and with groups that disagree; the communicators made carry
// their own messages.
func TestCommCreate(t *testing.T) {
	const n = 6
	for _, tc := range []struct {
		name   string
		group  func(r int) []int // world ranks rank r passes; nil: the empty group
		member func(r int) []int // world ranks of rank r's new communicator; nil: none
		bad    bool
	}{
		{"one group", func(int) []int { return []int{4, 0, 2} }, func(r int) []int {
			if r%2 == 0 {
				return []int{4, 0, 2}
			}
			return nil
		}, false},
		{"disjoint", disjoint, disjoint, false},
		{"everyone", func(int) []int { return []int{5, 4, 3, 2, 1, 0} }, func(int) []int { return []int{5, 4, 3, 2, 1, 0} }, false},
		// Rank 1 orders the same members otherwise: its communicator would
		// number them differently.
		{"order disagrees", func(r int) []int {
			if r == 1 {
				return []int{1, 0}
			}
			return []int{0, 1}
		}, nil, true},
		// Rank 3 passes a group overlapping another.
		{"overlap", func(r int) []int {
			if r < 3 {
				return []int{0, 1, 2}
			}
			return []int{2, 3, 4, 5}
		}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := loopJob(t, n)
			ctx := ctxT(t)
			each(t, cs, func(c *adi.Comm) error {
				g, err := c.Group().Incl(tc.group(c.Rank()))
				if err != nil {
					return err
				}
				nc, err := c.Create(ctx, g)
				if tc.bad {
					if !errors.Is(err, adi.ErrMismatch) {
						return fmt.Errorf("disagreeing groups: %v, want ErrMismatch", err)
					}
					return nil
				}
				if err != nil {
					return err
				}
				want := tc.member(c.Rank())
				if want == nil {
					if nc != nil {
						return errors.New("a rank outside its group got a communicator")
					}
					return nil
				}
				if got := nc.Group().WorldRanks(); !slices.Equal(got, want) || nc.Rank() != g.Rank() {
					return fmt.Errorf("communicator of %v as rank %d, want %v as rank %d", got, nc.Rank(), want, g.Rank())
				}
				// A message to the next rank on the new communicator and one
				// with the same tag on the parent: each lands on its own.
				next, prev := (nc.Rank()+1)%nc.Size(), (nc.Rank()-1+nc.Size())%nc.Size()
				rp := must(c.Irecv(make([]byte, 8), adi.AnySource, 9))
				rn := must(nc.Irecv(make([]byte, 8), prev, 9))
				if err := nc.Send(ctx, []byte("new"), next, 9); err != nil {
					return err
				}
				st, err := rn.Wait(ctx)
				if err != nil || st.Count != 3 || st.Source != prev {
					return fmt.Errorf("on the new communicator: %+v %v", st, err)
				}
				rp.Cancel()
				if st, err := rp.Wait(ctx); !st.Cancelled {
					return fmt.Errorf("the parent's receive took a message: %+v %v", st, err)
				}
				// Sum the world ranks over the new communicator.
				sum := []int64{int64(c.Rank())}
				if err := adi.Allreduce(ctx, nc, sum, sum, adi.Sum); err != nil {
					return err
				}
				var ws int64
				for _, r := range want {
					ws += int64(r)
				}
				if sum[0] != ws {
					return fmt.Errorf("sum %d, want %d", sum[0], ws)
				}
				return nil
			})
		})
	}
}

// TestCommCreateBadGroup: a rank whose group has a rank outside the
// communicator gets that error, and the ranks counting on it a mismatch
// rather than waiting for it for ever.
func TestCommCreateBadGroup(t *testing.T) {
	cs := loopJob(t, 4)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		g := c.Group()
		if c.Rank() == 1 {
			g = cs[0].Group() // the same ranks, but taken from another World
		}
		_, err := c.Create(ctx, g)
		switch {
		case c.Rank() == 1 && (err == nil || errors.Is(err, adi.ErrMismatch)):
			return fmt.Errorf("a group of another World: %v, want an error saying so", err)
		case c.Rank() != 1 && !errors.Is(err, adi.ErrMismatch):
			return fmt.Errorf("with rank 1's group wrong: %v, want ErrMismatch", err)
		}
		return nil
	})
	// A group with a rank the communicator lacks.
	each(t, cs, func(c *adi.Comm) error {
		sub, err := c.Split(ctx, c.Rank()%2, 0)
		if err != nil {
			return err
		}
		g := c.Group() // every world rank, half of them outside sub
		if _, err := sub.Create(ctx, g); !errors.Is(err, adi.ErrRank) {
			return fmt.Errorf("a group larger than the communicator: %v, want ErrRank", err)
		}
		return nil
	})
}

// TestCommCreateGroup: only the members call it; calls on overlapping
// groups at the same time (different tags) and calls one after the other
// (the same tag) all make communicators of their own.
func TestCommCreateGroup(t *testing.T) {
	const n = 5
	cs := loopJob(t, n)
	ctx := ctxT(t)
	type made struct{ a, b, seq1, seq2 *adi.Comm }
	got := make([]made, n)
	var wg sync.WaitGroup
	errs := make(chan error, 4*n)
	groupOf := func(c *adi.Comm, ranks ...int) adi.Group {
		g, err := c.Group().Incl(ranks)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	ga, gb := []int{0, 1, 2}, []int{3, 2, 1} // overlapping in 1 and 2
	for r, c := range cs {
		// Rank 4 is in no group and calls nothing: the others must not wait for it.
		if slices.Contains(ga, r) {
			wg.Go(func() {
				var err error
				if got[r].a, err = c.CreateGroup(ctx, groupOf(c, ga...), 1); err != nil {
					errs <- fmt.Errorf("rank %d, group a: %w", r, err)
				}
			})
		}
		if slices.Contains(gb, r) {
			wg.Go(func() {
				var err error
				if got[r].b, err = c.CreateGroup(ctx, groupOf(c, gb...), 2); err != nil {
					errs <- fmt.Errorf("rank %d, group b: %w", r, err)
				}
				if r == 3 {
					return
				}
				// Twice the same group and tag, one after the other.
				g := groupOf(c, 2, 1)
				if got[r].seq1, err = c.CreateGroup(ctx, g, 2); err != nil {
					errs <- fmt.Errorf("rank %d, first of two: %w", r, err)
				}
				if got[r].seq2, err = c.CreateGroup(ctx, g, 2); err != nil {
					errs <- fmt.Errorf("rank %d, second of two: %w", r, err)
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for r, m := range got {
		for _, x := range []struct {
			c    *adi.Comm
			want []int
		}{{m.a, ga}, {m.b, gb}} {
			if !slices.Contains(x.want, r) {
				continue
			}
			if g := x.c.Group().WorldRanks(); !slices.Equal(g, x.want) || x.c.Rank() != slices.Index(x.want, r) {
				t.Errorf("rank %d: communicator of %v as rank %d, want %v", r, g, x.c.Rank(), x.want)
			}
		}
	}
	// Ranks 1 and 2 share four communicators; the same (source, tag) on
	// each lands on its own, whatever the order of the sends.
	one, two := got[1], got[2]
	comms := []struct {
		recv, send *adi.Comm
		name       string
	}{{one.a, two.a, "a"}, {one.b, two.b, "b"}, {one.seq1, two.seq1, "seq1"}, {one.seq2, two.seq2, "seq2"}}
	var reqs []*adi.Request
	bufs := make([][]byte, len(comms))
	for i, x := range comms {
		src := slices.Index(x.send.Group().WorldRanks(), 2)
		bufs[i] = make([]byte, 8)
		reqs = append(reqs, must(x.recv.Irecv(bufs[i], src, 7)))
	}
	for i := len(comms) - 1; i >= 0; i-- {
		x := comms[i]
		dst := slices.Index(x.send.Group().WorldRanks(), 1)
		if err := x.send.Send(ctx, []byte(x.name), dst, 7); err != nil {
			t.Fatal(err)
		}
	}
	for i, q := range reqs {
		st, err := q.Wait(ctx)
		if got := string(bufs[i][:st.Count]); err != nil || got != comms[i].name {
			t.Errorf("communicator %s got %q: %+v %v", comms[i].name, got, st, err)
		}
	}
}

// TestCommCreateGroupArguments: a caller outside the group, a bad tag,
// and members that pass different groups.
func TestCommCreateGroupArguments(t *testing.T) {
	cs := loopJob(t, 3)
	ctx := ctxT(t)
	g, _ := cs[0].Group().Incl([]int{1, 2})
	if _, err := cs[0].CreateGroup(ctx, g, 0); !errors.Is(err, adi.ErrRank) {
		t.Errorf("a caller outside the group: %v, want ErrRank", err)
	}
	g, _ = cs[0].Group().Incl([]int{0, 1})
	if _, err := cs[0].CreateGroup(ctx, g, -3); !errors.Is(err, adi.ErrTag) {
		t.Errorf("a negative tag: %v, want ErrTag", err)
	}
	// Ranks 0 and 1 each put themselves first: both see the mismatch.
	each(t, cs[:2], func(c *adi.Comm) error {
		g, err := c.Group().Incl([]int{c.Rank(), 1 - c.Rank()})
		if err != nil {
			return err
		}
		if _, err := c.CreateGroup(ctx, g, 5); !errors.Is(err, adi.ErrMismatch) {
			return fmt.Errorf("groups in another order: %v, want ErrMismatch", err)
		}
		return nil
	})
}

// TestGroupOtherWorld: groups of two Worlds (two ranks in one process)
// are never taken for one another: Compare finds them Unequal and
// TranslateRanks refuses, as the set operations do.
func TestGroupOtherWorld(t *testing.T) {
	cs := loopJob(t, 2)
	g, h := cs[0].Group(), cs[1].Group() // the same world ranks
	if got := g.Compare(h); got != adi.Unequal {
		t.Errorf("Compare of two Worlds' groups: %v, want Unequal", got)
	}
	if got, err := g.TranslateRanks([]int{0, 1}, h); err == nil {
		t.Errorf("TranslateRanks into another World's group: %v, want an error", got)
	}
	if _, err := g.Union(h); err == nil {
		t.Error("Union of two Worlds' groups: no error")
	}
	if got := g.Compare(cs[0].Group()); got != adi.Ident {
		t.Errorf("Compare of one World's groups: %v, want Ident", got)
	}
}
