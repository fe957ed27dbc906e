package adi_test

import (
	"testing"

	"github.com/hpc-multidevice/multidevice/adi"
)

// BenchmarkShmPingPong is an eager ping-pong between two ranks of this
// process over shm, through the blocking Send and Recv; half of ns/op is
// the one-way latency. cmd/mdbench measures between processes.
func BenchmarkShmPingPong(b *testing.B) {
	cs := shmJob(b, 2)
	ctx := ctxT(b)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64)
		for {
			st, err := cs[1].Recv(ctx, buf, 0, adi.AnyTag)
			if err != nil || st.Tag == 1 {
				return
			}
			if err := cs[1].Send(ctx, buf[:st.Count], 0, 0); err != nil {
				return
			}
		}
	}()
	msg, buf := make([]byte, 8), make([]byte, 64)
	b.ReportAllocs()
	for b.Loop() {
		if err := cs[0].Send(ctx, msg, 1, 0); err != nil {
			b.Fatal(err)
		}
		if _, err := cs[0].Recv(ctx, buf, 1, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := cs[0].Send(ctx, nil, 1, 1); err != nil {
		b.Fatal(err)
	}
	<-done
}
