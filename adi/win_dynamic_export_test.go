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
	<-w.stopped.Done()
}

// Kept is how many answers and Fence reports w keeps for a later call.
func Kept(w *Win) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.leftovers) + len(w.reports)
}

// DecodeFenceReport decodes a dynamic window's Fence report: the epoch
// of the Fence that sent it, and the count, kind, address and length of
// the misses it reports.
func DecodeFenceReport(b []byte) (epoch, count uint64, kind byte, addr, length uint64, err error) {
	e, m, err := decodeFenceReport(b)
	return e, m.count, m.kind, m.addr, m.length, err
}

// EncodeFenceReport encodes what DecodeFenceReport decodes.
func EncodeFenceReport(epoch, count uint64, kind byte, addr, length uint64) []byte {
	return encodeFenceReport(epoch, missReport{kind: kind, count: count, addr: addr, length: length})
}
