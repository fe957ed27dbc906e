package main

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// cpuEnv tells a rank which CPU to bind to (--bind).
const cpuEnv = "MDBENCH_CPU"

// bindFromEnv binds every thread of this process to the CPU cpuEnv names,
// if any. Threads the Go runtime starts later inherit the binding from the
// thread that starts them; a second pass catches threads started during
// the first.
func bindFromEnv() error {
	v := os.Getenv(cpuEnv)
	if v == "" {
		return nil
	}
	cpu, err := strconv.Atoi(v)
	if err != nil || cpu < 0 {
		return fmt.Errorf("%s=%q: want a CPU number", cpuEnv, v)
	}
	var set unix.CPUSet
	set.Set(cpu)
	for range 2 {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("bind to CPU %d: %w", cpu, err)
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil {
				return fmt.Errorf("bind thread %d to CPU %d: %w", tid, cpu, err)
			}
		}
	}
	return nil
}
