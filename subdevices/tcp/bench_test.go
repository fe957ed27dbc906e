package tcp

import (
	"errors"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// chanHandler hands frames to the benchmark loop without copying more than
// needed, so the numbers are the subdevice's, not a recorder's.
type chanHandler struct {
	arrived chan int
	done    atomic.Int64
}

func (h *chanHandler) Deliver(_ sdi.Rank, _, payload []byte) { h.arrived <- len(payload) }
func (h *chanHandler) SendDone(uint64, error)                { h.done.Add(1) }
func (h *chanHandler) PeerDown(sdi.Rank, error)              {}

func benchPair(b *testing.B) (sdi.SubDevice, sdi.SubDevice, *chanHandler, *chanHandler) {
	b.Helper()
	hs := []*chanHandler{{arrived: make(chan int, 1024)}, {arrived: make(chan int, 1024)}}
	sds := make([]sdi.SubDevice, 2)
	locals := make([]sdi.Local, 2)
	for i := range sds {
		sds[i] = New(nil)
		l, err := sds[i].Open(b.Context(), sdi.OpenParams{Rank: sdi.Rank(i), Size: 2, JobID: "bench", Secret: []byte("s"),
			Handler: hs[i], Config: []byte(`{"listen": "127.0.0.1:0"}`)})
		if err != nil {
			b.Fatal(err)
		}
		locals[i] = l
		b.Cleanup(func() { sds[i].Close(b.Context()) })
	}
	for i := range sds {
		if err := sds[i].Connect(b.Context(), sdi.Rank(1-i), locals[1-i].Addr); err != nil {
			b.Fatal(err)
		}
	}
	return sds[0], sds[1], hs[0], hs[1]
}

// BenchmarkPingPong measures round trips; half of ns/op is the one-way
// latency.
func BenchmarkPingPong(b *testing.B) {
	for _, size := range []int{1, 4 << 10, 64 << 10} {
		b.Run(strconv.Itoa(size), func(b *testing.B) {
			a, c, ha, hc := benchPair(b)
			buf := make([]byte, size)
			b.SetBytes(int64(2 * size))
			for b.Loop() {
				sendBench(b, a, &sdi.Frame{Peer: 1, Payload: buf})
				<-hc.arrived
				sendBench(b, c, &sdi.Frame{Peer: 0, Payload: buf})
				<-ha.arrived
			}
		})
	}
}

// BenchmarkStream measures one-way throughput with the queue kept full.
func BenchmarkStream(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10, 1 << 20} {
		b.Run(strconv.Itoa(size), func(b *testing.B) {
			a, _, _, hc := benchPair(b)
			buf := make([]byte, size)
			b.SetBytes(int64(size))
			got := make(chan struct{})
			n := b.N
			go func() {
				for range n {
					<-hc.arrived
				}
				close(got)
			}()
			b.ResetTimer()
			for range n {
				sendBench(b, a, &sdi.Frame{Peer: 1, Payload: buf})
			}
			<-got
		})
	}
}

func sendBench(b *testing.B, sd sdi.SubDevice, f *sdi.Frame) {
	for {
		_, err := sd.Send(f)
		if err == nil {
			return
		}
		if !errors.Is(err, sdi.ErrWouldBlock) {
			b.Fatal(err)
		}
		runtime.Gosched() // let the writer drain; there are only two cores
	}
}

// BenchmarkPollIdlePeers: ranks 0 and 1 play ping-pong with 8-byte frames,
// one goroutine polling each in turn, in jobs where every rank is
// connected to every other; the others stay idle. ns/op is a round trip.
// Reading every inbound connection ("read-each") costs a system call per
// idle connection per poll; the poll set (the default beyond pollScanMax
// connections) asks once which connections have something.
func BenchmarkPollIdlePeers(b *testing.B) {
	for _, n := range []int{2, 8, 32} {
		for _, mode := range []struct {
			name    string
			scanMax int
		}{{"read-each", 1 << 30}, {"poll-set", pollScanMax}} {
			b.Run(strconv.Itoa(n)+"-ranks/"+mode.name, func(b *testing.B) {
				old := pollScanMax
				b.Cleanup(func() { pollScanMax = old }) // after the job closed
				pollScanMax = mode.scanMax
				nodes := newJob(b, n, jobOpts{})
				a, c := nodes[0], nodes[1]
				pa, pc := a.sd.(sdi.Poller), c.sd.(sdi.Poller)
				buf := make([]byte, 8)
				i := 0
				for b.Loop() {
					i++
					sendBench(b, a.sd, &sdi.Frame{Peer: 1, Payload: buf})
					for c.rec.count(0) < i {
						pc.Poll()
					}
					sendBench(b, c.sd, &sdi.Frame{Peer: 0, Payload: buf})
					for a.rec.count(1) < i {
						pa.Poll()
					}
				}
			})
		}
	}
}
