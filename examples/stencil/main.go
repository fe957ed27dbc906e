// Command stencil is the shape of most MPI programs: a heat equation on a
// square plate, solved by Jacobi iterations over a grid of ranks, which
// the library may renumber so that grid neighbours share a host
// (adi.Reorder). Each rank owns a block of the plate and swaps its edges
// with its neighbours every iteration, in one neighbour alltoall on the
// Cart that travels while the rank updates the cells that need no
// neighbour's (ProcNull at the plate's edge needs no special case), and
// an Allreduce finds the largest change. Both are persistent requests
// (MPI 4.0), stated once and started every iteration. At
// the end rank 0 gathers the plate and checks it bit for bit against the
// same iterations run on one rank, which they must match whatever the
// grid of ranks: every cell's update adds the same numbers in the same
// order.
//
//	go build -o bin/ ./cmd/mdrun ./examples/stencil && bin/mdrun -n 4 bin/stencil
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
)

func main() {
	n := flag.Int("size", 64, "cells along each side of the plate")
	iters := flag.Int("iterations", 200, "Jacobi iterations")
	timeout := flag.Duration("timeout", 2*time.Minute, "give up after this long")
	flag.Parse()
	if *n < 1 || *iters < 0 {
		fmt.Fprintln(os.Stderr, "stencil: -size must be positive and -iterations not negative")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := run(ctx, *n, *iters); err != nil {
		fmt.Fprintln(os.Stderr, "stencil:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, n, iters int) error {
	w, err := adi.Init(ctx)
	if err != nil {
		return err
	}
	if err := solve(ctx, w.Comm(), n, iters); err != nil {
		w.Abort(1, err.Error())
		return err
	}
	return w.Finalize(ctx)
}

// block is a rank's part of the plate: rows [r0, r0+rows) and columns
// [c0, c0+cols), stored with a one-cell halo all round.
type block struct {
	r0, c0, rows, cols int
	cur, next          []float64 // (rows+2) x (cols+2)
}

func (b *block) at(g []float64, i, j int) *float64 { return &g[(i+1)*(b.cols+2)+j+1] }

// split gives part k of p parts of n cells: where it starts and how long
// it is, the first n%p parts one longer.
func split(n, p, k int) (start, length int) {
	length = n / p
	start = k*length + min(k, n%p)
	if k < n%p {
		length++
	}
	return start, length
}

// boundary is the fixed temperature just outside the plate: the top edge
// is hot, the others cold.
func boundary(i int) float64 {
	if i < 0 {
		return 1
	}
	return 0
}

func solve(ctx context.Context, c *adi.Comm, n, iters int) error {
	dims := []int{0, 0}
	if err := adi.DimsCreate(c.Size(), dims); err != nil {
		return err
	}
	if dims[0] > n || dims[1] > n {
		return fmt.Errorf("a %d-cell plate cannot be split over a %dx%d grid of ranks", n, dims[0], dims[1])
	}
	grid, err := c.CartCreate(ctx, dims, []bool{false, false}, adi.Reorder())
	if err != nil {
		return err
	}
	me, err := grid.Coords(grid.Rank())
	if err != nil {
		return err
	}
	b := &block{}
	b.r0, b.rows = split(n, dims[0], me[0])
	b.c0, b.cols = split(n, dims[1], me[1])
	b.cur = make([]float64, (b.rows+2)*(b.cols+2))
	b.next = make([]float64, len(b.cur))
	// The halo cells outside the plate hold the boundary for good.
	for _, g := range [][]float64{b.cur, b.next} {
		for i := -1; i <= b.rows; i++ {
			for j := -1; j <= b.cols; j++ {
				if gi, gj := b.r0+i, b.c0+j; gi < 0 || gi >= n || gj < 0 || gj >= n {
					*b.at(g, i, j) = boundary(gi)
				}
			}
		}
	}
	// The neighbours in the Cart's order: up, down (dimension 0), left,
	// right (dimension 1); ProcNull past the plate's edge.
	nb := grid.Neighbors()
	left, right := nb[2], nb[3]
	sendL, sendR := make([]float64, b.rows), make([]float64, b.rows)
	recvL, recvR := make([]float64, b.rows), make([]float64, b.rows)
	row := func(g []float64, i int) []float64 { return g[(i+1)*(b.cols+2)+1 : (i+1)*(b.cols+2)+1+b.cols] }
	// One exchange with the four neighbours: the edge rows as they lie,
	// the edge columns packed. Each slot receives what that neighbour
	// sent the other way: its bottom row into the top halo, and so on.
	// Slots of ProcNull neighbours are left alone. The plate alternates
	// between two arrays, so there is one persistent exchange for each.
	arrays := [2][]float64{b.cur, b.next}
	var halos [2]*adi.Request
	for k, g := range arrays {
		if halos[k], err = grid.NeighborAlltoallvInit(
			[][]byte{adi.Bytes(row(g, 0)), adi.Bytes(row(g, b.rows-1)), adi.Bytes(sendL), adi.Bytes(sendR)},
			[][]byte{adi.Bytes(row(g, -1)), adi.Bytes(row(g, b.rows)), adi.Bytes(recvL), adi.Bytes(recvR)}); err != nil {
			return err
		}
	}
	global := make([]float64, 1)
	largest, err := adi.AllreduceInit(grid.Comm, global, global, adi.Max)
	if err != nil {
		return err
	}
	var change float64
	for it := range iters {
		g := b.cur // arrays[it%2]
		local := 0.0
		update := func(i, j int) {
			v := 0.25 * (*b.at(g, i-1, j) + *b.at(g, i+1, j) + *b.at(g, i, j-1) + *b.at(g, i, j+1))
			local = math.Max(local, math.Abs(v-*b.at(g, i, j)))
			*b.at(b.next, i, j) = v
		}
		for i := range b.rows {
			sendL[i], sendR[i] = *b.at(g, i, 0), *b.at(g, i, b.cols-1)
		}
		halo := halos[it%2]
		if err := halo.Start(); err != nil {
			return err
		}
		// The interior needs no halo: update it while the edges travel
		// (it only reads what is being sent).
		for i := 1; i < b.rows-1; i++ {
			for j := 1; j < b.cols-1; j++ {
				update(i, j)
			}
		}
		if _, err := halo.Wait(ctx); err != nil {
			return err
		}
		for i := range b.rows {
			if left != adi.ProcNull {
				*b.at(g, i, -1) = recvL[i]
			}
			if right != adi.ProcNull {
				*b.at(g, i, b.cols) = recvR[i]
			}
		}
		// Then the rim, which reads the halo.
		for i := range b.rows {
			if i == 0 || i == b.rows-1 {
				for j := range b.cols {
					update(i, j)
				}
				continue
			}
			update(i, 0)
			if b.cols > 1 {
				update(i, b.cols-1)
			}
		}
		b.cur, b.next = b.next, b.cur
		global[0] = local
		if err := largest.Start(); err != nil {
			return err
		}
		if _, err := largest.Wait(ctx); err != nil {
			return err
		}
		change = global[0]
	}
	return check(ctx, grid, b, n, iters, change)
}

// check gathers the plate on rank 0 and compares it with the serial run.
func check(ctx context.Context, grid *adi.Cart, b *block, n, iters int, change float64) error {
	mine := make([]float64, 0, 4+b.rows*b.cols)
	mine = append(mine, float64(b.r0), float64(b.c0), float64(b.rows), float64(b.cols))
	for i := range b.rows {
		for j := range b.cols {
			mine = append(mine, *b.at(b.cur, i, j))
		}
	}
	// Every rank's length first, then the blocks.
	lens := make([]int64, grid.Size())
	if err := grid.Gather(ctx, binary.LittleEndian.AppendUint64(nil, uint64(len(mine))), adi.Bytes(lens), 0); err != nil {
		return err
	}
	var parts [][]byte
	if grid.Rank() == 0 {
		parts = make([][]byte, grid.Size())
		for r := range parts {
			parts[r] = make([]byte, 8*lens[r])
		}
	}
	if err := grid.Gatherv(ctx, adi.Bytes(mine), parts, 0); err != nil {
		return err
	}
	if grid.Rank() != 0 {
		return nil
	}
	plate := make([]float64, n*n)
	for _, p := range parts {
		v := make([]float64, len(p)/8)
		for i := range v {
			v[i] = math.Float64frombits(binary.LittleEndian.Uint64(p[8*i:]))
		}
		r0, c0, rows, cols := int(v[0]), int(v[1]), int(v[2]), int(v[3])
		for i := range rows {
			copy(plate[(r0+i)*n+c0:(r0+i)*n+c0+cols], v[4+i*cols:4+(i+1)*cols])
		}
	}
	want := serial(n, iters)
	for k := range plate {
		if plate[k] != want[k] {
			return fmt.Errorf("cell (%d,%d) is %v, the serial run gives %v", k/n, k%n, plate[k], want[k])
		}
	}
	d := grid.Dims()
	fmt.Printf("stencil: %dx%d plate on %dx%d ranks, %d iterations, last change %.3g, centre %.6f: matches the serial run\n",
		n, n, d[0], d[1], iters, change, plate[(n/2)*n+n/2])
	return nil
}

// serial runs the same iterations on the whole plate.
func serial(n, iters int) []float64 {
	at := func(g []float64, i, j int) float64 {
		if i < 0 || i >= n || j < 0 || j >= n {
			return boundary(i)
		}
		return g[i*n+j]
	}
	cur, next := make([]float64, n*n), make([]float64, n*n)
	for range iters {
		for i := range n {
			for j := range n {
				next[i*n+j] = 0.25 * (at(cur, i-1, j) + at(cur, i+1, j) + at(cur, i, j-1) + at(cur, i, j+1))
			}
		}
		cur, next = next, cur
	}
	return cur
}
