package adi

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// Passive-target synchronization beyond Lock and Unlock (MPI-3): a shared
// lock on every rank at once, and flushes that complete operations
// without ending the epoch.

// ErrRMASync is a one-sided call made in the wrong synchronization state
// (MPI_ERR_RMA_SYNC): a request-based operation outside a passive-target
// epoch on its target, an Unlock without a Lock, a Lock on a target this
// rank has locked already or inside LockAll, and the like. Nothing is
// sent.
var ErrRMASync = errors.New("adi: one-sided call outside its synchronization")

// lockState is what this rank has done to take a passive-target lock.
type lockState uint8

const (
	lockNone   lockState = iota
	lockWanted           // requested, not yet granted
	lockHeld
	lockReleasing // Unlock or UnlockAll under way
)

// LockAll starts a passive-target epoch on every rank's window
// (MPI_Win_lock_all): it returns once every rank, this one included, has
// granted this rank a shared lock. The requests go out together, not
// one rank after another. It blocks while some rank's window is locked
// exclusively by another rank; as with Lock, a program that holds an
// exclusive lock while it waits for one elsewhere can deadlock with a
// LockAll, and avoiding that is the program's part, as in MPI. A rank
// inside LockAll may not Lock, and one holding a Lock may not LockAll
// (ErrRMASync). If ctx ends first, the requests stay queued at the
// targets and hold them once granted; UnlockAll withdraws them, waiting
// for the grants first.
func (w *Win) LockAll(ctx context.Context) error {
	w.mu.Lock()
	if w.freed {
		w.mu.Unlock()
		return fmt.Errorf("adi: lock all: %w", errWinFreed)
	}
	if w.all != lockNone || len(w.locks) > 0 {
		w.mu.Unlock()
		return fmt.Errorf("adi: lock all: %w: this rank holds a lock on the window already", ErrRMASync)
	}
	w.all = lockWanted
	w.mu.Unlock()
	targets := w.ranks()
	grants, err := w.roundTrips(ctx, rmaHeader{kind: rmaLock, op: lockShared}, targets)
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err == nil:
		w.all = lockHeld
		return nil
	case len(grants) > 0:
		// Some requests are queued at their targets (ctx ended, or a
		// send failed after the first): UnlockAll withdraws those.
		w.allGrants, w.allTargets = grants, targets[:len(grants)]
		return fmt.Errorf("adi: lock all: %w (the requests sent stay queued: UnlockAll withdraws them)", err)
	default:
		w.all = lockNone
		return fmt.Errorf("adi: lock all: %w", err)
	}
}

// UnlockAll ends the epoch LockAll started (MPI_Win_unlock_all): the
// operations this rank started are complete, at their targets too, and
// every rank's shared lock is released. Without LockAll it fails with
// ErrRMASync and sends nothing. If it fails before the release is sent
// (ctx ended), the locks are still held and UnlockAll may be called
// again.
func (w *Win) UnlockAll(ctx context.Context) error {
	w.mu.Lock()
	if w.freed {
		w.mu.Unlock()
		return fmt.Errorf("adi: unlock all: %w", errWinFreed)
	}
	was, grants, kept := w.all, w.allGrants, w.allTargets
	if was != lockHeld && grants == nil {
		w.mu.Unlock()
		return fmt.Errorf("adi: unlock all: %w: this rank is in no LockAll epoch", ErrRMASync)
	}
	targets := kept // those LockAll asked, when its ctx ended
	if grants == nil {
		targets = w.ranks()
	}
	w.all, w.allGrants, w.allTargets = lockReleasing, nil, nil
	w.mu.Unlock()
	released, err := w.release(ctx, "unlock all", targets, grants)
	w.mu.Lock()
	if err != nil && !released {
		w.all, w.allGrants, w.allTargets = was, grants, kept
	} else {
		w.all = lockNone
	}
	w.mu.Unlock()
	return err
}

// FlushAll completes every operation this rank started on the window
// before the call (MPI_Win_flush_all), at this rank and at the targets:
// Get's and the fetching operations' results are in place, the origin
// buffers are the program's again, and every Put and Accumulate has been
// applied, so that what any rank reads from those targets afterwards
// shows it. It asks each target written to since its last flush to
// acknowledge (one round trip to each, all at once), so it blocks; it
// does not end the epoch. It may be called in any epoch, or none.
func (w *Win) FlushAll(ctx context.Context) error {
	return w.flush(ctx, "flush all", -1)
}

// flush is FlushAll (only < 0) or Flush of one target.
func (w *Win) flush(ctx context.Context, what string, only int) error {
	w.mu.Lock()
	if w.freed {
		w.mu.Unlock()
		return fmt.Errorf("adi: %s: %w", what, errWinFreed)
	}
	var targets []int
	for t, n := range w.writes {
		if n > w.acked[t] && (only < 0 || t == only) {
			targets = append(targets, t)
		}
	}
	w.mu.Unlock()
	// The flush requests go out first, so that their round trips overlap
	// the wait for this rank's own sends; the wait includes them. Each
	// acknowledgement records, as it is read, that its target applied
	// what this rank wrote there (settle), whatever else fails: a miss
	// reported here leaves nothing for the next flush to ask. A target
	// lost fails the flush, once (giveUp), but the operations on the
	// others are completed all the same.
	_, err := w.roundTrips(ctx, rmaHeader{kind: rmaFlush}, targets)
	if err != nil {
		err = fmt.Errorf("adi: %s: %w", what, err)
		if ctx.Err() != nil {
			return err
		}
	}
	var ranks []int // whose failed operations fail the flush: nil, every rank's
	if only >= 0 {
		ranks = []int{only}
	}
	return errors.Join(err, w.flushLocal(ctx, what, ranks))
}

// FlushLocal completes every operation this rank started on the window
// before the call at this rank only (MPI_Win_flush_local_all): the
// origin buffers of Put and Accumulate are the program's again, and the
// results of Get, GetAccumulate, FetchAndOp and CompareAndSwap are in
// place, which also means the target has applied those. A Put or
// Accumulate may still be on its way; since every target applies one
// origin's operations in the order they were sent, it is applied before
// anything this rank sends that target later, but another rank may not
// see it yet (FlushAll for that). It needs no round trip of its own.
func (w *Win) FlushLocal(ctx context.Context) error {
	return w.flushLocal(ctx, "flush local", nil)
}

// flushLocal is FlushLocal, its errors named what, failing for the
// operations that failed on ranks (nil: on every rank; see waitMissed).
func (w *Win) flushLocal(ctx context.Context, what string, ranks []int) error {
	w.mu.Lock()
	if w.freed {
		w.mu.Unlock()
		return fmt.Errorf("adi: %s: %w", what, errWinFreed)
	}
	pending := slices.Clone(w.pending)
	w.mu.Unlock()
	if err := w.wait(ctx, pending, ranks); err != nil {
		return fmt.Errorf("adi: %s: %w", what, err)
	}
	return nil
}

// ranks lists the window's ranks.
func (w *Win) ranks() []int {
	rs := make([]int, len(w.sizes))
	for r := range rs {
		rs[r] = r
	}
	return rs
}

// passive checks that this rank is in a passive-target epoch on target,
// as the request-based operations require.
func (w *Win) passive(what string, target int) error {
	w.mu.Lock()
	ok := w.all == lockHeld || w.locks[target] == lockHeld
	w.mu.Unlock()
	if !ok {
		return fmt.Errorf("adi: %s: %w: no Lock or LockAll epoch on rank %d's window", what, ErrRMASync, target)
	}
	return nil
}
