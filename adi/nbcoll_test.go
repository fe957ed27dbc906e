package adi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/internal/leakcheck"
)

// TestNonblockingCollectives: every rank starts a dozen nonblocking
// collectives at once, with a blocking one among them, and point-to-point
// messages going meanwhile; each collective's result is what its
// blocking form gives. Lengths reach past loopJob's eager limit, so the
// collectives' large messages wait for receives of their own.
func TestNonblockingCollectives(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5} {
		for _, size := range []int{8, 3000} {
			t.Run(fmt.Sprintf("ranks=%d/bytes=%d", n, size), func(t *testing.T) {
				cs := loopJob(t, n)
				ctx := ctxT(t)
				elems := size / 8
				want := contribution(0, elems)
				for r := 1; r < n; r++ {
					affine(want, contribution(r, elems))
				}
				each(t, cs, func(c *adi.Comm) error {
					me := c.Rank()
					var reqs []*adi.Request
					start := func(q *adi.Request, err error) {
						if err != nil {
							t.Error(err)
						}
						reqs = append(reqs, q)
					}
					start(c.Ibarrier())
					bcast := pattern(1, 0, size)
					if me != n-1 {
						bcast = make([]byte, size)
					}
					start(c.Ibcast(bcast, n-1))
					allred := make([]uint64, elems)
					start(adi.Iallreduce(c, contribution(me, elems), allred, affine))
					red := make([]uint64, elems)
					start(adi.Ireduce(c, contribution(me, elems), red, affine, 0))
					scan := make([]uint64, elems)
					start(adi.Iscan(c, contribution(me, elems), scan, affine))
					gathered := make([]byte, n*size)
					start(c.Iallgather(pattern(me, 0, size), gathered))
					a2a := make([]byte, n*size)
					var out []byte
					for d := range n {
						out = append(out, pattern(me, d, size)...)
					}
					start(c.Ialltoall(out, a2a))
					rs := make([]uint64, elems)
					start(adi.IreduceScatterBlock(c, contribution(me, n*elems), rs, affine))
					// A blocking collective between nonblocking ones.
					blocking := pattern(2, 0, size)
					if me != 0 {
						blocking = make([]byte, size)
					}
					if err := c.Bcast(ctx, blocking, 0); err != nil {
						return fmt.Errorf("blocking bcast among nonblocking ones: %w", err)
					}
					if !bytes.Equal(blocking, pattern(2, 0, size)) {
						return errors.New("blocking bcast: wrong data")
					}
					// Point-to-point around the ring meanwhile.
					ring := make([]byte, size)
					if _, err := c.Sendrecv(ctx, pattern(me, 9, size), (me+1)%n, 1, ring, (me+n-1)%n, 1); err != nil {
						return err
					}
					if _, err := adi.WaitAll(ctx, reqs...); err != nil {
						return err
					}
					if !bytes.Equal(ring, pattern((me+n-1)%n, 9, size)) {
						return errors.New("ring: wrong data")
					}
					if !bytes.Equal(bcast, pattern(1, 0, size)) {
						return errors.New("ibcast: wrong data")
					}
					if !equal(allred, want) || me == 0 && !equal(red, want) {
						return errors.New("iallreduce or ireduce: wrong result")
					}
					whole := contribution(0, n*elems)
					for r := 1; r < n; r++ {
						affine(whole, contribution(r, n*elems))
					}
					if !equal(rs, whole[me*elems:(me+1)*elems]) {
						return errors.New("ireducescatterblock: wrong result")
					}
					prefix := contribution(0, elems)
					for r := 1; r <= me; r++ {
						affine(prefix, contribution(r, elems))
					}
					if !equal(scan, prefix) {
						return errors.New("iscan: wrong result")
					}
					for r := range n {
						if !bytes.Equal(gathered[r*size:(r+1)*size], pattern(r, 0, size)) {
							return fmt.Errorf("iallgather: block of rank %d wrong", r)
						}
						if !bytes.Equal(a2a[r*size:(r+1)*size], pattern(r, me, size)) {
							return fmt.Errorf("ialltoall: block from rank %d wrong", r)
						}
					}
					return nil
				})
			})
		}
	}
}

// TestNonblockingCollectiveRequests: a collective's request works with
// Test, WaitAny and WaitAll beside point-to-point ones, is not cancelled,
// and is taken for a point-to-point operation only once it is over.
func TestNonblockingCollectiveRequests(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	q, err := cs[0].Ibarrier()
	if err != nil {
		t.Fatal(err)
	}
	if _, done, _ := q.Test(); done {
		t.Fatal("a barrier only one rank entered is done")
	}
	q.Cancel()
	if err := cs[0].IrecvInto(q, nil, 1, 0); !errors.Is(err, adi.ErrRequestBusy) {
		t.Fatalf("reuse of a running collective's request: %v, want ErrRequestBusy", err)
	}
	recv := must(cs[0].Irecv(make([]byte, 1), 1, 3))
	other, err := cs[1].Ibarrier()
	if err != nil {
		t.Fatal(err)
	}
	i, _, err := adi.WaitAny(ctx, recv, q)
	if i != 1 || err != nil {
		t.Fatalf("WaitAny: request %d, %v; want the barrier, 1", i, err)
	}
	if _, err := adi.WaitAll(ctx, other); err != nil {
		t.Fatal(err)
	}
	if err := cs[0].IrecvInto(q, make([]byte, 1), 1, 4); err != nil {
		t.Fatalf("reuse of a finished collective's request: %v", err)
	}
	if err := cs[1].Send(ctx, []byte{7}, 0, 4); err != nil {
		t.Fatal(err)
	}
	if st, err := q.Wait(ctx); err != nil || st.Count != 1 {
		t.Fatalf("receive in a reused request: %+v %v", st, err)
	}
	recv.Cancel()
}

// TestFinalizeEndsNonblockingCollectives: a collective that some rank never
// joins ends with ErrFinalized when its rank finalizes, and leaves no
// goroutine behind.
func TestFinalizeEndsNonblockingCollectives(t *testing.T) {
	ws := job(t, 2)
	q, err := ws[0].Comm().Ibcast(make([]byte, 10), 1)
	if err != nil {
		t.Fatal(err)
	}
	each(t, []*adi.Comm{ws[0].Comm(), ws[1].Comm()}, func(c *adi.Comm) error {
		return ws[c.Rank()].Finalize(context.Background())
	})
	if _, err := q.Wait(ctxT(t)); !errors.Is(err, adi.ErrFinalized) {
		t.Errorf("pending collective after Finalize: %v, want ErrFinalized", err)
	}
	if _, err := ws[0].Comm().Ibarrier(); !errors.Is(err, adi.ErrFinalized) {
		t.Errorf("collective started after Finalize: %v, want ErrFinalized", err)
	}
	if g := leakcheck.Goroutines("adi.(*background).work", "adi.(*Comm).nonblocking"); g != "" {
		t.Errorf("goroutines left:\n%s", g)
	}
}
