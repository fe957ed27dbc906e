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
	n := int(unsafe.Sizeof(set)) * 8
	s := make(CPUSet, (n+63)/64)
	for i := range n {
		if set.IsSet(i) {
			s[i/64] |= 1 << (i % 64)
		}
	}
	return s, nil
}
