package adi

import "context"

// Hooks into windows for the tests of package adi_test.

// UnlockUnheld sends target an unlock request whether or not w holds a
// lock there, as a broken or hostile origin could, and waits for its
// acknowledgement.
func UnlockUnheld(ctx context.Context, w *Win, target int) error {
	_, err := w.roundTrips(ctx, rmaHeader{kind: rmaUnlock}, []int{target})
	return err
}

// HoldApply keeps w's server from applying operations until the
// function it returns is called, as a server busy applying others does.
func HoldApply(w *Win) func() {
	w.amu.Lock()
	return w.amu.Unlock
}

// SentTo is how many operations w sent target since the last Fence:
// FlushAll's round trips among them.
func SentTo(w *Win, target int) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sent[target]
}
