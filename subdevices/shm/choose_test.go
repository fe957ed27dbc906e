package shm

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestChooser drives a sender's chooser through the machine's two states
// with the rates each side would see (the sender's copies into the ring in
// GB/s, the receiver's published copies out and reads in MB/s) and checks
// the path of every payload: each path on trial for a window of payloads
// at first, then the ring unless its writes are slowWrites times slower
// than its reads (and the reads beat them), the other path on trial once
// per exploreEvery, and a change of state followed but not one odd
// sample.
func TestChooser(t *testing.T) {
	const n = 256 << 10
	ms := time.Millisecond
	us := time.Microsecond
	type step struct {
		at        time.Duration
		in        float64 // a sample of the sender's copy into the ring before the choice, 0 for none
		out, desc uint32  // the receiver's published rates, MB/s
		want      int     // path taken
	}
	// warm is the first 2*window payloads, 0.1 ms apart: a window on the
	// path not preferred, then a window on the other.
	warm := func(first int, in float64, out, desc uint32) []step {
		var s []step
		for i := range 2 * window {
			s = append(s, step{time.Duration(i) * 100 * us, in, out, desc, first ^ i/window})
		}
		return s
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"each path is on trial for a window at first", warm(pathDesc, 0, 0, 0)},
		{"fast state keeps the ring and tries the single copy every exploreEvery", append(warm(pathDesc, 15, 30000, 10000),
			step{1 * ms, 15, 30000, 10000, pathRing},
			step{20 * ms, 15, 30000, 10000, pathRing},
			step{21 * ms, 15, 30000, 10000, pathDesc},
			step{21*ms + 100*us, 15, 30000, 10000, pathDesc},
			step{21*ms + 200*us, 15, 30000, 10000, pathDesc},
			step{21*ms + 300*us, 15, 30000, 10000, pathDesc},
			step{21*ms + 400*us, 15, 30000, 10000, pathRing},
		)},
		{"slow state takes the single copy and tries the ring every exploreEvery", append(warm(pathRing, 2.3, 22000, 9000),
			step{1 * ms, 0, 22000, 9000, pathDesc},
			step{19 * ms, 0, 22000, 9000, pathDesc},
			step{21 * ms, 0, 22000, 9000, pathRing},
			step{21*ms + 100*us, 2.3, 22000, 9000, pathRing},
			step{21*ms + 200*us, 2.3, 22000, 9000, pathRing},
			step{21*ms + 300*us, 2.3, 22000, 9000, pathRing},
			step{21*ms + 400*us, 2.3, 22000, 9000, pathDesc},
		)},
		{"one fast copy into a ring left alone does not bring it back", append(warm(pathRing, 2.3, 22000, 9000),
			step{21 * ms, 0, 22000, 9000, pathRing},
			step{21*ms + 100*us, 10, 22000, 9000, pathRing},
			step{21*ms + 200*us, 2.3, 22000, 9000, pathRing},
			step{21*ms + 300*us, 2.3, 22000, 9000, pathRing},
			step{21*ms + 400*us, 2.3, 22000, 9000, pathDesc},
		)},
		{"a fast trial brings the ring back", append(warm(pathRing, 2, 20000, 9000),
			step{10 * ms, 0, 20000, 9000, pathDesc},
			step{21 * ms, 0, 20000, 9000, pathRing},
			step{21*ms + 100*us, 15, 20000, 9000, pathRing},
			step{21*ms + 200*us, 15, 20000, 9000, pathRing},
			step{21*ms + 300*us, 15, 20000, 9000, pathRing},
			step{21*ms + 400*us, 15, 20000, 9000, pathRing},
		)},
		{"a ring that slows is left once most of a window is slow", append(warm(pathDesc, 15, 20000, 9000),
			step{1 * ms, 2, 20000, 9000, pathRing},
			step{2 * ms, 2, 20000, 9000, pathRing},
			step{3 * ms, 2, 20000, 9000, pathDesc},
		)},
		{"even copies keep the ring however fast the reads", append(warm(pathDesc, 10, 30000, 40000),
			step{1 * ms, 10, 30000, 40000, pathRing},
		)},
		{"slow writes keep the ring when reads are slower still", append(warm(pathDesc, 2, 20000, 1500),
			step{1 * ms, 2, 20000, 1500, pathRing},
		)},
		{"no copies out published keeps the ring", append(warm(pathDesc, 2, 0, 9000),
			step{1 * ms, 2, 0, 9000, pathRing},
		)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c chooser
			for i, s := range tt.steps {
				if s.in > 0 {
					c.in.add(n, time.Duration(float64(n)/s.in))
				}
				if got := c.byDesc(s.at, exploreEvery, s.out, s.desc); got != (s.want == pathDesc) {
					t.Fatalf("step %d at %v (ring in %.1f GB/s, out %d MB/s, reads %d MB/s): single copy %v, want %v",
						i, s.at, c.in.rate(), s.out, s.desc, got, s.want == pathDesc)
				}
			}
		})
	}
}

// TestRateWindow checks that a rate is the median of the last window
// samples and that publishing it rounds to MB/s and saturates instead of
// wrapping.
func TestRateWindow(t *testing.T) {
	var w rateWindow
	if w.rate() != 0 {
		t.Fatalf("empty window rate %v, want 0", w.rate())
	}
	for i, tt := range []struct {
		n    int
		d    time.Duration
		want float64
	}{
		{1000, 1000, 1},  // [1]
		{1000, 100, 5.5}, // [1 10]
		{1000, 500, 2},   // [1 10 2]
		{1000, 250, 3},   // [1 10 2 4]
		{1000, 50, 7},    // [20 10 2 4]: the 1 fell out
		{0, 0, 4},        // [20 _ 2 4]: a zero duration counts as 1 ns, a zero rate as no sample
	} {
		if got := w.add(tt.n, tt.d); got != tt.want {
			t.Fatalf("sample %d (%d bytes in %v): rate %v, want %v", i, tt.n, tt.d, got, tt.want)
		}
	}
	var word atomic.Uint32
	for _, tt := range []struct {
		rate float64
		want uint32
	}{{2.5, 2500}, {0, 0}, {1e12, 1<<32 - 1}} {
		publishRate(&word, tt.rate)
		if word.Load() != tt.want {
			t.Fatalf("publishRate(%v) stored %d, want %d", tt.rate, word.Load(), tt.want)
		}
	}
}
