package adi_test

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/bootstrap"
)

// Two programs coupled in one job, as `mdrun -n 3 ocean : -n 2 atmosphere`
// launches them: each rank splits the world by its program's number,
// finds the other program's first rank, and the two groups build an
// intercommunicator led by their rank 0. Each group then sums its
// values for the other, the leaders exchange a message, and the two
// groups merge into one communicator, the ocean first. Here the ranks are
// goroutines of one process, each told its program by WithAppNum; under
// mdrun each is a process of its own that gets MD_APPNUM and runs the
// body of the loop alone.
func ExampleComm_IntercommCreate() {
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
			app := 0 // ranks 0-2 run the ocean, 3-4 the atmosphere
			if r >= 3 {
				app = 1
			}
			line, err := couple(ctx, boots[r], app)
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
	// world rank 0: ocean rank 0 of 3; the atmosphere's 2 ranks sum to 7; its leader says "hello from atmosphere"; merged rank 0 of 5
	// world rank 1: ocean rank 1 of 3; the atmosphere's 2 ranks sum to 7; merged rank 1 of 5
	// world rank 2: ocean rank 2 of 3; the atmosphere's 2 ranks sum to 7; merged rank 2 of 5
	// world rank 3: atmosphere rank 0 of 2; the ocean's 3 ranks sum to 3; its leader says "hello from ocean"; merged rank 3 of 5
	// world rank 4: atmosphere rank 1 of 2; the ocean's 3 ranks sum to 3; merged rank 4 of 5
}

// couple is what each rank of the example runs.
func couple(ctx context.Context, boot bootstrap.Bootstrap, app int) (string, error) {
	w, err := adi.Init(ctx, adi.WithBootstrap(boot), adi.WithAppNum(app))
	if err != nil {
		return "", err
	}
	defer w.Finalize(ctx)
	world := w.Comm()
	names := []string{"ocean", "atmosphere"}
	// Every rank's program, to find the other program's first rank.
	apps := make([]int64, world.Size())
	if err := world.Allgather(ctx, adi.Bytes([]int64{int64(w.AppNum())}), adi.Bytes(apps)); err != nil {
		return "", err
	}
	remoteLeader := slices.Index(apps, int64(1-w.AppNum()))
	mine, err := world.Split(ctx, w.AppNum(), world.Rank())
	if err != nil {
		return "", err
	}
	ic, err := mine.IntercommCreate(ctx, 0, world, remoteLeader, 99)
	if err != nil {
		return "", err
	}
	// Each group gets the sum of the other's world ranks.
	sum := []int{world.Rank()}
	if err := adi.InterAllreduce(ctx, ic, sum, sum, adi.Sum); err != nil {
		return "", err
	}
	line := fmt.Sprintf("world rank %d: %s rank %d of %d; the %s's %d ranks sum to %d",
		world.Rank(), names[app], ic.Rank(), ic.Size(), names[1-app], ic.RemoteSize(), sum[0])
	// The leaders greet each other: destinations are remote ranks.
	if ic.Rank() == 0 {
		buf := make([]byte, 64)
		st, err := ic.Sendrecv(ctx, []byte("hello from "+names[app]), 0, 1, buf, 0, 1)
		if err != nil {
			return "", err
		}
		line += fmt.Sprintf("; its leader says %q", buf[:st.Count])
	}
	// One communicator of both programs, the ocean (high false) first.
	all, err := ic.Merge(ctx, app == 1)
	if err != nil {
		return "", err
	}
	return line + fmt.Sprintf("; merged rank %d of %d", all.Rank(), all.Size()), nil
}
