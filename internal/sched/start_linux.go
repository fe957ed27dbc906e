package sched

import "os/exec"

// StartOn starts cmd bound to the CPUs of set, as mpiexec -bind-to core
// starts a rank: the child inherits the CPUs of the thread that forks it,
// so its Go runtime, if it has one, sizes GOMAXPROCS to them from the
// start. A process that bound itself once running would run its first
// second or so with a processor per CPU it could use before, until its
// runtime noticed.
func StartOn(cmd *exec.Cmd, set CPUSet) error {
	restore, err := pinThread(set)
	if err != nil {
		return err
	}
	defer restore()
	return cmd.Start()
}
