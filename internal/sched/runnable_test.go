package sched

import (
	"runtime"
	"testing"
)

// Runnable sees a goroutine that waits for the one processor there is.
func TestRunnable(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	if Runnable() {
		t.Skip("something else of the test binary waits for a processor")
	}
	ready := make(chan struct{})
	done := make(chan struct{})
	go func() {
		close(ready)
		<-done
	}()
	// With one processor the new goroutine waits for this one to yield
	// or block: it is runnable until then.
	if !Runnable() {
		t.Error("a goroutine made ready did not count as runnable")
	}
	<-ready
	close(done)
}
