package plugin

import (
	"bytes"
	"testing"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// TestBatchChunks checks that the stream plane's batches keep records in
// order and whole, and bound every chunk of several records to
// chunkBytes, so gRPC never marshals one larger than that unless a single
// record is.
func TestBatchChunks(t *testing.T) {
	lim := limits{maxHeader: 64, maxPayload: 2 * chunkBytes, size: 4}
	for _, tc := range []struct {
		name  string
		sizes []int // payload sizes, in the order added
	}{
		{"one small", []int{8}},
		{"small ones fill several chunks", repeat(40<<10, 40)},
		{"a record larger than a chunk travels alone", []int{8, chunkBytes + 100, 8, 8}},
		{"exactly a chunk", []int{chunkBytes - recordPrefix, 0}},
		{"mixed", []int{0, 1, 1 << 20, 65536, 3, chunkBytes / 2, chunkBytes / 2, 7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b batch
			for round := range 2 { // the second round starts from last's hint
				for i, n := range tc.sizes {
					b.add(kindFrame, sdi.Rank(i%4), 0, []byte{byte(i)}, bytes.Repeat([]byte{byte(i + round)}, n))
				}
				chunks := b.take()
				if b.bytes != 0 || b.chunks != nil {
					t.Fatalf("round %d: take left %d bytes", round, b.bytes)
				}
				next := 0
				for _, c := range chunks {
					records := 0
					for rest := c; len(rest) > 0; records++ {
						r, used, err := decodeRecord(rest, lim)
						if err != nil {
							t.Fatalf("round %d: record %d: %v", round, next, err)
						}
						if next >= len(tc.sizes) || len(r.payload) != tc.sizes[next] || r.header[0] != byte(next) ||
							(len(r.payload) > 0 && r.payload[len(r.payload)-1] != byte(next+round)) {
							t.Fatalf("round %d: record %d out of order or mangled: %d bytes, header %v", round, next, len(r.payload), r.header)
						}
						rest = rest[used:]
						next++
					}
					if records > 1 && len(c) > chunkBytes {
						t.Errorf("round %d: a chunk of %d records holds %d bytes, over %d", round, records, len(c), chunkBytes)
					}
				}
				if next != len(tc.sizes) {
					t.Fatalf("round %d: %d records came out of %d", round, next, len(tc.sizes))
				}
			}
		})
	}
}

func repeat(n, times int) []int {
	s := make([]int, times)
	for i := range s {
		s[i] = n
	}
	return s
}
