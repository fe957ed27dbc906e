package adi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hpc-multidevice/multidevice/adi"
)

func TestWinShared(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			cs := loopJob(t, n)
			each(t, cs, func(c *adi.Comm) error { return sharedWindowCheck(ctxT(t), c) })
		})
	}
}

// sharedSize is what rank r of n asks WinAllocateShared for: rank 1 of
// three or more asks for nothing, and no size is a multiple of 64.
func sharedSize(r, n int) int {
	if r == 1 && n > 2 {
		return 0
	}
	return 64*(r+1) + 8
}

// sharedWindowCheck: the ranks of c, on one host, share a window. Each
// fills its part, all add to a counter in rank 0's part with atomic
// operations, and each then reads every part directly; Put and Get reach
// the same memory; after Free nothing is left in /dev/shm. In one process
// each rank maps the segment anew, so this checks the sharing of the
// mappings as well as it does across processes.
func sharedWindowCheck(ctx context.Context, c *adi.Comm) error {
	n, me := c.Size(), c.Rank()
	const adds = 1000
	win, mine, err := c.WinAllocateShared(ctx, sharedSize(me, n))
	if err != nil {
		return err
	}
	if len(mine) != sharedSize(me, n) || cap(mine) != len(mine) {
		return fmt.Errorf("rank %d: part of len %d cap %d, want %d", me, len(mine), cap(mine), sharedSize(me, n))
	}
	if me == 0 {
		// Rank 0 unlinked the segment's name before returning.
		if left, _ := filepath.Glob(fmt.Sprintf("/dev/shm/mdshm.*.win.%d.*", os.Getpid())); len(left) > 0 {
			return fmt.Errorf("segments left in /dev/shm: %v", left)
		}
	}
	for i := range mine {
		if mine[i] != 0 {
			return fmt.Errorf("rank %d: part not zeroed at %d", me, i)
		}
		mine[i] = byte(me + 1)
	}
	zero, err := win.SharedQuery(0)
	if err != nil {
		return err
	}
	if err := c.Barrier(ctx); err != nil { // rank 0 filled its part first
		return err
	}
	words, err := adi.Elems[int64](zero[:8])
	if err != nil {
		return err
	}
	counter := &words[0]
	for range adds {
		atomic.AddInt64(counter, 1)
	}
	if err := c.Barrier(ctx); err != nil {
		return err
	}
	if got, want := atomic.LoadInt64(counter), int64(0x0101010101010101)+int64(n*adds); got != want {
		return fmt.Errorf("rank %d: counter %#x, want %#x", me, got, want)
	}
	for r := range n {
		part, err := win.SharedQuery(r)
		if err != nil {
			return err
		}
		if len(part) != sharedSize(r, n) {
			return fmt.Errorf("rank %d: rank %d's part has %d bytes, want %d", me, r, len(part), sharedSize(r, n))
		}
		if len(part) > 0 && uintptr(unsafe.Pointer(&part[0]))%64 != 0 {
			return fmt.Errorf("rank %d: rank %d's part at %p, not on a 64-byte boundary", me, r, &part[0])
		}
		from := 0
		if r == 0 {
			from = 8
		}
		if want := bytes.Repeat([]byte{byte(r + 1)}, len(part)-from); !bytes.Equal(part[from:], want) {
			return fmt.Errorf("rank %d: rank %d's part reads %v, want %v", me, r, part[from:], want)
		}
	}
	if first, err := win.SharedQuery(adi.ProcNull); err != nil || len(first) == 0 || &first[0] != &zero[0] {
		return fmt.Errorf("rank %d: SharedQuery(ProcNull) = %p, %v; want rank 0's part at %p", me, first, err, zero)
	}
	// A Put lands in the target's shared part, and a Get reads what a
	// rank stored directly.
	last := n - 1
	if err := win.Fence(ctx); err != nil {
		return err
	}
	if me == 0 {
		if err := win.Put([]byte("put"), last, 8); err != nil {
			return err
		}
	}
	if err := win.Fence(ctx); err != nil {
		return err
	}
	lastPart, err := win.SharedQuery(last)
	if err != nil {
		return err
	}
	if got := string(lastPart[8:11]); got != "put" {
		return fmt.Errorf("rank %d: rank %d's part holds %q after a Put, want \"put\"", me, last, got)
	}
	if me == last {
		copy(mine[16:], "stored")
	}
	if err := win.Fence(ctx); err != nil {
		return err
	}
	got := make([]byte, 6)
	if err := win.Get(got, last, 16); err != nil {
		return err
	}
	if err := win.Fence(ctx); err != nil {
		return err
	}
	if string(got) != "stored" {
		return fmt.Errorf("rank %d: Get from rank %d's part gave %q, want \"stored\"", me, last, got)
	}
	if err := win.Free(ctx); err != nil {
		return err
	}
	if _, err := win.SharedQuery(0); err == nil {
		return fmt.Errorf("rank %d: SharedQuery after Free succeeded", me)
	}
	return nil
}

// TestWinSharedErrors: every rank fails alike, and none waits for the
// others, when the ranks span hosts, one asks for a negative size, or the
// window is larger than /dev/shm; a WinCreate window has no shared parts.
func TestWinSharedErrors(t *testing.T) {
	ctx := ctxT(t)
	t.Run("hosts", func(t *testing.T) {
		ws, _ := loopWorldsOn(t, 3, func(r int) string { return []string{"a", "a", "b"}[r] })
		errs := make([]error, 3)
		each(t, comms(ws), func(c *adi.Comm) error {
			_, _, errs[c.Rank()] = c.WinAllocateShared(ctx, 64)
			return nil
		})
		for r, err := range errs {
			if !errors.Is(err, adi.ErrNotShared) || !strings.Contains(err.Error(), `rank 2 is on host "b"`) {
				t.Errorf("rank %d: %v, want ErrNotShared naming rank 2's host", r, err)
			}
		}
		// SplitHost gives communicators that can.
		each(t, comms(ws), func(c *adi.Comm) error {
			h, err := c.SplitHost(ctx)
			if err != nil {
				return err
			}
			win, _, err := h.WinAllocateShared(ctx, 64)
			if err != nil {
				return err
			}
			return win.Free(ctx)
		})
	})
	for _, tc := range []struct {
		name  string
		sizes func(t *testing.T) []int // each rank's; called on the test's goroutine, which may skip
		want  []string                 // each rank's error contains it
	}{
		{"negative", func(*testing.T) []int { return []int{8, -1, 8} }, []string{"rank 1 asked for -1 bytes", "rank 1 asked for -1 bytes", "rank 1 asked for -1 bytes"}},
		{"beyond /dev/shm", func(t *testing.T) []int { return []int{beyondShm(t), 0, 8} },
			[]string{"reserve memory", "rank 0 could not create the segment", "rank 0 could not create the segment"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sizes := tc.sizes(t)
			cs := loopJob(t, 3)
			errs := make([]error, 3)
			each(t, cs, func(c *adi.Comm) error {
				_, _, errs[c.Rank()] = c.WinAllocateShared(ctx, sizes[c.Rank()])
				return nil
			})
			for r, err := range errs {
				if err == nil || !strings.Contains(err.Error(), tc.want[r]) {
					t.Errorf("rank %d: %v, want an error with %q", r, err, tc.want[r])
				}
			}
		})
	}
	t.Run("not shared", func(t *testing.T) {
		cs := loopJob(t, 2)
		each(t, cs, func(c *adi.Comm) error {
			win, _, err := c.WinAllocateShared(ctx, 8)
			if err != nil {
				return err
			}
			if _, err := win.SharedQuery(2); !errors.Is(err, adi.ErrRank) {
				return fmt.Errorf("SharedQuery(2) of 2 ranks: %v, want ErrRank", err)
			}
			if err := win.Free(ctx); err != nil {
				return err
			}
			plain, err := c.WinCreate(ctx, make([]byte, 8))
			if err != nil {
				return err
			}
			if _, err := plain.SharedQuery(0); !errors.Is(err, adi.ErrNotShared) || !strings.Contains(err.Error(), "made by WinCreate") {
				return fmt.Errorf("SharedQuery on WinCreate's window: %v, want ErrNotShared saying who made it", err)
			}
			dyn, err := c.WinCreateDynamic(ctx)
			if err != nil {
				return errors.Join(err, plain.Free(ctx))
			}
			if _, err := dyn.SharedQuery(0); !errors.Is(err, adi.ErrNotShared) || !strings.Contains(err.Error(), "made by WinCreateDynamic") {
				return fmt.Errorf("SharedQuery on WinCreateDynamic's window: %v, want ErrNotShared saying who made it", err)
			}
			return errors.Join(plain.Free(ctx), dyn.Free(ctx))
		})
	})
}

// TestWinSharedFinalize: Finalize unmaps the shared windows nobody freed,
// as it stops their servers.
func TestWinSharedFinalize(t *testing.T) {
	ctx := ctxT(t)
	ws, _ := loopWorlds(t, 2)
	wins := make([]*adi.Win, 2)
	each(t, comms(ws), func(c *adi.Comm) error {
		var err error
		wins[c.Rank()], _, err = c.WinAllocateShared(ctx, 4096)
		return err
	})
	// Mappings of the segment's inode: rank 0 mapped it before it had a
	// name, so /proc/self/maps shows it by inode alone.
	inode := ""
	mapped := func() int {
		maps, err := os.ReadFile("/proc/self/maps")
		if err != nil {
			t.Fatal(err)
		}
		var lines [][]string
		for _, l := range strings.Split(string(maps), "\n") {
			if f := strings.Fields(l); len(f) >= 6 && strings.HasPrefix(f[5], "/dev/shm/") {
				lines = append(lines, f)
				if inode == "" && strings.Contains(f[5], fmt.Sprintf(".win.%d.", os.Getpid())) {
					inode = f[4]
				}
			}
		}
		n := 0
		for _, f := range lines {
			if f[4] == inode {
				n++
			}
		}
		return n
	}
	if n := mapped(); n != 2 {
		t.Fatalf("%d mappings of the window's segment, want one per rank", n)
	}
	each(t, comms(ws), func(c *adi.Comm) error { return ws[c.Rank()].Finalize(ctx) })
	if n := mapped(); n != 0 {
		t.Fatalf("%d mappings of the window's segment left after Finalize", n)
	}
	if _, err := wins[0].SharedQuery(0); err == nil {
		t.Fatal("SharedQuery after Finalize succeeded")
	}
}

func comms(ws []*adi.World) []*adi.Comm {
	cs := make([]*adi.Comm, len(ws))
	for i, w := range ws {
		cs[i] = w.Comm()
	}
	return cs
}

// shmBytes is /dev/shm's size.
func shmBytes(t *testing.T) uint64 {
	var fs unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &fs); err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	return fs.Blocks * uint64(fs.Bsize)
}

// beyondShm is a window size 1 GiB beyond /dev/shm's. It skips where an
// int cannot hold that and the header and alignment a shared window adds
// (a 32-bit platform whose /dev/shm is over 1 GiB): the window would fail
// for its size before it reached /dev/shm.
func beyondShm(t *testing.T) int {
	n := shmBytes(t) + 1<<30
	if n > math.MaxInt-1<<20 {
		t.Skipf("a window 1 GiB beyond /dev/shm's %d bytes is more than an int holds here", n-1<<30)
	}
	return int(n)
}

// TestElems: Elems views bytes as numbers where they are whole and
// aligned, sharing the memory, and refuses them otherwise.
func TestElems(t *testing.T) {
	buf := make([]int64, 4) // 8-byte aligned
	b := adi.Bytes(buf)
	xs, err := adi.Elems[int64](b)
	if err != nil || len(xs) != 4 || &xs[0] != &buf[0] {
		t.Fatalf("Elems[int64] of 32 aligned bytes: %d elements at %p, %v; want 4 at %p", len(xs), xs, err, buf)
	}
	if hs, err := adi.Elems[uint16](b[2:10]); err != nil || len(hs) != 4 {
		t.Fatalf("Elems[uint16] of 8 bytes at an even address: %v, %v", hs, err)
	}
	if zs, err := adi.Elems[float64](b[:0]); err != nil || zs != nil {
		t.Fatalf("Elems of no bytes: %v, %v; want nil, nil", zs, err)
	}
	for _, tc := range []struct {
		name string
		f    func() error
		want string
	}{
		{"not whole", func() error { _, err := adi.Elems[int64](b[:12]); return err }, "12 bytes are not a whole number of int64, 8 bytes each"},
		{"misaligned", func() error { _, err := adi.Elems[int64](b[4:12]); return err }, "not aligned for int64, which needs a multiple of 8"},
		{"complex", func() error { _, err := adi.Elems[complex128](b[:24]); return err }, "not a whole number of complex128, 16 bytes each"},
		// Aligned as Go needs for a uint32 on 32-bit platforms, but not as
		// sync/atomic needs for an int64 there.
		{"aligned for 4 only", func() error { _, err := adi.Elems[uint64](b[4:12]); return err }, "needs a multiple of 8"},
		{"complex64", func() error { _, err := adi.Elems[complex64](b[4:12]); return err }, "needs a multiple of 8"},
	} {
		if err := tc.f(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// TestWinSync: two ranks, each with a mapping of its own of a shared
// window's segment, take turns passing values through their parts: the
// writer stores, calls Sync and enters a Barrier; the reader leaves the
// Barrier, calls Sync and loads. Each Sync is an atomic increment of one
// word in the segment's header, which both mappings show counting every
// rank's Syncs. Sync is legal, and changes nothing shared, on the other
// windows, and fails on a freed one.
func TestWinSync(t *testing.T) {
	const rounds, words = 50, 32
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	parts := make([]uintptr, 2)
	each(t, cs, func(c *adi.Comm) error {
		me := c.Rank()
		win, mine, err := c.WinAllocateShared(ctx, 8*words)
		if err != nil {
			return err
		}
		zero, err := win.SharedQuery(0)
		if err != nil {
			return err
		}
		parts[me] = uintptr(unsafe.Pointer(&zero[0]))
		// The segment starts with the sync word, a header line before
		// rank 0's part.
		word := (*uint64)(unsafe.Add(unsafe.Pointer(&zero[0]), -64))
		other, err := win.SharedQuery(1 - me)
		if err != nil {
			return err
		}
		out, err := adi.Elems[int64](mine)
		if err != nil {
			return err
		}
		in, err := adi.Elems[int64](other)
		if err != nil {
			return err
		}
		for i := range rounds {
			writer := i % 2
			if me == writer {
				for k := range out {
					out[k] = int64(1000*i + k)
				}
				if err := win.Sync(); err != nil {
					return err
				}
			}
			if err := c.Barrier(ctx); err != nil {
				return err
			}
			if me != writer {
				if err := win.Sync(); err != nil {
					return err
				}
				for k, v := range in {
					if v != int64(1000*i+k) {
						return fmt.Errorf("round %d: word %d of rank %d's part reads %d, want %d", i, k, writer, v, 1000*i+k)
					}
				}
			}
			if err := c.Barrier(ctx); err != nil { // the reader is done before the next round's writer stores
				return err
			}
		}
		if got := atomic.LoadUint64(word); got != 2*rounds {
			return fmt.Errorf("rank %d's mapping of the sync word reads %d after %d Syncs in all", me, got, 2*rounds)
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		if err := win.Free(ctx); err != nil {
			return err
		}
		if err := win.Sync(); err == nil || !strings.Contains(err.Error(), "window freed") {
			return fmt.Errorf("Sync after Free: %v", err)
		}
		// The other windows: legal, nothing to share.
		plain, err := c.WinCreate(ctx, make([]byte, 8))
		if err != nil {
			return err
		}
		dyn, err := c.WinCreateDynamic(ctx)
		if err != nil {
			return err
		}
		empty, _, err := c.WinAllocateShared(ctx, 0)
		if err != nil {
			return err
		}
		for _, w := range []*adi.Win{plain, dyn, empty} {
			if err := errors.Join(w.Sync(), w.Free(ctx)); err != nil {
				return err
			}
		}
		return nil
	})
	if parts[0] == parts[1] {
		t.Errorf("both ranks map the segment at %#x: the test needs a mapping each", parts[0])
	}
}
