package adi

import (
	"fmt"
	"math"
	"testing"
)

// maxParts is the most partitions a request may have, MaxTag+1, where
// int holds it; on 32-bit platforms, MaxTag.
const maxParts = int(min(int64(MaxTag)+1, math.MaxInt))

// TestOverlap: the sender partitions overlap names for a receiver
// partition are exactly those sharing a byte with it, for every pair of
// partition counts up to 12.
func TestOverlap(t *testing.T) {
	for sp := 1; sp <= 12; sp++ {
		for rp := 1; rp <= 12; rp++ {
			length := sp * rp * 2
			sl, rl := length/sp, length/rp
			for j := range rp {
				wantLo, wantHi := -1, -1
				for i := range sp {
					if i*sl < (j+1)*rl && j*rl < (i+1)*sl {
						if wantLo < 0 {
							wantLo = i
						}
						wantHi = i
					}
				}
				if lo, hi := overlap(j, rp, sp); lo != wantLo || hi != wantHi {
					t.Errorf("overlap(%d, %d receiver partitions, %d sender partitions) = %d..%d, want %d..%d", j, rp, sp, lo, hi, wantLo, wantHi)
				}
			}
		}
	}
	if lo, hi := overlap(maxParts-1, maxParts, maxParts); lo != maxParts-1 || hi != maxParts-1 {
		t.Errorf("overlap at MaxTag+1 partitions: %d..%d", lo, hi)
	}
}

// TestPartitionContext: channel ids are even, in the range of ids all
// ranks derive alike (top bit clear), never the world's, and differ
// with each input.
func TestPartitionContext(t *testing.T) {
	seen := map[uint64]string{}
	for _, parent := range []uint64{worldContext, deriveContext(worldContext, 1, 0)} {
		for s := range 3 {
			for r := range 3 {
				for _, tag := range []int{0, 1, MaxTag} {
					for k := uint64(1); k <= 3; k++ {
						id := partitionContext(parent, s, r, tag, k)
						in := fmt.Sprint(parent, s, r, tag, k)
						if id&1 != 0 || id&groupContext != 0 || id <= worldContext {
							t.Errorf("partitionContext(%s) = %#x: odd, of CreateGroup's range, or the world's", in, id)
						}
						if prev, ok := seen[id]; ok {
							t.Errorf("partitionContext(%s) = partitionContext(%s) = %#x", in, prev, id)
						}
						seen[id] = in
					}
				}
			}
		}
	}
	// Not the ids of the communicators Dup and Split make of the same parent.
	for n := uint64(0); n < 64; n++ {
		for color := uint64(0); color < 8; color++ {
			if in, ok := seen[deriveContext(worldContext, n, color)]; ok && n > 1 {
				t.Errorf("partitionContext(%s) is a derived communicator's id", in)
			}
		}
	}
}

// TestSetupRoundTrip: what encodeSetup writes, decodeSetup reads back;
// what breaks its rules (more messages than bytes among them), it
// refuses.
func TestSetupRoundTrip(t *testing.T) {
	var b [setupSize]byte
	for _, c := range []struct {
		parts  int
		length uint64
	}{{1, 0}, {4, 4096}, {3, 6}, {maxParts, uint64(maxParts) << 2}} {
		encodeSetup(&b, c.parts, c.length)
		parts, length, err := decodeSetup(b[:])
		if err != nil || parts != c.parts || length != c.length {
			t.Errorf("round trip of %d partitions, %d bytes: %d, %d, %v", c.parts, c.length, parts, length, err)
		}
	}
	encodeSetup(&b, 4, 100)
	for name, bad := range map[string][]byte{
		"short":        b[:15],
		"long":         append(b[:], 0),
		"version":      append([]byte{2}, b[1:]...),
		"flags":        append([]byte{1, 0, 1}, b[3:]...),
		"no partition": {1, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0},
		"too many":     {1, 0, 0, 0, 1, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 0, 0},
		"uneven":       {1, 0, 0, 0, 3, 0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0},
		// An empty buffer travels as one message: a receiver would keep
		// a request for each of 2^31 (535 GB) for nothing.
		"empty in many": {1, 0, 0, 0, 0, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 0, 0},
		"empty in two":  {1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
	} {
		if _, _, err := decodeSetup(bad); err == nil {
			t.Errorf("decodeSetup(%s % x) accepted it", name, bad)
		}
	}
}

// FuzzDecodeSetup: decodeSetup never panics, and what it accepts obeys
// the rules and encodes back to the same bytes.
func FuzzDecodeSetup(f *testing.F) {
	var b [setupSize]byte
	encodeSetup(&b, 4, 4096)
	f.Add(b[:])
	encodeSetup(&b, 1, 0)
	f.Add(b[:])
	encodeSetup(&b, maxParts, uint64(maxParts))
	f.Add(b[:])
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, in []byte) {
		parts, length, err := decodeSetup(in)
		if err != nil {
			return
		}
		if parts < 1 || int64(parts) > int64(MaxTag)+1 || length%uint64(parts) != 0 || uint64(parts) > max(length, 1) {
			t.Fatalf("decodeSetup(% x) = %d partitions, %d bytes", in, parts, length)
		}
		var again [setupSize]byte
		encodeSetup(&again, parts, length)
		if string(again[:]) != string(in) {
			t.Fatalf("decodeSetup(% x) = %d, %d, which encodes as % x", in, parts, length, again)
		}
	})
}
