package main

import (
	"fmt"
	"strconv"

	"github.com/hpc-multidevice/multidevice/internal/sched"
)

// bindMode is what -bind binds each rank to.
type bindMode int

const (
	bindNone     bindMode = iota
	bindCore              // a core of its own, with all its hardware threads
	bindHWThread          // one hardware thread (CPU) of its own
)

// parseBind reads -bind's value.
func parseBind(s string) (bindMode, error) {
	switch s {
	case "none":
		return bindNone, nil
	case "core":
		return bindCore, nil
	case "hwthread":
		return bindHWThread, nil
	}
	return bindNone, fmt.Errorf("-bind %q: want none, core or hwthread", s)
}

func (m bindMode) String() string {
	return [...]string{"none", "core", "hwthread"}[m]
}

// binding is where -bind puts one rank.
type binding struct {
	// cpus are the CPUs of this machine the rank starts on; nil: any.
	cpus sched.CPUSet
	// remote are the words that bind a rank on another host, put before
	// its command on the launcher's command line; nil: none.
	remote []string
}

// placeBindings returns, per rank, where -bind puts it. The ranks of a
// host take its cores (or hardware threads) in rank order: here those of
// the CPUs mdrun may use, on another host all of the host's, counted from
// CPU 0 there.
func (j *job) placeBindings() ([]binding, error) {
	bs := make([]binding, j.size())
	if j.cfg.bind == bindNone {
		return bs, nil
	}
	allowed, err := sched.Affinity()
	if err != nil {
		return nil, fmt.Errorf("-bind %v: %w", j.cfg.bind, err)
	}
	units := sched.Cores(allowed)
	have := fmt.Sprintf("%d cores (CPUs %v)", len(units), allowed)
	if j.cfg.bind == bindHWThread {
		units, have = nil, fmt.Sprintf("%d CPUs (%v)", allowed.Count(), allowed)
		for _, c := range allowed.List() {
			units = append(units, sched.CPUs(c))
		}
	}
	seen := map[string]int{} // ranks placed so far per host
	for r := range bs {
		host := ""
		if j.hostOf != nil && !isLocal(j.hostOf[r], j.self) {
			host = j.hostOf[r]
		}
		k := seen[host]
		seen[host]++
		if host != "" {
			bs[r].remote = remoteBind(j.cfg.bind, k)
			continue
		}
		if k >= len(units) {
			return nil, fmt.Errorf("-bind %v: rank %d would be the %s rank on this host, and mdrun may use %s", j.cfg.bind, r, ordinal(k+1), have)
		}
		bs[r].cpus = units[k]
	}
	return bs, nil
}

// remoteBind returns the shell words that bind the k-th rank of another
// host with taskset (util-linux): to CPU k, or to the k-th core of the
// host (see pickCore).
func remoteBind(mode bindMode, k int) []string {
	if mode == bindHWThread {
		return []string{"taskset", "-c", strconv.Itoa(k)}
	}
	return []string{pickCore("/sys/devices/system/cpu", k), "taskset", "-c", `"$c"`}
}

// pickCore returns shell code that sets c to the CPUs of the k-th core
// the host's sysfs CPU directory dir describes, as sched.Cores reads it
// here, or fails the command line. Cores are told apart by their lowest
// CPU, so the thread lists sorted by it without repeats list each core
// once, in order. The code is one group ending in &&, before the
// command it binds: after a failed "cd -- DIR &&" it does not run, and
// the cd's own message is the only one.
func pickCore(dir string, k int) string {
	return `{ c=$(sort -nu ` + dir + `/cpu[0-9]*/topology/thread_siblings_list | sed -n ` + strconv.Itoa(k+1) + `p) && [ -n "$c" ] || ` +
		`{ echo 'mdrun: -bind core: this host has no ` + ordinal(k+1) + ` core' >&2; exit 1; }; } &&`
}
