package adi_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/hpc-multidevice/multidevice/adi"
)

func TestDimsCreate(t *testing.T) {
	for _, tc := range []struct {
		n          int
		dims, want []int
	}{
		{12, []int{0, 0}, []int{4, 3}},
		{72, []int{0, 0}, []int{9, 8}},
		{72, []int{0, 0, 0}, []int{6, 4, 3}},
		{1 << 20, []int{0, 0, 0}, []int{128, 128, 64}},
		{1000003, []int{0, 0}, []int{1000003, 1}}, // a prime
		{8, []int{0, 0, 0}, []int{2, 2, 2}},
		{24, []int{0, 0, 0}, []int{4, 3, 2}},
		{36, []int{0, 0}, []int{6, 6}},
		{7, []int{0, 0}, []int{7, 1}},
		{1, []int{0, 0}, []int{1, 1}},
		{12, []int{0, 3}, []int{4, 3}},
		{12, []int{2, 0, 0}, []int{2, 3, 2}},
		{6, []int{2, 3}, []int{2, 3}},
		{5, nil, nil}, // no dimensions hold one rank only
		{5, []int{2, 0}, nil},
		{6, []int{4}, nil},
		{0, []int{0}, nil},
		{6, []int{-1, 0}, nil},
		{4, []int{1 << 32, 1 << 32, 0}, nil},    // the product wraps to 0
		{1, []int{7, 7905747460161236407}, nil}, // and to 1, whose inverse mod 2^64 it is
	} {
		dims := slices.Clone(tc.dims)
		err := adi.DimsCreate(tc.n, dims)
		if (err != nil) != (tc.want == nil) || err == nil && !slices.Equal(dims, tc.want) {
			t.Errorf("DimsCreate(%d, %v) = %v, %v; want %v", tc.n, tc.dims, dims, err, tc.want)
		}
	}
}

// TestCartHalo: ranks on a grid exchange halos along every dimension
// with Shift and Sendrecv, periodic and not; past the edge of a
// dimension that does not wrap, ProcNull makes the exchange a no-op.
func TestCartHalo(t *testing.T) {
	for _, tc := range []struct {
		ranks, grid int // ranks in the job, on the grid
		dims        []int
		periodic    []bool
	}{
		{6, 6, []int{0, 0}, []bool{false, false}},
		{6, 6, []int{0, 0}, []bool{true, false}},
		{5, 4, []int{2, 2}, []bool{true, true}}, // rank 4 is left out
		{8, 8, []int{2, 2, 2}, []bool{false, true, false}},
		{3, 3, []int{3}, []bool{true}},
	} {
		t.Run(fmt.Sprintf("%d/%v/%v", tc.ranks, tc.dims, tc.periodic), func(t *testing.T) {
			cs := loopJob(t, tc.ranks)
			ctx := ctxT(t)
			dims := slices.Clone(tc.dims)
			if err := adi.DimsCreate(tc.grid, dims); err != nil {
				t.Fatal(err)
			}
			each(t, cs, func(c *adi.Comm) error {
				grid, err := c.CartCreate(ctx, dims, tc.periodic)
				if err != nil {
					return err
				}
				size := 1
				for _, d := range dims {
					size *= d
				}
				if c.Rank() >= size {
					if grid != nil {
						return errors.New("a rank beyond the grid got a communicator")
					}
					return nil
				}
				me, err := grid.Coords(grid.Rank())
				if err != nil {
					return err
				}
				if r, err := grid.RankOf(me); err != nil || r != grid.Rank() {
					return fmt.Errorf("RankOf(Coords(%d)) = %d, %v", grid.Rank(), r, err)
				}
				for dim := range dims {
					for _, disp := range []int{1, -1, 2} {
						src, dst, err := grid.Shift(dim, disp)
						if err != nil {
							return err
						}
						// What each neighbour should be, from the coordinates.
						for _, nb := range []struct {
							got, step int
						}{{src, -disp}, {dst, disp}} {
							want := slices.Clone(me)
							want[dim] += nb.step
							w, err := grid.RankOf(want)
							if err != nil {
								w = adi.ProcNull
							}
							if nb.got != w {
								return fmt.Errorf("shift %d along %d from %v: %d, want %d", disp, dim, me, nb.got, w)
							}
						}
						halo := bytes.Repeat([]byte{0xEE}, 8)
						st, err := grid.Sendrecv(ctx, []byte(fmt.Sprintf("rank%04d", grid.Rank())), dst, 3, halo, src, 3)
						if err != nil {
							return err
						}
						if src == adi.ProcNull {
							if st.Source != adi.ProcNull || st.Count != 0 || !bytes.Equal(halo, bytes.Repeat([]byte{0xEE}, 8)) {
								return fmt.Errorf("receive from ProcNull: %+v, buffer %q", st, halo)
							}
						} else if string(halo) != fmt.Sprintf("rank%04d", src) {
							return fmt.Errorf("halo from %d: %q", src, halo)
						}
					}
				}
				return nil
			})
		})
	}
}

// TestProcNull: every point-to-point call takes ProcNull as "nobody".
func TestProcNull(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	c := cs[0]
	null := adi.Status{Source: adi.ProcNull, Tag: adi.AnyTag}
	if err := c.Send(ctx, []byte("x"), adi.ProcNull, 1); err != nil {
		t.Error(err)
	}
	if err := c.Ssend(ctx, nil, adi.ProcNull, 1); err != nil {
		t.Error(err)
	}
	if st, err := c.Recv(ctx, make([]byte, 1), adi.ProcNull, adi.AnyTag); st != null || err != nil {
		t.Errorf("Recv: %+v %v", st, err)
	}
	if st, ok, err := c.Iprobe(adi.ProcNull, 4); st != null || !ok || err != nil {
		t.Errorf("Iprobe: %+v %v %v", st, ok, err)
	}
	m, st, err := c.Mprobe(ctx, adi.ProcNull, 4)
	if st != null || err != nil {
		t.Errorf("Mprobe: %+v %v", st, err)
	}
	if st, err := m.Recv(ctx, nil); st != null || err != nil {
		t.Errorf("receive of the no-process message: %+v %v", st, err)
	}
	var q adi.Request
	for _, start := range []func() error{
		func() error { return c.IsendInto(&q, nil, adi.ProcNull, 2) },
		func() error { return c.IrecvInto(&q, nil, adi.ProcNull, 2) },
		func() error { return c.IrecvInto(&q, make([]byte, 1), 1, 2) }, // a real one after the null ones
	} {
		if err := start(); err != nil {
			t.Fatal(err)
		}
		if _, done, _ := q.Test(); done {
			continue
		}
		if err := c.IsendInto(&q, nil, adi.ProcNull, 2); !errors.Is(err, adi.ErrRequestBusy) {
			t.Errorf("a null send into a request in flight: %v, want ErrRequestBusy", err)
		}
		if err := cs[1].Send(ctx, []byte{9}, 0, 2); err != nil {
			t.Fatal(err)
		}
		if st, err := q.Wait(ctx); err != nil || st.Source != 1 {
			t.Errorf("the real receive: %+v %v", st, err)
		}
	}
	if st, err := c.Sendrecv(ctx, nil, adi.ProcNull, 1, nil, adi.ProcNull, 1); st != null || err != nil {
		t.Errorf("Sendrecv with nobody: %+v %v", st, err)
	}
	if err := c.Send(ctx, nil, adi.ProcNull, -5); !errors.Is(err, adi.ErrTag) {
		t.Errorf("a bad tag to ProcNull: %v, want ErrTag", err)
	}
}

// TestCartSub: MPI_Cart_sub keeps the chosen dimensions, with their
// periodicity, and groups the ranks that share their coordinates in the
// others, in the order they have in the grid.
func TestCartSub(t *testing.T) {
	dims, periodic := []int{3, 2, 2}, []bool{true, false, true}
	cs := loopJob(t, 12)
	ctx := ctxT(t)
	for _, remain := range [][]bool{
		{true, false, true},
		{false, true, false},
		{true, true, true},
		{false, false, false},
		{false, true, true},
	} {
		t.Run(fmt.Sprint(remain), func(t *testing.T) {
			each(t, cs, func(c *adi.Comm) error {
				grid, err := c.CartCreate(ctx, dims, periodic)
				if err != nil {
					return err
				}
				sub, err := grid.Sub(ctx, remain)
				if err != nil {
					return err
				}
				var wantDims []int
				var wantPeriodic []bool
				for i, keep := range remain {
					if keep {
						wantDims = append(wantDims, dims[i])
						wantPeriodic = append(wantPeriodic, periodic[i])
					}
				}
				size := 1
				for _, d := range wantDims {
					size *= d
				}
				if !slices.Equal(sub.Dims(), wantDims) || !slices.Equal(sub.Periodic(), wantPeriodic) || sub.Size() != size {
					return fmt.Errorf("sub grid %v %v of %d ranks, want %v %v of %d", sub.Dims(), sub.Periodic(), sub.Size(), wantDims, wantPeriodic, size)
				}
				me, _ := grid.Coords(grid.Rank())
				// Every rank of the sub grid shares this rank's coordinates
				// in the dropped dimensions and has its sub coordinates in
				// the kept ones.
				for i, wr := range sub.Group().WorldRanks() {
					theirs, err := grid.Coords(wr) // the grid's ranks are the world's
					if err != nil {
						return err
					}
					subCoords, err := sub.Coords(i)
					if err != nil {
						return err
					}
					var kept []int
					for d, keep := range remain {
						if !keep && theirs[d] != me[d] {
							return fmt.Errorf("sub rank %d is at %v, this rank at %v", i, theirs, me)
						}
						if keep {
							kept = append(kept, theirs[d])
						}
					}
					if !slices.Equal(kept, subCoords) && !(len(kept) == 0 && len(subCoords) == 0) {
						return fmt.Errorf("sub rank %d (grid %v) has sub coordinates %v, want %v", i, theirs, subCoords, kept)
					}
				}
				// The sub grid is a communicator of its own.
				sum := []int64{int64(c.Rank())}
				if err := adi.Allreduce(ctx, sub.Comm, sum, sum, adi.Sum); err != nil {
					return err
				}
				var want int64
				for _, wr := range sub.Group().WorldRanks() {
					want += int64(wr)
				}
				if sum[0] != want {
					return fmt.Errorf("sum over the sub grid %d, want %d", sum[0], want)
				}
				return nil
			})
		})
	}
}

// TestCartTooLarge: a grid larger than the communicator is an error on
// every rank, also one whose size wraps past MaxInt, which once came out
// as a negative size and left every rank beyond the grid (nil, nil).
func TestCartTooLarge(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		for _, dims := range [][]int{{3}, {2, 2}, {2, math.MaxInt}, {math.MaxInt, 2}} {
			if cart, err := c.CartCreate(ctx, dims, make([]bool, len(dims))); err == nil {
				return fmt.Errorf("CartCreate(%v) on %d ranks = %v, nil; want an error", dims, c.Size(), cart)
			}
		}
		return nil
	})
}

// TestCartArgumentsDisagree: ranks that pass other arguments to
// CartCreate or Sub than the others all get an error instead of
// communicators that do not fit together.
func TestCartArgumentsDisagree(t *testing.T) {
	cs := loopJob(t, 6)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		dims := []int{2, 3}
		if c.Rank() == 4 {
			dims = []int{3, 2}
		}
		if _, err := c.CartCreate(ctx, dims, []bool{false, true}); !errors.Is(err, adi.ErrMismatch) {
			return fmt.Errorf("CartCreate with rank 4's dims reversed: %v, want ErrMismatch", err)
		}
		// A rank with wrong arguments gets its error; the others are
		// told rather than left waiting.
		dims = []int{2, 3}
		if c.Rank() == 1 {
			dims = []int{2, 4}
		}
		_, err := c.CartCreate(ctx, dims, []bool{false, true})
		if c.Rank() == 1 && (err == nil || errors.Is(err, adi.ErrMismatch)) || c.Rank() != 1 && !errors.Is(err, adi.ErrMismatch) {
			return fmt.Errorf("CartCreate with rank 1's grid too large: %v", err)
		}
		grid, err := c.CartCreate(ctx, []int{2, 3}, []bool{false, true})
		if err != nil {
			return err
		}
		remain := []bool{true, false}
		if c.Rank() == 2 {
			remain = []bool{false, true}
		}
		if _, err := grid.Sub(ctx, remain); !errors.Is(err, adi.ErrMismatch) {
			return fmt.Errorf("Sub with rank 2's remain otherwise: %v, want ErrMismatch", err)
		}
		remain = []bool{true, false}
		if c.Rank() == 0 {
			remain = []bool{true}
		}
		_, err = grid.Sub(ctx, remain)
		if c.Rank() == 0 && (err == nil || errors.Is(err, adi.ErrMismatch)) || c.Rank() != 0 && !errors.Is(err, adi.ErrMismatch) {
			return fmt.Errorf("Sub with one flag on rank 0: %v", err)
		}
		// After all that the grid still works.
		if _, err := grid.Sub(ctx, []bool{false, true}); err != nil {
			return err
		}
		return grid.Barrier(ctx)
	})
}
