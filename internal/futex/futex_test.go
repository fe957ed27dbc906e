package futex

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestWaitReturnsWhenValueDiffers(t *testing.T) {
	var w uint32 = 7
	// Must return at once: the word does not hold 6. A bug here hangs the
	// test, which the test timeout reports.
	if err := Wait(&w, 6, 0); err != nil {
		t.Fatalf("Wait: %v", err)
	}
}

func TestWaitTimeout(t *testing.T) {
	var w uint32
	if err := Wait(&w, 0, 10*time.Millisecond); err != nil {
		t.Fatalf("Wait with timeout: %v", err)
	}
}

func TestWakeWakesWaiter(t *testing.T) {
	var w uint32
	done := make(chan error, 1)
	go func() {
		for atomic.LoadUint32(&w) == 0 {
			if err := Wait(&w, 0, 0); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	atomic.StoreUint32(&w, 1)
	if _, err := Wake(&w, 1); err != nil {
		t.Fatalf("Wake: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("waiter: %v", err)
	}
}

func TestWakeWithoutWaiters(t *testing.T) {
	var w uint32
	n, err := Wake(&w, 1)
	if err != nil || n != 0 {
		t.Fatalf("Wake with no waiters = %d, %v; want 0, nil", n, err)
	}
}
