package sched

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// PinThread locks the calling goroutine to its thread and binds that
// thread to cpu, as a benchmark that measures one core against another
// needs; restore gives the thread its former CPUs back and unlocks it.
func PinThread(cpu int) (restore func(), err error) {
	runtime.LockOSThread()
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("sched: read this thread's CPUs: %w", err)
	}
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("sched: bind to CPU %d: %w", cpu, err)
	}
	return func() {
		_ = unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	}, nil
}
