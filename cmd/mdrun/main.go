// Command mdrun starts the ranks of a multidevice job on this host.
//
//	mdrun [flags] -n N prog [args...]
//
// It runs N copies of prog, each with the environment the bootstrap package
// reads (MDRUN_ADDR, MDRUN_RANK, MDRUN_SIZE, MDRUN_JOBID, MDRUN_SECRET,
// MDRUN_HOST, and MD_PLUGINS and MD_CONNTABLE when -plugins and -conntable
// are given), serves their rendezvous, and forwards their output line by
// line with a "[rank] " prefix (lines over 64 KiB are split). The ranks'
// standard input is /dev/null. Each rank runs in its own process group, so
// SIGINT and SIGTERM reach it once, passed on by mdrun, together with any
// process it started; a second signal kills the ranks at once.
//
// The job ends when every rank has exited, or as soon as one rank fails:
// exits non-zero, is killed by a signal, panics, or calls Abort. mdrun then
// names that rank, sends the others SIGTERM and, after a grace period,
// SIGKILL. Its exit status is:
//
//	0        every rank exited 0
//	N        the first failing rank exited with status N, or aborted with code N
//	         (an abort code outside 1..255 becomes 1)
//	128+S    the first failing rank was killed by signal S, or mdrun itself
//	         received signal S
//	124      the job ran longer than -timeout
//	2        usage error: bad flags, no program, program not found
//	1        mdrun could not run the job (rendezvous service, starting a rank)
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr, sigs))
}
