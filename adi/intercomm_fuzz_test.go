package adi

import (
	"encoding/binary"
	"math"
	"testing"
)

// FuzzIntercommHandshake: whatever bytes a leader receives where it
// expects the other leader's handshake and group (a program may use the
// tag for its own messages), decoding returns an error or a group of
// distinct ranks of the world of the size announced; it never panics.
func FuzzIntercommHandshake(f *testing.F) {
	f.Add(encodeHandshake(42, 2), encodeGroup([]int{3, 1}), 4)
	f.Add(make([]byte, 24), make([]byte, 16), 4)
	f.Add(encodeHandshake(1, math.MaxInt), []byte{1, 2, 3}, 1)
	f.Fuzz(func(t *testing.T, hdr, group []byte, worldSize int) {
		if worldSize < 1 || worldSize > 1<<16 {
			return
		}
		h, err := decodeHandshake(hdr, worldSize)
		if err != nil {
			return
		}
		if h.size < 1 || h.size > worldSize || h.proposal != binary.LittleEndian.Uint64(hdr[8:]) {
			t.Fatalf("decoded %+v from %x in a world of %d", h, hdr, worldSize)
		}
		ranks, err := decodeGroup(group, h.size, worldSize)
		if err != nil {
			return
		}
		seen := make(map[int]bool)
		for _, wr := range ranks {
			if wr < 0 || wr >= worldSize || seen[wr] {
				t.Fatalf("decoded group %v from %x in a world of %d", ranks, group, worldSize)
			}
			seen[wr] = true
		}
		if len(ranks) != h.size {
			t.Fatalf("group of %d ranks, the handshake said %d", len(ranks), h.size)
		}
	})
}
