//go:build !linux

package sched

import "errors"

// Affinity returns the CPUs the calling thread may run on where the system
// tells; here it does not.
func Affinity() (CPUSet, error) {
	return nil, errors.New("sched: reading a thread's CPUs needs Linux")
}
