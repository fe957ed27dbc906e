package adi

import (
	"math"
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
		h, p, err := decodeRMA(append(header, payload...), uint64(size))
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

// FuzzDecodeMissReport: no report of missed operations, however garbled,
// panics the origin; one it accepts names puts or accumulates of some
// bytes at an address that does not wrap, and encodes back to what came.
func FuzzDecodeMissReport(f *testing.F) {
	f.Add(missReport{kind: rmaPut, count: 3, addr: 0x10040, length: 8}.encode(nil))
	f.Add(missReport{}.encode(nil))
	f.Add([]byte(nil))
	f.Add(missReport{kind: rmaGet, count: 1, addr: 1, length: 1}.encode(nil))
	f.Add(missReport{kind: rmaAcc, count: 1, addr: 1<<64 - 8, length: 9}.encode(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMissReport(b)
		if err != nil {
			return
		}
		if m.count == 0 {
			if m != (missReport{}) {
				t.Fatalf("a report of no operations decoded as %+v", m)
			}
			return
		}
		if m.kind != rmaPut && m.kind != rmaAcc || m.length == 0 || m.addr+m.length < m.addr {
			t.Fatalf("accepted %+v", m)
		}
		if got := m.encode(nil); string(got) != string(b) {
			t.Fatalf("%x decoded as %+v, which encodes as %x", b, m, got)
		}
		_ = m.err(1).Error()
	})
}

// FuzzDynamicApply: an operation on a dynamic window, however garbled,
// with regions attached at whatever addresses Attach hands out, either
// finds every byte it names in one attached region or touches none; the
// server applies what it finds without reaching outside it.
func FuzzDynamicApply(f *testing.F) {
	first := uint64(dynFirstAddr)
	f.Add(rmaHeader{kind: rmaPut, offset: first + 8, length: 4}.encode(nil), []byte{1, 2, 3, 4}, uint16(16), uint16(100), uint8(0))
	f.Add(rmaHeader{kind: rmaGet, offset: first + 128, length: 100, tag: 9}.encode(nil), []byte(nil), uint16(16), uint16(100), uint8(0))
	f.Add(rmaHeader{kind: rmaAcc, elem: byte(reflect.Float64), op: AccSum, offset: first + 12, length: 8}.encode(nil), make([]byte, 8), uint16(16), uint16(8), uint8(1))
	f.Add(rmaHeader{kind: rmaCAS, elem: byte(reflect.Uint64), offset: first + 128, length: 8, tag: 4}.encode(nil), make([]byte, 16), uint16(1), uint16(8), uint8(0))
	f.Add(rmaHeader{kind: rmaPut, offset: 1<<64 - 2, length: 4}.encode(nil), []byte{1, 2, 3, 4}, uint16(16), uint16(100), uint8(0))
	f.Fuzz(func(t *testing.T, header, payload []byte, sizeA, sizeB uint16, detach uint8) {
		d := &dynRegions{next: dynFirstAddr}
		a, b := make([]byte, int(sizeA)%4096+1), make([]byte, int(sizeB)%4096+1)
		if _, err := d.attach(a); err != nil {
			t.Fatal(err)
		}
		if _, err := d.attach(b); err != nil {
			t.Fatal(err)
		}
		if detach%3 == 1 {
			if err := d.detach(a); err != nil {
				t.Fatal(err)
			}
		}
		h, p, err := decodeRMA(append(header, payload...), math.MaxUint64)
		if err != nil {
			return
		}
		at, ok := d.find(h.offset, h.length)
		if !ok {
			return
		}
		if uint64(len(at)) != h.length {
			t.Fatalf("%d bytes at %#x found as %d", h.length, h.offset, len(at))
		}
		if len(at) > 0 {
			inside := false
			for _, r := range d.regions {
				f, e := memSpan(r.buf)
				if s, te := memSpan(at); s >= f && te <= e {
					inside = inside || h.offset-r.addr == uint64(s-f)
				}
			}
			if !inside {
				t.Fatalf("%d bytes at %#x found outside the attached regions %+v", h.length, h.offset, d.regions)
			}
		}
		switch h.kind {
		case rmaPut, rmaAcc, rmaGetAcc, rmaCAS:
			modify(h, at, p, nil)
		}
	})
}
