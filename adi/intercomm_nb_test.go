package adi_test

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	"github.com/hpc-multidevice/multidevice/adi"
)

// TestIntercommNonblocking: every rank of both groups starts the
// nonblocking collectives one after another, with a blocking one among
// them, and waits for all at once: each gets what the blocking ones would
// give, though they were in flight together, by eager and rendezvous.
func TestIntercommNonblocking(t *testing.T) {
	for _, s := range []split{splits[0], splits[3], splits[6]} {
		for _, n := range []int{8, 3000} {
			t.Run(fmt.Sprintf("%s/%d bytes", s.name, n), func(t *testing.T) {
				xs := intercomms(t, s)
				ctx := ctxT(t)
				last := func(color int) int { m := s.members(color); return m[len(m)-1] }
				eachIC(t, xs, func(x *icRank) error {
					// Roots: group 0's last rank for Ibcast, group 1's for
					// Igather; as each rank passes them.
					root := func(color int) int {
						switch {
						case x.color != color:
							return len(s.members(color)) - 1
						case x.me == last(color):
							return adi.Root
						}
						return adi.ProcNull
					}
					var reqs []*adi.Request
					start := func(r *adi.Request, err error) error {
						reqs = append(reqs, r)
						return err
					}
					all := make([]byte, n*len(x.remote))
					bcast := make([]byte, n)
					if x.me == last(0) {
						copy(bcast, pattern(x.me, 0, n))
					}
					sums := make([]int64, n/8)
					mine := make([]int64, n/8)
					for i := range mine {
						mine[i] = int64(10*x.me + i)
					}
					var gathered []byte
					if x.me == last(1) {
						gathered = make([]byte, n*len(x.remote))
					}
					send, recv := make([]byte, n*len(x.remote)), make([]byte, n*len(x.remote))
					for j, r := range x.remote {
						copy(send[j*n:], pattern(x.me, r, n))
					}
					blocking := make([]byte, n*len(x.remote))
					// Arguments are evaluated left to right: the calls start in this order.
					if err := firstErr(
						start(x.ic.Iallgather(pattern(x.me, 0, n), all)),
						start(x.ic.Ibcast(bcast, root(0))),
						start(adi.IinterAllreduce(x.ic, mine, sums, adi.Sum)),
						x.ic.Allgather(ctx, pattern(x.me, 1, n), blocking),
						start(x.ic.Ibarrier()),
						start(x.ic.Igather(pattern(x.me, 2, n), gathered, root(1))),
						start(x.ic.Ialltoall(send, recv)),
					); err != nil {
						return err
					}
					// A blocking collective after the last nonblocking one:
					// one that ran on ic itself rather than its own copy
					// would take this one's place.
					after := make([]byte, 8*len(x.remote))
					if err := x.ic.Allgather(ctx, pattern(x.me, 3, 8), after); err != nil {
						return err
					}
					if _, err := adi.WaitAll(ctx, reqs...); err != nil {
						return err
					}
					for j, r := range x.remote {
						if !bytes.Equal(after[8*j:8*(j+1)], pattern(r, 3, 8)) {
							return fmt.Errorf("allgather after the nonblocking ones: remote rank %d's block differs", j)
						}
					}
					for j, r := range x.remote {
						if !bytes.Equal(all[j*n:(j+1)*n], pattern(r, 0, n)) || !bytes.Equal(blocking[j*n:(j+1)*n], pattern(r, 1, n)) {
							return fmt.Errorf("allgather: remote rank %d's block differs", j)
						}
						if !bytes.Equal(recv[j*n:(j+1)*n], pattern(r, x.me, n)) {
							return fmt.Errorf("alltoall: remote rank %d's block differs", j)
						}
						if gathered != nil && !bytes.Equal(gathered[j*n:(j+1)*n], pattern(r, 2, n)) {
							return fmt.Errorf("gather: remote rank %d's block differs", j)
						}
					}
					if x.color == 1 && !bytes.Equal(bcast, pattern(last(0), 0, n)) {
						return fmt.Errorf("bcast: got %v", bcast)
					}
					for i, got := range sums {
						want := int64(0)
						for _, r := range x.remote {
							want += int64(10*r + i)
						}
						if got != want {
							return fmt.Errorf("allreduce: element %d is %d, want %d", i, got, want)
						}
					}
					return nil
				})
			})
		}
	}
}

// firstErr is the first of errs that is not nil.
func firstErr(errs ...error) error {
	if i := slices.IndexFunc(errs, func(err error) bool { return err != nil }); i >= 0 {
		return errs[i]
	}
	return nil
}

// TestIntercommNonblockingV: the nonblocking v-form and reduce-scatter
// collectives, started one after another with a blocking one among them
// and in flight together, each get what the blocking ones would give,
// with uneven blocks, empty ones among them, by eager and rendezvous.
func TestIntercommNonblockingV(t *testing.T) {
	for _, s := range []split{vSplits[0], vSplits[1], vSplits[3]} {
		for _, bs := range blockSizes {
			t.Run(fmt.Sprintf("%s/%s", s.name, bs.name), func(t *testing.T) {
				n := bs.n
				xs := intercomms(t, s)
				ctx := ctxT(t)
				last := func(color int) int { m := s.members(color); return m[len(m)-1] }
				p := [2]int{len(s.members(0)), len(s.members(1))}
				total := 3 * p[0] * p[1] // elements: some parts empty
				if bs.name == "large" {
					total *= 40
				}
				eachIC(t, xs, func(x *icRank) error {
					// Igatherv into group 1's last rank, Iscatterv from
					// group 0's.
					gRoot, gIs := rootOf(s, x, 1, p[1]-1)
					sRoot, sIs := rootOf(s, x, 0, p[0]-1)
					q, me := len(x.remote), x.ic.Rank()
					var gathered, scattered [][]byte
					if gIs {
						for _, wr := range x.remote {
							gathered = append(gathered, make([]byte, n(wr, x.me)))
						}
					}
					if sIs {
						for _, wr := range x.remote {
							scattered = append(scattered, pattern(x.me, wr, n(x.me, wr)))
						}
					}
					var got []byte
					if x.color == 1 {
						got = make([]byte, n(last(0), x.me))
					}
					all, blocking := make([][]byte, q), make([][]byte, q)
					send, recv := make([][]byte, q), make([][]byte, q)
					for j, wr := range x.remote {
						all[j], blocking[j] = make([]byte, n(wr, 0)), make([]byte, n(wr, 1))
						send[j], recv[j] = pattern(x.me, wr, n(x.me, wr)), make([]byte, n(wr, x.me))
					}
					counts := unevenCounts(p[x.color], total)
					parts := make([]uint64, counts[me])
					block := make([]uint64, total/p[x.color])
					var reqs []*adi.Request
					start := func(r *adi.Request, err error) error {
						reqs = append(reqs, r)
						return err
					}
					// Arguments are evaluated left to right: the calls start in this order.
					if err := firstErr(
						start(x.ic.Iallgatherv(pattern(x.me, 0, n(x.me, 0)), all)),
						start(adi.IinterReduceScatter(x.ic, contribution(x.me, total), parts, counts, affine)),
						start(x.ic.Igatherv(pattern(x.me, last(1), n(x.me, last(1))), gathered, gRoot)),
						x.ic.Allgatherv(ctx, pattern(x.me, 1, n(x.me, 1)), blocking),
						start(x.ic.Iscatterv(scattered, got, sRoot)),
						start(x.ic.Ialltoallv(send, recv)),
						start(adi.IinterReduceScatterBlock(x.ic, contribution(x.me+100, total), block, affine)),
						x.ic.Barrier(ctx), // a blocking one after them all, while they run
					); err != nil {
						return err
					}
					if _, err := adi.WaitAll(ctx, reqs...); err != nil {
						return err
					}
					for j, wr := range x.remote {
						if !bytes.Equal(all[j], pattern(wr, 0, n(wr, 0))) || !bytes.Equal(blocking[j], pattern(wr, 1, n(wr, 1))) {
							return fmt.Errorf("allgatherv: remote rank %d's block differs", j)
						}
						if !bytes.Equal(recv[j], pattern(wr, x.me, n(wr, x.me))) {
							return fmt.Errorf("alltoallv: remote rank %d's block differs", j)
						}
						if gIs && !bytes.Equal(gathered[j], pattern(wr, x.me, n(wr, x.me))) {
							return fmt.Errorf("gatherv: remote rank %d's block differs", j)
						}
					}
					if x.color == 1 && !bytes.Equal(got, pattern(last(0), x.me, n(last(0), x.me))) {
						return fmt.Errorf("scatterv: got %v", got)
					}
					off := 0
					for _, c := range counts[:me] {
						off += c
					}
					if want := fold(x.remote, total)[off : off+counts[me]]; !equal(parts, want) {
						return fmt.Errorf("reduce_scatter: got %x, want %x", parts, want)
					}
					others := make([]int, q)
					for j, wr := range x.remote {
						others[j] = wr + 100
					}
					m := len(block)
					if want := fold(others, total)[me*m : (me+1)*m]; !equal(block, want) {
						return fmt.Errorf("reduce_scatter_block: got %x, want %x", block, want)
					}
					return nil
				})
			})
		}
	}
}
