package sditest

import "testing"

// TestPatternCatchesMixUps: a payload the suite checks must fail its check
// when shifted, cut, swapped for another frame's or patched with another
// chunk's bytes, at any size around the pattern's chunks; patterns are
// windows of one table, so two of them may not overlap in it by accident.
func TestPatternCatchesMixUps(t *testing.T) {
	const seed = 0x0001_0002_0003_0004
	for _, n := range []int{1, 7, 8, 9, 100, patternChunk - 1, patternChunk, patternChunk + 1, 3*patternChunk + 5, 4 << 20} {
		b := make([]byte, n)
		pattern(b, seed)
		if i := mismatch(b, seed); i != -1 {
			t.Fatalf("%d bytes: the pattern's own bytes mismatch at %d", n, i)
		}
		other := make([]byte, n)
		pattern(other, seed+1) // the next frame of the stream
		if mismatch(other, seed) == -1 && n >= 8 {
			t.Errorf("%d bytes: the next frame's payload passes for this one's", n)
		}
		if n < 16 {
			continue
		}
		last := n - 1
		for _, tc := range []struct {
			name   string
			mutate func(c []byte)
			at     int // the first byte that differs
		}{
			{"last byte flipped", func(c []byte) { c[last] ^= 1 }, last},
			{"shifted by 8", func(c []byte) { copy(c[8:], b) }, 8},
			{"second half from the other frame", func(c []byte) { copy(c[n/2:], other[n/2:]) }, n / 2},
		} {
			c := append([]byte(nil), b...)
			tc.mutate(c)
			if i := mismatch(c, seed); i < tc.at || i >= tc.at+8 {
				t.Errorf("%d bytes, %s: mismatch at %d, want the first change, near %d", n, tc.name, i, tc.at)
			}
		}
		if n > patternChunk {
			c := append([]byte(nil), b...)
			copy(c[patternChunk:], b) // the second chunk is the first again
			if i := mismatch(c, seed); i < patternChunk || i >= patternChunk+8 {
				t.Errorf("%d bytes with its first chunk repeated: mismatch at %d, want near %d", n, i, patternChunk)
			}
		}
	}
}
