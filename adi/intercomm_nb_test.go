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
					if _, err := adi.WaitAll(ctx, reqs...); err != nil {
						return err
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
