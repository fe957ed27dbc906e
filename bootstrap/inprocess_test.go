package bootstrap

import (
	"context"
	"errors"
	"fmt"
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
