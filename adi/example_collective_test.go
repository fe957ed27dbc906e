package adi_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/bootstrap"
)

// Four ranks sum a vector each; every rank gets the sum. Here the ranks
// are goroutines of one process (bootstrap.InProcess); under mdrun each
// is a process of its own and runs the body of the loop alone.
func ExampleAllreduce() {
	ctx := context.Background()
	boots, err := bootstrap.InProcess(4, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	sums := make([][]float64, 4)
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
			v := []float64{1, float64(c.Rank())}
			if err := adi.Allreduce(ctx, c, v, v, adi.Sum); err != nil {
				fmt.Println(err)
				return
			}
			sums[c.Rank()] = v
		})
	}
	wg.Wait()
	fmt.Println(sums)
	// Output: [[4 6] [4 6] [4 6] [4 6]]
}
