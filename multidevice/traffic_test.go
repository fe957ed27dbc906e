package multidevice

import (
	"sync"
	"testing"
)

// TestTraffic counts frames and bytes across the fold of the frame part,
// with a frame too large for the packed word, from several goroutines.
func TestTraffic(t *testing.T) {
	tests := []struct {
		name    string
		workers int
		frames  int // per worker
		size    int
		big     int // one frame of this many bytes, if non-zero
	}{
		{name: "one frame", workers: 1, frames: 1, size: 8},
		{name: "past the frame part's range", workers: 1, frames: 1<<trafficFrameBits + 10, size: 3},
		{name: "concurrent, past the range", workers: 4, frames: 1 << (trafficFrameBits - 1), size: 1000},
		{name: "a frame of a quarter of the byte range", workers: 2, frames: 5, size: 7, big: 1 << (trafficByteBits - 2)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tr traffic
			if f, b := tr.load(); f != 0 || b != 0 {
				t.Fatalf("counted %d frames, %d bytes before any", f, b)
			}
			var wg sync.WaitGroup
			for range tt.workers {
				wg.Go(func() {
					for range tt.frames {
						tr.add(tt.size)
					}
				})
			}
			wg.Wait()
			wantF, wantB := uint64(tt.workers*tt.frames), uint64(tt.workers*tt.frames*tt.size)
			if tt.big != 0 {
				tr.add(tt.big)
				wantF, wantB = wantF+1, wantB+uint64(tt.big)
			}
			if f, b := tr.load(); f != wantF || b != wantB {
				t.Fatalf("counted %d frames, %d bytes, want %d and %d", f, b, wantF, wantB)
			}
		})
	}
}
