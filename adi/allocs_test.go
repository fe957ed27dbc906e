// The race detector makes sync.Pool drop items on purpose, so allocation
// counts mean nothing under it.

//go:build !race

package adi_test

import (
	"testing"

	"github.com/hpc-multidevice/multidevice/adi"
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

// TestReusedRequestsAllocateNothing checks that nonblocking operations
// started in requests the caller reuses (IsendInto, IrecvInto) allocate
// nothing once warmed up, in either rank.
func TestReusedRequestsAllocateNothing(t *testing.T) {
	cs := shmJob(t, 2)
	ctx := ctxT(t)
	stop := echo(t, ctx, cs[0], cs[1])
	msg, buf := make([]byte, 8), make([]byte, 64)
	var sq, rq adi.Request
	round := func() {
		if err := cs[0].IrecvInto(&rq, buf, 1, 0); err != nil {
			t.Fatal(err)
		}
		if err := cs[0].IsendInto(&sq, msg, 1, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := sq.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := rq.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range 1000 { // fill the pools
		round()
	}
	allocs := testing.AllocsPerRun(2000, round)
	stop()
	if allocs != 0 {
		t.Fatalf("%.1f allocations per Isend+Irecv+Wait round trip with reused requests, want 0", allocs)
	}
}
