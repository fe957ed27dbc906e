package adi_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
)

// dynEpoch runs ops, the operations of one epoch on targets, in an epoch
// of the kind named, and then synchronizes every rank of c, so that each
// may read its own memory: "fence" (Fence, ops, Fence), "lock" (Lock,
// ops and Unlock per target, shared), "lockall" (LockAll, ops, FlushAll,
// UnlockAll).
func dynEpoch(ctx context.Context, kind string, c *adi.Comm, win *adi.Win, targets []int, ops func(t int) error) error {
	switch kind {
	case "fence":
		if err := win.Fence(ctx); err != nil {
			return err
		}
		for _, t := range targets {
			if err := ops(t); err != nil {
				return err
			}
		}
		return win.Fence(ctx)
	case "lock":
		for _, t := range targets {
			if err := errors.Join(win.Lock(ctx, t, false), ops(t), win.Unlock(ctx, t)); err != nil {
				return err
			}
		}
	case "lockall":
		if err := win.LockAll(ctx); err != nil {
			return err
		}
		for _, t := range targets {
			if err := ops(t); err != nil {
				return err
			}
		}
		if err := errors.Join(win.FlushAll(ctx), win.UnlockAll(ctx)); err != nil {
			return err
		}
	default:
		return fmt.Errorf("no epoch %q", kind)
	}
	return c.Barrier(ctx)
}

var dynEpochs = []string{"fence", "lock", "lockall"}

// TestWinDynamic: every rank attaches three regions to a dynamic window
// after making it, and the ranks exchange their addresses; every rank
// then puts into the first region of every rank, gets from the second,
// accumulates into and compares and swaps in the third, in each kind of
// epoch, and every region ends as those operations make it. Size is 0
// everywhere.
func TestWinDynamic(t *testing.T) {
	for _, kind := range dynEpochs {
		for _, n := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s/ranks=%d", kind, n), func(t *testing.T) {
				cs := loopJob(t, n)
				ctx := ctxT(t)
				each(t, cs, func(c *adi.Comm) error { return dynamicCheck(ctx, kind, c) })
			})
		}
	}
}

func dynamicCheck(ctx context.Context, kind string, c *adi.Comm) error {
	n, me := c.Size(), c.Rank()
	win, err := c.WinCreateDynamic(ctx)
	if err != nil {
		return err
	}
	for r := range n {
		if sz, err := win.Size(r); sz != 0 || err != nil {
			return fmt.Errorf("Size(%d) of a dynamic window: %d, %v; want 0", r, sz, err)
		}
	}
	puts := make([]byte, 8*n)  // each rank's put at 8*rank
	src := pattern(me, 0, 100) // what the others get
	acc := make([]byte, 16)    // a sum, then a word every rank swaps 0 for rank+1 in
	regions := [][]byte{puts, src, acc}
	mine := make([]uint64, len(regions))
	for i, b := range regions {
		if mine[i], err = win.Attach(b); err != nil {
			return err
		}
	}
	addrs := make([]uint64, len(regions)*n)
	if err := c.Allgather(ctx, adi.Bytes(mine), adi.Bytes(addrs)); err != nil {
		return err
	}
	addr := func(t, region, off int) int { return int(addrs[len(regions)*t+region]) + off }

	got := make([]byte, 8*n)    // from each target's src, at 8*me+3
	swapped := make([]int64, n) // each target's swap word before this rank's CAS
	var v [8]byte
	binary.LittleEndian.PutUint64(v[:], uint64(100+me))
	targets := make([]int, n)
	for t := range targets {
		targets[t] = t
	}
	err = dynEpoch(ctx, kind, c, win, targets, func(t int) error {
		return errors.Join(win.Put(v[:], t, addr(t, 0, 8*me)),
			win.Get(got[8*t:8*t+8], t, addr(t, 1, 8*me+3)),
			adi.Accumulate(win, []int64{int64(me + 1)}, t, addr(t, 2, 0), adi.AccSum),
			adi.CompareAndSwap(win, int64(me+1), 0, &swapped[t], t, addr(t, 2, 8)))
	})
	if err != nil {
		return err
	}
	for r := range n {
		if got := i64(puts, r); got != int64(100+r) {
			return fmt.Errorf("the put from rank %d: %d, want %d", r, got, 100+r)
		}
		if want := pattern(r, 0, 100)[8*me+3 : 8*me+11]; !bytes.Equal(got[8*r:8*r+8], want) {
			return fmt.Errorf("the get from rank %d: %v, want %v", r, got[8*r:8*r+8], want)
		}
	}
	if s := i64(acc, 0); s != int64(n*(n+1)/2) {
		return fmt.Errorf("the accumulated sum: %d, want %d", s, n*(n+1)/2)
	}
	// Exactly one rank found 0 in each swap word, and put its number
	// there.
	won := make([]int64, n)
	for t, old := range swapped {
		switch {
		case old == 0:
			won[t] = 1
		case old < 1 || old > int64(n) || old == int64(me+1):
			return fmt.Errorf("rank %d's swap word held %d before this rank's swap", t, old)
		}
	}
	wins := make([]int64, n)
	if err := adi.Allreduce(ctx, c, won, wins, adi.Sum); err != nil {
		return err
	}
	for t, w := range wins {
		if w != 1 {
			return fmt.Errorf("%d ranks swapped rank %d's word", w, t)
		}
	}
	if w := i64(acc, 1); w < 1 || w > int64(n) {
		return fmt.Errorf("the swap word holds %d", w)
	}
	for _, b := range regions {
		if err := win.Detach(b); err != nil {
			return err
		}
	}
	return win.Free(ctx)
}

// TestWinDynamicMiss: an operation on rank 1 that names an address where
// rank 1 has nothing attached (past a region's end, in the gap after it,
// 0, or detached) fails at rank 0, the origin, in every kind of epoch,
// with ErrNoRegion naming rank 1, the address and the length; it writes
// nothing on rank 1, whose own synchronization does not fail, and the
// next epoch is clean.
func TestWinDynamicMiss(t *testing.T) {
	const size = 16
	type access struct {
		name string
		n    int // bytes
		do   func(win *adi.Win, addr int) error
	}
	var cas, fetched int64
	ops := []access{
		{"put", 8, func(win *adi.Win, addr int) error { return win.Put(make([]byte, 8), 1, addr) }},
		{"get", 8, func(win *adi.Win, addr int) error { return win.Get(make([]byte, 8), 1, addr) }},
		{"accumulate", 8, func(win *adi.Win, addr int) error {
			return adi.Accumulate(win, []int64{1}, 1, addr, adi.AccSum)
		}},
		{"compare and swap", 8, func(win *adi.Win, addr int) error { return adi.CompareAndSwap(win, 1, 0, &cas, 1, addr) }},
		{"fetch and op", 8, func(win *adi.Win, addr int) error { return adi.FetchAndOp(win, 1, &fetched, 1, addr, adi.AccSum) }},
	}
	// Where, from the address of rank 1's region and of one it detached.
	wheres := []struct {
		name string
		at   func(region, detached uint64) int
	}{
		{"past the end", func(region, _ uint64) int { return int(region) + size - 4 }},
		{"in the gap", func(region, _ uint64) int { return int(region) + size }},
		{"zero", func(uint64, uint64) int { return 0 }},
		{"detached", func(_, detached uint64) int { return int(detached) }},
	}
	type tc struct {
		epoch, op, where string
		n                int
		do               func(*adi.Win, int) error
		at               func(uint64, uint64) int
	}
	var cases []tc
	for _, op := range ops {
		for _, w := range wheres {
			cases = append(cases, tc{"fence", op.name, w.name, op.n, op.do, w.at})
		}
	}
	for _, epoch := range []string{"lock", "flush", "lockall", "flushlocal"} {
		for _, op := range ops {
			cases = append(cases, tc{epoch, op.name, "past the end", op.n, op.do, wheres[0].at})
		}
	}
	for _, c := range cases {
		t.Run(c.epoch+"/"+c.op+"/"+c.where, func(t *testing.T) {
			cs := loopJob(t, 2)
			ctx := ctxT(t)
			var bad int
			each(t, cs, func(comm *adi.Comm) error {
				me := comm.Rank()
				win, err := comm.WinCreateDynamic(ctx)
				if err != nil {
					return err
				}
				region, gone := bytes.Repeat([]byte{0xAA}, size), bytes.Repeat([]byte{0xBB}, size)
				var addrs [2]uint64
				if me == 1 {
					if addrs[1], err = win.Attach(gone); err != nil {
						return err
					}
					if err := win.Detach(gone); err != nil {
						return err
					}
					if addrs[0], err = win.Attach(region); err != nil {
						return err
					}
				}
				if err := comm.Bcast(ctx, adi.Bytes(addrs[:]), 1); err != nil {
					return err
				}
				if me == 0 {
					bad = c.at(addrs[0], addrs[1])
				}
				// Rank 0 misses, then reaches the region as it should.
				// What is wrong is kept, not returned at once: the other
				// rank would wait for this one in the steps below.
				var sync, wrong error
				good := make([]byte, 4)
				switch c.epoch {
				case "fence":
					if err := win.Fence(ctx); err != nil {
						return err
					}
					if me == 0 {
						if err := errors.Join(c.do(win, bad), win.Get(good, 1, int(addrs[0])+size-4)); err != nil {
							return err
						}
					}
					sync = win.Fence(ctx)
				case "lock", "flush", "flushlocal":
					if me == 0 {
						err := errors.Join(win.Lock(ctx, 1, true), c.do(win, bad), win.Get(good, 1, int(addrs[0])+size-4))
						if err != nil {
							return err
						}
						switch c.epoch {
						case "flush":
							sync = win.Flush(ctx, 1)
						case "flushlocal":
							sync = win.FlushLocal(ctx)
						}
						// FlushLocal does not hear of a put's miss:
						// Unlock does.
						if err := win.Unlock(ctx, 1); sync == nil {
							sync = err
						} else if err != nil {
							wrong = fmt.Errorf("unlock after a %s that reported the miss: %v", c.epoch, err)
						}
					}
				case "lockall":
					if me == 0 {
						if err := errors.Join(win.LockAll(ctx), c.do(win, bad), win.Get(good, 1, int(addrs[0])+size-4)); err != nil {
							return err
						}
						sync = win.FlushAll(ctx)
						if err := win.UnlockAll(ctx); err != nil {
							wrong = fmt.Errorf("unlock all after a flush all that reported the miss: %v", err)
						}
					}
				}
				if me == 0 && c.epoch != "fence" {
					// The epoch that reported the miss ended: the lock
					// is free to take again.
					if err := errors.Join(win.Lock(ctx, 1, true), win.Unlock(ctx, 1)); err != nil {
						wrong = errors.Join(wrong, fmt.Errorf("locking again after the epoch that missed: %v", err))
					}
				}
				if me == 1 {
					if sync != nil {
						wrong = fmt.Errorf("the target's synchronization failed: %v", sync)
					}
				} else {
					want := []string{"rank 1", fmt.Sprintf("address %#x", bad), fmt.Sprintf("%s of %d bytes", c.op, c.n)}
					if c.op == "fetch and op" {
						want[2] = fmt.Sprintf("get accumulate of %d bytes", c.n)
					}
					switch {
					case wrong != nil:
					case !errors.Is(sync, adi.ErrNoRegion) || !containsAll(sync.Error(), want):
						wrong = fmt.Errorf("the origin's synchronization: %v; want ErrNoRegion with %q", sync, want)
					case !bytes.Equal(good, region[:4]):
						wrong = fmt.Errorf("a get beside the miss read %x", good)
					}
				}
				if err := comm.Barrier(ctx); err != nil {
					return errors.Join(wrong, err)
				}
				if me == 1 && (!bytes.Equal(region, bytes.Repeat([]byte{0xAA}, size)) || !bytes.Equal(gone, bytes.Repeat([]byte{0xBB}, size))) {
					wrong = errors.Join(wrong, fmt.Errorf("the miss wrote: region %x, detached %x", region, gone))
				}
				// Reported once: the next epoch is clean.
				if err := errors.Join(win.Fence(ctx), win.Fence(ctx)); err != nil {
					wrong = errors.Join(wrong, fmt.Errorf("the epoch after the miss: %v", err))
				}
				return errors.Join(wrong, win.Free(ctx))
			})
		})
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestWinDynamicRequestMiss: an Rget from where nothing is attached
// completes with no bytes, and the Unlock that ends its epoch fails with
// ErrNoRegion naming the address.
func TestWinDynamicRequestMiss(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		win, err := c.WinCreateDynamic(ctx)
		if err != nil {
			return err
		}
		if c.Rank() == 0 {
			dst := bytes.Repeat([]byte{7}, 8)
			if err := win.Lock(ctx, 1, false); err != nil {
				return err
			}
			q, err := win.Rget(dst, 1, 1<<20)
			if err != nil {
				return err
			}
			st, err := q.Wait(ctx)
			if err != nil || st.Count != 0 || !bytes.Equal(dst, bytes.Repeat([]byte{7}, 8)) {
				return fmt.Errorf("an rget that missed: count %d, %v, dst %v; want 0 bytes, dst as it was", st.Count, err, dst)
			}
			if err := win.Unlock(ctx, 1); !errors.Is(err, adi.ErrNoRegion) || !strings.Contains(err.Error(), "address 0x100000 for a get of 8 bytes") {
				return fmt.Errorf("unlock after an rget that missed: %v", err)
			}
		}
		return win.Free(ctx)
	})
}

// TestWinDynamicAttach: addresses are never 0, start on 64-byte
// boundaries with a gap after each region, and are not handed out again
// after Detach; Attach refuses empty and overlapping memory and the
// other windows, Detach memory not attached, and both a freed window.
func TestWinDynamicAttach(t *testing.T) {
	cs := loopJob(t, 1)
	ctx := ctxT(t)
	win, err := cs[0].WinCreateDynamic(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a, b := make([]byte, 100), make([]byte, 1)
	addrA, errA := win.Attach(a)
	addrB, errB := win.Attach(b)
	if err := errors.Join(errA, errB); err != nil {
		t.Fatal(err)
	}
	if addrA == 0 || addrA%64 != 0 || addrB%64 != 0 || addrB < addrA+100+64 {
		t.Errorf("addresses %#x (100 bytes) and %#x: want nonzero, on 64-byte boundaries, with 64 free after each", addrA, addrB)
	}
	if err := win.Detach(b); err != nil {
		t.Fatal(err)
	}
	again, err := win.Attach(b)
	if err != nil || again == addrB {
		t.Errorf("b attached again: %#x, %v; want an address other than %#x", again, err, addrB)
	}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"attach empty", func() error { _, err := win.Attach(nil); return err }(), "empty memory"},
		{"attach twice", func() error { _, err := win.Attach(a); return err }(), "overlapping the 100 attached at address"},
		{"attach inside", func() error { _, err := win.Attach(a[10:20]); return err }(), "overlapping"},
		{"detach not attached", win.Detach(make([]byte, 8)), "none of the 2 regions attached starts"},
		{"detach part", win.Detach(a[:50]), "holds 100 bytes, not the 50 given"},
		{"detach inside", win.Detach(a[1:]), "none of the 2 regions"},
		{"detach empty", win.Detach(nil), "empty memory is never attached"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, tc.err, tc.want)
		}
		if strings.HasPrefix(tc.name, "detach") && !errors.Is(tc.err, adi.ErrNoRegion) {
			t.Errorf("%s: %v, want ErrNoRegion", tc.name, tc.err)
		}
	}
	// Partly overlapping memory: a slice of a larger buffer.
	big := make([]byte, 64)
	if _, err := win.Attach(big[:32]); err != nil {
		t.Fatal(err)
	}
	if _, err := win.Attach(big[16:48]); err == nil || !strings.Contains(err.Error(), "overlapping the 32") {
		t.Errorf("attach of memory half attached: %v", err)
	}
	if _, err := win.Attach(big[32:]); err != nil {
		t.Errorf("attach of the other half: %v", err)
	}
	if err := win.Free(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := win.Attach(make([]byte, 8)); err == nil || !strings.Contains(err.Error(), "window freed") {
		t.Errorf("attach after Free: %v", err)
	}
	if err := win.Detach(a); err == nil || !strings.Contains(err.Error(), "window freed") {
		t.Errorf("detach after Free: %v", err)
	}
	plain, err := cs[0].WinCreate(ctx, make([]byte, 8))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Attach(make([]byte, 8)); err == nil || !strings.Contains(err.Error(), "not made by WinCreateDynamic") {
		t.Errorf("attach to WinCreate's window: %v", err)
	}
	if err := plain.Detach(make([]byte, 8)); err == nil || !strings.Contains(err.Error(), "not made by WinCreateDynamic") {
		t.Errorf("detach from WinCreate's window: %v", err)
	}
	if err := plain.Free(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestWinDynamicDetachRacing: rank 1 attaches and detaches memory on one
// goroutine, over and over, while rank 0 puts into another of its
// regions under a lock and, meanwhile, into a third that rank 1 detaches
// midway. The puts into the region that stays all land; none lands in
// the detached one after Detach returned (rank 1 overwrites it then, and
// finds its own bytes at the end), and the race detector sees every
// write of the window's server ordered before Detach returns. The puts
// after the Detach fail at rank 0 with ErrNoRegion, or not, depending on
// when they came, and nothing else.
func TestWinDynamicDetachRacing(t *testing.T) {
	const rounds = 200
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		win, err := c.WinCreateDynamic(ctx)
		if err != nil {
			return err
		}
		stays, leaves := make([]byte, 8*rounds), make([]byte, 8*rounds)
		var addrs [2]uint64
		if c.Rank() == 1 {
			if addrs[0], err = win.Attach(stays); err != nil {
				return err
			}
			if addrs[1], err = win.Attach(leaves); err != nil {
				return err
			}
		}
		if err := c.Bcast(ctx, adi.Bytes(addrs[:]), 1); err != nil {
			return err
		}
		if c.Rank() == 0 {
			var v [8]byte
			if err := win.Lock(ctx, 1, false); err != nil {
				return err
			}
			var missed error
			for i := range rounds {
				if i == rounds/2 { // rank 1 detaches the second region now
					if err := c.Send(ctx, nil, 1, 0); err != nil {
						return err
					}
				}
				binary.LittleEndian.PutUint64(v[:], uint64(i+1))
				if err := errors.Join(win.Put(v[:], 1, int(addrs[0])+8*i), win.Put(v[:], 1, int(addrs[1])+8*i)); err != nil {
					return err
				}
				if i%10 == 9 {
					if err := win.Flush(ctx, 1); err != nil && !errors.Is(err, adi.ErrNoRegion) {
						return err
					} else if err != nil {
						missed = err
					}
				}
			}
			if err := win.Unlock(ctx, 1); err != nil && !errors.Is(err, adi.ErrNoRegion) {
				return err
			}
			t.Logf("rank 0's puts into the detached region: %v", missed)
			return errors.Join(c.Barrier(ctx), c.Barrier(ctx), win.Free(ctx))
		}
		// Rank 1: attach and detach on one goroutine, detach leaves
		// midway on another.
		var wg sync.WaitGroup
		churn := make(chan error, 1)
		stop := make(chan struct{})
		wg.Go(func() {
			defer close(churn)
			for {
				select {
				case <-stop:
					return
				default:
				}
				b := make([]byte, 64)
				if _, err := win.Attach(b); err != nil {
					churn <- err
					return
				}
				if err := win.Detach(b); err != nil {
					churn <- err
					return
				}
			}
		})
		// Halfway through the puts, detach leaves and make it ours.
		if _, err := c.Recv(ctx, nil, 0, 0); err != nil {
			return err
		}
		if err := win.Detach(leaves); err != nil {
			return err
		}
		for i := range leaves {
			leaves[i] = 0xEE
		}
		if err := c.Barrier(ctx); err != nil { // rank 0 unlocked: every put applied
			return err
		}
		close(stop)
		wg.Wait()
		if err := <-churn; err != nil {
			return fmt.Errorf("attach and detach beside the puts: %v", err)
		}
		for i := range rounds {
			if v := binary.LittleEndian.Uint64(stays[8*i:]); v != uint64(i+1) {
				return fmt.Errorf("put %d into the region that stays: %d", i, v)
			}
		}
		if !bytes.Equal(leaves, bytes.Repeat([]byte{0xEE}, len(leaves))) {
			return fmt.Errorf("a put landed in the region after Detach returned")
		}
		return errors.Join(c.Barrier(ctx), win.Free(ctx))
	})
}

// TestWinDynamicMissCtxEnds: a flush or unlock whose ctx ends once its
// request is sent still has its target's report of the puts that missed
// read, and the miss returned by exactly one call: the one whose ctx
// ended, if the answer came in time, or a later one, which the tests
// make likely with puts enough to keep the target busy.
// winCall is a call on a window, for tables of epochs; method
// expressions (*adi.Win).LockAll and the like are ones.
type winCall = func(*adi.Win, context.Context) error

// Calls on rank 1 of a window, for the tables.
var (
	lockRank1   winCall = func(w *adi.Win, ctx context.Context) error { return w.Lock(ctx, 1, true) }
	unlockRank1 winCall = func(w *adi.Win, ctx context.Context) error { return w.Unlock(ctx, 1) }
	flushRank1  winCall = func(w *adi.Win, ctx context.Context) error { return w.Flush(ctx, 1) }
)

func TestWinDynamicMissCtxEnds(t *testing.T) {
	const puts = 5000
	nowhere := 1 << 20 // rank 1 attaches nothing
	cases := []struct {
		name string
		// lock starts the epoch; ended is the call given a ctx that
		// ended; then come the calls that end the epoch, if ended did
		// not, and another epoch.
		lock  winCall
		ended winCall
		after []winCall
	}{
		{"flush", lockRank1, flushRank1, []winCall{unlockRank1, lockRank1, unlockRank1}},
		{"flush all", (*adi.Win).LockAll, (*adi.Win).FlushAll, []winCall{(*adi.Win).FlushAll, (*adi.Win).UnlockAll}},
		{"unlock", lockRank1, unlockRank1, []winCall{lockRank1, unlockRank1}},
		{"unlock all", (*adi.Win).LockAll, (*adi.Win).UnlockAll, []winCall{(*adi.Win).LockAll, (*adi.Win).UnlockAll}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cs := loopJob(t, 2)
			ctx := ctxT(t)
			each(t, cs, func(c *adi.Comm) error {
				win, err := c.WinCreateDynamic(ctx)
				if err != nil {
					return err
				}
				var wrong error
				if c.Rank() == 0 {
					if err := tc.lock(win, ctx); err != nil {
						return err
					}
					for range puts {
						if err := win.Put(make([]byte, 8), 1, nowhere); err != nil {
							return err
						}
					}
					// Complete the puts here: an unlock whose ctx ended
					// before its request went would keep the lock.
					if err := win.FlushLocal(ctx); err != nil {
						return err
					}
					ended, cancel := context.WithCancel(ctx)
					cancel()
					errs := []error{tc.ended(win, ended)}
					t.Logf("%s with a ctx that ended: %v", tc.name, errs[0])
					for _, f := range tc.after {
						errs = append(errs, f(win, ctx))
					}
					errs = append(errs, win.Fence(ctx), win.Fence(ctx))
					reports := 0
					for i, err := range errs {
						switch {
						case errors.Is(err, adi.ErrNoRegion) && !errors.Is(err, context.Canceled):
							reports++
						case err != nil && i > 0:
							wrong = errors.Join(wrong, fmt.Errorf("call %d after: %v", i, err))
						}
					}
					if reports != 1 {
						wrong = errors.Join(wrong, fmt.Errorf("%d puts missed, reported %d times: %v", puts, reports, errs))
					}
				} else if err := errors.Join(win.Fence(ctx), win.Fence(ctx)); err != nil {
					return err
				}
				return errors.Join(wrong, win.Free(ctx))
			})
		})
	}
}

// TestWinDynamicFenceCtxEnds: a Fence whose ctx ends while it waits for
// the other ranks' reports of missed operations leaves nothing behind:
// the miss a target reported to it is returned by the next Fence, once.
func TestWinDynamicFenceCtxEnds(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	failed := make(chan struct{}) // rank 1's first Fence returned
	each(t, cs, func(c *adi.Comm) error {
		win, err := c.WinCreateDynamic(ctx)
		if err != nil {
			return err
		}
		if err := win.Fence(ctx); err != nil {
			return err
		}
		fence, cancel := context.WithCancel(ctx)
		defer cancel()
		first := true
		if c.Rank() == 0 {
			// Rank 0's report comes once rank 1 stopped waiting for it.
			adi.OnExchange(win, func() {
				if first {
					first = false
					<-failed
				}
			})
		} else {
			adi.OnExchange(win, cancel)
			if err := win.Put(make([]byte, 8), 0, 1<<20); err != nil {
				return err
			}
		}
		errs := []error{win.Fence(fence)}
		if c.Rank() == 1 {
			close(failed)
		}
		errs = append(errs, win.Fence(ctx), win.Fence(ctx))
		var wrong error
		if c.Rank() == 0 {
			if err := errors.Join(errs...); err != nil {
				wrong = fmt.Errorf("the target's fences: %v", err)
			}
		} else if !errors.Is(errs[0], context.Canceled) || errors.Is(errs[0], adi.ErrNoRegion) ||
			!errors.Is(errs[1], adi.ErrNoRegion) || !strings.Contains(errs[1].Error(), "rank 0") || errs[2] != nil {
			wrong = fmt.Errorf("fences: %v; want the first's ctx error, ErrNoRegion from rank 0 then nil", errs)
		}
		return errors.Join(wrong, win.Free(ctx))
	})
}

// TestWinDynamicFenceFailsBeforeExchange: rank 1's Fence fails before
// its exchange of reports (its ctx ended before the counts were in),
// while rank 0's goes on to the exchange, takes its record of rank 1's
// missed put out and sends it, and waits for rank 1's report until its
// own ctx ends. Rank 1's next Fence returns the miss, once, and rank 0's
// next reads the report it waited for, so neither keeps anything.
func TestWinDynamicFenceFailsBeforeExchange(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		win, err := c.WinCreateDynamic(ctx)
		if err != nil {
			return err
		}
		if err := win.Fence(ctx); err != nil {
			return err
		}
		var first error
		if c.Rank() == 1 {
			if err := errors.Join(win.Put(make([]byte, 8), 0, 1<<20), win.FlushLocal(ctx)); err != nil {
				return err
			}
			ended, cancel := context.WithCancel(ctx)
			cancel()
			first = win.Fence(ended)
		} else {
			// Rank 1's report never comes: this ctx ends.
			short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			first = win.Fence(short)
			cancel()
		}
		errs := []error{first, win.Fence(ctx), win.Fence(ctx), win.Fence(ctx)}
		var wrong error
		switch {
		case !errors.Is(errs[0], context.Canceled) && !errors.Is(errs[0], context.DeadlineExceeded):
			wrong = fmt.Errorf("first fence: %v, want its ctx's error", errs[0])
		case c.Rank() == 0 && errors.Join(errs[1:]...) != nil:
			wrong = fmt.Errorf("the target's fences after the first: %v", errs[1:])
		case c.Rank() == 1 && (errors.Is(errs[0], adi.ErrNoRegion) || !errors.Is(errs[1], adi.ErrNoRegion) ||
			!strings.Contains(errs[1].Error(), "rank 0") || errors.Join(errs[2:]...) != nil):
			wrong = fmt.Errorf("fences: %v; want the first's ctx error, ErrNoRegion from rank 0, then nil", errs)
		}
		if n := adi.Kept(win); n != 0 {
			wrong = errors.Join(wrong, fmt.Errorf("%d answers or reports kept after the fences", n))
		}
		return errors.Join(wrong, win.Free(ctx))
	})
}

// FuzzDecodeFenceReport: no Fence report, however garbled, panics the
// receiver; one it accepts names a Fence's epoch, from 1, and puts or
// accumulates of some bytes at an address that does not wrap, or none,
// and encodes back to what came.
func FuzzDecodeFenceReport(f *testing.F) {
	const put, get = 1, 2 // rmaPut, rmaGet
	f.Add(adi.EncodeFenceReport(7, 3, put, 0x10040, 8))
	f.Add(adi.EncodeFenceReport(1, 0, 0, 0, 0))
	f.Add(adi.EncodeFenceReport(0, 0, 0, 0, 0))
	f.Add(adi.EncodeFenceReport(2, 1, get, 1, 1))
	f.Add(adi.EncodeFenceReport(2, 1, put, 1<<64-8, 9))
	f.Add([]byte(nil))
	f.Add(make([]byte, 32))
	f.Fuzz(func(t *testing.T, b []byte) {
		epoch, count, kind, addr, length, err := adi.DecodeFenceReport(b)
		if err != nil {
			return
		}
		switch {
		case epoch == 0:
			t.Fatalf("%x accepted with epoch 0", b)
		case count == 0 && (kind != 0 || addr != 0 || length != 0):
			t.Fatalf("a report of no operations decoded with kind %d, address %#x, length %d", kind, addr, length)
		case count > 0 && (kind != put && kind != 3 || length == 0 || addr+length < addr):
			t.Fatalf("accepted %d operations of kind %d, %d bytes at %#x", count, kind, length, addr)
		}
		if got := adi.EncodeFenceReport(epoch, count, kind, addr, length); !bytes.Equal(got, b) {
			t.Fatalf("%x decoded, encodes as %x", b, got)
		}
	})
}
