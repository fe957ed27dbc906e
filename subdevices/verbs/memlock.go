package verbs

import (
	"errors"
	"syscall"
)

// memlockHint names the likely cause when the kernel refuses to pin memory:
// queue pairs, completion queues and registered buffers all count against
// the locked-memory limit, which containers and older systems keep at
// 64 KiB.
func memlockHint(err error) string {
	if errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.EPERM) {
		return " (is the locked-memory limit, ulimit -l, too low?)"
	}
	return ""
}
