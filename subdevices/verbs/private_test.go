package verbs

import (
	"bytes"
	"testing"
)

func TestPrivateRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 17, maxPrivate} {
		p := bytes.Repeat([]byte{0xa5}, n)
		b, err := encodePrivate(p)
		if err != nil {
			t.Fatalf("encodePrivate(%d bytes): %v", n, err)
		}
		// The listening side sees the request's whole private data area,
		// zero-padded.
		padded := make([]byte, 56)
		copy(padded, b)
		got, err := decodePrivate(padded)
		if err != nil || !bytes.Equal(got, p) {
			t.Fatalf("decodePrivate(encodePrivate(%d bytes)) = %x, %v; want %x", n, got, err, p)
		}
	}
	if _, err := encodePrivate(make([]byte, maxPrivate+1)); err == nil {
		t.Fatalf("encodePrivate(%d bytes) succeeded", maxPrivate+1)
	}
}

func TestDecodePrivateRefuses(t *testing.T) {
	for _, b := range [][]byte{nil, {}, {1}, {5, 1, 2}, append([]byte{56}, make([]byte, 56)...)} {
		if got, err := decodePrivate(b); err == nil {
			t.Errorf("decodePrivate(%x) = %x, want an error", b, got)
		}
	}
}

// FuzzDecodePrivate feeds decodePrivate what a connection request from
// anyone on the fabric may carry: it must never panic, must return at most
// maxPrivate bytes that lie within the input, and what encodePrivate makes
// of its result must decode to the same bytes again.
func FuzzDecodePrivate(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{3, 'a', 'b', 'c'})
	f.Add(append([]byte{maxPrivate}, make([]byte, 56)...))
	f.Add([]byte{255, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := decodePrivate(b)
		if err != nil {
			return
		}
		if len(p) > maxPrivate || len(p) > len(b)-1 || !bytes.Equal(p, b[1:1+len(p)]) {
			t.Fatalf("decodePrivate(%x) = %x: not the %d bytes after the length", b, p, b[0])
		}
		e, err := encodePrivate(p)
		if err != nil {
			t.Fatalf("encodePrivate of a decoded %d bytes: %v", len(p), err)
		}
		if q, err := decodePrivate(e); err != nil || !bytes.Equal(q, p) {
			t.Fatalf("round trip of %x: %x, %v", p, q, err)
		}
	})
}
