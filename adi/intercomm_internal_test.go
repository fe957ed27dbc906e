package adi

import (
	"math/rand/v2"
	"testing"
)

// TestInterContextID: the id two leaders agree on is the same whichever
// proposal is whose, even, in deriveContext's range (so not CreateGroup's
// nor its negotiations'), and never the world's.
func TestInterContextID(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 10000 {
		a, b := rng.Uint64(), rng.Uint64()
		if rng.IntN(4) == 0 {
			a = rng.Uint64N(8) // small ids, near the world's
		}
		id := interContextID(a, b)
		if other := interContextID(b, a); other != id {
			t.Fatalf("interContextID(%#x, %#x) = %#x but swapped %#x", a, b, id, other)
		}
		if id&1 != 0 || id&groupContext != 0 || id <= worldContext {
			t.Fatalf("interContextID(%#x, %#x) = %#x: odd, in CreateGroup's range, or the world's", a, b, id)
		}
	}
}

// TestHandshakeRoundTrip: what a leader encodes, the other decodes.
func TestHandshakeRoundTrip(t *testing.T) {
	h, err := decodeHandshake(encodeHandshake(0xfeed_beef_0000_0002, 3), 5)
	if err != nil || h != (handshake{proposal: 0xfeed_beef_0000_0002, size: 3}) {
		t.Fatalf("handshake: %+v %v", h, err)
	}
	ranks := []int{4, 0, 2}
	got, err := decodeGroup(encodeGroup(ranks), 3, 5)
	if err != nil || len(got) != 3 || got[0] != 4 || got[1] != 0 || got[2] != 2 {
		t.Fatalf("group: %v %v", got, err)
	}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"short handshake", func() error { _, err := decodeHandshake(make([]byte, 23), 5); return err }()},
		{"wrong magic", func() error { _, err := decodeHandshake(make([]byte, 24), 5); return err }()},
		{"empty group", func() error { _, err := decodeHandshake(encodeHandshake(1, 0), 5); return err }()},
		{"group larger than the world", func() error { _, err := decodeHandshake(encodeHandshake(1, 6), 5); return err }()},
		{"group of another length", func() error { _, err := decodeGroup(encodeGroup(ranks), 2, 5); return err }()},
		{"rank outside the world", func() error { _, err := decodeGroup(encodeGroup([]int{5}), 1, 5); return err }()},
		{"rank twice", func() error { _, err := decodeGroup(encodeGroup([]int{1, 1}), 2, 5); return err }()},
	} {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}
