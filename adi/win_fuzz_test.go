package adi

import (
	"reflect"
	"testing"
)

// FuzzDecodeRMA: no operation message, however garbled, panics the
// window's server or reaches outside the window; what decodeRMA accepts
// can be applied.
func FuzzDecodeRMA(f *testing.F) {
	f.Add(rmaHeader{kind: rmaPut, offset: 8, length: 4}.encode(nil), []byte{1, 2, 3, 4}, 64)
	f.Add(rmaHeader{kind: rmaGet, offset: 0, length: 64, tag: 9}.encode(nil), []byte(nil), 64)
	f.Add(rmaHeader{kind: rmaAcc, elem: byte(reflect.Float64), op: AccSum, offset: 3, length: 8}.encode(nil), make([]byte, 8), 16)
	f.Add(rmaHeader{kind: rmaLock, op: lockShared, tag: 7}.encode(nil), []byte(nil), 8)
	f.Add([]byte{3, 255, 9}, []byte(nil), 0)
	f.Fuzz(func(t *testing.T, header, payload []byte, size int) {
		if size < 0 || size > 1<<16 {
			return
		}
		h, p, err := decodeRMA(append(header, payload...), size)
		if err != nil {
			return
		}
		if h.offset+h.length > uint64(size) {
			t.Fatalf("accepted %d bytes at %d of a %d-byte window", h.length, h.offset, size)
		}
		window := make([]byte, size)
		at := window[h.offset : h.offset+h.length]
		switch h.kind {
		case rmaPut:
			copy(at, p)
		case rmaAcc:
			accumulate(reflect.Kind(h.elem), h.op, at, p)
		}
	})
}
