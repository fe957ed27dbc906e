package shm

import "golang.org/x/sys/unix"

// osYield gives this thread's CPU to another runnable thread, of this
// process or another (sched_yield). runtime.Gosched only lets other
// goroutines run on the same thread.
func osYield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
