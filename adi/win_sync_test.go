package adi_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hpc-multidevice/multidevice/adi"
)

// TestWinLockAll: every rank, in a LockAll epoch, puts into every rank's
// window and flushes; after a barrier, every rank reads every window and
// finds all the puts. Meanwhile ranks in LockAll are shared holders: two
// exclusive writers on rank 0 write a pair of words in two steps, and no
// LockAll reader ever sees the pair half written, as it would if a
// shared lock were granted beside an exclusive one.
func TestWinLockAll(t *testing.T) {
	const n, rounds = 4, 30
	cs := loopJob(t, n)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		me := c.Rank()
		base := make([]byte, 8*n+16) // slots, then the pair at 8n
		win, err := c.WinCreate(ctx, base)
		if err != nil {
			return err
		}
		pair := 8 * n
		if err := win.LockAll(ctx); err != nil {
			return err
		}
		var mine [8]byte
		binary.LittleEndian.PutUint64(mine[:], uint64(me+1))
		for r := range n {
			if err := win.Put(mine[:], r, 8*me); err != nil {
				return err
			}
		}
		if err := errors.Join(win.FlushAll(ctx), c.Barrier(ctx)); err != nil {
			return err
		}
		got := make([]byte, 8*n*n)
		for r := range n {
			if err := win.Get(got[8*n*r:8*n*(r+1)], r, 0); err != nil {
				return err
			}
		}
		if err := errors.Join(win.FlushLocal(ctx), win.UnlockAll(ctx)); err != nil {
			return err
		}
		for r := range n {
			for s := range n {
				if v := binary.LittleEndian.Uint64(got[8*(n*r+s):]); v != uint64(s+1) {
					return fmt.Errorf("rank %d's slot %d holds %d after the puts and a flush", r, s, v)
				}
			}
		}

		// The pair: ranks 1 and 2 write it under exclusive locks, the
		// others read it under LockAll.
		var buf [16]byte
		for i := range rounds {
			if me == 1 || me == 2 {
				v := uint64(me*1000 + i)
				binary.LittleEndian.PutUint64(buf[:], v)
				err := errors.Join(win.Lock(ctx, 0, true), win.Put(buf[:8], 0, pair), win.FlushAll(ctx),
					win.Put(buf[:8], 0, pair+8), win.Unlock(ctx, 0))
				if err != nil {
					return err
				}
				continue
			}
			if err := errors.Join(win.LockAll(ctx), win.Get(buf[:], 0, pair), win.UnlockAll(ctx)); err != nil {
				return err
			}
			if a, b := binary.LittleEndian.Uint64(buf[:]), binary.LittleEndian.Uint64(buf[8:]); a != b {
				return fmt.Errorf("read a half-written pair (%d, %d) under LockAll", a, b)
			}
		}
		return win.Free(ctx)
	})
}

// TestWinFlushAllAsks: FlushAll asks for an acknowledgement only from
// the targets written to since they last acknowledged, Flush only from
// the one it names, and Unlock's
// acknowledgement counts as one. (Whether a put is applied when FlushAll
// returns cannot be watched from outside without timing: on loopback it
// almost always is anyway.)
func TestWinFlushAllAsks(t *testing.T) {
	cs := loopJob(t, 3)
	ctx := ctxT(t)
	wins := make([]*adi.Win, 3)
	each(t, cs, func(c *adi.Comm) error {
		var err error
		wins[c.Rank()], err = c.WinCreate(ctx, make([]byte, 16))
		return err
	})
	w := wins[0]
	var b [8]byte
	for _, step := range []struct {
		name string
		do   func() error
		sent [3]int64 // operations sent to each rank so far
	}{
		{"lock all", func() error { return w.LockAll(ctx) }, [3]int64{1, 1, 1}},
		{"nothing to flush", func() error { return w.FlushAll(ctx) }, [3]int64{1, 1, 1}},
		{"put to 1", func() error { return w.Put(b[:], 1, 0) }, [3]int64{1, 2, 1}},
		{"flush local asks nobody", func() error { return w.FlushLocal(ctx) }, [3]int64{1, 2, 1}},
		{"flush asks 1", func() error { return w.FlushAll(ctx) }, [3]int64{1, 3, 1}},
		{"flush again asks nobody", func() error { return w.FlushAll(ctx) }, [3]int64{1, 3, 1}},
		{"a get is complete with its data", func() error {
			return errors.Join(w.Get(b[:], 2, 0), w.FlushAll(ctx))
		}, [3]int64{1, 3, 2}},
		{"accumulate to 0 and 2", func() error {
			return errors.Join(adi.Accumulate(w, []int64{1}, 0, 0, adi.AccSum), adi.Accumulate(w, []int64{1}, 2, 0, adi.AccSum))
		}, [3]int64{2, 3, 3}},
		{"flush of 2 asks 2 alone", func() error { return w.Flush(ctx, 2) }, [3]int64{2, 3, 4}},
		{"flush of 2 again asks nobody", func() error { return w.Flush(ctx, 2) }, [3]int64{2, 3, 4}},
		{"flush of ProcNull asks nobody", func() error { return w.Flush(ctx, adi.ProcNull) }, [3]int64{2, 3, 4}},
		{"flush all asks 0 alone", func() error { return w.FlushAll(ctx) }, [3]int64{3, 3, 4}},
		{"put to 1, unlock all", func() error { return errors.Join(w.Put(b[:], 1, 8), w.UnlockAll(ctx)) }, [3]int64{4, 5, 5}},
		{"unlock acknowledged it", func() error { return w.FlushAll(ctx) }, [3]int64{4, 5, 5}},
	} {
		if err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		for r, want := range step.sent {
			if got := adi.SentTo(w, r); got != want {
				t.Errorf("%s: %d operations sent to rank %d, want %d", step.name, got, r, want)
			}
		}
	}
	each(t, cs, func(c *adi.Comm) error { return wins[c.Rank()].Free(ctx) })
}

// TestWinSyncErrors: synchronization calls in the wrong state fail with
// ErrRMASync and send nothing, and the epochs go on as if they had not
// been made.
func TestWinSyncErrors(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	wins := make([]*adi.Win, 2)
	each(t, cs, func(c *adi.Comm) error {
		var err error
		wins[c.Rank()], err = c.WinCreate(ctx, make([]byte, 8))
		return err
	})
	w := wins[0]
	for _, step := range []struct {
		name string
		do   func() error
		sync bool // fails with ErrRMASync; else succeeds
	}{
		{"unlock without lock", func() error { return w.Unlock(ctx, 1) }, true},
		{"unlock all without lock all", func() error { return w.UnlockAll(ctx) }, true},
		{"lock", func() error { return w.Lock(ctx, 1, true) }, false},
		{"lock it again", func() error { return w.Lock(ctx, 1, false) }, true},
		{"lock all beside it", func() error { return w.LockAll(ctx) }, true},
		{"unlock all beside it", func() error { return w.UnlockAll(ctx) }, true},
		{"lock another", func() error { return w.Lock(ctx, 0, false) }, false},
		{"unlock", func() error { return errors.Join(w.Unlock(ctx, 1), w.Unlock(ctx, 0)) }, false},
		{"unlock again", func() error { return w.Unlock(ctx, 1) }, true},
		{"lock all", func() error { return w.LockAll(ctx) }, false},
		{"lock all again", func() error { return w.LockAll(ctx) }, true},
		{"lock inside lock all", func() error { return w.Lock(ctx, 1, false) }, true},
		{"unlock inside lock all", func() error { return w.Unlock(ctx, 1) }, true},
		{"unlock all", func() error { return w.UnlockAll(ctx) }, false},
		{"unlock all again", func() error { return w.UnlockAll(ctx) }, true},
		{"ProcNull needs no lock", func() error { return errors.Join(w.Lock(ctx, adi.ProcNull, true), w.Unlock(ctx, adi.ProcNull)) }, false},
	} {
		err := step.do()
		if step.sync != errors.Is(err, adi.ErrRMASync) || !step.sync && err != nil {
			t.Errorf("%s: %v", step.name, err)
		}
	}
	each(t, cs, func(c *adi.Comm) error { return wins[c.Rank()].Free(ctx) }) // no stray unlock reached a server
	for name, err := range map[string]error{
		"lock all": w.LockAll(ctx), "unlock all": w.UnlockAll(ctx), "flush all": w.FlushAll(ctx), "flush": w.Flush(ctx, 1), "flush local": w.FlushLocal(ctx),
	} {
		if err == nil || !strings.Contains(err.Error(), "window freed") {
			t.Errorf("%s after Free: %v", name, err)
		}
	}
}
