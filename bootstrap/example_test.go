package bootstrap_test

import (
	"context"
	"fmt"

	"github.com/hpc-multidevice/multidevice/bootstrap"
)

// A program not started by mdrun is a world of one rank; the same code
// exchanges cards with every rank when mdrun starts it.
func ExampleOpen() {
	ctx := context.Background()
	bs, err := bootstrap.Open(ctx, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer bs.Close()

	if err := bs.Put("card", []byte(fmt.Sprintf("tcp:rank-%d", bs.Rank()))); err != nil {
		fmt.Println(err)
		return
	}
	if err := bs.Fence(ctx); err != nil {
		fmt.Println(err)
		return
	}
	for r := range bs.Size() {
		card, err := bs.Get(ctx, r, "card")
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("rank %d of %d: %s\n", r, bs.Size(), card)
	}
	// Output: rank 0 of 1: tcp:rank-0
}
