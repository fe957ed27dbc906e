package adi_test

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
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
			if err := adi.StartAll(order...); err != nil {
				return err
			}
			if _, err := adi.WaitAll(ctx, qa, qb); err != nil {
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
	q, err := c.AllgatherInit(make([]byte, 4), make([]byte, 2)) // a receive buffer too short
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Wait(ctx); err == nil {
		t.Fatal("allgather of 4 bytes into 2: no error")
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
		me := c.Rank()
		ring, err := c.CartCreate(ctx, []int{n}, []bool{true})
		if err != nil {
			return err
		}
		// The graph: every rank sends to the next one only.
		next, prev := (me+1)%n, (me+n-1)%n
		g, err := c.DistGraphCreateAdjacent(ctx, []int{prev}, []int{next})
		if err != nil {
			return err
		}
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
			if err := adi.StartAll(order...); err != nil {
				return err
			}
			if _, err := adi.WaitAll(ctx, qa, qb, qg); err != nil {
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
			if err := adi.StartAll(order...); err != nil {
				return err
			}
			if _, err := adi.WaitAll(ctx, qs, qg); err != nil {
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
			if err := adi.StartAll(qs...); err != nil {
				return err
			}
			if _, err := adi.WaitAll(ctx, qs...); err != nil {
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
			if err := adi.StartAll(qs...); err != nil {
				return err
			}
			if _, err := adi.WaitAll(ctx, qs...); err != nil {
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
