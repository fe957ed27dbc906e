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
