package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/plugin"
	"github.com/hpc-multidevice/multidevice/subdevices/tcp"
)

// benchHandler counts arrivals and signals when a target is reached, so
// the loop measures the subdevice and not a recorder.
type benchHandler struct {
	arrived atomic.Int64
	target  atomic.Int64
	reached chan struct{}
}

func (h *benchHandler) Deliver(sdi.Rank, []byte, []byte) {
	if n := h.arrived.Add(1); n == h.target.Load() {
		h.reached <- struct{}{}
	}
}
func (h *benchHandler) SendDone(uint64, error)   {}
func (h *benchHandler) PeerDown(sdi.Rank, error) {}

// expect arms the handler for n more arrivals.
func (h *benchHandler) expect(n int64) { h.target.Store(h.arrived.Load() + n) }

type benchPair struct {
	sds [2]sdi.SubDevice
	hs  [2]*benchHandler
}

func openPair(b *testing.B, newSD func() sdi.SubDevice) *benchPair {
	b.Helper()
	p := &benchPair{}
	var locals [2]sdi.Local
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range p.sds {
		p.hs[i] = &benchHandler{reached: make(chan struct{}, 1)}
		p.sds[i] = newSD()
		b.Cleanup(func() { p.sds[i].Close(context.Background()) })
		l, err := p.sds[i].Open(ctx, sdi.OpenParams{Rank: sdi.Rank(i), Size: 2, Host: "bench", JobID: "bench", Secret: []byte("s"),
			APIVersion: sdi.APIVersion, Handler: p.hs[i], Config: []byte(`{"listen": "127.0.0.1:0"}`)})
		if err != nil {
			b.Fatal(err)
		}
		locals[i] = l
	}
	for i := range p.sds {
		if err := p.sds[i].Connect(ctx, sdi.Rank(1-i), locals[1-i].Addr); err != nil {
			b.Fatal(err)
		}
	}
	return p
}

// send retries ErrWouldBlock, as the multidevice does.
func send(sd sdi.SubDevice, f *sdi.Frame) error {
	for i := 0; ; i++ {
		_, err := sd.Send(f)
		if !errors.Is(err, sdi.ErrWouldBlock) {
			return err
		}
		if i < 50 {
			runtime.Gosched()
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

func await(h *benchHandler) error {
	select {
	case <-h.reached:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("gave up waiting for %d frames (have %d)", h.target.Load(), h.arrived.Load())
	}
}

// latency returns the one-way latency of size-byte frames: half the mean
// round trip of n ping-pongs.
func (p *benchPair) latency(size, n int) (time.Duration, error) {
	buf := make([]byte, size)
	hdr := make([]byte, 16)
	start := time.Now()
	for range n {
		p.hs[1].expect(1)
		if err := send(p.sds[0], &sdi.Frame{Peer: 1, Header: hdr, Payload: buf}); err != nil {
			return 0, err
		}
		if err := await(p.hs[1]); err != nil {
			return 0, err
		}
		p.hs[0].expect(1)
		if err := send(p.sds[1], &sdi.Frame{Peer: 0, Header: hdr, Payload: buf}); err != nil {
			return 0, err
		}
		if err := await(p.hs[0]); err != nil {
			return 0, err
		}
	}
	return time.Since(start) / time.Duration(2*n), nil
}

// bandwidth streams n size-byte frames one way and returns bytes/s at the
// receiver. Frames go out as fast as the subdevice accepts them; with
// done=false the buffer is not touched again, so one buffer serves all.
func (p *benchPair) bandwidth(size, n int) (float64, error) {
	buf := make([]byte, size)
	hdr := make([]byte, 16)
	p.hs[1].expect(int64(n))
	start := time.Now()
	for i := range n {
		if err := send(p.sds[0], &sdi.Frame{Peer: 1, Header: hdr, Payload: buf, Token: uint64(i)}); err != nil {
			return 0, err
		}
	}
	if err := await(p.hs[1]); err != nil {
		return 0, err
	}
	return float64(size*n) / time.Since(start).Seconds(), nil
}

// BenchmarkPluginTCP compares the tcp subdevice served by its plugin binary
// (cmd/sdi-tcp, shared-memory data plane) with the built-in one, both over
// IPv4 loopback in this process, interleaved in one run:
//
//	go test -run '^$' -bench PluginTCP -benchtime 1x ./sdi/plugin
//
// It prints the medians of reps rounds and reports the ratios as metrics:
// lat-ratio is plugin/built-in one-way latency at 8 bytes (target <= 1.5),
// bw-% is plugin/built-in bandwidth at 1 MiB (target >= 80).
// MD_BENCH_REPS sets the rounds (default 11).
func BenchmarkPluginTCP(b *testing.B) {
	bin := buildPlugin(b, "cmd/sdi-tcp")
	reps := 11
	if s := os.Getenv("MD_BENCH_REPS"); s != "" {
		fmt.Sscan(s, &reps)
	}
	for b.Loop() {
		pairs := []*benchPair{
			openPair(b, func() sdi.SubDevice { return tcp.New(nil) }),
			openPair(b, func() sdi.SubDevice {
				sd, err := plugin.Start(context.Background(), plugin.Config{Name: "tcp", Path: bin})
				if err != nil {
					b.Fatal(err)
				}
				return sd
			}),
		}
		names := []string{"built-in", "plugin"}
		lat := make([][]time.Duration, 2)
		bw := make([][]float64, 2)
		for _, p := range pairs { // warm up connections, rings and caches
			if _, err := p.latency(8, 200); err != nil {
				b.Fatal(err)
			}
			if _, err := p.bandwidth(1<<20, 16); err != nil {
				b.Fatal(err)
			}
		}
		for rep := range reps {
			for k := range pairs {
				i := (k + rep) % 2 // alternate which goes first
				l, err := pairs[i].latency(8, 2000)
				if err != nil {
					b.Fatalf("%s latency: %v", names[i], err)
				}
				lat[i] = append(lat[i], l)
			}
			for k := range pairs {
				i := (k + rep) % 2
				w, err := pairs[i].bandwidth(1<<20, 128)
				if err != nil {
					b.Fatalf("%s bandwidth: %v", names[i], err)
				}
				bw[i] = append(bw[i], w)
			}
		}
		ml := []time.Duration{median(lat[0]), median(lat[1])}
		mb := []float64{median(bw[0]), median(bw[1])}
		fmt.Printf("tcp over loopback, medians of %d interleaved rounds\n", reps)
		fmt.Printf("%-10s %14s %16s\n", "", "8 B latency", "1 MiB bandwidth")
		for i, n := range names {
			fmt.Printf("%-10s %14v %12.0f MB/s\n", n, ml[i], mb[i]/1e6)
		}
		latRatio := float64(ml[1]) / float64(ml[0])
		bwPct := 100 * mb[1] / mb[0]
		fmt.Printf("plugin/built-in: latency %.2fx (target <= 1.5x), bandwidth %.0f%% (target >= 80%%)\n", latRatio, bwPct)
		b.ReportMetric(latRatio, "lat-ratio")
		b.ReportMetric(bwPct, "bw-%")
	}
}

func median[T time.Duration | float64](v []T) T {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
