package adi_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/internal/leakcheck"
	"github.com/hpc-multidevice/multidevice/sdi"
)

func i64(b []byte, i int) int64 { return int64(binary.LittleEndian.Uint64(b[8*i:])) }

// TestWinEpochs: ranks put into, get from and accumulate into each
// other's windows (and their own) over three epochs; after each Fence
// every window holds what the epoch's operations make of it.
func TestWinEpochs(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			cs := loopJob(t, n)
			ctx := ctxT(t)
			each(t, cs, func(c *adi.Comm) error {
				me := c.Rank()
				// Slots 0..n-1: what each rank put; n: a sum; n+1: a max;
				// n+2: bitwise or; then a float64 at an odd offset; then
				// a large region.
				const large = 70000
				base := make([]byte, 8*(n+3)+1+8+large)
				fl := 8*(n+3) + 1
				big := fl + 8
				win, err := c.WinCreate(ctx, base)
				if err != nil {
					return err
				}
				if sz, _ := win.Size(n - 1); sz != len(base) {
					return fmt.Errorf("rank %d's window: %d bytes, want %d", n-1, sz, len(base))
				}
				var mine [8]byte
				binary.LittleEndian.PutUint64(mine[:], uint64(100+me))
				for t := range n {
					if err := win.Put(mine[:], t, 8*me); err != nil {
						return err
					}
				}
				if err := win.Put(bytes.Repeat([]byte{byte(me + 1)}, large), (me+1)%n, big); err != nil {
					return err
				}
				if err := win.Fence(ctx); err != nil {
					return err
				}
				for r := range n {
					if got := i64(base, r); got != int64(100+r) {
						return fmt.Errorf("epoch 1: slot %d holds %d, want %d", r, got, 100+r)
					}
				}
				if !bytes.Equal(base[big:], bytes.Repeat([]byte{byte((me+n-1)%n + 1)}, large)) {
					return fmt.Errorf("epoch 1: the large put from rank %d is wrong", (me+n-1)%n)
				}

				got := make([]byte, 8*n)
				bigGot := make([]byte, large)
				for t := range n {
					if err := win.Get(got[8*t:8*t+8], t, 8*t); err != nil {
						return err
					}
					if err := adi.Accumulate(win, []int64{int64(me + 1)}, t, 8*n, adi.AccSum); err != nil {
						return err
					}
					if err := adi.Accumulate(win, []int64{int64(me * 7)}, t, 8*(n+1), adi.AccMax); err != nil {
						return err
					}
					if err := adi.Accumulate(win, []uint64{1 << me}, t, 8*(n+2), adi.AccBOr); err != nil {
						return err
					}
					if err := adi.Accumulate(win, []float64{0.5}, t, fl, adi.AccSum); err != nil {
						return err
					}
				}
				if err := win.Get(bigGot, (me+1)%n, big); err != nil {
					return err
				}
				if err := win.Fence(ctx); err != nil {
					return err
				}
				for r := range n {
					if i64(got, r) != int64(100+r) {
						return fmt.Errorf("epoch 2: get of rank %d's slot: %d", r, i64(got, r))
					}
				}
				if !bytes.Equal(bigGot, bytes.Repeat([]byte{byte(me + 1)}, large)) {
					return fmt.Errorf("epoch 2: the large get from rank %d is wrong", (me+1)%n)
				}
				if s, m, or := i64(base, n), i64(base, n+1), i64(base, n+2); s != int64(n*(n+1)/2) || m != int64(7*(n-1)) || or != 1<<n-1 {
					return fmt.Errorf("epoch 2: sum %d, max %d, or %b", s, m, or)
				}
				if f := math.Float64frombits(binary.LittleEndian.Uint64(base[fl:])); f != 0.5*float64(n) {
					return fmt.Errorf("epoch 2: float sum at an odd offset %v, want %v", f, 0.5*float64(n))
				}
				// Epoch 3: replace, then nothing: an empty epoch fences too.
				if err := adi.Accumulate(win, []int32{-1}, (me+1)%n, 8*me, adi.AccReplace); err != nil {
					return err
				}
				if err := win.Fence(ctx); err != nil {
					return err
				}
				if got := int32(binary.LittleEndian.Uint32(base[8*((me+n-1)%n):])); got != -1 {
					return fmt.Errorf("epoch 3: replace gave %d", got)
				}
				return win.Free(ctx)
			})
			if g := leakcheck.Goroutines("adi.(*Win).serve"); g != "" {
				t.Errorf("window servers left after Free:\n%s", g)
			}
		})
	}
}

func TestWinArguments(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	wins := make([]*adi.Win, 2)
	each(t, cs, func(c *adi.Comm) error {
		var err error
		wins[c.Rank()], err = c.WinCreate(ctx, make([]byte, 16*(c.Rank()+1)))
		return err
	})
	w := wins[0]
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"put past the end", w.Put(make([]byte, 8), 0, 12)},
		{"put to no rank", w.Put(nil, 2, 0)},
		{"negative offset", w.Get(make([]byte, 1), 1, -1)},
		{"get past the end", w.Get(make([]byte, 40), 1, 0)},
		{"bitwise on floats", adi.Accumulate(w, []float64{1}, 1, 0, adi.AccBAnd)},
		{"unknown op", adi.Accumulate(w, []int64{1}, 1, 0, adi.AccOp(99))},
	} {
		if tc.err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	if err := w.Put(make([]byte, 8), 1, 24); err != nil { // rank 1's window is longer
		t.Errorf("put within rank 1's window: %v", err)
	}
	// ProcNull is nobody, as in point-to-point calls: nothing happens.
	if err := errors.Join(w.Put(make([]byte, 8), adi.ProcNull, 0), w.Get(make([]byte, 8), adi.ProcNull, 0),
		adi.Accumulate(w, []int64{1}, adi.ProcNull, 0, adi.AccSum)); err != nil {
		t.Errorf("operations on ProcNull: %v", err)
	}
	freeWindows(t, ctx, cs, wins)
	// A freed window says so, and does not wait.
	for name, err := range map[string]error{
		"put": w.Put(make([]byte, 1), 1, 0), "get": w.Get(make([]byte, 1), 1, 0),
		"accumulate": adi.Accumulate(w, []int64{1}, 1, 0, adi.AccSum), "fence": w.Fence(ctx), "free": w.Free(ctx),
	} {
		if err == nil || !strings.Contains(err.Error(), "window freed") {
			t.Errorf("%s after Free: %v", name, err)
		}
	}
}

// TestWinFinalize: a window never freed ends with the world, and its
// calls fail afterwards as after Free, Sync and Attach among them.
func TestWinFinalize(t *testing.T) {
	ws := job(t, 2)
	wins := make([][2]*adi.Win, 2) // each rank's: WinCreate's, WinCreateDynamic's
	each(t, []*adi.Comm{ws[0].Comm(), ws[1].Comm()}, func(c *adi.Comm) error {
		plain, err := c.WinCreate(ctxT(t), make([]byte, 8))
		if err != nil {
			return err
		}
		dyn, err := c.WinCreateDynamic(ctxT(t))
		wins[c.Rank()] = [2]*adi.Win{plain, dyn}
		return err
	})
	each(t, []*adi.Comm{ws[0].Comm(), ws[1].Comm()}, func(c *adi.Comm) error {
		return ws[c.Rank()].Finalize(context.Background())
	})
	if g := leakcheck.Goroutines("adi.(*Win).serve"); g != "" {
		t.Errorf("window servers left after Finalize:\n%s", g)
	}
	_, attach := wins[0][1].Attach(make([]byte, 8))
	for name, err := range map[string]error{
		"sync": wins[0][0].Sync(), "dynamic sync": wins[0][1].Sync(), "attach": attach,
		"fence": wins[0][0].Fence(context.Background()), "flush all": wins[0][1].FlushAll(context.Background()),
	} {
		if err == nil || !strings.Contains(err.Error(), "window freed") {
			t.Errorf("%s after Finalize: %v", name, err)
		}
	}
}

// TestWinFinalizeHalted: a window whose server stopped because a Fence
// could not receive an operation ends with the world all the same: its
// calls fail afterwards as after Free, Attach among them.
func TestWinFinalizeHalted(t *testing.T) {
	ws := job(t, 2)
	wins := make([]*adi.Win, 2)
	each(t, []*adi.Comm{ws[0].Comm(), ws[1].Comm()}, func(c *adi.Comm) error {
		w, err := c.WinCreateDynamic(ctxT(t))
		if err != nil {
			return err
		}
		wins[c.Rank()] = w
		adi.Halt(w, errors.New("a receive failed, as the test has it"))
		return ws[c.Rank()].Finalize(context.Background())
	})
	if g := leakcheck.Goroutines("adi.(*Win).serve"); g != "" {
		t.Errorf("window servers left after Finalize:\n%s", g)
	}
	for r, w := range wins {
		if _, err := w.Attach(make([]byte, 8)); err == nil || !strings.Contains(err.Error(), "window freed") {
			t.Errorf("rank %d: attach after Finalize: %v", r, err)
		}
	}
}

// TestWinLock: ranks increment a counter in rank 0's window with a read,
// a flush and a write under an exclusive lock, and read it under shared
// locks; no increment is lost, as one would be if two ranks held the
// lock at once. Rank 0 takes no part but its Fence-free server.
func TestWinLock(t *testing.T) {
	const n, rounds = 4, 25
	cs := loopJob(t, n)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		win, err := c.WinCreate(ctx, make([]byte, 8))
		if err != nil {
			return err
		}
		if c.Rank() > 0 {
			var cur [8]byte
			for range rounds {
				if err := win.Lock(ctx, 0, true); err != nil {
					return err
				}
				if err := errors.Join(win.Get(cur[:], 0, 0), win.Flush(ctx, 0)); err != nil {
					return err
				}
				binary.LittleEndian.PutUint64(cur[:], binary.LittleEndian.Uint64(cur[:])+1)
				if err := errors.Join(win.Put(cur[:], 0, 0), win.Unlock(ctx, 0)); err != nil {
					return err
				}
			}
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		var got [8]byte
		if err := errors.Join(win.Lock(ctx, 0, false), win.Get(got[:], 0, 0), win.Unlock(ctx, 0)); err != nil {
			return err
		}
		if v := binary.LittleEndian.Uint64(got[:]); v != (n-1)*rounds {
			return fmt.Errorf("counter %d after %d locked increments", v, (n-1)*rounds)
		}
		// An unlock without a lock is refused at the origin; one that
		// reaches the target anyway is acknowledged and reported by the
		// target's Fence.
		if err := win.Unlock(ctx, 0); !errors.Is(err, adi.ErrRMASync) {
			return fmt.Errorf("an unlock without a lock: %v, want ErrRMASync", err)
		}
		if err := adi.UnlockUnheld(ctx, win, 0); err != nil {
			return fmt.Errorf("an unlock without a lock, sent anyway: %v", err)
		}
		if err := win.Free(ctx); c.Rank() == 0 && (err == nil || !strings.Contains(err.Error(), "holds no lock")) {
			return fmt.Errorf("rank 0's server reported %v for the unlocks without a lock", err)
		} else if c.Rank() != 0 && err != nil {
			return err
		}
		return nil
	})
}

// windows makes a window of size bytes on every rank of cs, returned in
// rank order.
func windows(t *testing.T, ctx context.Context, cs []*adi.Comm, size int) []*adi.Win {
	t.Helper()
	wins := make([]*adi.Win, len(cs))
	each(t, cs, func(c *adi.Comm) error {
		var err error
		wins[c.Rank()], err = c.WinCreate(ctx, make([]byte, size))
		return err
	})
	return wins
}

// freeWindows frees the windows windows made, every rank at once.
func freeWindows(t *testing.T, ctx context.Context, cs []*adi.Comm, wins []*adi.Win) {
	t.Helper()
	each(t, cs, func(c *adi.Comm) error { return wins[c.Rank()].Free(ctx) })
}

// TestWinServesOnAfterLostOrigin: an origin lost while its large Put was
// coming to a target costs that operation, which the target's next Fence
// reports, and nothing else: the target's window still serves the ranks
// that live. Its server once stopped at the failed receive, and every
// other rank's Lock and Get on that window waited until its ctx ended.
func TestWinServesOnAfterLostOrigin(t *testing.T) {
	ws, f := loopWorlds(t, 3)
	ctx := ctxT(t)
	cs := comms(ws)
	wins := windows(t, ctx, cs, 1<<16)
	release := adi.HoldApply(wins[1]) // rank 1's server is busy
	if err := wins[2].Put(make([]byte, 1<<16), 1, 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	f.Sever(2)
	time.Sleep(50 * time.Millisecond)
	release()
	short, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var got [8]byte
	if err := wins[0].Lock(short, 1, false); err != nil {
		t.Fatalf("rank 0 cannot lock live rank 1's window after rank 2 was lost: %v", err)
	}
	if err := errors.Join(wins[0].Get(got[:], 1, 0), wins[0].Unlock(short, 1)); err != nil {
		t.Fatalf("rank 0's Get from rank 1's window after rank 2 was lost: %v", err)
	}
}

// TestLockOfLostRank: a rank lost while it holds a passive-target lock on
// a live rank's window (exclusive with Lock, or shared with LockAll), or
// while its request for one waits there, or comes there, gives the lock
// up: the window grants the ranks that live. Nothing released a lost
// rank's lock, and every other rank's Lock of that window waited until
// its ctx ended. The same holds over a subdevice that matches on its own
// (sdi.FlagMatching), where a probe of the lost rank, by which the window
// learns of the loss, once never failed.
func TestLockOfLostRank(t *testing.T) {
	fabrics := []struct {
		name string
		// worlds starts 3 ranks, and lose loses one of them.
		worlds func(t *testing.T) (ws []*adi.World, lose func(r int))
	}{
		{"loopback", func(t *testing.T) ([]*adi.World, func(int)) {
			ws, f := loopWorlds(t, 3)
			return ws, func(r int) { f.Sever(sdi.Rank(r)) }
		}},
		{"matching", func(t *testing.T) ([]*adi.World, func(int)) {
			ws, f := matchWorlds(t, 3)
			return ws, func(r int) { f.Kill(sdi.Rank(r)) }
		}},
	}
	lockIn := func(ctx context.Context, w *adi.Win) <-chan error { // rank 2's Lock of rank 0, waiting
		done := make(chan error, 1)
		go func() { done <- w.Lock(ctx, 0, true) }()
		time.Sleep(100 * time.Millisecond)
		return done
	}
	for _, tc := range []struct {
		name string
		// before runs before rank 2 is lost, after once it is.
		before func(t *testing.T, ctx context.Context, wins []*adi.Win) (after func())
	}{
		{"held", func(t *testing.T, ctx context.Context, wins []*adi.Win) func() {
			if err := wins[2].Lock(ctx, 0, true); err != nil {
				t.Fatal(err)
			}
			return func() {}
		}},
		{"held by LockAll", func(t *testing.T, ctx context.Context, wins []*adi.Win) func() {
			if err := wins[2].LockAll(ctx); err != nil {
				t.Fatal(err)
			}
			return func() {}
		}},
		{"waiting", func(t *testing.T, ctx context.Context, wins []*adi.Win) func() {
			if err := wins[1].Lock(ctx, 0, true); err != nil {
				t.Fatal(err)
			}
			waiting := lockIn(ctx, wins[2]) // behind rank 1
			return func() {
				if err := wins[1].Unlock(ctx, 0); err != nil {
					t.Fatal(err)
				}
				<-waiting // fails with its rank
			}
		}},
		{"applied once lost", func(t *testing.T, ctx context.Context, wins []*adi.Win) func() {
			release := adi.HoldApply(wins[0]) // the request waits unapplied
			waiting := lockIn(ctx, wins[2])
			return func() {
				release()
				<-waiting
			}
		}},
	} {
		for _, fab := range fabrics {
			t.Run(fab.name+"/"+tc.name, func(t *testing.T) {
				ws, lose := fab.worlds(t)
				cs := comms(ws)
				ctx := ctxT(t)
				wins := windows(t, ctx, cs, 64)
				after := tc.before(t, ctx, wins)
				lose(2)
				time.Sleep(100 * time.Millisecond)
				after()
				short, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				if err := wins[1].Lock(short, 0, true); err != nil {
					t.Fatalf("rank 1's Lock of rank 0's window after rank 2 was lost: %v", err)
				}
				if err := wins[1].Unlock(short, 0); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestFenceInLockEpoch: Fence and Free inside a Lock or LockAll epoch
// fail with ErrRMASync, send nothing, and leave the lock and the window
// as they were: the package promises that of every synchronization call
// made in the wrong epoch, and Fence once returned nil with the lock
// still held.
func TestFenceInLockEpoch(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		w, err := c.WinCreate(ctx, make([]byte, 8))
		if err != nil {
			return err
		}
		if c.Rank() == 0 {
			for _, all := range []bool{false, true} {
				lock, unlock := func() error { return w.Lock(ctx, 1, true) }, func() error { return w.Unlock(ctx, 1) }
				if all {
					lock, unlock = func() error { return w.LockAll(ctx) }, func() error { return w.UnlockAll(ctx) }
				}
				if err := lock(); err != nil {
					return err
				}
				if err := w.Fence(ctx); !errors.Is(err, adi.ErrRMASync) {
					return fmt.Errorf("Fence in a lock epoch (all %v): %v, want ErrRMASync", all, err)
				}
				if err := w.Free(ctx); !errors.Is(err, adi.ErrRMASync) {
					return fmt.Errorf("Free in a lock epoch (all %v): %v, want ErrRMASync", all, err)
				}
				if err := w.Put([]byte("abcdefgh"), 1, 0); err != nil {
					return fmt.Errorf("Put after the refused Fence (all %v): %v", all, err)
				}
				if err := unlock(); err != nil {
					return err
				}
			}
		}
		return w.Free(ctx)
	})
}

// TestWinOverMatchingSubDevice: windows work when the ranks talk through
// a subdevice that matches on its own (sdi.FlagMatching): a window's
// server takes its requests with a matched probe, which such a
// subdevice's messages refuse (errors.ErrUnsupported). The server once
// stopped at the first request, so that every Fence failed and every
// Lock waited until its ctx ended.
func TestWinOverMatchingSubDevice(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(ctx context.Context, w *adi.Win, c *adi.Comm) error
	}{
		{"lock", func(ctx context.Context, w *adi.Win, c *adi.Comm) error {
			if c.Rank() == 1 {
				if err := errors.Join(w.Lock(ctx, 0, true), w.Put([]byte("abcdefgh"), 0, 0), w.Unlock(ctx, 0)); err != nil {
					return fmt.Errorf("rank 1's Lock, Put and Unlock of rank 0's window: %w", err)
				}
			}
			return c.Barrier(ctx)
		}},
		{"put and fence", func(ctx context.Context, w *adi.Win, c *adi.Comm) error {
			return errors.Join(w.Put([]byte("abcdefgh"), 1-c.Rank(), 0), w.Fence(ctx))
		}},
		{"get and flush", func(ctx context.Context, w *adi.Win, c *adi.Comm) error {
			var got [8]byte
			if err := errors.Join(w.LockAll(ctx), w.Get(got[:], 1-c.Rank(), 0), w.FlushAll(ctx), w.UnlockAll(ctx)); err != nil {
				return fmt.Errorf("rank %d's Get from rank %d: %w", c.Rank(), 1-c.Rank(), err)
			}
			return c.Barrier(ctx)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, _ := matchWorlds(t, 2)
			cs := comms(ws)
			// A hang, not a slow call, runs out this ctx.
			ctx, cancel := context.WithTimeout(ctxT(t), 5*time.Second)
			defer cancel()
			wins := windows(t, ctx, cs, 8)
			each(t, cs, func(c *adi.Comm) error { return tc.run(ctx, wins[c.Rank()], c) })
			freeWindows(t, ctx, cs, wins)
		})
	}
}

// TestWinStoppedServerFailsWaits: once a window's server has stopped (an
// operation it could not receive), this rank's calls on the window that
// wait fail with the server's error, at once, not when their ctx ends:
// nothing they wait for may come, and "context deadline exceeded" did
// not say why. (Fence, collective, reports it once every rank is in it,
// as TestWinFinalizeHalted's windows do.)
func TestWinStoppedServerFailsWaits(t *testing.T) {
	why := errors.New("a receive failed, as the test has it")
	for _, tc := range []struct {
		name string
		call func(ctx context.Context, w *adi.Win) error
	}{
		{"lock", func(ctx context.Context, w *adi.Win) error { return w.Lock(ctx, 0, true) }},
		{"flush", func(ctx context.Context, w *adi.Win) error {
			var got [8]byte
			return errors.Join(w.LockAll(ctx), w.Get(got[:], 0, 0), w.FlushAll(ctx))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, _ := loopWorlds(t, 2)
			cs := comms(ws)
			wins := windows(t, ctxT(t), cs, 8)
			// Both servers stop: rank 1's requests to rank 0 are never
			// applied, and rank 1's own server is what says so.
			adi.Halt(wins[0], why)
			adi.Halt(wins[1], why)
			ctx, cancel := context.WithTimeout(ctxT(t), 5*time.Second)
			defer cancel()
			if err := tc.call(ctx, wins[1]); !errors.Is(err, why) {
				t.Errorf("%s on a window whose server stopped: %v, want the server's error", tc.name, err)
			}
		})
	}
}
