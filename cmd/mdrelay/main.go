// Command mdrelay is a dedicated relay of a multidevice job: a process that
// takes no application rank and only forwards between ranks that have no
// direct link (two clusters on private networks joined through a front-end
// host, GridMPI's relay). The launcher starts it as one of the last ranks of
// the job, after the application's; the application's world does not count
// it. It reads the same environment as an application rank (MDRUN_*,
// MD_PLUGINS, MD_CONNTABLE, MD_FORWARD_BLOCK, MD_FORWARD_WINDOW,
// MD_FORWARD_RETRY, MD_LOG_LEVEL) and exits 0 when every rank of the job has finalized.
// SIGINT or SIGTERM make it leave at once with status 1.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/hpc-multidevice/multidevice/adi"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := adi.RunRelay(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "mdrelay:", err)
		os.Exit(1)
	}
}
