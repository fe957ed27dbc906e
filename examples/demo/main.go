// Command demo is the first job to run: a token ring, a ping-pong between
// pairs of ranks, an all-to-all exchange and a few collectives, after which
// rank 0 prints, for every pair of ranks, which subdevice carried the
// traffic.
//
//	go build -o bin/ ./cmd/mdrun ./examples/demo && bin/mdrun -n 4 bin/demo
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
)

const (
	tagRing = iota
	tagPing
	tagAll
	tagStats
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w, err := adi.Init(ctx)
	if err != nil {
		return err
	}
	c := w.Comm()
	steps := []func(context.Context, *adi.Comm) error{ring, pingPong, allToAll, collectives}
	for _, step := range steps {
		if err := step(ctx, c); err != nil {
			w.Abort(1, err.Error())
			return err
		}
	}
	if err := report(ctx, w); err != nil {
		return err
	}
	return w.Finalize(ctx)
}

// ring passes a counter around the ranks twice; every rank adds one.
func ring(ctx context.Context, c *adi.Comm) error {
	if c.Size() == 1 {
		fmt.Println("ring: a world of one rank; run under mdrun -n 4 for a real job")
		return nil
	}
	next, prev := (c.Rank()+1)%c.Size(), (c.Rank()+c.Size()-1)%c.Size()
	buf := make([]byte, 8)
	for lap := range 2 {
		if c.Rank() == 0 {
			buf[0] = byte(lap)
			if err := c.Send(ctx, buf, next, tagRing); err != nil {
				return fmt.Errorf("ring: %w", err)
			}
		}
		if _, err := c.Recv(ctx, buf, prev, tagRing); err != nil {
			return fmt.Errorf("ring: %w", err)
		}
		// Four bytes of count: one byte wrapped at 128 ranks.
		binary.LittleEndian.PutUint32(buf[4:], binary.LittleEndian.Uint32(buf[4:])+1)
		if c.Rank() != 0 {
			if err := c.Send(ctx, buf, next, tagRing); err != nil {
				return fmt.Errorf("ring: %w", err)
			}
		}
	}
	if c.Rank() == 0 {
		hops := binary.LittleEndian.Uint32(buf[4:])
		fmt.Printf("ring: the token went around %d ranks twice and counted %d hops\n", c.Size(), hops)
		if int(hops) != 2*c.Size() {
			return fmt.Errorf("ring: counted %d hops, want %d", hops, 2*c.Size())
		}
	}
	return nil
}

// pingPong bounces messages between ranks 2k and 2k+1 and reports the half
// round-trip time per size.
func pingPong(ctx context.Context, c *adi.Comm) error {
	peer := c.Rank() ^ 1
	if peer >= c.Size() {
		return nil
	}
	for _, size := range []int{8, 64 << 10, 1 << 20} {
		msg := bytes.Repeat([]byte{byte(c.Rank())}, size)
		buf := make([]byte, size)
		const iters = 100
		start := time.Now()
		for range iters {
			if c.Rank()%2 == 0 {
				if err := c.Send(ctx, msg, peer, tagPing); err != nil {
					return err
				}
				if _, err := c.Recv(ctx, buf, peer, tagPing); err != nil {
					return err
				}
			} else {
				if _, err := c.Recv(ctx, buf, peer, tagPing); err != nil {
					return err
				}
				if err := c.Send(ctx, msg, peer, tagPing); err != nil {
					return err
				}
			}
			if buf[0] != byte(peer) || buf[size-1] != byte(peer) {
				return fmt.Errorf("ping-pong: corrupted message from rank %d", peer)
			}
		}
		if c.Rank()%2 == 0 {
			half := time.Since(start) / (2 * iters)
			fmt.Printf("ping-pong %d<->%d: %8d B  %10v half round trip\n", c.Rank(), peer, size, half)
		}
	}
	return nil
}

// allToAll sends one small and one large message from every rank to every
// other, so each pair carries traffic in both size classes.
func allToAll(ctx context.Context, c *adi.Comm) error {
	var reqs []*adi.Request
	for peer := range c.Size() {
		if peer == c.Rank() {
			continue
		}
		for _, size := range []int{100, 256 << 10} {
			r, err := c.Irecv(make([]byte, size), peer, tagAll)
			if err != nil {
				return err
			}
			s, err := c.Isend(make([]byte, size), peer, tagAll)
			if err != nil {
				return err
			}
			reqs = append(reqs, r, s)
		}
	}
	_, err := adi.WaitAll(ctx, reqs...)
	return err
}

// collectives broadcasts a vector from rank 0, has every rank scale it by
// its rank plus one, and sums the results on every rank: element i comes
// back as i * (1 + 2 + ... + size).
func collectives(ctx context.Context, c *adi.Comm) error {
	v := make([]float64, 1000)
	if c.Rank() == 0 {
		for i := range v {
			v[i] = float64(i)
		}
	}
	if err := c.Bcast(ctx, adi.Bytes(v), 0); err != nil {
		return err
	}
	for i := range v {
		v[i] *= float64(c.Rank() + 1)
	}
	if err := adi.Allreduce(ctx, c, v, v, adi.Sum); err != nil {
		return err
	}
	n := float64(c.Size())
	for i, x := range v {
		if want := float64(i) * n * (n + 1) / 2; x != want {
			return fmt.Errorf("collectives: element %d is %v, want %v", i, x, want)
		}
	}
	if err := c.Barrier(ctx); err != nil {
		return err
	}
	if c.Rank() == 0 {
		fmt.Printf("collectives: bcast, allreduce over %d ranks (element 999 of the sum: %v), barrier\n", c.Size(), v[999])
	}
	return nil
}

type linkReport struct {
	From  int
	Stats []adi.LinkStats
}

// report gathers every rank's link statistics at rank 0 and prints them.
func report(ctx context.Context, w *adi.World) error {
	c := w.Comm()
	mine, err := json.Marshal(linkReport{From: c.Rank(), Stats: w.Stats()})
	if err != nil {
		return err
	}
	if c.Rank() != 0 {
		return c.Send(ctx, mine, 0, tagStats)
	}
	all := []linkReport{}
	var first linkReport
	_ = json.Unmarshal(mine, &first)
	all = append(all, first)
	for range c.Size() - 1 {
		st, err := c.Probe(ctx, adi.AnySource, tagStats)
		if err != nil {
			return err
		}
		buf := make([]byte, st.Count)
		if _, err := c.Recv(ctx, buf, st.Source, tagStats); err != nil {
			return err
		}
		var lr linkReport
		if err := json.Unmarshal(buf, &lr); err != nil {
			return err
		}
		all = append(all, lr)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].From < all[j].From })
	fmt.Println("traffic by pair of ranks (sender -> receiver: subdevice, frames, payload bytes):")
	for _, lr := range all {
		for _, s := range lr.Stats {
			if s.Peer == lr.From {
				continue
			}
			fmt.Printf("  %d -> %d: %-4s %6d frames %12d bytes\n", lr.From, s.Peer, s.SubDevice, s.Frames, s.Bytes)
		}
	}
	return nil
}
