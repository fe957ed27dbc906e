package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestInProcess: ranks sharing a process exchange keys through fences, see
// their hosts, and an abort fails a fence that can no longer complete.
func TestInProcess(t *testing.T) {
	bs, err := InProcess(3, func(r int) string { return fmt.Sprint("h", r%2) })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for r, b := range bs {
		wg.Go(func() {
			if err := b.Put("card", []byte(fmt.Sprint("card-", r))); err != nil {
				t.Error(err)
			}
			if err := b.Fence(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for r := range bs {
		got, err := bs[0].Get(ctx, r, "card")
		if err != nil || string(got) != fmt.Sprint("card-", r) {
			t.Errorf("rank %d's card: %q %v", r, got, err)
		}
	}
	if bs[2].Host() != "h0" || bs[1].Host() != "h1" || bs[0].JobID() != bs[2].JobID() {
		t.Errorf("identity: hosts %q %q, job ids %q %q", bs[2].Host(), bs[1].Host(), bs[0].JobID(), bs[2].JobID())
	}
	if _, err := bs[1].Get(ctx, 0, "missing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing key: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- bs[0].Fence(ctx) }()
	if err := bs[2].Abort(4, "gave up"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Errorf("fence after another rank aborted: %v, want ErrClosed", err)
	}
	if _, err := InProcess(0, nil); err == nil {
		t.Error("a job of 0 ranks was created")
	}
}

// TestInProcessLeftRank: once a rank has closed or aborted, no fence can
// complete, and every fence fails naming it instead of hanging (as under
// mdrun, see TestFinalizedRankFailsLaterFences), including one whose
// arrival would complete the barrier. A rank that leaves after a barrier
// completed does not fail the ranks that passed it.
func TestInProcessLeftRank(t *testing.T) {
	tests := []struct {
		name  string
		leave func(Bootstrap)
		want  string
	}{
		{"close", func(b Bootstrap) { b.Close() }, "rank 0 closed"},
		{"abort", func(b Bootstrap) { b.Abort(3, "bad") }, "rank 0 aborted with code 3: bad"},
		// The code a launcher would end the job with, as the other
		// backends report it.
		{"abort with code 256", func(b Bootstrap) { b.Abort(256, "bad") }, "rank 0 aborted with code 1: bad"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bs, err := InProcess(3, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// Rank 0 leaves right after a barrier that it completed.
			errs := make(chan error, 2)
			for _, b := range bs[1:] {
				go func() { errs <- b.Fence(ctx) }()
			}
			waitInArrivals(bs[0], 2)
			if err := bs[0].Fence(ctx); err != nil {
				t.Fatal(err)
			}
			tt.leave(bs[0])
			for range 2 {
				if err := <-errs; err != nil {
					t.Errorf("fence that completed before rank 0 left: %v", err)
				}
			}
			// Ranks 1 and 2 fail; then rank 0, whose arrival would
			// complete the barrier after an abort, fails too.
			for _, b := range bs[1:] {
				go func() { errs <- b.Fence(ctx) }()
			}
			for range 2 {
				if err := <-errs; err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrClosed) {
					t.Errorf("fence after rank 0 left: %v; want ErrClosed with %q", err, tt.want)
				}
			}
			if err := bs[0].Fence(ctx); !errors.Is(err, ErrClosed) {
				t.Errorf("rank 0's fence after it left: %v; want ErrClosed", err)
			}
		})
	}
}

// TestInProcessCloseWakesFence: a rank waiting in a fence when another
// closes is woken, and fails naming it.
func TestInProcessCloseWakesFence(t *testing.T) {
	bs, err := InProcess(2, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The deadline is a watchdog: the fence must fail long before it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- bs[1].Fence(ctx) }()
	waitInArrivals(bs[0], 1)
	if err := bs[0].Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil || !strings.Contains(err.Error(), "rank 0 closed") {
		t.Errorf("fence waiting when rank 0 closed: %v; want an error naming rank 0", err)
	}
}

// waitInArrivals waits until n ranks of b's job wait in the fence.
func waitInArrivals(b Bootstrap, n int) {
	j := b.(*inRank).job
	for {
		j.mu.Lock()
		arrived := j.arrived
		j.mu.Unlock()
		if arrived == n {
			return
		}
		time.Sleep(time.Millisecond)
	}
}
