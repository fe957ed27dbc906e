package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
)

// collTests are the collective benchmarks. They run on --ranks ranks and
// are timed as OSU's osu_allreduce, osu_bcast, osu_barrier and
// osu_alltoall time them; baseline/osu.c runs the same loops.
var collTests = []string{"allreduce", "bcast", "barrier", "alltoall"}

func isCollective(test string) bool { return slices.Contains(collTests, test) }

// collSizes returns the sizes test runs at: barrier carries no message
// and runs once, at size 0; every other test at every size.
func collSizes(test string, sizes []int) []int {
	if test == "barrier" {
		return []int{0}
	}
	return sizes
}

// maxRankBytes bounds what one rank allocates for its buffers (see
// bufLens) or for a collective: alltoall at size s on p ranks needs two
// buffers of s*p bytes.
const maxRankBytes = 1 << 30

// collective times test at size OSU style: after untimed warm-up calls,
// latIters(size) calls, each timed on its own and followed by an untimed
// Barrier so that every call starts with the ranks together (without it a
// broadcast's root would stream calls ahead of its receivers and time how
// fast it can send, not a broadcast; barrier itself runs back to back, as
// osu_barrier does). Each rank averages its calls; the figure, returned
// on rank 0, is the largest of the ranks' averages, µs: a collective is
// over when its slowest rank is done. (OSU prints the mean of the ranks'
// averages by default and their maximum with -f; with two ranks the two
// differ little, with more the maximum is the figure an application that
// waits on every rank sees.)
//
// The sizes are OSU's: allreduce sums size/8 float64s (at least one),
// bcast sends size bytes from rank 0, alltoall sends size bytes to every
// rank (buffers of size*p bytes). Before timing, one call is checked for
// its result, so that a benchmark that moved nothing cannot report a
// fast figure.
func (m *mdRank) collective(ctx context.Context, test string, size int) (float64, error) {
	c := m.c
	p, me := c.Size(), c.Rank()
	var call, check func() error
	perIter := size // bytes a call moves out of a rank, for warmIters
	switch test {
	case "allreduce":
		elems := max(1, size/8)
		in, out := make([]float64, elems), make([]float64, elems)
		call = func() error { return adi.Allreduce(ctx, c, in, out, adi.Sum) }
		check = func() error {
			for i := range in {
				in[i] = float64(me + 1)
			}
			if err := call(); err != nil {
				return err
			}
			want := float64(p * (p + 1) / 2)
			for i, v := range out {
				if v != want {
					return fmt.Errorf("element %d of the sum is %g, want %g", i, v, want)
				}
			}
			return nil
		}
		perIter = 8 * elems
	case "bcast":
		buf := make([]byte, size)
		call = func() error { return c.Bcast(ctx, buf, 0) }
		check = func() error {
			if me == 0 {
				for i := range buf {
					buf[i] = byte(i*7 + 1)
				}
			} else {
				clear(buf)
			}
			if err := call(); err != nil {
				return err
			}
			for i, b := range buf {
				if b != byte(i*7+1) {
					return fmt.Errorf("byte %d is %d, want %d", i, b, byte(i*7+1))
				}
			}
			return nil
		}
	case "barrier":
		call = func() error { return c.Barrier(ctx) }
		check = call
		perIter = 0
	case "alltoall":
		send, recv := make([]byte, size*p), make([]byte, size*p)
		call = func() error { return c.Alltoall(ctx, send, recv) }
		check = func() error {
			for r := range p {
				for i := range size {
					send[r*size+i] = byte(me*31 + r*7 + i)
				}
			}
			if err := call(); err != nil {
				return err
			}
			for r := range p {
				for i := range size {
					if want := byte(r*31 + me*7 + i); recv[r*size+i] != want {
						return fmt.Errorf("byte %d from rank %d is %d, want %d", i, r, recv[r*size+i], want)
					}
				}
			}
			return nil
		}
		perIter = size * (p - 1)
	default:
		return 0, fmt.Errorf("unknown test %q", test)
	}
	if err := check(); err != nil {
		return 0, fmt.Errorf("wrong result: %w", err)
	}
	n := latIters(size, m.scale)
	warm := warmIters(n, perIter)
	sync := test != "barrier"
	if err := c.Barrier(ctx); err != nil {
		return 0, err
	}
	var total time.Duration
	for i := range n + warm {
		t0 := time.Now()
		if err := call(); err != nil {
			return 0, err
		}
		if d := time.Since(t0); i >= warm {
			total += d
		}
		if sync {
			if err := c.Barrier(ctx); err != nil {
				return 0, err
			}
		}
	}
	mine := []float64{float64(total.Nanoseconds()) / 1e3 / float64(n)}
	worst := []float64{math.NaN()}
	if err := adi.Reduce(ctx, c, mine, worst, adi.Max, 0); err != nil {
		return 0, fmt.Errorf("gather the ranks' averages: %w", err)
	}
	return worst[0], nil
}
