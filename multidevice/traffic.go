package multidevice

import (
	"sync"
	"sync/atomic"
)

// traffic counts the frames and payload bytes one subdevice carried to
// one peer with one atomic addition per frame, where a counter each cost
// two locked instructions on every send: the frames in the top
// trafficFrameBits bits of a word, the bytes below. Before either part
// can overflow, the sender that finds it past half its range folds the
// word into the totals under mu.
type traffic struct {
	w  atomic.Uint64
	mu sync.Mutex
	// Folded totals, under mu.
	frames, bytes uint64
}

const (
	trafficFrameBits = 20
	trafficByteBits  = 64 - trafficFrameBits
	trafficByteMask  = 1<<trafficByteBits - 1
)

// add counts one frame of n payload bytes. A frame of a quarter of the
// byte part's range or more is added to the totals directly, so that
// concurrent adds cannot carry a full part into the next before one of
// them folds it.
func (t *traffic) add(n int) {
	if uint64(n) >= 1<<(trafficByteBits-2) {
		t.mu.Lock()
		t.frames++
		t.bytes += uint64(n)
		t.mu.Unlock()
		return
	}
	v := t.w.Add(1<<trafficByteBits + uint64(n))
	if v>>trafficByteBits >= 1<<(trafficFrameBits-1) || v&trafficByteMask >= 1<<(trafficByteBits-1) {
		t.fold()
	}
}

func (t *traffic) fold() {
	t.mu.Lock()
	v := t.w.Swap(0)
	t.frames += v >> trafficByteBits
	t.bytes += v & trafficByteMask
	t.mu.Unlock()
}

// load returns the frames and bytes counted so far.
func (t *traffic) load() (frames, bytes uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v := t.w.Load()
	return t.frames + v>>trafficByteBits, t.bytes + v&trafficByteMask
}
