//go:build !linux

package sched

import (
	"errors"
	"os/exec"
)

// StartOn starts cmd bound to the CPUs of set where the system allows
// it; here it does not.
func StartOn(cmd *exec.Cmd, set CPUSet) error {
	return errors.New("sched: binding a process to a CPU needs Linux")
}
