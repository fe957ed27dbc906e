package shm

import (
	"path/filepath"
	"testing"

	"github.com/hpc-multidevice/multidevice/internal/shmem"
)

// A job whose ranks never reach Close leaves its segments; the launcher's
// sweep removes exactly those and no other job's.
func TestRemoveJobSegments(t *testing.T) {
	crashed := openJob(t, 2, jobOpts{})
	other := openJob(t, 2, jobOpts{})
	segs := func(j *job) []string {
		names, err := filepath.Glob(filepath.Join(shmem.Dir, shmem.JobPrefix(j.id)+"*"))
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	if got := len(segs(crashed)); got != 2 {
		t.Fatalf("job has %d segments in %s, want 2", got, shmem.Dir)
	}
	n, err := RemoveJobSegments(crashed.id)
	if err != nil || n != 2 {
		t.Fatalf("RemoveJobSegments = %d, %v; want 2, nil", n, err)
	}
	if left := segs(crashed); len(left) != 0 {
		t.Errorf("segments left after the sweep: %v", left)
	}
	if got := len(segs(other)); got != 2 {
		t.Errorf("the sweep touched another job: %d of its 2 segments left", got)
	}
	if n, err := RemoveJobSegments(crashed.id); err != nil || n != 0 {
		t.Errorf("second sweep = %d, %v; want 0, nil", n, err)
	}
	// The cleanup's Close of the swept ranks must still succeed: their
	// mappings outlive the names.
}
