package leakcheck

import (
	"strings"
	"testing"
)

func parked(stop chan struct{}) { <-stop }

func TestGoroutines(t *testing.T) {
	stop := make(chan struct{})
	go parked(stop)
	if got := Goroutines("leakcheck.parked"); !strings.Contains(got, "leakcheck.parked") {
		t.Fatalf("a parked goroutine was not found: %q", got)
	}
	close(stop)
	if got := Goroutines("leakcheck.parked"); got != "" {
		t.Fatalf("a goroutine that returned is still reported: %q", got)
	}
}
