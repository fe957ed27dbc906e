package adi

import (
	"encoding/binary"
	"slices"
	"testing"
)

// TestCreateMembers: a group's Create records decode to its subgroup in
// order, and records that disagree, or that no honest group sends, are
// errors.
func TestCreateMembers(t *testing.T) {
	const fp = 0x1234
	u := int64(Undefined)
	for _, tc := range []struct {
		name string
		recs []int64
		want []int // nil: an error
	}{
		{"whole group in order", []int64{fp, 0, fp, 1, fp, 2}, []int{0, 1, 2}},
		{"reversed", []int64{fp, 2, fp, 1, fp, 0}, []int{2, 1, 0}},
		{"some ranks outside", []int64{fp, u, fp, 1, fp, u, fp, 0}, []int{3, 1}},
		{"empty subgroup", []int64{fp, u, fp, u}, []int{}},
		{"different groups", []int64{fp, 0, fp + 1, 1}, nil},
		{"a bad group", []int64{int64(badGroup), u, int64(badGroup), u}, nil},
		{"a place twice", []int64{fp, 0, fp, 0}, nil},
		{"a place past the end", []int64{fp, 0, fp, 2}, nil},
		{"a negative place", []int64{fp, -5, fp, 0}, nil},
		{"no records", nil, nil},
		{"half a record", []int64{fp, 0, fp}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, got, err := createMembers(tc.recs)
			switch {
			case tc.want == nil && err == nil:
				t.Fatalf("got %v, want an error", got)
			case tc.want != nil && (err != nil || !slices.Equal(got, tc.want)):
				t.Fatalf("got %v %v, want %v", got, err, tc.want)
			}
		})
	}
}

// FuzzIntercommSplitRecords: whatever records a rank receives from the
// other group (Split's or Create's), decoding never panics: Create's
// decode to an error or to distinct ranks of the group, one for each
// record with a place; Split's to the ranks of a color, ordered by key,
// then by rank.
func FuzzIntercommSplitRecords(f *testing.F) {
	enc := func(recs ...int64) []byte {
		b := make([]byte, 8*len(recs))
		for i, x := range recs {
			binary.LittleEndian.PutUint64(b[8*i:], uint64(x))
		}
		return b
	}
	f.Add(enc(7, 0, 7, 1, 7, -1), int64(7))
	f.Add(enc(0, 3, 1, 2, 0, 1), int64(0))
	f.Add(enc(-2, 0, 5), int64(-1))
	f.Fuzz(func(t *testing.T, b []byte, color int64) {
		recs := make([]int64, len(b)/8)
		for i := range recs {
			recs[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
		}
		n := len(recs) / 2
		if _, order, err := createMembers(recs); err == nil {
			places := 0
			for r := 0; r+1 < len(recs); r += 2 {
				if recs[r+1] != Undefined {
					places++
				}
			}
			seen := make(map[int]bool)
			for i, r := range order {
				if r < 0 || r >= n || seen[r] || recs[2*r+1] != int64(i) {
					t.Fatalf("order %v from %v", order, recs)
				}
				seen[r] = true
			}
			if len(order) != places {
				t.Fatalf("order %v of %d ranks from %v, %d with a place", order, len(order), recs, places)
			}
		}
		_ = splitColors(recs, nil)
		members := splitMembers(recs, color)
		for i, r := range members {
			if r < 0 || r >= n || recs[2*r] != color {
				t.Fatalf("members %v of color %d from %v", members, color, recs)
			}
			if i > 0 {
				p := members[i-1]
				if recs[2*p+1] > recs[2*r+1] || recs[2*p+1] == recs[2*r+1] && p >= r {
					t.Fatalf("members %v of color %d from %v: out of order", members, color, recs)
				}
			}
		}
		want := 0
		for r := 0; r+1 < len(recs); r += 2 {
			if recs[r] == color {
				want++
			}
		}
		if len(members) != want {
			t.Fatalf("members %v of color %d from %v: want %d", members, color, recs, want)
		}
	})
}
