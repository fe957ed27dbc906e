package adi

import (
	"math/rand/v2"
	"testing"
)

// TestContextRanges: the ids deriveContext gives (world, Dup, Split,
// Create), those CreateGroup agrees on and those it talks on fall into
// three disjoint ranges, whatever the inputs, and all are even, so that
// a communicator's collectives (the odd id after) stay in its range too.
// This is what makes CreateGroup's ids unable to collide with the others.
func TestContextRanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		parent, n, color := rng.Uint64(), rng.Uint64N(1<<20), rng.Uint64N(1<<20)
		tag := int(rng.Int32N(MaxTag))
		nonces := []uint64{rng.Uint64(), rng.Uint64N(100), rng.Uint64()}
		for _, tc := range []struct {
			name      string
			id        uint64
			mask, top uint64 // id&mask must be top
		}{
			{"deriveContext", deriveContext(parent, n, color), groupContext, 0},
			{"groupID", groupID(parent, tag, rng.Uint64(), nonces), groupContext | negotiationContext, groupContext},
			{"negotiationID", negotiationID(parent, tag), groupContext | negotiationContext, groupContext | negotiationContext},
		} {
			if got := tc.id & tc.mask; got != tc.top {
				t.Fatalf("%s(%#x, ...) = %#x: top bits %02b, want %02b", tc.name, parent, tc.id, got>>62, tc.top>>62)
			}
			if tc.id&1 != 0 {
				t.Fatalf("%s(%#x, ...) = %#x is odd", tc.name, parent, tc.id)
			}
		}
	}
}
