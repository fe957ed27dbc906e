package sched

import "runtime/metrics"

const runnableMetric = "/sched/goroutines/runnable:goroutines"

// Runnable reports whether some goroutine of this process is ready to run
// but waits for a processor. A goroutine about to block in a system call
// checks it first: a goroutine blocked in a system call keeps its
// processor until the runtime's monitor takes it back, 20 us to 10 ms
// later, and a rank bound to one CPU has only the one processor, so
// whatever was ready stands still that long. The count is approximate;
// where the runtime does not provide it, Runnable reports false.
func Runnable() bool {
	s := [1]metrics.Sample{{Name: runnableMetric}}
	metrics.Read(s[:])
	return s[0].Value.Kind() == metrics.KindUint64 && s[0].Value.Uint64() > 0
}
