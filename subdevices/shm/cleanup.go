package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/hpc-multidevice/multidevice/internal/shmem"
)

// RemoveJobSegments unlinks the shared-memory segments that ranks of job
// jobID created on this host and did not remove themselves: a rank that
// crashes, is killed or aborts never reaches Close, and its segment would
// otherwise hold its rings' memory in /dev/shm until the next reboot.
//
// A launcher calls it once every rank of the job on this host has exited
// (mdrun does); calling it while ranks of the job still run would break
// their later connections. It returns how many segments it removed.
func RemoveJobSegments(jobID string) (int, error) {
	pattern := filepath.Join(shmem.Dir, shmem.JobPrefix(jobID)+"*")
	names, err := filepath.Glob(pattern)
	if err != nil {
		return 0, fmt.Errorf("shm: remove segments of job %q: %w", jobID, err)
	}
	removed := 0
	var errs []error
	for _, n := range names {
		if err := os.Remove(n); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("shm: remove segments of job %q: %w", jobID, err)
	}
	return removed, nil
}
