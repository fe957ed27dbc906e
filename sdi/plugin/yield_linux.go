package plugin

import "golang.org/x/sys/unix"

// osYield gives the CPU to any runnable thread, not only to this
// process's goroutines.
func osYield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
