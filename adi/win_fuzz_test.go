package adi

import (
	"reflect"
	"testing"
)

// FuzzDecodeRMA: no operation message, however garbled, panics the
// window's server or reaches outside the window; what decodeRMA accepts
// can be applied, and a fetching one sends back as many bytes as it
// names.
func FuzzDecodeRMA(f *testing.F) {
	f.Add(rmaHeader{kind: rmaPut, offset: 8, length: 4}.encode(nil), []byte{1, 2, 3, 4}, 64)
	f.Add(rmaHeader{kind: rmaGet, offset: 0, length: 64, tag: 9}.encode(nil), []byte(nil), 64)
	f.Add(rmaHeader{kind: rmaAcc, elem: byte(reflect.Float64), op: AccSum, offset: 3, length: 8}.encode(nil), make([]byte, 8), 16)
	f.Add(rmaHeader{kind: rmaLock, op: lockShared, tag: 7}.encode(nil), []byte(nil), 8)
	f.Add([]byte{3, 255, 9}, []byte(nil), 0)
	f.Add(rmaHeader{kind: rmaGetAcc, elem: byte(reflect.Int64), op: AccSum, offset: 8, length: 8, tag: 3}.encode(nil), make([]byte, 8), 16)
	f.Add(rmaHeader{kind: rmaGetAcc, elem: byte(reflect.Float32), op: AccNoOp, offset: 1, length: 8, tag: 3}.encode(nil), []byte(nil), 16)
	f.Add(rmaHeader{kind: rmaCAS, elem: byte(reflect.Uint32), offset: 5, length: 4, tag: 4}.encode(nil), make([]byte, 8), 16)
	f.Add(rmaHeader{kind: rmaCAS, elem: byte(reflect.Float64), offset: 0, length: 8, tag: 4}.encode(nil), make([]byte, 16), 16)
	f.Add(rmaHeader{kind: rmaFlush, tag: 5}.encode(nil), []byte(nil), 0)
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
		if h.kind == rmaAcc && h.op == AccNoOp {
			t.Fatalf("accepted AccNoOp in a plain accumulate")
		}
		window := make([]byte, size)
		at := window[h.offset : h.offset+h.length]
		old := modify(h, at, p, nil) // what the server does
		want := uint64(0)
		if h.kind == rmaGetAcc || h.kind == rmaCAS {
			want = h.length
		}
		if uint64(len(old)) != want {
			t.Fatalf("%s sends back %d bytes, want %d", rmaName(h.kind), len(old), want)
		}
	})
}
