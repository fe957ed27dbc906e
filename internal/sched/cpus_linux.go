package sched

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Affinity returns the CPUs the calling thread may run on. A process's
// threads inherit them from the thread that started it, so this is the
// process's binding unless somebody pinned this thread (PinThread).
func Affinity() (CPUSet, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("sched: read this thread's CPUs: %w", err)
	}
	// Bit by bit: unix.CPUSet's words are 32 bits wide on 32-bit systems.
	var s CPUSet
	for i := range int(unsafe.Sizeof(set)) * 8 {
		if set.IsSet(i) {
			s.Add(i)
		}
	}
	return s, nil
}
