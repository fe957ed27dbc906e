//go:build !linux

package sched

import (
	"errors"
	"os/exec"
)

// StartOn starts cmd bound to cpu where the system allows it; here it
// does not.
func StartOn(cmd *exec.Cmd, cpu int) error {
	return errors.New("sched: binding a process to a CPU needs Linux")
}
