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

// TestWaitAllIntoAllocatesNothing checks that a window of reused requests
// waited for with WaitAllInto, statuses kept or ignored, allocates nothing
// once warmed up; WaitAll allocates the statuses it returns.
func TestWaitAllIntoAllocatesNothing(t *testing.T) {
	const window = 8
	cs := shmJob(t, 2)
	ctx := ctxT(t)
	msg, buf := make([]byte, 8), make([]byte, 8*window)
	reqs := reusedRequests(2 * window) // receives, then sends
	sts := make([]adi.Status, 2*window)
	for _, keep := range []bool{true, false} {
		into := sts
		if !keep {
			into = nil
		}
		round := func() {
			for w := range window {
				if err := cs[1].IrecvInto(reqs[w], buf[8*w:8*w+8], 0, w); err != nil {
					t.Fatal(err)
				}
				if err := cs[0].IsendInto(reqs[window+w], msg, 1, w); err != nil {
					t.Fatal(err)
				}
			}
			if err := adi.WaitAllInto(ctx, into, reqs...); err != nil {
				t.Fatal(err)
			}
		}
		for range 200 { // fill the pools
			round()
		}
		if allocs := testing.AllocsPerRun(500, round); allocs != 0 {
			t.Errorf("statuses kept %v: %.1f allocations per window, want 0", keep, allocs)
		}
		if keep && (sts[window-1].Tag != window-1 || sts[window-1].Count != 8 || sts[window-1].Source != 0) {
			t.Errorf("status of the last receive: %+v", sts[window-1])
		}
	}
	if err := adi.WaitAllInto(ctx, make([]adi.Status, 1), reqs...); err == nil {
		t.Error("WaitAllInto with too few statuses succeeded")
	}
}
