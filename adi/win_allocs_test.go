// The race detector makes sync.Pool drop items on purpose, so allocation
// counts mean nothing under it.

//go:build !race

package adi_test

import (
	"context"
	"errors"
	"testing"

	"github.com/hpc-multidevice/multidevice/adi"
)

// TestWinWaitDoneAllocatesNothing: a wait on the window whose requests
// are done, as most of a Fence's are, allocates nothing. Every wait once
// set up its watch of the window's server, a context and an AfterFunc,
// even with nothing left to wait for, which made a Fence-based Get of 8
// bytes twice as slow (BenchmarkShmWindowRead/get8): only a wait that
// must park watches the server.
func TestWinWaitDoneAllocatesNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		wait func(ctx context.Context, w *adi.Win) error
	}{
		{"flush local", func(ctx context.Context, w *adi.Win) error { return w.FlushLocal(ctx) }},
		{"flush all", func(ctx context.Context, w *adi.Win) error { return w.FlushAll(ctx) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := loopJob(t, 2)
			ctx := ctxT(t)
			wins := windows(t, ctx, cs, 64)
			w := wins[0]
			var got [8]byte
			if err := errors.Join(w.LockAll(ctx), w.Put([]byte("abcdefgh"), 1, 0), w.Get(got[:], 1, 0), w.FlushAll(ctx)); err != nil {
				t.Fatal(err)
			}
			var err error
			allocs := testing.AllocsPerRun(100, func() { err = tc.wait(ctx, w) })
			if err != nil {
				t.Fatal(err)
			}
			if allocs != 0 {
				t.Errorf("%.0f allocations per %s with nothing left to wait for, want 0", allocs, tc.name)
			}
			if err := w.UnlockAll(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
