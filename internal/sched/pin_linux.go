package sched

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// PinThread locks the calling goroutine to its thread and binds that
// thread to cpu, as a benchmark that measures one core against another
// needs; restore gives the thread its former CPUs back and unlocks it.
func PinThread(cpu int) (restore func(), err error) { return pinThread(CPUs(cpu)) }

// pinThread is PinThread to the CPUs of set.
func pinThread(set CPUSet) (restore func(), err error) {
	var want unix.CPUSet // the C library's cpu_set_t
	for _, c := range set.List() {
		if n := int(unsafe.Sizeof(want)) * 8; c >= n {
			return nil, fmt.Errorf("sched: bind to CPUs %v: CPU %d is beyond the %d this program can name", set, c, n)
		}
		want.Set(c)
	}
	runtime.LockOSThread()
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("sched: read this thread's CPUs: %w", err)
	}
	if err := unix.SchedSetaffinity(0, &want); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("sched: bind to CPUs %v: %w", set, err)
	}
	return func() {
		_ = unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	}, nil
}
