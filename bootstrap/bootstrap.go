package bootstrap

import (
	"context"
	"errors"
)

// Bootstrap is one rank's view of the job's launcher. Implementations are
// safe for concurrent use.
type Bootstrap interface {
	// Rank is this process's rank in the world, in [0, Size).
	Rank() int
	// Size is the number of ranks in the world.
	Size() int
	// Host is the launcher's name for the host this rank runs on. Ranks with
	// the same Host share a machine (and may use shared memory).
	Host() string
	// JobID is unique per job; subdevices name shared resources with it.
	JobID() string
	// Secret is a per-job secret that subdevices use to refuse strangers.
	Secret() []byte
	// Put publishes a key of this rank. Keys become visible to other ranks
	// after the next Fence.
	Put(key string, value []byte) error
	// Fence is a barrier over all ranks that also publishes every Put made
	// before it.
	Fence(ctx context.Context) error
	// Get returns the value rank published under key before the last Fence.
	// It returns an error wrapping ErrNotFound when there is none.
	Get(ctx context.Context, rank int, key string) ([]byte, error)
	// Abort asks the launcher to end the whole job with code, and says why.
	// A code outside 1..255 becomes 1, in every backend and as mdrun does:
	// a launcher keeps the low 8 bits of an exit status, so 0 or 256 would
	// end an aborted job as a success. It need not return once the
	// launcher took the abort (the PMIx backend then exits with the
	// code); an error means the launcher was not told, as after Close
	// (ErrClosed). An Abort while another runs returns when that one
	// does, with its outcome.
	Abort(code int, reason string) error
	// Close tells the launcher this rank finished cleanly and releases the
	// connection.
	Close() error
}

// exitCode is what an Abort given code hands to the launcher, or exits
// with (see [Bootstrap.Abort]).
func exitCode(code int) int {
	if code < 1 || code > 255 {
		return 1
	}
	return code
}

// LostReporter is a [Bootstrap] that can tell the launcher that this rank
// lost another: mdrun's does, so that when ranks fail together it names
// the one whose loss the others' failures follow, rather than the first
// of them it happens to see exit (see [Departure.Lost]). A rank reports a
// loss before any request fails for it, and so before the application
// can exit because of it.
type LostReporter interface {
	// ReportLost says that this rank lost rank, and why. It does not
	// fail; it waits a moment at most, for the report to be on its way,
	// and does nothing for a rank reported before or once the bootstrap
	// is closed.
	ReportLost(rank int, why string)
}

// Sentinel errors.
var (
	// ErrNotFound: the key was not published by that rank.
	ErrNotFound = errors.New("bootstrap: key not found")
	// ErrClosed: the bootstrap was closed, or the launcher went away.
	ErrClosed = errors.New("bootstrap: closed")
)
