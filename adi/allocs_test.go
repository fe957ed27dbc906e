// The race detector makes sync.Pool drop items on purpose, so allocation
// counts mean nothing under it.

//go:build !race

package adi_test

import (
	"testing"
)

// TestEagerSendRecvAllocatesNothing checks that, once warmed up, a blocking
// eager ping-pong over shm allocates nothing per message, in either rank:
// frames, headers, requests and unexpected-message buffers are recycled.
func TestEagerSendRecvAllocatesNothing(t *testing.T) {
	cs := shmJob(t, 2)
	ctx := ctxT(t)
	stop := echo(t, ctx, cs[0], cs[1])
	msg, buf := make([]byte, 8), make([]byte, 64)
	pingPong := func() {
		if err := cs[0].Send(ctx, msg, 1, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := cs[0].Recv(ctx, buf, 1, 0); err != nil {
			t.Fatal(err)
		}
	}
	for range 1000 { // fill the pools
		pingPong()
	}
	allocs := testing.AllocsPerRun(2000, pingPong)
	stop()
	if allocs != 0 {
		t.Fatalf("%.0f allocations per eager round trip, want 0", allocs)
	}
}
