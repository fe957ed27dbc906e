// Command ordercheck checks that a job keeps MPI's message order whatever
// launched it: a token ring, then every rank sends numbered messages of
// random sizes (eager and rendezvous) to every other, which checks that each
// source's messages arrive in order, then collectives whose results every
// rank checks, then exchanges: Sendrecv around the ring, and goroutines
// receiving every rank's messages through matched probes while
// nonblocking collectives run, and one-sided puts, accumulates, locked
// increments and fetch-and-add tickets. Each rank prints one line naming its host and the
// subdevices it used; the exit status is non-zero on any error.
//
//	mdrun -n 4 ./ordercheck
//	mpiexec -n 4 ./ordercheck            # MPICH's Hydra, over PMI
//	srun --mpi=pmi2 -n 4 ./ordercheck    # Slurm, over PMI-2
//	mpirun -n 4 ./ordercheck             # Open MPI, over PMIx (go build -tags pmix)
//	srun --mpi=pmix -n 4 ./ordercheck    # Slurm, over PMIx (go build -tags pmix)
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
)

const (
	tagRing  = 100
	tagShift = 101
	tagProbe = 102
	tagMax   = 3 // order messages use tags 0..tagMax-1
)

func main() {
	per := flag.Int("messages", 100, "messages from each rank to each other rank")
	maxSize := flag.Int("max-size", 100<<10, "largest message in bytes (at least 8)")
	timeout := flag.Duration("timeout", 2*time.Minute, "give up after this long")
	flag.Parse()
	if *maxSize < 8 || *per < 0 {
		fmt.Fprintln(os.Stderr, "ordercheck: -max-size must be at least 8 and -messages not negative")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := run(ctx, *per, *maxSize); err != nil {
		fmt.Fprintln(os.Stderr, "ordercheck:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, per, maxSize int) error {
	w, err := adi.Init(ctx)
	if err != nil {
		return err
	}
	c := w.Comm()
	for _, step := range []func(context.Context, *adi.Comm) error{
		ring,
		func(ctx context.Context, c *adi.Comm) error { return order(ctx, c, per, maxSize) },
		collectives,
		func(ctx context.Context, c *adi.Comm) error { return exchange(ctx, c, per, maxSize) },
	} {
		if err := step(ctx, c); err != nil {
			w.Abort(1, err.Error())
			return err
		}
	}
	used := map[string]bool{}
	for _, s := range w.Stats() {
		if s.Peer != c.Rank() {
			used[s.SubDevice] = true
		}
	}
	names := make([]string, 0, len(used))
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	local, err := c.SplitHost(ctx)
	if err != nil {
		w.Abort(1, err.Error())
		return err
	}
	site := ""
	if w.Site() != "" {
		site = " in site " + w.Site()
	}
	fmt.Printf("rank %d of %d on %s: ring ok, order ok, collectives ok, exchange ok (%d messages to each peer; subdevices %s; %d ranks on this host)%s\n",
		c.Rank(), c.Size(), w.Host(), per, strings.Join(names, ","), local.Size(), site)
	return w.Finalize(ctx)
}

// ring passes a counter around the ranks; every rank adds one.
func ring(ctx context.Context, c *adi.Comm) error {
	if c.Size() == 1 {
		return nil
	}
	next, prev := (c.Rank()+1)%c.Size(), (c.Rank()+c.Size()-1)%c.Size()
	buf := make([]byte, 8)
	if c.Rank() == 0 {
		if err := c.Send(ctx, buf, next, tagRing); err != nil {
			return fmt.Errorf("ring: %w", err)
		}
	}
	if _, err := c.Recv(ctx, buf, prev, tagRing); err != nil {
		return fmt.Errorf("ring: %w", err)
	}
	hops := binary.LittleEndian.Uint64(buf) + 1
	binary.LittleEndian.PutUint64(buf, hops)
	if c.Rank() != 0 {
		return c.Send(ctx, buf, next, tagRing)
	}
	if hops != uint64(c.Size()) {
		return fmt.Errorf("ring: the token counted %d hops around %d ranks", hops, c.Size())
	}
	return nil
}

// order: every rank sends per numbered messages of random sizes to every
// other on random tags; receivers take any source and tag and check that
// each source's numbers arrive in sequence.
func order(ctx context.Context, c *adi.Comm, per, maxSize int) error {
	var reqs []*adi.Request
	rng := rand.New(rand.NewPCG(uint64(c.Rank()), uint64(time.Now().UnixNano())))
	for i := range per {
		for peer := range c.Size() {
			if peer == c.Rank() {
				continue
			}
			msg := make([]byte, 8+rng.IntN(maxSize-7))
			binary.LittleEndian.PutUint64(msg, uint64(i))
			r, err := c.Isend(msg, peer, rng.IntN(tagMax))
			if err != nil {
				return fmt.Errorf("order: %w", err)
			}
			reqs = append(reqs, r)
		}
	}
	next := make([]uint64, c.Size())
	buf := make([]byte, maxSize)
	for range per * (c.Size() - 1) {
		st, err := c.Recv(ctx, buf, adi.AnySource, adi.AnyTag)
		if err != nil {
			return fmt.Errorf("order: %w", err)
		}
		if st.Tag == tagRing || st.Count < 8 {
			return fmt.Errorf("order: unexpected message of %d bytes with tag %d from rank %d", st.Count, st.Tag, st.Source)
		}
		got := binary.LittleEndian.Uint64(buf)
		if got != next[st.Source] {
			return fmt.Errorf("order: rank %d got message %d from rank %d, want %d", c.Rank(), got, st.Source, next[st.Source])
		}
		next[st.Source]++
	}
	if _, err := adi.WaitAll(ctx, reqs...); err != nil {
		return fmt.Errorf("order: %w", err)
	}
	return nil
}

// collectives runs each kind of collective once, small and past the
// eager limit, and checks the results: the same on every launcher and
// route as between ranks of one host.
func collectives(ctx context.Context, c *adi.Comm) error {
	n, me := c.Size(), c.Rank()
	for _, elems := range []int{4, 20000} {
		v := make([]int64, elems)
		for i := range v {
			v[i] = int64(me*elems + i)
		}
		if err := adi.Allreduce(ctx, c, v, v, adi.Sum); err != nil {
			return fmt.Errorf("collectives: %w", err)
		}
		for i, x := range v {
			// The sum over ranks r of r*elems + i.
			if want := int64(elems*n*(n-1)/2 + n*i); x != want {
				return fmt.Errorf("collectives: allreduce element %d is %d, want %d", i, x, want)
			}
		}
		b := make([]int64, elems)
		if me == n-1 {
			copy(b, v)
		}
		if err := c.Bcast(ctx, adi.Bytes(b), n-1); err != nil {
			return fmt.Errorf("collectives: %w", err)
		}
		send, recv := make([]int64, n*elems), make([]int64, n*elems)
		for r := range n {
			send[r*elems] = int64(me*n + r)
		}
		if err := c.Alltoall(ctx, adi.Bytes(send), adi.Bytes(recv)); err != nil {
			return fmt.Errorf("collectives: %w", err)
		}
		for r := range n {
			if got := recv[r*elems]; got != int64(r*n+me) || b[elems-1] != v[elems-1] {
				return fmt.Errorf("collectives: alltoall block from rank %d starts %d, want %d (or bcast differs)", r, got, r*n+me)
			}
		}
	}
	// Neighbour allgather on the ranks as a ring: slot 0 from the left,
	// slot 1 from the right, the same rank twice on a ring of two.
	ring, err := c.CartCreate(ctx, []int{n}, []bool{true})
	if err != nil {
		return fmt.Errorf("collectives: %w", err)
	}
	got := make([]int64, 2)
	if err := ring.NeighborAllgather(ctx, adi.Bytes([]int64{int64(me)}), adi.Bytes(got)); err != nil {
		return fmt.Errorf("collectives: %w", err)
	}
	if want := []int64{int64((me + n - 1) % n), int64((me + 1) % n)}; got[0] != want[0] || got[1] != want[1] {
		return fmt.Errorf("collectives: neighbour allgather gave %v, want %v", got, want)
	}
	if err := c.Barrier(ctx); err != nil {
		return fmt.Errorf("collectives: %w", err)
	}
	return nil
}

// exchange shifts a buffer around the ring both ways with Sendrecv, then
// has every rank send per numbered messages of random sizes to every
// other, which two goroutines of the receiver take through matched probes
// (each receives exactly what it probed) while a nonblocking allreduce
// and barrier run beside them.
func exchange(ctx context.Context, c *adi.Comm, per, maxSize int) error {
	n, me := c.Size(), c.Rank()
	right, left := (me+1)%n, (me+n-1)%n
	out, in := fill(me, maxSize), make([]byte, maxSize)
	if _, err := c.Sendrecv(ctx, out, right, tagShift, in, left, tagShift); err != nil {
		return fmt.Errorf("exchange: %w", err)
	}
	if !bytes.Equal(in, fill(left, maxSize)) {
		return fmt.Errorf("exchange: sendrecv brought wrong data from rank %d", left)
	}
	if _, err := c.SendrecvReplace(ctx, in, left, tagShift, right, tagShift); err != nil {
		return fmt.Errorf("exchange: %w", err)
	}
	if !bytes.Equal(in, fill(me, maxSize)) {
		return fmt.Errorf("exchange: sendrecv-replace brought wrong data from rank %d", right)
	}

	sum := []int64{int64(me)}
	allreduce, err := adi.Iallreduce(c, sum, sum, adi.Sum)
	if err != nil {
		return fmt.Errorf("exchange: %w", err)
	}
	barrier, err := c.Ibarrier()
	if err != nil {
		return fmt.Errorf("exchange: %w", err)
	}
	var reqs []*adi.Request
	rng := rand.New(rand.NewPCG(uint64(me), uint64(time.Now().UnixNano())))
	for i := range per {
		for peer := range n {
			if peer == me {
				continue
			}
			msg := fill(me*per+i, 8+rng.IntN(maxSize-7))
			binary.LittleEndian.PutUint64(msg, uint64(i))
			r, err := c.Isend(msg, peer, tagProbe)
			if err != nil {
				return fmt.Errorf("exchange: %w", err)
			}
			reqs = append(reqs, r)
		}
	}
	const receivers = 2
	total := per * (n - 1)
	seen := make([][]bool, n)
	for r := range seen {
		seen[r] = make([]bool, per)
	}
	var mu sync.Mutex
	var untaken atomic.Int64 // messages no goroutine has taken on yet
	untaken.Store(int64(total))
	errs := make(chan error, receivers)
	for range receivers {
		go func() {
			for untaken.Add(-1) >= 0 {
				m, st, err := c.Mprobe(ctx, adi.AnySource, tagProbe)
				if err != nil {
					errs <- err
					return
				}
				buf := make([]byte, st.Count)
				if _, err := m.Recv(ctx, buf); err != nil {
					errs <- err
					return
				}
				i := int(binary.LittleEndian.Uint64(buf))
				if i < 0 || i >= per || !bytes.Equal(buf[8:], fill(st.Source*per+i, st.Count)[8:]) {
					errs <- fmt.Errorf("message %d of %d bytes from rank %d is corrupted", i, st.Count, st.Source)
					return
				}
				mu.Lock()
				dup := seen[st.Source][i]
				seen[st.Source][i] = true
				mu.Unlock()
				if dup {
					errs <- fmt.Errorf("message %d from rank %d received twice", i, st.Source)
					return
				}
			}
			errs <- nil
		}()
	}
	for range receivers {
		if err := <-errs; err != nil {
			return fmt.Errorf("exchange: matched probes: %w", err)
		}
	}
	if _, err := adi.WaitAll(ctx, append(reqs, allreduce, barrier)...); err != nil {
		return fmt.Errorf("exchange: %w", err)
	}
	if want := int64(n * (n - 1) / 2); sum[0] != want {
		return fmt.Errorf("exchange: nonblocking allreduce gave %d, want %d", sum[0], want)
	}
	return window(ctx, c, maxSize)
}

// window checks one-sided communication: every rank puts a buffer into
// its right neighbour's window and adds to a sum in rank 0's, fences,
// then increments a counter in rank 0's window under an exclusive lock,
// and draws a ticket from another with an atomic fetch-and-add.
func window(ctx context.Context, c *adi.Comm, maxSize int) error {
	n, me := c.Size(), c.Rank()
	right, left := (me+1)%n, (me+n-1)%n
	const putAt = 24 // after the sum, the counter and the tickets
	base := make([]byte, putAt+maxSize)
	win, err := c.WinCreate(ctx, base)
	if err != nil {
		return fmt.Errorf("window: %w", err)
	}
	if err := errors.Join(win.Put(fill(me+7, maxSize), right, putAt),
		adi.Accumulate(win, []int64{int64(me)}, 0, 0, adi.AccSum), win.Fence(ctx)); err != nil {
		return fmt.Errorf("window: %w", err)
	}
	if !bytes.Equal(base[putAt:], fill(left+7, maxSize)) {
		return fmt.Errorf("window: the put from rank %d is wrong", left)
	}
	if got, want := int64(binary.LittleEndian.Uint64(base)), int64(n*(n-1)/2); me == 0 && got != want {
		return fmt.Errorf("window: accumulated %d, want %d", got, want)
	}
	var cur [8]byte
	if err := errors.Join(win.Lock(ctx, 0, true), win.Get(cur[:], 0, 8), win.Flush(ctx, 0)); err != nil {
		return fmt.Errorf("window: %w", err)
	}
	binary.LittleEndian.PutUint64(cur[:], binary.LittleEndian.Uint64(cur[:])+1)
	if err := errors.Join(win.Put(cur[:], 0, 8), win.Unlock(ctx, 0), win.Fence(ctx)); err != nil {
		return fmt.Errorf("window: %w", err)
	}
	if got := binary.LittleEndian.Uint64(base[8:]); me == 0 && got != uint64(n) {
		return fmt.Errorf("window: %d locked increments counted, want %d", got, n)
	}
	var ticket int64
	if err := errors.Join(win.LockAll(ctx), adi.FetchAndOp(win, 1, &ticket, 0, 16, adi.AccSum), win.UnlockAll(ctx)); err != nil {
		return fmt.Errorf("window: %w", err)
	}
	tickets := make([]int64, n)
	if err := c.Allgather(ctx, adi.Bytes([]int64{ticket}), adi.Bytes(tickets)); err != nil {
		return fmt.Errorf("window: %w", err)
	}
	slices.Sort(tickets)
	for i, tk := range tickets {
		if tk != int64(i) {
			return fmt.Errorf("window: fetch-and-add tickets %v, want 0 to %d once each", tickets, n-1)
		}
	}
	return win.Free(ctx)
}

// fill is n bytes that depend on seed.
func fill(seed, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(seed*131 + i*7)
	}
	return b
}
