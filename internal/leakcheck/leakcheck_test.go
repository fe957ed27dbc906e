package leakcheck

import (
	"strings"
	"testing"
)

func parked(started, stop chan struct{}) {
	close(started)
	<-stop
}

func TestGoroutines(t *testing.T) {
	started, stop := make(chan struct{}), make(chan struct{})
	go parked(started, stop)
	<-started
	if got := Goroutines("leakcheck.parked"); !strings.Contains(got, "leakcheck.parked") {
		t.Fatalf("a parked goroutine was not found: %q", got)
	}
	close(stop)
	if got := Goroutines("leakcheck.parked"); got != "" {
		t.Fatalf("a goroutine that returned is still reported: %q", got)
	}
}
