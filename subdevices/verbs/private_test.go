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
