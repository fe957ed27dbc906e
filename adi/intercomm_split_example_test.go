package adi_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/bootstrap"
)

// World ranks 0-2 and 3-4 form two groups joined by an
// intercommunicator; Split then pairs each group's even local ranks with
// the other's even ones, and the odd with the odd, each new group in
// reverse order of its ranks (key -rank). Every rank sends its world
// rank to the remote leader of its new intercommunicator, and each
// leader names the one it got from the other leader.
func ExampleIntercomm_Split() {
	ctx := context.Background()
	const n = 5
	boots, err := bootstrap.InProcess(n, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	out := make([]string, n)
	var wg sync.WaitGroup
	for r := range boots {
		wg.Go(func() {
			line, err := splitParity(ctx, boots[r])
			if err != nil {
				line = err.Error()
			}
			out[r] = line
		})
	}
	wg.Wait()
	for _, line := range out {
		fmt.Println(line)
	}
	// Output:
	// world rank 0: local [2 0] remote [3]
	// world rank 1: local [1] remote [4]; remote leader is world rank 4
	// world rank 2: local [2 0] remote [3]; remote leader is world rank 3
	// world rank 3: local [3] remote [2 0]; remote leader is world rank 2
	// world rank 4: local [4] remote [1]; remote leader is world rank 1
}

// splitParity is what each rank of the example runs.
func splitParity(ctx context.Context, boot bootstrap.Bootstrap) (string, error) {
	w, err := adi.Init(ctx, adi.WithBootstrap(boot))
	if err != nil {
		return "", err
	}
	defer w.Finalize(ctx)
	world := w.Comm()
	group, remoteLeader := 0, 3
	if world.Rank() >= 3 {
		group, remoteLeader = 1, 0
	}
	mine, err := world.Split(ctx, group, world.Rank())
	if err != nil {
		return "", err
	}
	ic, err := mine.IntercommCreate(ctx, 0, world, remoteLeader, 99)
	if err != nil {
		return "", err
	}
	pair, err := ic.Split(ctx, ic.Rank()%2, -ic.Rank())
	if err != nil {
		return "", err
	}
	line := fmt.Sprintf("world rank %d: local %v remote %v", world.Rank(), pair.Group().WorldRanks(), pair.RemoteGroup().WorldRanks())
	// Every rank sends to the remote leader; the leaders receive one
	// message from each remote rank.
	if err := pair.Send(ctx, adi.Bytes([]int64{int64(world.Rank())}), 0, 1); err != nil {
		return "", err
	}
	if pair.Rank() == 0 {
		for range pair.RemoteSize() {
			v := []int64{0}
			st, err := pair.Recv(ctx, adi.Bytes(v), adi.AnySource, 1)
			if err != nil {
				return "", err
			}
			if st.Source == 0 {
				line += fmt.Sprintf("; remote leader is world rank %d", v[0])
			}
		}
	}
	return line, nil
}
