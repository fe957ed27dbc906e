package adi

// Hooks into dynamic windows for the tests of package adi_test.

// OnExchange has f run in each of w's Fences on a dynamic window once
// its receives of the other ranks' reports of missed operations are
// posted, before it sends its own.
func OnExchange(w *Win, f func()) { w.exchanging = f }

// Halt stops w's server as a failure to receive an operation in Fence
// does, with err, and returns once it has stopped: nothing applies the
// operations that come to w until its next Fence.
func Halt(w *Win, err error) {
	w.halt(err)
	<-w.stopped
}
