// Command mdbench measures the multidevice's point-to-point speed, OSU
// style, side by side with MPICH and Open MPI. See run.go for the flags and
// README.md for an example.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}
