package adi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/hpc-multidevice/multidevice/adi"
)

// TestPersistentCollectives: persistent collectives started again and
// again, with new buffer contents each time and a blocking collective
// between the starts, give each time what their blocking forms give.
func TestPersistentCollectives(t *testing.T) {
	for _, n := range []int{1, 3, 4} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			cs := loopJob(t, n)
			ctx := ctxT(t)
			each(t, cs, func(c *adi.Comm) error {
				me := c.Rank()
				root := n - 1
				x := make([]int64, 3)
				sum := make([]int64, 3)
				bc := make([]byte, 700) // past loopJob's eager limit
				gathered := make([]byte, n)
				allred, err := adi.AllreduceInit(c, x, sum, adi.Sum)
				if err != nil {
					return err
				}
				bcast, err := c.BcastInit(bc, root)
				if err != nil {
					return err
				}
				gather, err := c.GatherInit([]byte{byte(me)}, gathered, 0)
				if err != nil {
					return err
				}
				for it := range 5 {
					for i := range x {
						x[i] = int64(100*it + 10*me + i)
					}
					if me == root {
						for i := range bc {
							bc[i] = byte(it + i)
						}
					}
					if err := adi.StartAll(allred, bcast); err != nil {
						return err
					}
					if err := c.Barrier(ctx); err != nil {
						return err
					}
					if err := gather.Start(); err != nil {
						return err
					}
					if _, err := adi.WaitAll(ctx, allred, bcast, gather); err != nil {
						return fmt.Errorf("iteration %d: %w", it, err)
					}
					for i := range sum {
						want := int64(n*(100*it+i) + 10*n*(n-1)/2)
						if sum[i] != want {
							return fmt.Errorf("iteration %d: allreduce[%d] = %d, want %d", it, i, sum[i], want)
						}
					}
					for i := range bc {
						if bc[i] != byte(it+i) {
							return fmt.Errorf("iteration %d: bcast[%d] = %d, want %d", it, i, bc[i], byte(it+i))
						}
					}
					if me == 0 {
						for r := range n {
							if gathered[r] != byte(r) {
								return fmt.Errorf("iteration %d: gathered %v", it, gathered)
							}
						}
					}
				}
				return nil
			})
		})
	}
}

// TestPersistentCollectiveRules: a persistent collective's request is
// inactive until started, refuses a second Start while it runs, reports
// disagreeing arguments at Wait, and a bad root at Init.
func TestPersistentCollectiveRules(t *testing.T) {
	cs := loopJob(t, 3)
	ctx := ctxT(t)
	// Every rank makes the bad Inits, as a collective's calls are made:
	// each still draws its context.
	for _, c := range cs {
		if _, err := c.BcastInit(nil, 3); !errors.Is(err, adi.ErrRank) {
			t.Errorf("BcastInit with root 3 of 3: %v, want ErrRank", err)
		}
		if _, err := adi.ReduceInit(c, []int64{1}, []int64{0}, adi.Sum, -1); !errors.Is(err, adi.ErrRank) {
			t.Errorf("ReduceInit with root -1: %v, want ErrRank", err)
		}
	}
	reqs := make([]*adi.Request, 3)
	bufs := make([][]byte, 3)
	for r, c := range cs {
		bufs[r] = make([]byte, 8)
		q, err := c.BcastInit(bufs[r], 2)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := q.Wait(ctx); err != nil {
			t.Fatalf("Wait before the first Start: %v", err)
		}
		reqs[r] = q
	}
	// Rank 0 waits for the root, which has not started: its request is
	// active, and a second Start is refused.
	if err := reqs[0].Start(); err != nil {
		t.Fatal(err)
	}
	if err := reqs[0].Start(); !errors.Is(err, adi.ErrRequestBusy) {
		t.Errorf("Start of a running persistent collective: %v, want ErrRequestBusy", err)
	}
	copy(bufs[2], "persist!")
	for _, q := range reqs[1:] {
		if err := q.Start(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := adi.WaitAll(ctx, reqs...); err != nil {
		t.Fatal(err)
	}
	for r, b := range bufs {
		if string(b) != "persist!" {
			t.Errorf("rank %d got %q", r, b)
		}
	}

	// Rank 1's block is short: its Allgather reports the mismatch at Wait,
	// and so do the ranks that receive from it.
	errs := make([]error, 3)
	each(t, cs, func(c *adi.Comm) error {
		send := make([]byte, 4)
		if c.Rank() == 1 {
			send = send[:2]
		}
		q, err := c.AllgatherInit(send, make([]byte, 12))
		if err != nil {
			return err
		}
		if err := q.Start(); err != nil {
			return err
		}
		_, errs[c.Rank()] = q.Wait(ctx)
		return nil
	})
	if !slices.ContainsFunc(errs, func(err error) bool { return errors.Is(err, adi.ErrMismatch) }) {
		t.Errorf("allgather with a short block: %v, want ErrMismatch", errs)
	}
	var sendReq adi.Request
	if err := sendReq.Start(); err == nil {
		t.Error("Start of a request that is not persistent: no error")
	}
}

// TestPersistentStartOrder: ranks may start different persistent
// collectives in different orders (MPI 4.0 orders the Init calls, not the
// starts); each still meets its own kind on the other ranks.
func TestPersistentStartOrder(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		a, b := []int64{1}, []int64{100}
		sa, sb := make([]int64, 1), make([]int64, 1)
		qa, err := adi.AllreduceInit(c, a, sa, adi.Sum)
		if err != nil {
			return err
		}
		qb, err := adi.AllreduceInit(c, b, sb, adi.Sum)
		if err != nil {
			return err
		}
		for it := range 3 {
			order := []*adi.Request{qa, qb}
			if (c.Rank()+it)%2 == 1 {
				order = []*adi.Request{qb, qa}
			}
			if err := startWait(ctx, order...); err != nil {
				return err
			}
			if sa[0] != 2 || sb[0] != 200 {
				return fmt.Errorf("iteration %d: sums %d and %d, want 2 and 200", it, sa[0], sb[0])
			}
		}
		return nil
	})
}

// TestPersistentFailedStart: a Start that fails leaves the request
// inactive, not holding the last round's result.
func TestPersistentFailedStart(t *testing.T) {
	ws, _ := loopWorlds(t, 1)
	c := ws[0].Comm()
	ctx := ctxT(t)
	// Its own block's slot too short: only the collective finds that.
	q, err := c.AllgathervInit(make([]byte, 4), [][]byte{make([]byte, 2)})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Wait(ctx); !errors.Is(err, adi.ErrMismatch) {
		t.Fatalf("allgatherv of 4 bytes into 2: %v, want ErrMismatch", err)
	}
	if err := ws[0].Finalize(ctx); err != nil {
		t.Fatal(err)
	}
	if err := q.Start(); !errors.Is(err, adi.ErrFinalized) {
		t.Fatalf("Start after Finalize: %v, want ErrFinalized", err)
	}
	if _, err := q.Wait(ctx); err != nil {
		t.Errorf("Wait after a failed Start: %v, want an inactive request's nil", err)
	}
}

// TestPersistentNeighborCollectives: persistent neighbour collectives on
// a ring and on a graph give each round's data, with the ranks starting
// the ring's two in different orders.
func TestPersistentNeighborCollectives(t *testing.T) {
	const n = 3
	cs := loopJob(t, n)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		x, err := newTopoRank(ctx, c, n)
		if err != nil {
			return err
		}
		ring, g, me := x.ring, x.g, x.me
		next, prev := (me+1)%n, (me+n-1)%n
		mine, halos := make([]byte, 1), make([]byte, 2)
		out, in := make([]byte, 2), make([]byte, 2) // to and from -1, then +1
		gout, gin := make([]byte, 1), make([]byte, 1)
		qa, err := ring.NeighborAllgatherInit(mine, halos)
		if err != nil {
			return err
		}
		qb, err := ring.NeighborAlltoallInit(out, in)
		if err != nil {
			return err
		}
		qg, err := g.NeighborAlltoallInit(gout, gin)
		if err != nil {
			return err
		}
		for it := range 4 {
			mine[0], gout[0] = byte(10*it+me), byte(100+10*it+me)
			out[0], out[1] = byte(50+10*it+me), byte(70+10*it+me)
			order := []*adi.Request{qa, qb, qg}
			if (me+it)%2 == 1 {
				order = []*adi.Request{qg, qb, qa}
			}
			if err := startWait(ctx, order...); err != nil {
				return err
			}
			if want := []byte{byte(10*it + prev), byte(10*it + next)}; !bytes.Equal(halos, want) {
				return fmt.Errorf("round %d: ring allgather %v, want %v", it, halos, want)
			}
			// -1 sent me its +1 block, +1 its -1 block.
			if want := []byte{byte(70 + 10*it + prev), byte(50 + 10*it + next)}; !bytes.Equal(in, want) {
				return fmt.Errorf("round %d: ring alltoall %v, want %v", it, in, want)
			}
			if want := byte(100 + 10*it + prev); gin[0] != want {
				return fmt.Errorf("round %d: graph got %d, want %d", it, gin[0], want)
			}
		}
		return nil
	})
}

// TestPersistentIntercommCollectives: persistent collectives on an
// intercommunicator carry each round's data from the other group, with
// the groups starting them in different orders.
func TestPersistentIntercommCollectives(t *testing.T) {
	xs := intercomms(t, splits[3])
	ctx := ctxT(t)
	eachIC(t, xs, func(x *icRank) error {
		if _, err := x.ic.BcastInit(nil, x.ic.RemoteSize()); !errors.Is(err, adi.ErrRank) {
			return fmt.Errorf("BcastInit with root %d of %d remote ranks: %v, want ErrRank", x.ic.RemoteSize(), x.ic.RemoteSize(), err)
		}
		send, sum := make([]int64, 1), make([]int64, 1)
		mine, theirs := make([]byte, 1), make([]byte, x.ic.RemoteSize())
		qs, err := adi.InterAllreduceInit(x.ic, send, sum, adi.Sum)
		if err != nil {
			return err
		}
		qg, err := x.ic.AllgatherInit(mine, theirs)
		if err != nil {
			return err
		}
		for it := range 4 {
			send[0], mine[0] = int64(100*it+x.me), byte(10*it+x.me)
			order := []*adi.Request{qs, qg}
			if (x.color+it)%2 == 1 {
				order = []*adi.Request{qg, qs}
			}
			if err := startWait(ctx, order...); err != nil {
				return err
			}
			var want int64
			for i, r := range x.remote {
				want += int64(100*it + r)
				if theirs[i] != byte(10*it+r) {
					return fmt.Errorf("round %d: allgather %v from %v", it, theirs, x.remote)
				}
			}
			if sum[0] != want {
				return fmt.Errorf("round %d: allreduce %d, want %d", it, sum[0], want)
			}
		}
		return nil
	})
}

// TestPersistentBadRootKeepsAlignment: a rank whose Init fails on its
// root still draws the context the others draw, so the communicators
// all of them make next are the same one.
func TestPersistentBadRootKeepsAlignment(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		root := 0
		if c.Rank() == 0 {
			root = 7
		}
		if _, err := c.BcastInit(nil, root); (err != nil) != (c.Rank() == 0) {
			return fmt.Errorf("BcastInit with root %d: %v", root, err)
		}
		d, err := c.Dup(ctx)
		if err != nil {
			return err
		}
		if c.Rank() == 1 {
			return d.Send(ctx, []byte("same"), 0, 3)
		}
		_, err = d.Recv(ctx, make([]byte, 4), 1, 3)
		return err
	})
}

// TestPersistentReductions: the persistent scans and reduce-scatters,
// on a Comm and on an Intercomm, give each round what their blocking
// forms give.
func TestPersistentReductions(t *testing.T) {
	const n = 3
	cs := loopJob(t, n)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		me := c.Rank()
		x := make([]int64, n) // n elements: one for each rank's block
		got := [4][]int64{make([]int64, n), make([]int64, n), make([]int64, 1), make([]int64, 1)}
		want := [4][]int64{make([]int64, n), make([]int64, n), make([]int64, 1), make([]int64, 1)}
		counts := []int{1, 1, 1}
		var qs []*adi.Request
		for _, mk := range []func() (*adi.Request, error){
			func() (*adi.Request, error) { return adi.ScanInit(c, x, got[0], adi.Sum) },
			func() (*adi.Request, error) { return adi.ExscanInit(c, x, got[1], adi.Sum) },
			func() (*adi.Request, error) { return adi.ReduceScatterInit(c, x, got[2], counts, adi.Sum) },
			func() (*adi.Request, error) { return adi.ReduceScatterBlockInit(c, x, got[3], adi.Sum) },
		} {
			q, err := mk()
			if err != nil {
				return err
			}
			qs = append(qs, q)
		}
		for it := range 3 {
			for i := range x {
				x[i] = int64(100*it + 10*me + i)
			}
			if err := errors.Join(adi.Scan(ctx, c, x, want[0], adi.Sum), adi.Exscan(ctx, c, x, want[1], adi.Sum),
				adi.ReduceScatter(ctx, c, x, want[2], counts, adi.Sum), adi.ReduceScatterBlock(ctx, c, x, want[3], adi.Sum)); err != nil {
				return err
			}
			if err := startWait(ctx, qs...); err != nil {
				return err
			}
			for k := range got {
				if k == 1 && me == 0 {
					continue // Exscan leaves rank 0's result undefined
				}
				if !slices.Equal(got[k], want[k]) {
					return fmt.Errorf("round %d: persistent result %d is %v, want %v", it, k, got[k], want[k])
				}
			}
		}
		return nil
	})

	xs := intercomms(t, splits[3]) // 2|3
	eachIC(t, xs, func(x *icRank) error {
		const total = 6 // both groups' vectors: a multiple of 2 and of 3
		p := x.ic.Size()
		send := make([]int64, total)
		root := adi.ProcNull // group 1's last rank is the InterReduce's root
		switch {
		case x.color == 0:
			root = x.ic.RemoteSize() - 1
		case x.ic.Rank() == p-1:
			root = adi.Root
		}
		counts := make([]int, p)
		for i := range counts {
			counts[i] = total / p
		}
		got := [3][]int64{make([]int64, total), make([]int64, total/p), make([]int64, total/p)}
		want := [3][]int64{make([]int64, total), make([]int64, total/p), make([]int64, total/p)}
		var qs []*adi.Request
		for _, mk := range []func() (*adi.Request, error){
			func() (*adi.Request, error) { return adi.InterReduceInit(x.ic, send, got[0], adi.Sum, root) },
			func() (*adi.Request, error) { return adi.InterReduceScatterInit(x.ic, send, got[1], counts, adi.Sum) },
			func() (*adi.Request, error) { return adi.InterReduceScatterBlockInit(x.ic, send, got[2], adi.Sum) },
		} {
			q, err := mk()
			if err != nil {
				return err
			}
			qs = append(qs, q)
		}
		for it := range 3 {
			for i := range send {
				send[i] = int64(100*it + 10*x.me + i)
			}
			if err := errors.Join(adi.InterReduce(ctx, x.ic, send, want[0], adi.Sum, root),
				adi.InterReduceScatter(ctx, x.ic, send, want[1], counts, adi.Sum),
				adi.InterReduceScatterBlock(ctx, x.ic, send, want[2], adi.Sum)); err != nil {
				return err
			}
			if err := startWait(ctx, qs...); err != nil {
				return err
			}
			for k := range got {
				if !slices.Equal(got[k], want[k]) {
					return fmt.Errorf("round %d: persistent result %d is %v, want %v", it, k, got[k], want[k])
				}
			}
		}
		return nil
	})
}

// initCase is a persistent collective's Init with an argument its
// blocking form refuses on the ranks fails picks (nil: every rank): made
// on every rank, it must fail there at Init with an error containing
// want, the call's name and the argument, and wrapping is if set, and
// return a request on the other ranks.
type initCase[X any] struct {
	name  string
	init  func(x X) (*adi.Request, error)
	fails func(x X) bool
	want  string
	is    error
}

// badInits makes every case's Init on x, a rank, and returns what went
// otherwise than the case says.
func badInits[X any](x X, cases []initCase[X]) error {
	var errs []error
	for _, tc := range cases {
		q, err := tc.init(x)
		switch fails := tc.fails == nil || tc.fails(x); {
		case !fails && (err != nil || q == nil):
			errs = append(errs, fmt.Errorf("%s: %v, want a request", tc.name, err))
		case !fails:
		case err == nil:
			errs = append(errs, fmt.Errorf("%s: no error at Init", tc.name))
		case !strings.Contains(err.Error(), tc.want) || tc.is != nil && !errors.Is(err, tc.is):
			errs = append(errs, fmt.Errorf("%s: %q, want it to contain %q (and wrap %v)", tc.name, err, tc.want, tc.is))
		case q != nil:
			errs = append(errs, fmt.Errorf("%s: a request with the error %v", tc.name, err))
		}
	}
	return errors.Join(errs...)
}

// goodRound makes a persistent Allreduce of one int64 on c after bad
// Inits, starts and waits for it, and checks the sum of the ranks: it
// runs only if every rank's bad Inits drew the contexts the others' did.
func goodRound(ctx context.Context, c *adi.Comm) error {
	x, sum := []int64{int64(c.Rank() + 1)}, make([]int64, 1)
	q, err := adi.AllreduceInit(c, x, sum, adi.Sum)
	if err != nil {
		return err
	}
	if err := q.Start(); err != nil {
		return err
	}
	if _, err := q.Wait(ctx); err != nil {
		return fmt.Errorf("good persistent allreduce after the bad Inits: %w", err)
	}
	if n := int64(c.Size()); sum[0] != n*(n+1)/2 {
		return fmt.Errorf("good persistent allreduce after the bad Inits: %d, want %d", sum[0], n*(n+1)/2)
	}
	return nil
}

// TestPersistentInitChecks: every Init of a Comm refuses at Init what
// its blocking form refuses of this rank's own arguments, naming the
// call and the argument; a rank whose Init failed (alone, where only
// the root checks) still drew its context, so a good persistent
// collective made after them on every rank runs.
func TestPersistentInitChecks(t *testing.T) {
	const n = 3
	b, v, e := func(k int) []byte { return make([]byte, k) }, func(k int) [][]byte { return make([][]byte, k) }, func(k int) []int64 { return make([]int64, k) }
	rank := func(r int) func(c *adi.Comm) bool { return func(c *adi.Comm) bool { return c.Rank() == r } }
	cases := []initCase[*adi.Comm]{
		{"bcast root", func(c *adi.Comm) (*adi.Request, error) { return c.BcastInit(b(1), n) }, nil, "adi: bcast init: root: ", adi.ErrRank},
		{"gather root", func(c *adi.Comm) (*adi.Request, error) { return c.GatherInit(b(1), b(n), -1) }, nil, "adi: gather init: root: ", adi.ErrRank},
		{"gather recv", func(c *adi.Comm) (*adi.Request, error) { return c.GatherInit(b(2), b(2*n-1), 0) }, rank(0), "adi: gather init: receive buffer of 5 bytes", nil},
		{"gatherv root", func(c *adi.Comm) (*adi.Request, error) { return c.GathervInit(b(1), v(n), n) }, nil, "adi: gatherv init: root: ", adi.ErrRank},
		{"gatherv recv", func(c *adi.Comm) (*adi.Request, error) { return c.GathervInit(b(1), v(n-1), 1) }, rank(1), "adi: gatherv init: 2 receive slices for 3 ranks", nil},
		{"scatter root", func(c *adi.Comm) (*adi.Request, error) { return c.ScatterInit(b(n), b(1), n) }, nil, "adi: scatter init: root: ", adi.ErrRank},
		{"scatter send", func(c *adi.Comm) (*adi.Request, error) { return c.ScatterInit(b(2*n-1), b(2), 2) }, rank(2), "adi: scatter init: send buffer of 5 bytes", nil},
		{"scatterv root", func(c *adi.Comm) (*adi.Request, error) { return c.ScattervInit(v(n), b(1), -1) }, nil, "adi: scatterv init: root: ", adi.ErrRank},
		{"scatterv send", func(c *adi.Comm) (*adi.Request, error) { return c.ScattervInit(v(n+1), b(1), 0) }, rank(0), "adi: scatterv init: 4 send slices for 3 ranks", nil},
		{"allgather recv", func(c *adi.Comm) (*adi.Request, error) { return c.AllgatherInit(b(2), b(2*n-1)) }, nil, "adi: allgather init: receive buffer of 5 bytes", nil},
		{"allgatherv recv", func(c *adi.Comm) (*adi.Request, error) { return c.AllgathervInit(b(1), v(n-1)) }, nil, "adi: allgatherv init: 2 receive slices for 3 ranks", nil},
		{"alltoall send", func(c *adi.Comm) (*adi.Request, error) { return c.AlltoallInit(b(n+1), b(n+1)) }, nil, "adi: alltoall init: buffers of 4 and 4 bytes", nil},
		{"alltoall recv", func(c *adi.Comm) (*adi.Request, error) { return c.AlltoallInit(b(n), b(2*n)) }, nil, "adi: alltoall init: buffers of 3 and 6 bytes", nil},
		{"alltoallv recv", func(c *adi.Comm) (*adi.Request, error) { return c.AlltoallvInit(v(n), v(n-1)) }, nil, "adi: alltoallv init: 3 send and 2 receive slices for 3 ranks", nil},
		{"reduce root", func(c *adi.Comm) (*adi.Request, error) { return adi.ReduceInit(c, e(1), e(1), adi.Sum, n) }, nil, "adi: reduce init: root: ", adi.ErrRank},
		{"reduce recv", func(c *adi.Comm) (*adi.Request, error) { return adi.ReduceInit(c, e(2), e(1), adi.Sum, 1) }, rank(1), "adi: reduce init: receive slice of 1 elements for a send slice of 2", nil},
		{"reduce op", func(c *adi.Comm) (*adi.Request, error) { return adi.ReduceInit(c, e(1), e(1), nil, 0) }, nil, "adi: reduce init: op: nil", nil},
		{"allreduce recv", func(c *adi.Comm) (*adi.Request, error) { return adi.AllreduceInit(c, e(2), e(3), adi.Sum) }, nil, "adi: allreduce init: receive slice of 3 elements for a send slice of 2", nil},
		{"allreduce op", func(c *adi.Comm) (*adi.Request, error) { return adi.AllreduceInit(c, e(1), e(1), nil) }, nil, "adi: allreduce init: op: nil", nil},
		{"scan recv", func(c *adi.Comm) (*adi.Request, error) { return adi.ScanInit(c, e(2), e(1), adi.Sum) }, nil, "adi: scan init: receive slice of 1 elements", nil},
		{"exscan op", func(c *adi.Comm) (*adi.Request, error) { return adi.ExscanInit(c, e(1), e(1), nil) }, nil, "adi: exscan init: op: nil", nil},
		{"reduce_scatter counts", func(c *adi.Comm) (*adi.Request, error) {
			return adi.ReduceScatterInit(c, e(2), e(1), []int{1, 1}, adi.Sum)
		}, nil, "adi: reduce_scatter init: 2 counts for 3 ranks", nil},
		{"reduce_scatter negative count", func(c *adi.Comm) (*adi.Request, error) {
			return adi.ReduceScatterInit(c, e(3), e(2), []int{2, -1, 2}, adi.Sum)
		}, nil, "adi: reduce_scatter init: count of rank 1 is -1", nil},
		{"reduce_scatter send", func(c *adi.Comm) (*adi.Request, error) {
			return adi.ReduceScatterInit(c, e(4), e(1), []int{1, 1, 1}, adi.Sum)
		}, nil, "adi: reduce_scatter init: send slice of 4 elements for counts adding up to 3", nil},
		{"reduce_scatter recv", func(c *adi.Comm) (*adi.Request, error) {
			return adi.ReduceScatterInit(c, e(3), e(2), []int{1, 1, 1}, adi.Sum)
		}, nil, "adi: reduce_scatter init: receive slice of 2 elements for a count of 1", nil},
		{"reduce_scatter_block send", func(c *adi.Comm) (*adi.Request, error) { return adi.ReduceScatterBlockInit(c, e(4), e(1), adi.Sum) }, nil, "adi: reduce_scatter_block init: send slice of 4 elements for counts adding up to 3", nil},
		{"reduce_scatter_block op", func(c *adi.Comm) (*adi.Request, error) { return adi.ReduceScatterBlockInit(c, e(3), e(1), nil) }, nil, "adi: reduce_scatter_block init: op: nil", nil},
	}
	cs := loopJob(t, n)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		return errors.Join(badInits(c, cases), goodRound(ctx, c))
	})
}

// topoRank is one rank's topologies for the persistent neighbour tests.
type topoRank struct {
	ring *adi.Cart      // periodic, of n: two neighbours, each both ways
	g    *adi.DistGraph // from the rank before, to the rank after
	me   int
}

// newTopoRank makes c's rank's topoRank over n ranks.
func newTopoRank(ctx context.Context, c *adi.Comm, n int) (topoRank, error) {
	me := c.Rank()
	ring, err := c.CartCreate(ctx, []int{n}, []bool{true})
	if err != nil {
		return topoRank{}, err
	}
	g, err := c.DistGraphCreateAdjacent(ctx, []int{(me + n - 1) % n}, []int{(me + 1) % n})
	return topoRank{ring, g, me}, err
}

// TestPersistentNeighborInitChecks: the persistent neighbour
// collectives of a Cart and a DistGraph check at Init as
// TestPersistentInitChecks's do.
func TestPersistentNeighborInitChecks(t *testing.T) {
	const n = 3
	b, v := func(k int) []byte { return make([]byte, k) }, func(k int) [][]byte { return make([][]byte, k) }
	// The ring has 2 in- and 2 out-neighbours, the graph 1 of each.
	cases := []initCase[topoRank]{
		{"cart allgather recv", func(x topoRank) (*adi.Request, error) { return x.ring.NeighborAllgatherInit(b(1), b(3)) }, nil,
			"adi: neighbor_allgather init: receive buffer of 3 bytes for 2 in-neighbours of 1 bytes", nil},
		{"cart allgatherv recv", func(x topoRank) (*adi.Request, error) { return x.ring.NeighborAllgathervInit(b(1), v(3)) }, nil,
			"adi: neighbor_allgatherv init: 2 send blocks for 2 out-neighbours and 3 receive slots for 2 in-neighbours", nil},
		{"cart alltoall send", func(x topoRank) (*adi.Request, error) { return x.ring.NeighborAlltoallInit(b(3), b(2)) }, nil,
			"adi: neighbor_alltoall init: buffers of 3 and 2 bytes do not hold blocks of one length", nil},
		{"cart alltoallv send", func(x topoRank) (*adi.Request, error) { return x.ring.NeighborAlltoallvInit(v(1), v(2)) }, nil,
			"adi: neighbor_alltoallv init: 1 send blocks for 2 out-neighbours", nil},
		{"graph allgather recv", func(x topoRank) (*adi.Request, error) { return x.g.NeighborAllgatherInit(b(2), b(1)) }, nil,
			"adi: neighbor_allgather init: receive buffer of 1 bytes for 1 in-neighbours of 2 bytes", nil},
		{"graph allgather recv on rank 0", func(x topoRank) (*adi.Request, error) {
			return x.g.NeighborAllgatherInit(b(1), b(2-min(x.me, 1)))
		}, func(x topoRank) bool { return x.me == 0 }, "adi: neighbor_allgather init: receive buffer of 2 bytes for 1 in-neighbours of 1 bytes", nil},
		{"graph allgatherv recv", func(x topoRank) (*adi.Request, error) { return x.g.NeighborAllgathervInit(b(1), v(0)) }, nil,
			"adi: neighbor_allgatherv init: 1 send blocks for 1 out-neighbours and 0 receive slots for 1 in-neighbours", nil},
		{"graph alltoall recv", func(x topoRank) (*adi.Request, error) { return x.g.NeighborAlltoallInit(b(2), b(3)) }, nil,
			"adi: neighbor_alltoall init: buffers of 2 and 3 bytes do not hold blocks of one length", nil},
		{"graph alltoallv recv", func(x topoRank) (*adi.Request, error) { return x.g.NeighborAlltoallvInit(v(1), v(2)) }, nil,
			"adi: neighbor_alltoallv init: 1 send blocks for 1 out-neighbours and 2 receive slots for 1 in-neighbours", nil},
	}
	cs := loopJob(t, n)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		x, err := newTopoRank(ctx, c, n)
		if err != nil {
			return err
		}
		ring, g, me := x.ring, x.g, x.me
		if err := badInits(x, cases); err != nil {
			return err
		}
		// The bad Inits drew their contexts: a good one on each runs.
		mine, got := []byte{byte(me)}, b(2)
		q, err := ring.NeighborAllgatherInit(mine, got)
		if err != nil {
			return err
		}
		qg, err := g.NeighborAllgatherInit(mine, got[:1])
		if err != nil {
			return err
		}
		if err := startWait(ctx, q, qg); err != nil {
			return err
		}
		return errors.Join(goodRound(ctx, ring.Comm), goodRound(ctx, g.Comm))
	})
}

// TestPersistentIntercommInitChecks: the persistent collectives of an
// Intercomm check at Init as TestPersistentInitChecks's do; the rooted
// ones on the root alone (Root), or on the other group where their op
// is used.
func TestPersistentIntercommInitChecks(t *testing.T) {
	b, v, e := func(k int) []byte { return make([]byte, k) }, func(k int) [][]byte { return make([][]byte, k) }, func(k int) []int64 { return make([]int64, k) }
	// rootOf is group 1's rank 0 as the root: Root there, ProcNull on
	// the rest of group 1, its remote rank 0 in group 0.
	rootOf := func(x *icRank) int {
		switch {
		case x.color == 0:
			return 0
		case x.ic.Rank() == 0:
			return adi.Root
		}
		return adi.ProcNull
	}
	atRoot := func(x *icRank) bool { return rootOf(x) == adi.Root }
	other := func(x *icRank) bool { return x.color == 0 }
	cases := []initCase[*icRank]{
		{"bcast root", func(x *icRank) (*adi.Request, error) { return x.ic.BcastInit(b(1), x.ic.RemoteSize()) }, nil, "adi: intercomm bcast init: root: ", adi.ErrRank},
		{"gather root", func(x *icRank) (*adi.Request, error) { return x.ic.GatherInit(b(1), b(1), -1) }, nil, "adi: intercomm gather init: root: ", adi.ErrRank},
		{"scatter root", func(x *icRank) (*adi.Request, error) { return x.ic.ScatterInit(b(1), b(1), -4) }, nil, "adi: intercomm scatter init: root: ", adi.ErrRank},
		{"gatherv recv", func(x *icRank) (*adi.Request, error) {
			return x.ic.GathervInit(b(1), v(x.ic.RemoteSize()+1), rootOf(x))
		}, atRoot,
			"adi: intercomm gatherv init: 3 receive slices for 2 remote ranks", nil},
		{"scatterv send", func(x *icRank) (*adi.Request, error) { return x.ic.ScattervInit(v(0), b(1), rootOf(x)) }, atRoot,
			"adi: intercomm scatterv init: 0 send slices for 2 remote ranks", nil},
		{"allgather recv", func(x *icRank) (*adi.Request, error) { return x.ic.AllgatherInit(b(1), b(x.ic.RemoteSize()+1)) }, nil,
			"adi: intercomm allgather init: receive buffer of", nil},
		{"allgatherv recv", func(x *icRank) (*adi.Request, error) { return x.ic.AllgathervInit(b(1), v(x.ic.RemoteSize()+1)) }, nil,
			"adi: intercomm allgatherv init: ", nil},
		{"alltoall send", func(x *icRank) (*adi.Request, error) {
			return x.ic.AlltoallInit(b(x.ic.RemoteSize()+1), b(x.ic.RemoteSize()))
		}, nil, "adi: intercomm alltoall init: buffers of", nil},
		{"alltoallv recv", func(x *icRank) (*adi.Request, error) { return x.ic.AlltoallvInit(v(x.ic.RemoteSize()), v(0)) }, nil,
			" send and 0 receive slices for", nil},
		{"reduce root", func(x *icRank) (*adi.Request, error) { return adi.InterReduceInit(x.ic, e(1), e(1), adi.Sum, 9) }, nil, "adi: intercomm reduce init: root: ", adi.ErrRank},
		{"reduce op", func(x *icRank) (*adi.Request, error) { return adi.InterReduceInit(x.ic, e(1), e(1), nil, rootOf(x)) }, other,
			"adi: intercomm reduce init: op: nil", nil},
		{"allreduce recv", func(x *icRank) (*adi.Request, error) { return adi.InterAllreduceInit(x.ic, e(1), e(2), adi.Sum) }, nil,
			"adi: intercomm allreduce init: receive slice of 2 elements for a send slice of 1", nil},
		{"reduce_scatter counts", func(x *icRank) (*adi.Request, error) {
			return adi.InterReduceScatterInit(x.ic, e(1), e(1), []int{1}, adi.Sum)
		}, nil, "adi: intercomm reduce_scatter init: 1 counts for ", nil},
		{"reduce_scatter_block send", func(x *icRank) (*adi.Request, error) {
			return adi.InterReduceScatterBlockInit(x.ic, e(x.ic.Size()+1), e(1), adi.Sum)
		}, nil, "adi: intercomm reduce_scatter_block init: send slice of", nil},
	}
	xs := intercomms(t, splits[3]) // 2|3
	ctx := ctxT(t)
	eachIC(t, xs, func(x *icRank) error {
		if err := badInits(x, cases); err != nil {
			return err
		}
		// The bad Inits drew their contexts: a good one runs.
		send, sum := []int64{int64(x.me)}, make([]int64, 1)
		q, err := adi.InterAllreduceInit(x.ic, send, sum, adi.Sum)
		if err != nil {
			return err
		}
		if err := q.Start(); err != nil {
			return err
		}
		if _, err := q.Wait(ctx); err != nil {
			return err
		}
		var want int64
		for _, r := range x.remote {
			want += int64(r)
		}
		if sum[0] != want {
			return fmt.Errorf("good persistent allreduce after the bad Inits: %d, want %d", sum[0], want)
		}
		return nil
	})
}

// TestReductionNilOp: a reduction with a nil op is an error of the
// calling rank, in the blocking, nonblocking and persistent forms alike
// (it was a nil call, on a worker goroutine for the latter two).
func TestReductionNilOp(t *testing.T) {
	cs := loopJob(t, 1)
	c, ctx := cs[0], ctxT(t)
	x, y := []int64{1}, []int64{0}
	nb := func(q *adi.Request, err error) error {
		if err != nil {
			return err
		}
		_, err = q.Wait(ctx)
		return err
	}
	for name, err := range map[string]error{
		"Reduce":             adi.Reduce(ctx, c, x, y, nil, 0),
		"Allreduce":          adi.Allreduce(ctx, c, x, y, nil),
		"Scan":               adi.Scan(ctx, c, x, y, nil),
		"Exscan":             adi.Exscan(ctx, c, x, y, nil),
		"ReduceScatter":      adi.ReduceScatter(ctx, c, x, y, []int{1}, nil),
		"ReduceScatterBlock": adi.ReduceScatterBlock(ctx, c, x, y, nil),
		"Iallreduce":         nb(adi.Iallreduce(c, x, y, nil)),
		"Ireduce":            nb(adi.Ireduce(c, x, y, nil, 0)),
	} {
		if err == nil || !strings.Contains(err.Error(), "op: nil") {
			t.Errorf("%s with a nil op: %v, want an error naming op", name, err)
		}
	}
}

// startWait is one round of persistent requests: it starts qs, in that
// order, and waits for them all.
func startWait(ctx context.Context, qs ...*adi.Request) error {
	if err := adi.StartAll(qs...); err != nil {
		return err
	}
	_, err := adi.WaitAll(ctx, qs...)
	return err
}
