package adi_test

import (
	"context"
	"errors"
	"testing"

	"github.com/hpc-multidevice/multidevice/adi"
)

// BenchmarkShmPingPong is an eager ping-pong between two ranks of this
// process over shm, through the blocking Send and Recv; half of ns/op is
// the one-way latency. cmd/mdbench measures between processes.
func BenchmarkShmPingPong(b *testing.B) {
	cs := shmJob(b, 2)
	ctx := ctxT(b)
	stop := echo(b, ctx, cs[0], cs[1])
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
	stop()
}

// echo makes to send back every message it gets from from, until a message
// with tag 1; stop sends that message and waits for the echo to end.
func echo(tb testing.TB, ctx context.Context, from, to *adi.Comm) (stop func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64)
		for {
			st, err := to.Recv(ctx, buf, from.Rank(), adi.AnyTag)
			if err != nil {
				tb.Error(err)
				return
			}
			if st.Tag == 1 {
				return
			}
			if err := to.Send(ctx, buf[:st.Count], from.Rank(), 0); err != nil {
				tb.Error(err)
				return
			}
		}
	}()
	return func() {
		if err := from.Send(ctx, nil, to.Rank(), 1); err != nil {
			tb.Fatal(err)
		}
		<-done
	}
}

// BenchmarkShmSendRecvOneGoroutine sends an eager message from rank 0 to
// rank 1 and receives it, both on the calling goroutine, so no time goes
// into waiting for another core: ns/op is what the library spends per
// message on both ends. Compare with shm's BenchmarkSendPollOneGoroutine,
// the bare subdevice doing the same.
func BenchmarkShmSendRecvOneGoroutine(b *testing.B) {
	cs := shmJob(b, 2)
	ctx := ctxT(b)
	msg, buf := make([]byte, 8), make([]byte, 64)
	b.ReportAllocs()
	for b.Loop() {
		if err := cs[0].Send(ctx, msg, 1, 0); err != nil {
			b.Fatal(err)
		}
		if _, err := cs[1].Recv(ctx, buf, 0, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkShmWindowOneGoroutine posts a window of receives on rank 1,
// sends a window of eager messages from rank 0 and waits for all, on the
// calling goroutine, with requests reused as an application streaming
// messages would reuse them: ns/op is the library's cost per message on
// both ends of a message-rate loop.
func BenchmarkShmWindowOneGoroutine(b *testing.B) {
	const window = 64
	cs := shmJob(b, 2)
	ctx := ctxT(b)
	msg, buf := make([]byte, 8), make([]byte, 8*window)
	reqs := reusedRequests(2 * window) // receives, then sends
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		w := n % window
		if w == 0 && n > 0 {
			if err := adi.WaitAllInto(ctx, nil, reqs...); err != nil {
				b.Fatal(err)
			}
		}
		if err := cs[1].IrecvInto(reqs[w], buf[8*w:8*w+8], 0, 0); err != nil {
			b.Fatal(err)
		}
		if err := cs[0].IsendInto(reqs[window+w], msg, 1, 0); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.StopTimer()
	for i := range min(n, window) { // the last window
		for _, q := range []*adi.Request{reqs[i], reqs[window+i]} {
			if _, err := q.Wait(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// reusedRequests returns n requests that a streaming loop starts again and
// again (IsendInto, IrecvInto) and waits for with WaitAllInto.
func reusedRequests(n int) []*adi.Request {
	reqs := make([]adi.Request, n)
	ptrs := make([]*adi.Request, n)
	for i := range ptrs {
		ptrs[i] = &reqs[i]
	}
	return ptrs
}

// BenchmarkShmAllreduce sums one float64 over two ranks of this process
// over shm; ns/op is a call, allocs/op both ranks' allocations per call.
// "nonblocking" is Iallreduce and Wait: what starting the collective on a
// goroutine of its own costs over the blocking call.
func BenchmarkShmAllreduce(b *testing.B) {
	for _, nb := range []bool{false, true} {
		b.Run(map[bool]string{false: "blocking", true: "nonblocking"}[nb], func(b *testing.B) {
			cs := shmJob(b, 2)
			ctx := ctxT(b)
			sum := func(c *adi.Comm, in, out []float64) error {
				for range b.N {
					if !nb {
						if err := adi.Allreduce(ctx, c, in, out, adi.Sum); err != nil {
							return err
						}
						continue
					}
					q, err := adi.Iallreduce(c, in, out, adi.Sum)
					if err == nil {
						_, err = q.Wait(ctx)
					}
					if err != nil {
						return err
					}
				}
				return nil
			}
			in, out := []float64{1}, []float64{0}
			done := make(chan error)
			b.ReportAllocs()
			b.ResetTimer()
			go func() { done <- sum(cs[1], []float64{2}, []float64{0}) }()
			if err := sum(cs[0], in, out); err != nil {
				b.Fatal(err)
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			if out[0] != 3 {
				b.Fatalf("sum %v, want 3", out[0])
			}
		})
	}
}

// BenchmarkShmExchange has two ranks of this process swap 8 bytes at once,
// as a halo exchange does: Irecv, Isend, Wait both. "fresh" takes new
// requests from Irecv and Isend, "reused" keeps two (IrecvInto,
// IsendInto); the difference is what allocating a request per operation
// costs. "sendrecv" is one Sendrecv call, "isendrecv" one Isendrecv and
// its Wait: beside "sendrecv", what the request costs.
func BenchmarkShmExchange(b *testing.B) {
	for _, mode := range []string{"fresh", "reused", "sendrecv", "isendrecv"} {
		reuse := mode == "reused"
		b.Run(mode, func(b *testing.B) {
			cs := shmJob(b, 2)
			ctx := ctxT(b)
			swap := func(c *adi.Comm, peer int) error {
				sb, rb := make([]byte, 8), make([]byte, 8)
				var kept [2]adi.Request
				for range b.N {
					r, s := &kept[0], &kept[1]
					var err error
					switch mode {
					case "sendrecv":
						if _, err := c.Sendrecv(ctx, sb, peer, 5, rb, peer, 5); err != nil {
							return err
						}
						continue
					case "isendrecv":
						q, err := c.Isendrecv(sb, peer, 5, rb, peer, 5)
						if err == nil {
							_, err = q.Wait(ctx)
						}
						if err != nil {
							return err
						}
						continue
					}
					if reuse {
						err = errors.Join(c.IrecvInto(r, rb, peer, 5), c.IsendInto(s, sb, peer, 5))
					} else {
						if r, err = c.Irecv(rb, peer, 5); err == nil {
							s, err = c.Isend(sb, peer, 5)
						}
					}
					if err != nil {
						return err
					}
					if _, err := adi.WaitAll(ctx, r, s); err != nil {
						return err
					}
				}
				return nil
			}
			done := make(chan error)
			b.ReportAllocs()
			b.ResetTimer()
			go func() { done <- swap(cs[1], 0) }()
			if err := swap(cs[0], 1); err != nil {
				b.Fatal(err)
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkShmWindowRead is rank 0 reading rank 1's window per op, both
// ranks of this process on one host: "get" 64 KiB and "get8" 8 bytes
// through Get between two Fences, "shared" 64 KiB from a shared window's
// part with copy between two Barriers, as a program that shares a host's
// memory does.
func BenchmarkShmWindowRead(b *testing.B) {
	const size = 64 << 10
	for _, tc := range []struct {
		name string
		make func(c *adi.Comm) (*adi.Win, error)
		// read is rank 0's op; sync is rank 1's part in it.
		read func(ctx context.Context, w *adi.Win, c *adi.Comm, buf []byte) error
		sync func(ctx context.Context, w *adi.Win, c *adi.Comm) error
	}{
		{"get", func(c *adi.Comm) (*adi.Win, error) { return c.WinCreate(ctxT(b), make([]byte, size)) },
			func(ctx context.Context, w *adi.Win, c *adi.Comm, buf []byte) error {
				return errors.Join(w.Fence(ctx), w.Get(buf, 1, 0), w.Fence(ctx))
			},
			func(ctx context.Context, w *adi.Win, c *adi.Comm) error {
				return errors.Join(w.Fence(ctx), w.Fence(ctx))
			}},
		{"get8", func(c *adi.Comm) (*adi.Win, error) { return c.WinCreate(ctxT(b), make([]byte, size)) },
			func(ctx context.Context, w *adi.Win, c *adi.Comm, buf []byte) error {
				return errors.Join(w.Fence(ctx), w.Get(buf[:8], 1, 0), w.Fence(ctx))
			},
			func(ctx context.Context, w *adi.Win, c *adi.Comm) error {
				return errors.Join(w.Fence(ctx), w.Fence(ctx))
			}},
		{"shared", func(c *adi.Comm) (*adi.Win, error) {
			w, _, err := c.WinAllocateShared(ctxT(b), size)
			return w, err
		},
			func(ctx context.Context, w *adi.Win, c *adi.Comm, buf []byte) error {
				part, err := w.SharedQuery(1)
				if err != nil {
					return err
				}
				if err := c.Barrier(ctx); err != nil {
					return err
				}
				copy(buf, part)
				return c.Barrier(ctx)
			},
			func(ctx context.Context, w *adi.Win, c *adi.Comm) error {
				return errors.Join(c.Barrier(ctx), c.Barrier(ctx))
			}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			cs := shmJob(b, 2)
			ctx := ctxT(b)
			wins := make([]*adi.Win, 2)
			errs := make(chan error, 2)
			for r := range 2 {
				go func() {
					var err error
					wins[r], err = tc.make(cs[r])
					errs <- err
				}()
			}
			for range 2 {
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
			}
			go func() {
				var err error
				for i := 0; i < b.N && err == nil; i++ {
					err = tc.sync(ctx, wins[1], cs[1])
				}
				errs <- errors.Join(err, wins[1].Free(ctx))
			}()
			buf := make([]byte, size)
			b.ResetTimer()
			var err error
			for i := 0; i < b.N && err == nil; i++ {
				err = tc.read(ctx, wins[0], cs[0], buf)
			}
			b.StopTimer()
			if err := errors.Join(err, wins[0].Free(ctx), <-errs); err != nil {
				b.Fatal(err)
			}
		})
	}
}
