package shm

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// benchHandler counts deliveries and signals every one; it keeps nothing.
type benchHandler struct{ got chan struct{} }

func (h *benchHandler) Deliver(sdi.Rank, []byte, []byte) { h.got <- struct{}{} }
func (h *benchHandler) SendDone(uint64, error)           {}
func (h *benchHandler) PeerDown(sdi.Rank, error)         {}

func benchJob(b *testing.B) (sds [2]sdi.SubDevice, hs [2]*benchHandler) {
	j := openJob(b, 2, jobOpts{})
	for r := range 2 {
		sds[r] = j.sds[r]
		hs[r] = &benchHandler{got: make(chan struct{}, 1<<16)}
		// Swap in the counting handler before traffic starts: the
		// progress goroutine reads handler only when a frame arrives.
		j.sds[r].(*device).handler = hs[r]
	}
	return sds, hs
}

func trySend(sd sdi.SubDevice, f *sdi.Frame) {
	for {
		if _, err := sd.Send(f); !errors.Is(err, sdi.ErrWouldBlock) {
			return
		}
		runtime.Gosched()
	}
}

// BenchmarkPingPong measures a round trip between two ranks in one process;
// half of ns/op is the one-way latency.
func BenchmarkPingPong(b *testing.B) {
	for _, size := range []int{8, 1024, 16 << 10} {
		b.Run(fmt.Sprintf("bytes=%d", size), func(b *testing.B) {
			sds, hs := benchJob(b)
			ping := &sdi.Frame{Peer: 1, Payload: make([]byte, size)}
			pong := &sdi.Frame{Peer: 0, Payload: make([]byte, size)}
			stop := make(chan struct{})
			go func() {
				for {
					select {
					case <-hs[1].got:
						trySend(sds[1], pong)
					case <-stop:
						return
					}
				}
			}()
			b.SetBytes(int64(size))
			b.ResetTimer()
			for b.Loop() {
				trySend(sds[0], ping)
				<-hs[0].got
			}
			close(stop)
		})
	}
}

// BenchmarkStream measures one-way throughput from rank 0 to rank 1.
func BenchmarkStream(b *testing.B) {
	for _, size := range []int{1024, 64 << 10} {
		b.Run(fmt.Sprintf("bytes=%d", size), func(b *testing.B) {
			sds, hs := benchJob(b)
			f := &sdi.Frame{Peer: 1, Payload: make([]byte, size)}
			done := make(chan struct{})
			n := b.N
			go func() {
				for range n {
					<-hs[1].got
				}
				close(done)
			}()
			b.SetBytes(int64(size))
			b.ResetTimer()
			for range n {
				trySend(sds[0], f)
			}
			<-done
		})
	}
}

// copyHandler copies each payload out, as a receiver's library would.
// The progress goroutine may deliver too, hence the atomic count.
type copyHandler struct {
	buf []byte
	n   atomic.Int64
}

func (h *copyHandler) Deliver(_ sdi.Rank, _, payload []byte) {
	h.n.Add(int64(copy(h.buf, payload)))
}
func (h *copyHandler) SendDone(uint64, error)   {}
func (h *copyHandler) PeerDown(sdi.Rank, error) {}

// BenchmarkSendPollOneGoroutine sends a frame from rank 0 to rank 1 and
// polls rank 1 until it is delivered, on one goroutine: the subdevice's own
// cost per message, without waiting for another core.
func BenchmarkSendPollOneGoroutine(b *testing.B) {
	j := openJob(b, 2, jobOpts{})
	h := &copyHandler{buf: make([]byte, 64)}
	j.sds[1].(*device).handler = h
	hdr := make([]byte, 64) // the multidevice's header size
	f := &sdi.Frame{Peer: 1, Header: hdr, Payload: make([]byte, 8)}
	p := j.sds[1].(sdi.Poller)
	for b.Loop() {
		want := h.n.Load() + 8
		trySend(j.sds[0], f)
		for h.n.Load() < want {
			p.Poll()
		}
	}
}
