package multidevice

import (
	"errors"
	"testing"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// longHeader encodes h in the long form.
func longHeader(h header) []byte {
	b := make([]byte, headerSize)
	h.put(b)
	return b
}

func TestHeaderRoundTrip(t *testing.T) {
	in := header{kind: kindRTS, flags: flagSync, tag: 12, src: 3, dst: 1, context: 1 << 40, seq: 99, length: 1 << 30, sreq: 7, rreq: 8, offset: 9}
	b := make([]byte, headerSize)
	in.put(b)
	out, err := decodeHeader(b, 4)
	if err != nil || out != in {
		t.Fatalf("round trip: %+v, %v", out, err)
	}
}

func TestHeaderRejects(t *testing.T) {
	good := header{kind: kindEager, tag: 1, src: 0, dst: 1}
	for _, tc := range []struct {
		name string
		mut  func(b []byte) []byte
	}{
		{"short", func(b []byte) []byte { return b[:10] }},
		{"version", func(b []byte) []byte { b[0] = 9; return b }},
		{"kind", func(b []byte) []byte { b[1] = 77; return b }},
		{"source out of range", func(b []byte) []byte { b[8] = 5; return b }},
		{"negative destination", func(b []byte) []byte { b[12], b[13], b[14], b[15] = 255, 255, 255, 255; return b }},
		{"application message with negative tag", func(b []byte) []byte { b[7] = 0x80; return b }},
		{"unknown flag", func(b []byte) []byte { b[2] = 0x80; return b }},
		{"huge length", func(b []byte) []byte { b[39] = 0xff; return b }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := make([]byte, headerSize)
			good.put(b)
			if _, err := decodeHeader(tc.mut(b), 2); !errors.Is(err, errBadHeader) {
				t.Fatalf("err = %v, want errBadHeader", err)
			}
		})
	}
}

func FuzzDecodeHeader(f *testing.F) {
	b := make([]byte, headerSize)
	(&header{kind: kindEager, tag: 1, dst: 1}).put(b)
	f.Add(b)
	(&header{kind: kindSys, tag: sysCTS, src: 1}).put(b)
	f.Add(b)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := decodeHeader(data, 4)
		if err != nil {
			return
		}
		out := make([]byte, headerSize)
		h.put(out)
		if h2, err := decodeHeader(out, 4); err != nil || h2 != h {
			t.Fatalf("re-encoding a valid header changed it: %+v -> %+v (%v)", h, h2, err)
		}
	})
}

func TestShortHeaderRoundTrip(t *testing.T) {
	in := header{kind: kindEager, tag: 12, context: 1 << 40, seq: 99}
	b := make([]byte, shortHeaderSize)
	putShort(b, in.tag, in.context, in.seq)
	var out header
	err := out.decodeShort(b, 3, 1, 4, 8)
	want := in
	want.src, want.dst, want.length = 3, 1, 8
	if err != nil || out != want {
		t.Fatalf("round trip: %+v, %v; want %+v", out, err, want)
	}
}

func TestShortHeaderRejects(t *testing.T) {
	good := header{kind: kindEager, tag: 1, context: 2, seq: 3}
	for _, tc := range []struct {
		name string
		from int32
		mut  func(b []byte) []byte
	}{
		{"too short", 1, func(b []byte) []byte { return b[:10] }},
		{"long", 1, func(b []byte) []byte { return append(b, 0) }},
		{"version", 1, func(b []byte) []byte { b[0] = 9; return b }},
		{"not eager", 1, func(b []byte) []byte { b[1] = byte(kindRTS); return b }},
		{"sync flag", 1, func(b []byte) []byte { b[2] = flagSync; return b }},
		{"reserved byte", 1, func(b []byte) []byte { b[3] = 1; return b }},
		{"negative tag", 1, func(b []byte) []byte { b[7] = 0x80; return b }},
		{"sender out of range", 2, func(b []byte) []byte { return b }},
		{"negative sender", -1, func(b []byte) []byte { return b }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := make([]byte, shortHeaderSize)
			putShort(b, good.tag, good.context, good.seq)
			var h header
			if err := h.decodeShort(tc.mut(b), tc.from, 0, 2, 8); !errors.Is(err, errBadHeader) {
				t.Fatalf("err = %v, want errBadHeader", err)
			}
		})
	}
}

func FuzzDecodeShortHeader(f *testing.F) {
	b := make([]byte, shortHeaderSize)
	putShort(b, 1, 2, 3)
	f.Add(b, int32(1), 8)
	f.Add([]byte{}, int32(0), 0)
	f.Fuzz(func(t *testing.T, data []byte, from int32, plen int) {
		var h, h2 header
		if err := h.decodeShort(data, from, 0, 4, plen); err != nil {
			if !errors.Is(err, errBadHeader) {
				t.Fatalf("error %v does not wrap errBadHeader", err)
			}
			return
		}
		out := make([]byte, shortHeaderSize)
		putShort(out, h.tag, h.context, h.seq)
		if err := h2.decodeShort(out, from, 0, 4, plen); err != nil || h2 != h {
			t.Fatalf("re-encoding a valid short header changed it: %+v -> %+v (%v)", h, h2, err)
		}
	})
}

// TestHeaderSizeIsSDIMinHeader: sdi.MinHeader tells subdevice authors
// what the multidevice needs; the conformance suite fails a subdevice
// below it, so the two must not drift apart.
func TestHeaderSizeIsSDIMinHeader(t *testing.T) {
	if headerSize != sdi.MinHeader {
		t.Fatalf("the multidevice's header is %d bytes, sdi.MinHeader says %d", headerSize, sdi.MinHeader)
	}
}
