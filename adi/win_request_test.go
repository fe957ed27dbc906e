package adi_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/hpc-multidevice/multidevice/adi"
)

// TestWinRequests: in a LockAll epoch, every rank puts and accumulates
// into its right neighbour with Rput and Raccumulate, waits for those
// requests alone, flushes, and after a barrier reads its left
// neighbour's words with Rget and RgetAccumulate: each request, once
// complete, has its data in place without a flush.
func TestWinRequests(t *testing.T) {
	const n = 3
	cs := loopJob(t, n)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		me := c.Rank()
		right, left := (me+1)%n, (me+n-1)%n
		win, err := c.WinCreate(ctx, make([]byte, 24))
		if err != nil {
			return err
		}
		if err := win.LockAll(ctx); err != nil {
			return err
		}
		var word [8]byte
		binary.LittleEndian.PutUint64(word[:], uint64(100+me))
		put, err := win.Rput(word[:], right, 0)
		if err != nil {
			return err
		}
		acc, err := adi.Raccumulate(win, []int64{int64(me), 1}, right, 8, adi.AccSum)
		if err != nil {
			return err
		}
		if _, err := adi.WaitAll(ctx, put, acc); err != nil {
			return err
		}
		if err := errors.Join(win.FlushAll(ctx), c.Barrier(ctx)); err != nil {
			return err
		}
		var got [8]byte
		get, err := win.Rget(got[:], me, 0)
		if err != nil {
			return err
		}
		old := make([]int64, 2)
		getAcc, err := adi.RgetAccumulate(win, []int64{10, 10}, old, me, 8, adi.AccSum)
		if err != nil {
			return err
		}
		for {
			if done, err := adi.TestAll(nil, get, getAcc); err != nil {
				return err
			} else if done {
				break
			}
		}
		if v := binary.LittleEndian.Uint64(got[:]); v != uint64(100+left) {
			return fmt.Errorf("rget of my window's word: %d, want %d", v, 100+left)
		}
		if want := []int64{int64(left), 1}; !slices.Equal(old, want) {
			return fmt.Errorf("rget accumulate: %v, want %v", old, want)
		}
		// After the barrier, every rank's RgetAccumulate is in its window.
		if err := errors.Join(win.UnlockAll(ctx), c.Barrier(ctx)); err != nil {
			return err
		}
		// The same under Lock, and a request to ProcNull, complete at once.
		if err := win.Lock(ctx, right, false); err != nil {
			return err
		}
		get, err = win.Rget(got[:], right, 8)
		if err != nil {
			return err
		}
		null, err := win.Rput(word[:], adi.ProcNull, 0)
		if err != nil {
			return err
		}
		_, err = adi.WaitAll(ctx, get, null)
		if v := int64(binary.LittleEndian.Uint64(got[:])); err == nil && v != int64(me)+10 {
			err = fmt.Errorf("rget under Lock: %d, want %d", v, me+10)
		}
		// Free even after a failure: the others would wait for this rank.
		return errors.Join(err, win.Unlock(ctx, right), win.Free(ctx))
	})
}

// TestWinRequestErrors: request-based operations outside a
// passive-target epoch on their target fail with ErrRMASync; bad
// arguments fail as the plain operations' do; nothing is sent.
func TestWinRequestErrors(t *testing.T) {
	cs := loopJob(t, 3)
	ctx := ctxT(t)
	wins := windows(t, ctx, cs, 16)
	w := wins[0]
	b := make([]byte, 8)
	try := func(q *adi.Request, err error) error {
		if q != nil {
			_, werr := q.Wait(ctx)
			return errors.Join(errors.New("accepted"), werr)
		}
		return err
	}
	if err := w.Lock(ctx, 1, false); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		err  error
		sync bool // ErrRMASync
	}{
		{"rput with no epoch", try(w.Rput(b, 2, 0)), true},
		{"rget with no epoch", try(w.Rget(b, 2, 0)), true},
		{"raccumulate with no epoch", try(adi.Raccumulate(w, []int64{1}, 2, 0, adi.AccSum)), true},
		{"rget accumulate with no epoch", try(adi.RgetAccumulate(w, []int64{1}, []int64{0}, 2, 0, adi.AccSum)), true},
		{"rput past the end", try(w.Rput(b, 1, 9)), false},
		{"rget of no rank", try(w.Rget(b, 3, 0)), false},
		{"raccumulate with no-op", try(adi.Raccumulate(w, []int64{1}, 1, 0, adi.AccNoOp)), false},
		{"rget accumulate, bitwise on floats", try(adi.RgetAccumulate(w, []float64{1}, []float64{0}, 1, 0, adi.AccBAnd)), false},
		{"rget accumulate, lengths differ", try(adi.RgetAccumulate(w, []int64{1, 2}, []int64{0}, 1, 0, adi.AccSum)), false},
	} {
		if tc.err == nil || tc.sync != errors.Is(tc.err, adi.ErrRMASync) {
			t.Errorf("%s: %v", tc.name, tc.err)
		}
	}
	if got := adi.SentTo(w, 2); got != 0 {
		t.Errorf("%d operations sent to rank 2, which is not locked", got)
	}
	if err := w.Unlock(ctx, 1); err != nil {
		t.Fatal(err)
	}
	freeWindows(t, ctx, cs, wins)
}

// TestWinRequestKept: a one-sided operation's request can be neither
// cancelled (the target's reply would have nowhere to go, and the
// window's flushes would fail) nor restarted.
func TestWinRequestKept(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	wins := windows(t, ctx, cs, 4096)
	w := wins[0]
	if err := w.Lock(ctx, 1, false); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{8, 4096} { // eager and rendezvous replies
		dst := make([]byte, n)
		q, err := w.Rget(dst, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		q.Cancel()
		if st, err := q.Wait(ctx); err != nil || st.Cancelled {
			t.Errorf("Rget of %d bytes after Cancel: %+v, %v; want it complete", n, st, err)
		}
		if err := cs[0].IrecvInto(q, dst, 1, 0); !errors.Is(err, adi.ErrRequestBusy) {
			t.Errorf("IrecvInto with an Rget's request: %v, want ErrRequestBusy", err)
		}
		if err := w.FlushLocal(ctx); err != nil {
			t.Errorf("FlushLocal after a cancelled Rget of %d bytes: %v", n, err)
		}
	}
	if err := w.Unlock(ctx, 1); err != nil {
		t.Fatal(err)
	}
	freeWindows(t, ctx, cs, wins)
}

// TestRefusedIntoKeepsWindowRequest: an Into call given a one-sided
// operation's request refuses it whatever its other arguments, and the
// window's flush still finds the operation. A refused IrecvInto with a
// bad rank once dropped the finished Rget's result, and FlushAll failed
// with "request holds no operation".
func TestRefusedIntoKeepsWindowRequest(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		win, err := c.WinCreate(ctx, make([]byte, 8))
		if err != nil {
			return err
		}
		if err := win.LockAll(ctx); err != nil {
			return err
		}
		var got [8]byte
		q, err := win.Rget(got[:], 1-c.Rank(), 0)
		if err != nil {
			return err
		}
		if _, err := q.Wait(ctx); err != nil {
			return err
		}
		if err := c.IrecvInto(q, got[:], 99, 0); !errors.Is(err, adi.ErrRequestBusy) {
			return fmt.Errorf("IrecvInto from rank 99 into an Rget's request: %v, want ErrRequestBusy", err)
		}
		if err := win.FlushAll(ctx); err != nil {
			return fmt.Errorf("FlushAll after a refused IrecvInto on an Rget request: %w", err)
		}
		if err := win.UnlockAll(ctx); err != nil {
			return err
		}
		return c.Barrier(ctx)
	})
}
