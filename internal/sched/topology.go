package sched

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
)

// sysCPU is where Linux describes its CPUs.
const sysCPU = "/sys/devices/system/cpu"

// Cores groups the CPUs of allowed by the processor core they belong to,
// in the order of each core's lowest CPU: the cores mpiexec -bind-to core
// and srun --cpu-bind=cores hand out, one to a rank, with those of its
// hardware threads that allowed has. On a host with simultaneous
// multithreading a core's threads may be numbered side by side (0 and 1)
// or far apart (0 and 64); binding ranks to CPU 0, 1, ... in order would
// put two ranks on one core on the first kind. The kernel's topology
// under /sys/devices/system/cpu says which; a CPU it says nothing about
// (no sysfs, as in some containers) counts as a core of its own.
func Cores(allowed CPUSet) []CPUSet { return coresIn(os.DirFS(sysCPU), allowed) }

// coresIn is Cores over the sysfs CPU directory fsys.
func coresIn(fsys fs.FS, allowed CPUSet) []CPUSet {
	var cores []CPUSet
	var placed CPUSet
	for _, cpu := range allowed.List() {
		if placed.Has(cpu) {
			continue
		}
		core := CPUs(cpu)
		if threads, err := coreThreads(fsys, cpu); err == nil && threads.Has(cpu) {
			// Without placed: a CPU whose list could not be read became a
			// core of its own, which a sibling's list may name too.
			core = threads.Intersect(allowed).Without(placed)
		}
		placed = placed.Union(core)
		cores = append(cores, core)
	}
	return cores
}

// coreThreads reads the hardware threads of cpu's core: core_cpus_list
// since Linux 5.5, thread_siblings_list (the same list) before.
func coreThreads(fsys fs.FS, cpu int) (CPUSet, error) {
	name := "cpu" + strconv.Itoa(cpu) + "/topology/core_cpus_list"
	b, err := fs.ReadFile(fsys, name)
	if errors.Is(err, fs.ErrNotExist) {
		name = "cpu" + strconv.Itoa(cpu) + "/topology/thread_siblings_list"
		b, err = fs.ReadFile(fsys, name)
	}
	if err != nil {
		return nil, err
	}
	s, err := ParseCPUList(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w", sysCPU, name, err)
	}
	return s, nil
}

// ParseCPUList reads a CPU list in the kernel's form, as String writes it
// and /sys/devices/system/cpu and taskset -c use it: CPU numbers and
// ranges separated by commas ("0-3,8"), a range optionally with a stride
// ("0-7:2" is 0,2,4,6). Surrounding white space (sysfs ends its lists
// with a newline) is ignored.
func ParseCPUList(list string) (CPUSet, error) {
	list = strings.TrimSpace(list)
	if list == "" {
		return nil, errors.New("sched: empty CPU list")
	}
	var s CPUSet
	for item := range strings.SplitSeq(list, ",") {
		lo, hi, stride, err := parseCPURange(item)
		if err != nil {
			return nil, fmt.Errorf("sched: CPU list %q: %w", list, err)
		}
		for c := lo; c <= hi; c += stride {
			s.Add(c)
		}
	}
	return s, nil
}

// parseCPURange reads one item of a CPU list: N, N-M or N-M:S.
func parseCPURange(item string) (lo, hi, stride int, err error) {
	rng, st, hasStride := strings.Cut(item, ":")
	a, b, isRange := strings.Cut(rng, "-")
	if lo, err = parseCPU(a); err != nil {
		return 0, 0, 0, err
	}
	hi, stride = lo, 1
	if isRange {
		if hi, err = parseCPU(b); err != nil {
			return 0, 0, 0, err
		}
		if hi < lo {
			return 0, 0, 0, fmt.Errorf("range %q runs backwards", item)
		}
	}
	if hasStride {
		if !isRange {
			return 0, 0, 0, fmt.Errorf("stride in %q without a range", item)
		}
		if stride, err = strconv.Atoi(st); err != nil || stride < 1 {
			return 0, 0, 0, fmt.Errorf("stride in %q is not a positive number", item)
		}
		// Any stride past the range's end means lo alone; a huge one
		// would wrap the caller's loop.
		stride = min(stride, hi-lo+1)
	}
	return lo, hi, stride, nil
}

// parseCPU reads one CPU number, at most Linux's 8191.
func parseCPU(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || s[0] == '+' {
		return 0, fmt.Errorf("%q is not a CPU number", s)
	}
	if n >= maxCPUWords*64 {
		return 0, fmt.Errorf("CPU %d is beyond Linux's %d", n, maxCPUWords*64-1)
	}
	return n, nil
}
