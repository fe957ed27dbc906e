package adi_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/bootstrap"
)

// Five ranks make a star of four nodes as MPI_Graph_create takes it:
// node 0, the centre, lists nodes 1, 2 and 3, each of which lists node 0.
// Every rank passes the whole graph; rank 4 is beyond it and gets nil.
// Each node sends its rank to its neighbours in one call and receives
// theirs in the order its list names them.
func ExampleComm_GraphCreate() {
	ctx := context.Background()
	index := []int{3, 4, 5, 6} // node i's neighbours end at edges[index[i]]
	edges := []int{1, 2, 3, 0, 0, 0}
	boots, err := bootstrap.InProcess(5, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	got := make([][]byte, 5)
	var wg sync.WaitGroup
	for r := range boots {
		wg.Go(func() {
			w, err := adi.Init(ctx, adi.WithBootstrap(boots[r]))
			if err != nil {
				fmt.Println(err)
				return
			}
			defer w.Finalize(ctx)
			star, err := w.Comm().GraphCreate(ctx, index, edges)
			if err != nil || star == nil { // nil: beyond the graph
				return
			}
			n, err := star.NeighborsCount(star.Rank())
			if err != nil {
				fmt.Println(err)
				return
			}
			got[r] = make([]byte, n)
			if err := star.NeighborAllgather(ctx, []byte{byte(10 + star.Rank())}, got[r]); err != nil {
				fmt.Println(err)
			}
		})
	}
	wg.Wait()
	fmt.Println(got)
	// Output: [[11 12 13] [10] [10] [10] []]
}
