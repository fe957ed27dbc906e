package adi_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hpc-multidevice/multidevice/adi"
)

// TestWinFetchAndOpTickets: goroutines of every rank draw tickets from a
// counter in rank 0's window with FetchAndOp(AccSum) while others add to
// a second counter with Accumulate, read both with FetchAndOp(AccNoOp),
// and swap a third with GetAccumulate(AccReplace). The tickets are
// 0..N-1, each once: no two fetches saw the same value, as they would if
// a read and its update were not one step at the target.
func TestWinFetchAndOpTickets(t *testing.T) {
	const n, goroutines, draws = 4, 3, 40
	cs := loopJob(t, n)
	ctx := ctxT(t)
	var mu sync.Mutex
	var tickets []int64
	swapped := map[int32]int{} // the values the swaps took out
	each(t, cs, func(c *adi.Comm) error {
		win, err := c.WinCreate(ctx, make([]byte, 8+8+4))
		if err != nil {
			return err
		}
		errs := make([]error, goroutines)
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				errs[g] = func() error {
					var mine []int64
					for i := range draws {
						var ticket, seen int64
						var old [1]int32
						err := errors.Join(adi.FetchAndOp(win, 1, &ticket, 0, 0, adi.AccSum),
							adi.Accumulate(win, []int64{2}, 0, 8, adi.AccSum),
							adi.FetchAndOp(win, 0, &seen, 0, 8, adi.AccNoOp),
							adi.GetAccumulate(win, []int32{int32(1000*c.Rank() + 100*g + i + 1)}, old[:], 0, 16, adi.AccReplace),
							win.FlushLocal(ctx))
						if err != nil {
							return err
						}
						if seen%2 != 0 || seen < 0 || seen > 2*n*goroutines*draws {
							return fmt.Errorf("read %d from a counter that grows by 2 up to %d", seen, 2*n*goroutines*draws)
						}
						mine = append(mine, ticket)
						mu.Lock()
						swapped[old[0]]++
						mu.Unlock()
					}
					mu.Lock()
					tickets = append(tickets, mine...)
					mu.Unlock()
					return nil
				}()
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		if err := win.Fence(ctx); err != nil {
			return err
		}
		var got [2]int64
		if err := errors.Join(win.Get(adi.Bytes(got[:]), 0, 0), win.Free(ctx)); err != nil {
			return err
		}
		if want := int64(n * goroutines * draws); got[0] != want || got[1] != 2*want {
			return fmt.Errorf("counters %v, want [%d %d]", got, want, 2*want)
		}
		return nil
	})
	slices.Sort(tickets)
	for i, tk := range tickets {
		if tk != int64(i) {
			t.Fatalf("ticket %d is %d: tickets begin %v", i, tk, tickets[:min(len(tickets), 8)])
		}
	}
	if len(tickets) != n*goroutines*draws {
		t.Fatalf("%d tickets, want %d", len(tickets), n*goroutines*draws)
	}
	// Every swap took out what one other swap (or the initial 0) put in.
	for v, k := range swapped {
		if k != 1 {
			t.Errorf("%d swaps took out %d", k, v)
		}
	}
}

// TestWinGetAccumulate: each case applies one GetAccumulate from rank 1
// to rank 0's window, which holds before, and checks what comes back
// and what the window holds after the Fence.
func TestWinGetAccumulate(t *testing.T) {
	before := []int32{5, -3, 7, 0}
	for _, tc := range []struct {
		name   string
		op     adi.AccOp
		origin []int32
		after  []int32
	}{
		{"no-op reads", adi.AccNoOp, nil, before},
		{"replace swaps", adi.AccReplace, []int32{1, 2, 3, 4}, []int32{1, 2, 3, 4}},
		{"sum", adi.AccSum, []int32{1, 1, 1, 1}, []int32{6, -2, 8, 1}},
		{"min", adi.AccMin, []int32{0, 0, 9, 0}, []int32{0, -3, 7, 0}},
		{"bxor", adi.AccBXor, []int32{1, 1, 1, 1}, []int32{4, -4, 6, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := loopJob(t, 2)
			ctx := ctxT(t)
			each(t, cs, func(c *adi.Comm) error {
				base := slices.Clone(before)
				// The elements sit at an odd offset: a window need not be aligned.
				raw := append([]byte{0xee}, adi.Bytes(base)...)
				win, err := c.WinCreate(ctx, raw)
				if err != nil {
					return err
				}
				result := make([]int32, len(before))
				if c.Rank() == 1 {
					if err := adi.GetAccumulate(win, tc.origin, result, 0, 1, tc.op); err != nil {
						return err
					}
				}
				if err := win.Fence(ctx); err != nil {
					return err
				}
				// Free first: a rank that returned early would leave the
				// other waiting in Free until the test times out.
				err = win.Free(ctx)
				if c.Rank() == 1 && !slices.Equal(result, before) {
					err = errors.Join(err, fmt.Errorf("fetched %v, want %v", result, before))
				}
				if c.Rank() == 0 {
					after := make([]int32, len(before))
					copy(adi.Bytes(after), raw[1:])
					if !slices.Equal(after, tc.after) || raw[0] != 0xee {
						err = errors.Join(err, fmt.Errorf("window holds %v (guard %#x), want %v", after, raw[0], tc.after))
					}
				}
				return err
			})
		})
	}
}

// TestWinCompareAndSwap: every rank tries to swap a 0 in rank 0's
// window for its rank+1; exactly one finds the 0, and everyone reads the
// winner's value. Then the winner swaps back with the right compare
// value, and a rank with a wrong one changes nothing.
func TestWinCompareAndSwap(t *testing.T) {
	const n = 5
	cs := loopJob(t, n)
	ctx := ctxT(t)
	var mu sync.Mutex
	winners := 0
	each(t, cs, func(c *adi.Comm) error {
		win, err := c.WinCreate(ctx, make([]byte, 3+8)) // the word at offset 3
		if err != nil {
			return err
		}
		var old uint64
		if err := errors.Join(adi.CompareAndSwap(win, uint64(c.Rank()+1), 0, &old, 0, 3), win.FlushLocal(ctx)); err != nil {
			return err
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		var now uint64
		if err := errors.Join(adi.FetchAndOp(win, 0, &now, 0, 3, adi.AccNoOp), win.FlushLocal(ctx)); err != nil {
			return err
		}
		switch {
		case old == 0:
			mu.Lock()
			winners++
			mu.Unlock()
			if now != uint64(c.Rank()+1) {
				return fmt.Errorf("won the swap, but the word holds %d", now)
			}
		case old != now:
			return fmt.Errorf("lost the swap to %d, but the word holds %d", old, now)
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		if old == 0 {
			err = adi.CompareAndSwap(win, 0, now+1, &old, 0, 3) // wrong compare: no swap
			err = errors.Join(err, win.FlushLocal(ctx), adi.CompareAndSwap(win, 0, now, &old, 0, 3))
		}
		if err := errors.Join(err, win.Fence(ctx)); err != nil {
			return err
		}
		var final [8]byte
		if err := errors.Join(win.Get(final[:], 0, 3), win.Fence(ctx)); err != nil {
			return err
		}
		if v := binary.LittleEndian.Uint64(final[:]); v != 0 {
			return fmt.Errorf("the winner swapped back, yet the word holds %d", v)
		}
		return win.Free(ctx)
	})
	if winners != 1 {
		t.Errorf("%d ranks won the swap, want 1", winners)
	}
}

// TestWinAtomicArguments: bad arguments to the atomics are errors that
// say what is wrong, and send nothing; ProcNull does nothing.
func TestWinAtomicArguments(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	wins := windows(t, ctx, cs, 16)
	w := wins[0]
	var r64 int64
	var f64 float64
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"no-op in a plain accumulate", adi.Accumulate(w, []int64{1}, 1, 0, adi.AccNoOp)},
		{"bitwise fetch on a float", adi.FetchAndOp(w, 1, &f64, 1, 0, adi.AccBOr)},
		{"unknown op", adi.FetchAndOp(w, 1, &r64, 1, 0, adi.AccOp(42))},
		{"fetch past the end", adi.FetchAndOp(w, 1, &r64, 1, 9, adi.AccSum)},
		{"fetch into nil", adi.FetchAndOp[int64](w, 1, nil, 1, 0, adi.AccSum)},
		{"origin and result lengths differ", adi.GetAccumulate(w, []int32{1}, make([]int32, 2), 1, 0, adi.AccSum)},
		{"get accumulate of a rank not there", adi.GetAccumulate(w, []int32{1}, make([]int32, 1), 2, 0, adi.AccSum)},
		{"swap past the end", adi.CompareAndSwap(w, 1, 0, &r64, 1, 12)},
		{"swap into nil", adi.CompareAndSwap[int64](w, 1, 0, nil, 1, 0)},
		{"swap at a negative offset", adi.CompareAndSwap(w, 1, 0, &r64, 1, -1)},
	} {
		if tc.err == nil {
			t.Errorf("%s: accepted", tc.name)
		} else if !errors.Is(tc.err, adi.ErrRank) && tc.name == "get accumulate of a rank not there" {
			t.Errorf("%s: %v, want ErrRank", tc.name, tc.err)
		}
	}
	// ProcNull: nothing happens, the result is left alone.
	r64 = 7
	if err := errors.Join(adi.FetchAndOp(w, 1, &r64, adi.ProcNull, 0, adi.AccSum),
		adi.CompareAndSwap(w, 1, 0, &r64, adi.ProcNull, 0),
		adi.GetAccumulate(w, nil, []int64{0}, adi.ProcNull, 0, adi.AccNoOp), w.FlushLocal(ctx)); err != nil || r64 != 7 {
		t.Errorf("atomics on ProcNull: %v, result %d", err, r64)
	}
	freeWindows(t, ctx, cs, wins)
	if err := adi.FetchAndOp(w, 1, &r64, 1, 0, adi.AccSum); err == nil || !strings.Contains(err.Error(), "window freed") {
		t.Errorf("fetch and op after Free: %v", err)
	}
}
