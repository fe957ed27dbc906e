//go:build !linux

package sched

import "runtime"

// Yield lets other goroutines run; without sched_yield it cannot offer
// the CPU to other processes.
func Yield() { runtime.Gosched() }
