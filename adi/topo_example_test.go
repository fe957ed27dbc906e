package adi_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/bootstrap"
)

// Four ranks on a ring that does not wrap exchange their rank with both
// neighbours in one call; the slot of a missing neighbour (ProcNull, at
// the ends) keeps what it held, here 9. Then the even ranks make a
// communicator of their own from a group.
func ExampleCart_NeighborAllgather() {
	ctx := context.Background()
	boots, err := bootstrap.InProcess(4, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	got := make([][]byte, 4)
	sizes := make([]int, 4)
	var wg sync.WaitGroup
	for r := range boots {
		wg.Go(func() {
			w, err := adi.Init(ctx, adi.WithBootstrap(boots[r]))
			if err != nil {
				fmt.Println(err)
				return
			}
			defer w.Finalize(ctx)
			c := w.Comm()
			line, err := c.CartCreate(ctx, []int{4}, []bool{false})
			if err != nil {
				fmt.Println(err)
				return
			}
			halo := []byte{9, 9} // from the -1 neighbour, from the +1 neighbour
			if err := line.NeighborAllgather(ctx, []byte{byte(line.Rank())}, halo); err != nil {
				fmt.Println(err)
				return
			}
			got[r] = halo
			evens, err := c.Group().RangeIncl([]adi.Range{{First: 0, Last: 3, Stride: 2}})
			if err != nil {
				fmt.Println(err)
				return
			}
			sub, err := c.Create(ctx, evens) // nil on the odd ranks
			if err != nil {
				fmt.Println(err)
				return
			}
			if sub != nil {
				sizes[r] = sub.Size()
			}
		})
	}
	wg.Wait()
	fmt.Println(got, sizes)
	// Output: [[9 1] [0 2] [1 3] [2 9]] [2 0 2 0]
}

// A program started by mdrun on several hosts lays a periodic 2-D grid
// over its ranks and lets the library choose who sits where, so that
// most halo exchanges stay within a host; each rank then works on the
// block of the grid its new rank's coordinates name. Then it builds a
// ring whose edges to the right carry twice as much as those to the
// left, and numbers the graph's ranks host by host. (Not run here: it
// needs a launcher and several hosts. On 1 or 2 ranks, where left and
// right are one rank, the ring's weights do not pair up: the k-th edge
// from a rank to the other, or to itself, weighs 2 at one end and 1 at
// the other, and the call fails, on 1 rank with the rank's own error, on
// 2 with ErrMismatch; see Weights.)
func ExampleReorder() {
	ctx := context.Background()
	w, err := adi.Init(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer w.Finalize(ctx)
	c := w.Comm()
	dims := make([]int, 2)
	if err := adi.DimsCreate(c.Size(), dims); err != nil {
		fmt.Println(err)
		return
	}
	grid, err := c.CartCreate(ctx, dims, []bool{true, true}, adi.Reorder())
	if err != nil {
		fmt.Println(err)
		return
	}
	block, err := grid.Coords(grid.Rank()) // this rank's part of the data
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("rank", c.Rank(), "works on block", block, "as rank", grid.Rank())

	n, me := c.Size(), c.Rank()
	left, right := (me+n-1)%n, (me+1)%n
	// Each rank sends to its right twice as much as to its left: the
	// edge from left to me is left's edge to its right.
	ring, err := c.DistGraphCreateAdjacent(ctx, []int{left, right}, []int{left, right},
		adi.Weights([]int{2, 1}, []int{1, 2}), adi.Reorder())
	if err != nil {
		fmt.Println(err)
		return
	}
	sources, dests := ring.Neighbors() // the same processes, by their numbers in ring
	fmt.Println(ring.Rank(), sources, dests)
}
