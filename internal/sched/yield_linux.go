// Package sched holds what the polling loops and the launchers need of the
// OS and Go schedulers: yielding a CPU, binding threads and new processes
// to CPUs, which CPUs share a core, the CPU sets ranks publish, and
// whether goroutines wait for a processor.
package sched

import "golang.org/x/sys/unix"

// Yield gives this thread's CPU to another runnable thread, of this
// process or another (sched_yield). runtime.Gosched only lets other
// goroutines run: on a machine with fewer cores than spinning threads,
// the peer a poller waits for may be waiting for this very core. The call
// does not block, so it skips the Go scheduler's system-call bookkeeping.
func Yield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
