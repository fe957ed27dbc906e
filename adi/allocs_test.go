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
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64)
		for {
			st, err := cs[1].Recv(ctx, buf, 0, adi.AnyTag)
			if err != nil {
				t.Error(err)
				return
			}
			if st.Tag == 1 { // stop
				return
			}
			if err := cs[1].Send(ctx, buf[:st.Count], 0, 0); err != nil {
				t.Error(err)
				return
			}
		}
	}()
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
	if err := cs[0].Send(ctx, nil, 1, 1); err != nil {
		t.Fatal(err)
	}
	<-done
	if allocs != 0 {
		t.Fatalf("%.0f allocations per eager round trip, want 0", allocs)
	}
}
