package adi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
)

// each runs f on every rank of cs at once and fails t with every rank's
// error.
func each(t *testing.T, cs []*adi.Comm, f func(c *adi.Comm) error) {
	t.Helper()
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for r, c := range cs {
		wg.Go(func() { errs[r] = f(c) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// pattern is what rank src sends rank dst in a test of n bytes.
func pattern(src, dst, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(src*31 + dst*7 + i)
	}
	return b
}

// collSizes are the job sizes collectives are tested with: powers of two,
// odd sizes and sizes just above a power of two, where the algorithms fold.
var collSizes = []int{1, 2, 3, 4, 5, 6, 7, 8}

// collLengths are message lengths in bytes: empty, eager, and beyond
// loopJob's 512-byte eager limit, where messages go by rendezvous.
var collLengths = []int{0, 1, 100, 3000}

func TestBarrier(t *testing.T) {
	for _, n := range collSizes {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			cs := loopJob(t, n)
			ctx := ctxT(t)
			var arrived atomic.Int32
			each(t, cs, func(c *adi.Comm) error {
				for round := range 3 {
					// Ranks come late by different amounts; nobody may
					// leave a round before everybody has come to it.
					time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
					arrived.Add(1)
					if err := c.Barrier(ctx); err != nil {
						return err
					}
					if got := arrived.Load(); got < int32(n*(round+1)) {
						return fmt.Errorf("left barrier %d when %d of %d ranks had come to it", round, got-int32(n*round), n)
					}
					if err := c.Barrier(ctx); err != nil { // nobody counts the next round yet
						return err
					}
				}
				return nil
			})
		})
	}
}

// checkBcast broadcasts size bytes of a pattern from root and checks that
// the rank got them.
func checkBcast(ctx context.Context, size, root int) func(c *adi.Comm) error {
	want := pattern(root, 0, size)
	return func(c *adi.Comm) error {
		buf := make([]byte, size)
		if c.Rank() == root {
			copy(buf, want)
		}
		if err := c.Bcast(ctx, buf, root); err != nil {
			return err
		}
		if !bytes.Equal(buf, want) {
			return fmt.Errorf("rank %d: %d bytes differ", c.Rank(), size)
		}
		return nil
	}
}

// TestBcast: every rank gets the root's buffer, from every root. The
// second set of cases reaches van de Geijn's broadcast (from 12 KiB and
// 8 ranks; 7 ranks still take the tree) with lengths that do not divide
// into the ranks' blocks.
func TestBcast(t *testing.T) {
	for _, tc := range []struct{ sizes, lengths []int }{
		{collSizes, collLengths},
		{[]int{7, 8, 9, 12}, []int{12 << 10, 12<<10 + 5, 100003}},
	} {
		for _, n := range tc.sizes {
			cs := loopJob(t, n)
			ctx := ctxT(t)
			for _, size := range tc.lengths {
				for root := range n {
					t.Run(fmt.Sprintf("n=%d/len=%d/root=%d", n, size, root), func(t *testing.T) {
						each(t, cs, checkBcast(ctx, size, root))
					})
				}
			}
		}
	}
}

func TestGatherScatter(t *testing.T) {
	for _, n := range collSizes {
		cs := loopJob(t, n)
		ctx := ctxT(t)
		for _, size := range collLengths {
			for root := range n {
				t.Run(fmt.Sprintf("n=%d/len=%d/root=%d", n, size, root), func(t *testing.T) {
					each(t, cs, func(c *adi.Comm) error {
						var all []byte
						if c.Rank() == root {
							all = make([]byte, n*size)
						}
						if err := c.Gather(ctx, pattern(c.Rank(), root, size), all, root); err != nil {
							return err
						}
						if c.Rank() == root {
							for r := range n {
								if got, want := all[r*size:(r+1)*size], pattern(r, root, size); !bytes.Equal(got, want) {
									return fmt.Errorf("gather: block of rank %d is %x, want %x", r, got, want)
								}
							}
							for r := range n { // scatter what each rank is to get
								copy(all[r*size:], pattern(root, r, size))
							}
						}
						mine := make([]byte, size)
						if err := c.Scatter(ctx, all, mine, root); err != nil {
							return err
						}
						if want := pattern(root, c.Rank(), size); !bytes.Equal(mine, want) {
							return fmt.Errorf("scatter: got %x, want %x", mine, want)
						}
						return nil
					})
				})
			}
		}
	}
}

func TestAllgatherAlltoall(t *testing.T) {
	for _, n := range collSizes {
		cs := loopJob(t, n)
		ctx := ctxT(t)
		for _, size := range collLengths {
			t.Run(fmt.Sprintf("n=%d/len=%d", n, size), func(t *testing.T) {
				each(t, cs, func(c *adi.Comm) error {
					me := c.Rank()
					all := make([]byte, n*size)
					if err := c.Allgather(ctx, pattern(me, 0, size), all); err != nil {
						return err
					}
					for r := range n {
						if got, want := all[r*size:(r+1)*size], pattern(r, 0, size); !bytes.Equal(got, want) {
							return fmt.Errorf("allgather: block of rank %d is %x, want %x", r, got, want)
						}
					}
					send, recv := make([]byte, n*size), make([]byte, n*size)
					for r := range n {
						copy(send[r*size:], pattern(me, r, size))
					}
					if err := c.Alltoall(ctx, send, recv); err != nil {
						return err
					}
					for r := range n {
						if got, want := recv[r*size:(r+1)*size], pattern(r, me, size); !bytes.Equal(got, want) {
							return fmt.Errorf("alltoall: block from rank %d is %x, want %x", r, got, want)
						}
					}
					return nil
				})
			})
		}
	}
}

// affine is an associative operation that is not commutative: each
// element packs an affine map x -> a*x + b mod 2^32 as a<<32 | b, and
// combining composes the maps, the left one outermost. A reduction that
// combines out of rank order gets another map.
func affine(inout, in []uint64) {
	for i := range inout {
		a1, b1 := uint32(inout[i]>>32), uint32(inout[i])
		a2, b2 := uint32(in[i]>>32), uint32(in[i])
		inout[i] = uint64(a1*a2)<<32 | uint64(a1*b2+b1)
	}
}

// contribution is what rank r reduces: elems affine maps with odd factors
// (so that no product collapses to zero).
func contribution(r, elems int) []uint64 {
	v := make([]uint64, elems)
	for i := range v {
		v[i] = uint64(2*(r*131+i*17)+3)<<32 | uint64(r*1000+i)
	}
	return v
}

func TestReduceAllreduce(t *testing.T) {
	for _, n := range collSizes {
		cs := loopJob(t, n)
		ctx := ctxT(t)
		for _, elems := range []int{0, 1, 13, 700, 9000} { // 700 elements: 5600 bytes, rendezvous; 9000: by halving
			// What the ranks' contributions combine to, in rank order.
			want := contribution(0, elems)
			var sum []int64 = make([]int64, elems)
			for r := range n {
				if r > 0 {
					affine(want, contribution(r, elems))
				}
				for i := range sum {
					sum[i] += int64(r*elems + i)
				}
			}
			for root := range n {
				t.Run(fmt.Sprintf("n=%d/elems=%d/root=%d", n, elems, root), func(t *testing.T) {
					each(t, cs, func(c *adi.Comm) error {
						var got []uint64
						if c.Rank() == root {
							got = make([]uint64, elems)
						}
						if err := adi.Reduce(ctx, c, contribution(c.Rank(), elems), got, affine, root); err != nil {
							return err
						}
						if c.Rank() == root && !equal(got, want) {
							return fmt.Errorf("reduce: got %x, want %x", got, want)
						}
						return nil
					})
				})
			}
			t.Run(fmt.Sprintf("n=%d/elems=%d/all", n, elems), func(t *testing.T) {
				each(t, cs, func(c *adi.Comm) error {
					got := make([]uint64, elems)
					if err := adi.Allreduce(ctx, c, contribution(c.Rank(), elems), got, affine); err != nil {
						return err
					}
					if !equal(got, want) {
						return fmt.Errorf("allreduce: got %x, want %x", got, want)
					}
					// In place, with a predefined operation.
					v := make([]int64, elems)
					for i := range v {
						v[i] = int64(c.Rank()*elems + i)
					}
					if err := adi.Allreduce(ctx, c, v, v, adi.Sum); err != nil {
						return err
					}
					if !equal(v, sum) {
						return fmt.Errorf("allreduce in place: got %v, want %v", v, sum)
					}
					return nil
				})
			})
		}
	}
}

func equal[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestOps(t *testing.T) {
	for _, tc := range []struct {
		name      string
		op        adi.Op[int32]
		a, b, out []int32
	}{
		{"sum", adi.Sum[int32], []int32{1, -2}, []int32{3, 5}, []int32{4, 3}},
		{"prod", adi.Prod[int32], []int32{2, -2}, []int32{3, 5}, []int32{6, -10}},
		{"max", adi.Max[int32], []int32{2, -2}, []int32{3, -5}, []int32{3, -2}},
		{"min", adi.Min[int32], []int32{2, -2}, []int32{3, -5}, []int32{2, -5}},
		{"band", adi.BAnd[int32], []int32{6, 1}, []int32{3, 1}, []int32{2, 1}},
		{"bor", adi.BOr[int32], []int32{6, 1}, []int32{3, 0}, []int32{7, 1}},
		{"bxor", adi.BXor[int32], []int32{6, 1}, []int32{3, 1}, []int32{5, 0}},
	} {
		got := append([]int32(nil), tc.a...)
		tc.op(got, tc.b)
		if !equal(got, tc.out) {
			t.Errorf("%s(%v, %v) = %v, want %v", tc.name, tc.a, tc.b, got, tc.out)
		}
	}
	for _, tc := range []struct {
		name string
		op   adi.Op[bool]
		out  []bool
	}{{"land", adi.LAnd[bool], []bool{true, false, false, false}}, {"lor", adi.LOr[bool], []bool{true, true, true, false}}} {
		got := []bool{true, true, false, false}
		tc.op(got, []bool{true, false, true, false})
		if !equal(got, tc.out) {
			t.Errorf("%s = %v, want %v", tc.name, got, tc.out)
		}
	}
	if b := adi.Bytes([]uint16{0x0102, 0x0304}); len(b) != 4 {
		t.Errorf("Bytes of two uint16: %d bytes", len(b))
	}
	if b := adi.Bytes([]float64(nil)); b != nil {
		t.Errorf("Bytes of nothing: %v", b)
	}
}

// TestCollectiveMismatchText: a mismatch's error says what arrived: a
// longer message than expected, a shorter one, or one of poison's shape,
// which may only pass on a mismatch its sender met elsewhere.
func TestCollectiveMismatchText(t *testing.T) {
	const n = 5
	cs := loopJob(t, n)
	ctx := ctxT(t)
	mm := adi.ErrMismatch.Error()
	bcast := func(c *adi.Comm, size int) error { return c.Bcast(ctx, make([]byte, size), 0) }
	for _, tc := range []struct {
		name  string
		odd   int    // the rank that passes sizes[0] bytes
		sizes [2]int // sizes[1]: what the others pass
		f     func(c *adi.Comm, size int) error
		want  map[int]string // rank -> what its error must say
	}{
		// The tree from 0: 0 sends to 4, 2, 1; 2 passes poison on to 3.
		{"bcast, one short", 2, [2]int{32, 64}, bcast, map[int]string{
			2: "from rank 0: " + mm + ": more than the 32 bytes expected",
			3: "from rank 2: " + mm + ": 0 bytes where 64 were expected (rank 2 passed another length, or passes on a mismatch it met)"}},
		{"bcast, one empty", 2, [2]int{0, 64}, bcast, map[int]string{
			3: "from rank 2: " + mm + ": 1 bytes where 64 were expected (rank 2 passed another length, or passes on a mismatch it met)"}},
		{"bcast, all empty but the root", 0, [2]int{64, 0}, bcast, map[int]string{
			3: "from rank 2: " + mm + ": more than the 0 bytes expected (rank 2 passed another length, or passes on a mismatch it met)"}},
		{"gather", 1, [2]int{32, 64}, func(c *adi.Comm, size int) error { return c.Gather(ctx, make([]byte, size), make([]byte, n*64), 0) },
			map[int]string{0: "from rank 1: " + mm + ": 32 bytes where 64 were expected"}},
	} {
		errs := make([]error, n)
		var wg sync.WaitGroup
		for r, c := range cs {
			wg.Go(func() {
				s := tc.sizes[1]
				if r == tc.odd {
					s = tc.sizes[0]
				}
				errs[r] = tc.f(c, s)
			})
		}
		wg.Wait()
		for r, want := range tc.want {
			if errs[r] == nil || !strings.HasSuffix(errs[r].Error(), want) {
				t.Errorf("%s: rank %d: %v; want it to end %q", tc.name, r, errs[r], want)
			}
		}
	}
}

// TestCollectiveMismatch: ranks that disagree on a length get ErrMismatch,
// and so does every rank whose result depends on theirs; every rank
// returns.
func TestCollectiveMismatch(t *testing.T) {
	const n = 5
	cs := loopJob(t, n)
	ctx := ctxT(t)
	for _, tc := range []struct {
		name  string
		odd   int // the rank that passes another length
		f     func(c *adi.Comm, size int) error
		want  []bool // which ranks get ErrMismatch
		sizes []int  // default: 64 and 4096, eager and rendezvous
	}{
		// The tree from 0: 0 sends to 4, 2, 1; 2 passes on to 3.
		{"bcast", 2, func(c *adi.Comm, size int) error { return c.Bcast(ctx, make([]byte, size), 0) },
			[]bool{false, false, true, true, false}, nil},
		{"gather", 1, func(c *adi.Comm, size int) error { return c.Gather(ctx, make([]byte, size), make([]byte, n*size), 0) },
			[]bool{true, false, false, false, false}, nil},
		{"scatter", 1, func(c *adi.Comm, size int) error { return c.Scatter(ctx, make([]byte, n*size), make([]byte, size), 0) },
			[]bool{false, true, false, false, false}, nil},
		{"allgather", 3, func(c *adi.Comm, size int) error { return c.Allgather(ctx, make([]byte, size), make([]byte, n*size)) },
			[]bool{true, true, true, true, true}, nil},
		{"allreduce", 3, func(c *adi.Comm, size int) error {
			v := make([]byte, size)
			return adi.Allreduce(ctx, c, v, v, adi.BOr)
		}, []bool{true, true, true, true, true}, nil},
		{"reduce", 4, func(c *adi.Comm, size int) error {
			return adi.Reduce(ctx, c, make([]byte, size), make([]byte, size), adi.BOr, 1)
		}, []bool{true, true, false, false, false}, nil}, // 4 -> 0 -> 1: rank 4 only sends
		// From 64 KiB by reduce-scatter: 0 folds into 1; 4 and 3 swap
		// halves first, then pass the mismatch on to 2 and 1. (Halved,
		// rank 4's length would take the other algorithm, and the ranks
		// would wait for messages that never come.)
		{"reduce by halving", 4, func(c *adi.Comm, size int) error {
			return adi.Reduce(ctx, c, make([]byte, size), make([]byte, size), adi.BOr, 1)
		}, []bool{false, true, true, true, true}, []int{160000}},
		{"allreduce by halving", 4, func(c *adi.Comm, size int) error {
			v := make([]byte, size)
			return adi.Allreduce(ctx, c, v, v, adi.BOr)
		}, []bool{true, true, true, true, true}, []int{160000}},
	} {
		if tc.sizes == nil {
			tc.sizes = []int{64, 4096}
		}
		for _, size := range tc.sizes {
			errs := make([]error, n)
			var wg sync.WaitGroup
			for r, c := range cs {
				wg.Go(func() {
					s := size
					if r == tc.odd {
						s = size / 2
					}
					errs[r] = tc.f(c, s)
				})
			}
			wg.Wait()
			for r, want := range tc.want {
				if got := errors.Is(errs[r], adi.ErrMismatch); got != want || !want && errs[r] != nil {
					t.Errorf("%s of %d bytes, rank %d short: rank %d: %v; want ErrMismatch: %v", tc.name, size, tc.odd, r, errs[r], want)
				}
			}
		}
	}
	if err := cs[0].Bcast(ctx, nil, n); !errors.Is(err, adi.ErrRank) {
		t.Errorf("root %d of %d ranks: %v, want ErrRank", n, n, err)
	}
	if err := cs[0].Gather(ctx, make([]byte, 8), make([]byte, 8), 0); err == nil {
		t.Error("gather into a buffer for one rank of five: no error")
	}
	if err := cs[0].Alltoall(ctx, make([]byte, 6), make([]byte, 6)); err == nil {
		t.Error("alltoall of 6 bytes over 5 ranks: no error")
	}
	if err := adi.Allreduce(ctx, cs[0], make([]int, 3), make([]int, 2), adi.Sum); err == nil {
		t.Error("allreduce into a shorter slice: no error")
	}
}

// TestCollectiveIsolation: a collective neither takes nor disturbs the
// application's wildcard receives on the same communicator, and works on a
// communicator from Split.
func TestCollectiveIsolation(t *testing.T) {
	const n = 5
	cs := loopJob(t, n)
	ctx := ctxT(t)
	any := must(cs[0].Irecv(make([]byte, 8), adi.AnySource, adi.AnyTag))
	each(t, cs, func(c *adi.Comm) error {
		v := []int{c.Rank()}
		if err := adi.Allreduce(ctx, c, v, v, adi.Max); err != nil {
			return err
		}
		if v[0] != n-1 {
			return fmt.Errorf("max of ranks: %d", v[0])
		}
		if _, done, _ := any.Test(); done {
			return errors.New("the collective matched the application's wildcard receive")
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		if c.Rank() == 3 {
			if err := c.Send(ctx, []byte("app"), 0, 9); err != nil {
				return err
			}
		}
		// Odd and even ranks, the odd ones in reverse order.
		s, err := c.Split(ctx, c.Rank()%2, c.Rank()*(1-2*(c.Rank()%2)))
		if err != nil {
			return err
		}
		w := []int{c.Rank()}
		if err := adi.Allreduce(ctx, s, w, w, adi.Sum); err != nil {
			return err
		}
		if want := map[int]int{0: 0 + 2 + 4, 1: 1 + 3}[c.Rank()%2]; w[0] != want {
			return fmt.Errorf("sum over the split: %d, want %d", w[0], want)
		}
		return nil
	})
	st, err := any.Wait(ctx)
	if err != nil || st.Source != 3 || st.Tag != 9 || st.Count != 3 {
		t.Fatalf("wildcard receive: %+v, %v", st, err)
	}
}

// TestCollectiveContextEnds: a collective whose peers never come returns
// when its context ends.
func TestCollectiveContextEnds(t *testing.T) {
	cs := loopJob(t, 3)
	for _, tc := range []struct {
		name string
		f    func(context.Context, *adi.Comm) error
	}{
		{"bcast", func(ctx context.Context, c *adi.Comm) error { return c.Bcast(ctx, make([]byte, 8), 0) }},
		{"barrier", func(ctx context.Context, c *adi.Comm) error { return c.Barrier(ctx) }},
		{"allreduce", func(ctx context.Context, c *adi.Comm) error {
			v := []int{1}
			return adi.Allreduce(ctx, c, v, v, adi.Sum)
		}},
	} {
		ctx, cancel := context.WithTimeout(ctxT(t), 20*time.Millisecond)
		err := tc.f(ctx, cs[1])
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s on one rank of three: %v, want the context's end", tc.name, err)
		}
	}
}

// TestCollectivesShm runs the collectives over shm, with messages large
// enough for its rendezvous and single-copy paths.
func TestCollectivesShm(t *testing.T) {
	const n = 3
	ws := job(t, n)
	ctx := ctxT(t)
	cs := make([]*adi.Comm, n)
	for i, w := range ws {
		cs[i] = w.Comm()
	}
	const elems = 1 << 17 // 1 MiB of float64
	each(t, cs, func(c *adi.Comm) error {
		v := make([]float64, elems)
		for i := range v {
			v[i] = float64(c.Rank() + i)
		}
		if err := adi.Allreduce(ctx, c, v, v, adi.Sum); err != nil {
			return err
		}
		for i, x := range v {
			if want := float64(3*i + 3); x != want {
				return fmt.Errorf("allreduce: element %d is %v, want %v", i, x, want)
			}
		}
		b := make([]float64, elems)
		if c.Rank() == 2 {
			copy(b, v)
		}
		if err := c.Bcast(ctx, adi.Bytes(b), 2); err != nil {
			return err
		}
		if !equal(b, v) {
			return errors.New("bcast of the allreduced vector differs")
		}
		return c.Barrier(ctx)
	})
}

func TestScanExscan(t *testing.T) {
	for _, n := range collSizes {
		cs := loopJob(t, n)
		ctx := ctxT(t)
		for _, elems := range []int{0, 1, 13, 700} {
			// prefix[r]: ranks 0..r combined in rank order.
			prefix := make([][]uint64, n)
			for r := range n {
				prefix[r] = contribution(r, elems)
				if r > 0 {
					prefix[r] = append([]uint64(nil), prefix[r-1]...)
					affine(prefix[r], contribution(r, elems))
				}
			}
			t.Run(fmt.Sprintf("n=%d/elems=%d", n, elems), func(t *testing.T) {
				each(t, cs, func(c *adi.Comm) error {
					me := c.Rank()
					got := contribution(me, elems) // in place
					if err := adi.Scan(ctx, c, got, got, affine); err != nil {
						return err
					}
					if !equal(got, prefix[me]) {
						return fmt.Errorf("scan: got %x, want %x", got, prefix[me])
					}
					untouched := make([]uint64, elems)
					for i := range untouched {
						untouched[i] = 42
					}
					got = append([]uint64(nil), untouched...)
					if err := adi.Exscan(ctx, c, contribution(me, elems), got, affine); err != nil {
						return err
					}
					want := untouched // rank 0's is left alone
					if me > 0 {
						want = prefix[me-1]
					}
					if !equal(got, want) {
						return fmt.Errorf("exscan: got %x, want %x", got, want)
					}
					return nil
				})
			})
		}
	}
}

// TestVariableLengths: the v collectives with a different length from
// every rank (and for every pair), empty ones and rendezvous ones among
// them.
func TestVariableLengths(t *testing.T) {
	length := func(src, dst int) int { return []int{0, 1, 100, 3000, 7}[(src+2*dst)%5] }
	for _, n := range collSizes {
		cs := loopJob(t, n)
		ctx := ctxT(t)
		for root := range n {
			t.Run(fmt.Sprintf("n=%d/root=%d", n, root), func(t *testing.T) {
				each(t, cs, func(c *adi.Comm) error {
					me := c.Rank()
					// Gatherv: rank r sends length(r, root) bytes.
					var parts [][]byte
					if me == root {
						parts = make([][]byte, n)
						for r := range parts {
							parts[r] = make([]byte, length(r, root))
						}
					}
					if err := c.Gatherv(ctx, pattern(me, root, length(me, root)), parts, root); err != nil {
						return err
					}
					for r, b := range parts {
						if want := pattern(r, root, length(r, root)); !bytes.Equal(b, want) {
							return fmt.Errorf("gatherv: block of rank %d is %x, want %x", r, b, want)
						}
					}
					// Scatterv: the root sends rank r length(root, r) bytes.
					if me == root {
						for r := range parts {
							parts[r] = pattern(root, r, length(root, r))
						}
					}
					mine := make([]byte, length(root, me))
					if err := c.Scatterv(ctx, parts, mine, root); err != nil {
						return err
					}
					if want := pattern(root, me, length(root, me)); !bytes.Equal(mine, want) {
						return fmt.Errorf("scatterv: got %x, want %x", mine, want)
					}
					// Allgatherv: rank r contributes length(r, root) bytes.
					all := make([][]byte, n)
					for r := range all {
						all[r] = make([]byte, length(r, root))
					}
					if err := c.Allgatherv(ctx, pattern(me, root, length(me, root)), all); err != nil {
						return err
					}
					for r, b := range all {
						if want := pattern(r, root, length(r, root)); !bytes.Equal(b, want) {
							return fmt.Errorf("allgatherv: block of rank %d is %x, want %x", r, b, want)
						}
					}
					// Alltoallv: src sends dst length(src+root, dst) bytes.
					send, recv := make([][]byte, n), make([][]byte, n)
					for r := range n {
						send[r] = pattern(me, r, length(me+root, r))
						recv[r] = make([]byte, length(r+root, me))
					}
					if err := c.Alltoallv(ctx, send, recv); err != nil {
						return err
					}
					for r, b := range recv {
						if want := pattern(r, me, length(r+root, me)); !bytes.Equal(b, want) {
							return fmt.Errorf("alltoallv: block from rank %d is %x, want %x", r, b, want)
						}
					}
					return nil
				})
			})
		}
	}
}

// TestCollectiveBusy: a second collective started on a communicator while
// one runs there is refused, not raced; one on a duplicate goes ahead.
func TestCollectiveBusy(t *testing.T) {
	cs := loopJob(t, 2)
	ctx, cancel := context.WithCancel(ctxT(t))
	busy := func(err error) bool {
		return err != nil && strings.Contains(err.Error(), "another collective is running")
	}
	stuck := make(chan error, 1)
	start := func() { go func() { stuck <- cs[0].Bcast(ctx, make([]byte, 8), 1) }() } // rank 1 never joins
	start()
	ended, end := context.WithCancel(ctx)
	end() // a barrier that gets going returns at once
	for give := time.Now().Add(10 * time.Second); ; {
		err := cs[0].Barrier(ended)
		if busy(err) {
			break
		}
		if time.Now().After(give) {
			t.Fatalf("a barrier beside a running broadcast was never refused: %v", err)
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("a barrier alone on one rank of two: %v", err)
		}
		// The barrier ran before the broadcast began; if the broadcast
		// met it and was refused, it starts again.
		select {
		case err := <-stuck:
			if !busy(err) {
				t.Fatalf("the broadcast: %v", err)
			}
			start()
		default:
		}
	}
	d0, _ := cs[0].Dup(ctx)
	d1, _ := cs[1].Dup(ctx)
	each(t, []*adi.Comm{d0, d1}, func(c *adi.Comm) error { return c.Barrier(ctx) })
	cancel()
	if err := <-stuck; !errors.Is(err, context.Canceled) {
		t.Fatalf("the stuck broadcast: %v", err)
	}
}

// TestReduceScatter: each rank gets its part of the combination in rank
// order (affine maps do not commute), with equal and with uneven counts,
// empty parts included, small and past the size where Reduce halves.
func TestReduceScatter(t *testing.T) {
	for _, n := range collSizes {
		cs := loopJob(t, n)
		ctx := ctxT(t)
		for _, per := range []int{0, 1, 5, 9000 / n} {
			uneven := make([]int, n)
			for r := range uneven {
				uneven[r] = per * (r % 3) // 0, per, 2*per, 0, ...
			}
			for _, counts := range [][]int{nil, uneven} {
				name, total := "block", per*n
				if counts != nil {
					name, total = "uneven", 0
					for _, k := range counts {
						total += k
					}
				}
				t.Run(fmt.Sprintf("n=%d/per=%d/%s", n, per, name), func(t *testing.T) {
					want := contribution(0, total)
					for r := 1; r < n; r++ {
						affine(want, contribution(r, total))
					}
					each(t, cs, func(c *adi.Comm) error {
						me, off, mine := c.Rank(), 0, per
						if counts != nil {
							for r := range me {
								off += counts[r]
							}
							mine = counts[me]
						} else {
							off = me * per
						}
						got := make([]uint64, mine)
						var err error
						if counts != nil {
							err = adi.ReduceScatter(ctx, c, contribution(me, total), got, counts, affine)
						} else {
							err = adi.ReduceScatterBlock(ctx, c, contribution(me, total), got, affine)
						}
						if err != nil {
							return err
						}
						if !equal(got, want[off:off+mine]) {
							return fmt.Errorf("got %x, want %x", got, want[off:off+mine])
						}
						return nil
					})
				})
			}
		}
	}
}

// TestReduceScatterCountsWrap: counts that add up to the send slice's
// length only modulo 2^64 are refused, where they once passed the check
// and the cut of the vector panicked, in a worker goroutine for the
// nonblocking and persistent forms, which took the process down.
func TestReduceScatterCountsWrap(t *testing.T) {
	cs := loopJob(t, 3)
	ctx := ctxT(t)
	counts := []int{2, math.MaxInt, math.MaxInt} // 2^64 in all: 0 when it wraps
	send, recv := []int64{}, make([]int64, 2)
	const want = "adding up to more"
	if err := adi.ReduceScatter(ctx, cs[0], send, recv, counts, adi.Sum); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("ReduceScatter: %v, want an error saying the counts add up to more", err)
	}
	if q, err := adi.IreduceScatter(cs[0], send, recv, counts, adi.Sum); err == nil {
		if _, err = q.Wait(ctx); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("IreduceScatter: %v, want an error saying the counts add up to more", err)
		}
	} else if !strings.Contains(err.Error(), want) {
		t.Errorf("IreduceScatter: %v, want an error saying the counts add up to more", err)
	}
	if _, err := adi.ReduceScatterInit(cs[0], send, recv, counts, adi.Sum); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("ReduceScatterInit: %v, want an error saying the counts add up to more", err)
	}
}

func TestReduceScatterArguments(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	for _, tc := range []struct {
		name   string
		send   int
		recv   int
		counts []int
	}{
		{"too few counts", 4, 2, []int{4}},
		{"negative count", 4, 6, []int{6, -2}},
		{"counts and send disagree", 5, 2, []int{2, 2}},
		{"recv and count disagree", 4, 3, []int{2, 2}},
	} {
		err := adi.ReduceScatter(ctx, cs[0], make([]int32, tc.send), make([]int32, tc.recv), tc.counts, adi.Sum)
		if err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	if err := adi.ReduceScatterBlock(ctx, cs[0], make([]int32, 5), make([]int32, 2), adi.Sum); err == nil {
		t.Error("block: send of 5 for 2 ranks of 2 accepted")
	}
}
