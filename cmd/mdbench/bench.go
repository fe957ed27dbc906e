package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
)

// Iteration counts, mirrored in baseline/osu.c so that both sides run the
// same loops. scale multiplies them (--scale). The smallest messages take
// five times OSU's 10000 round trips: over shared memory those last about
// 10 ms, the scale of the pauses a virtual machine's host imposes, and a
// run's median moved by half from one invocation to the next.
func latIters(size int, scale float64) int {
	n := 200
	switch {
	case size <= 64:
		n = 50000
	case size <= 8192:
		n = 10000
	case size <= 262144:
		n = 1000
	}
	return scaled(n, scale)
}

// bwIters is how many windows of window messages of size bytes bw, bibw
// and mr time: OSU's 100 (20 above 64 KiB), or more, so that a test
// carries at least minStreamMsgs messages or minStreamBytes bytes,
// whichever comes first. OSU's 100 windows of 64 small messages took
// 0.5-4 ms here, as short as the disturbances of a rank's own runtime
// (timers, the shm progress goroutine's 1 ms naps, the scheduler's
// ticks): the bare subdevice's 8-byte bw swung from 5 to 127 MB/s
// between repeats within one launch, and from 106 to 132 MB/s with 20
// times as many windows. size and window are at least 1.
// baseline/osu.c computes the same.
func bwIters(size, window int, scale float64) int {
	n := 20
	if size <= 65536 {
		n = 100
	}
	n = max(n, min(ceilDiv(minStreamMsgs, window), ceilDiv(minStreamBytes, size*window)))
	return scaled(n, scale)
}

// The floor under what a streaming test carries (see bwIters).
const (
	minStreamMsgs  = 1 << 17
	minStreamBytes = 256 << 20
)

func ceilDiv(a, b int) int { return (a + b - 1) / b }

func scaled(n int, scale float64) int { return max(1, int(float64(n)*scale)) }

// warmBytes is how much a test sends before it starts the clock, at
// least: twice a default shm ring (1 MiB), so that the timed part finds
// the ring's lines where a long run finds them, having been written
// before, and not in their first lap, which cost a latency test at 512 B
// a quarter more when the sizes before it had not walked the ring.
const warmBytes = 2 << 20

// warmIters is how many untimed iterations come before n timed ones that
// each send perIter bytes: a tenth of n, or as many as carry warmBytes, up
// to n. baseline/osu.c computes the same.
func warmIters(n, perIter int) int {
	return max(n/10+1, min(n, warmBytes/max(perIter, 1)))
}

// Message tags of the benchmark loops.
const (
	tagLat = 1
	tagBW  = 2
	tagAck = 3
	tagIdl = 6
)

// bufLens returns the lengths of the send and receive buffers a rank
// allocates to run tests at sizes with window messages in flight. Only
// bw, bibw and mr keep a window of receives posted; lat needs one
// message of each size, and idle and the acknowledgements 8 bytes. The
// collectives allocate buffers of their own. A window of the largest
// messages for every test put ranks measuring latency at 256 MiB out of
// memory.
func bufLens(tests []string, sizes []int, window int) (send, recv int) {
	send = 8
	if slices.ContainsFunc(tests, func(t string) bool { return t == "lat" || isStreaming(t) }) {
		for _, s := range sizes {
			send = max(send, s)
		}
	}
	if slices.ContainsFunc(tests, isStreaming) {
		return send, send * max(1, window)
	}
	return send, send
}

// isStreaming reports whether test keeps a window of messages in flight.
func isStreaming(test string) bool { return test == "bw" || test == "bibw" || test == "mr" }

// mdRank runs the benchmarks over the multidevice, through adi as an
// application would.
type mdRank struct {
	c     *adi.Comm
	scale float64
	sbuf  []byte
	rbuf  []byte
}

// lat is the OSU latency loop between ranks 0 and 1: half a round trip, µs.
func (m *mdRank) lat(ctx context.Context, size int) (float64, error) {
	c := m.c
	n := latIters(size, m.scale)
	warm := warmIters(n, size)
	sb, rb := m.sbuf[:size], m.rbuf[:size]
	var t0 time.Time
	for i := range n + warm {
		if i == warm {
			if err := m.c.Barrier(ctx); err != nil {
				return 0, err
			}
			t0 = time.Now()
		}
		switch c.Rank() {
		case 0:
			if err := c.Send(ctx, sb, 1, tagLat); err != nil {
				return 0, err
			}
			if _, err := c.Recv(ctx, rb, 1, tagLat); err != nil {
				return 0, err
			}
		case 1:
			if _, err := c.Recv(ctx, rb, 0, tagLat); err != nil {
				return 0, err
			}
			if err := c.Send(ctx, sb, 0, tagLat); err != nil {
				return 0, err
			}
		}
	}
	return float64(time.Since(t0).Nanoseconds()) / 1e3 / float64(2*n), nil
}

// stream is the OSU bandwidth loop from sender to receiver (both ways with
// bidir): window messages in flight per iteration, then an acknowledgement.
// It returns MB/s (10^6 bytes per second).
func (m *mdRank) stream(ctx context.Context, sender, receiver, size, window int, bidir bool) (float64, error) {
	c := m.c
	n := bwIters(size, window, m.scale)
	warm := warmIters(n, size*window)
	me := c.Rank()
	// Requests are reused from one iteration to the next, as an
	// application streaming messages would, so that the loop measures
	// the library rather than the garbage collector.
	pool := make([]adi.Request, 2*window)
	reqs := make([]*adi.Request, 0, 2*window)
	next := func() *adi.Request { q := &pool[len(reqs)]; reqs = append(reqs, q); return q }
	var t0 time.Time
	for i := range n + warm {
		if i == warm {
			if err := m.c.Barrier(ctx); err != nil {
				return 0, err
			}
			t0 = time.Now()
		}
		reqs = reqs[:0]
		switch {
		case me == sender || (bidir && me == receiver):
			peer := receiver
			if me == receiver {
				peer = sender
			}
			if bidir {
				for w := range window {
					if err := c.IrecvInto(next(), m.rbuf[w*size:(w+1)*size], peer, tagBW); err != nil {
						return 0, err
					}
				}
			}
			for range window {
				if err := c.IsendInto(next(), m.sbuf[:size], peer, tagBW); err != nil {
					return 0, err
				}
			}
			if err := adi.WaitAllInto(ctx, nil, reqs...); err != nil {
				return 0, err
			}
			if !bidir {
				if _, err := c.Recv(ctx, m.rbuf[:4], peer, tagAck); err != nil {
					return 0, err
				}
			}
		case me == receiver:
			for w := range window {
				if err := c.IrecvInto(next(), m.rbuf[w*size:(w+1)*size], sender, tagBW); err != nil {
					return 0, err
				}
			}
			if err := adi.WaitAllInto(ctx, nil, reqs...); err != nil {
				return 0, err
			}
			if err := c.Send(ctx, m.sbuf[:4], sender, tagAck); err != nil {
				return 0, err
			}
		}
	}
	mult := 1.0
	if bidir {
		mult = 2
	}
	return mult * float64(size) * float64(window) * float64(n) / time.Since(t0).Seconds() / 1e6, nil
}

// rate runs stream in every pair (i, i+pairs) at once and returns the
// messages per second of all pairs together, at rank 0.
func (m *mdRank) rate(ctx context.Context, size, window int) (float64, error) {
	c := m.c
	pairs := c.Size() / 2
	me := c.Rank()
	mbs, err := m.stream(ctx, me%pairs, me%pairs+pairs, size, window, false)
	if err != nil {
		return 0, err
	}
	if me >= pairs {
		mbs = 0 // count each pair once, at its sender
	}
	total := make([]float64, 1)
	if err := adi.Reduce(ctx, c, []float64{mbs}, total, adi.Sum, 0); err != nil {
		return 0, err
	}
	return total[0] * 1e6 / float64(size), nil
}

// idle has rank 1 block in Recv for secs seconds and returns the share of
// a core (in %) its process used meanwhile; rank 0 just sleeps and sends.
func (m *mdRank) idle(ctx context.Context, secs float64) (float64, error) {
	c := m.c
	if c.Rank() == 0 {
		time.Sleep(time.Duration(secs * float64(time.Second)))
		return 0, c.Send(ctx, m.sbuf[:8], 1, tagIdl)
	}
	cpu0, t0 := cpuTime(), time.Now()
	if _, err := c.Recv(ctx, m.rbuf[:8], 0, tagIdl); err != nil {
		return 0, err
	}
	return 100 * (cpuTime() - cpu0).Seconds() / time.Since(t0).Seconds(), nil
}

// checkPairs reports a rank count the tests cannot use.
func checkPairs(test string, size int) error {
	if test == "mr" && (size < 2 || size%2 != 0) {
		return fmt.Errorf("message rate needs an even number of ranks, have %d", size)
	}
	return nil
}
