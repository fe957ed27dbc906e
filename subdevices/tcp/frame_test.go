package tcp

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/hpc-multidevice/multidevice/sdi"
)

func encodeFrame(header, payload []byte) []byte {
	b := make([]byte, sdi.WireHeaderSize, sdi.WireHeaderSize+len(header)+len(payload))
	sdi.WireHeader{HeaderLen: uint16(len(header)), PayloadLen: uint32(len(payload))}.Put(b)
	b = append(b, header...)
	return append(b, payload...)
}

func TestFrameReader(t *testing.T) {
	frames := [][2][]byte{
		{nil, nil},
		{[]byte("h"), nil},
		{nil, []byte("payload")},
		{bytes.Repeat([]byte{1}, maxHeader), bytes.Repeat([]byte{2}, maxFrame)},
		{[]byte("after the big one"), []byte("x")},
	}
	var stream []byte
	for _, f := range frames {
		stream = append(stream, encodeFrame(f[0], f[1])...)
	}
	fr := newFrameReader(bytes.NewReader(stream), maxHeader, maxFrame)
	for i, f := range frames {
		h, p, err := fr.next()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if !bytes.Equal(h, f[0]) || !bytes.Equal(p, f[1]) {
			t.Fatalf("frame %d: got %d+%d bytes, want %d+%d", i, len(h), len(p), len(f[0]), len(f[1]))
		}
		if cap(h) != len(h) {
			t.Fatalf("frame %d: header has spare capacity %d into the payload", i, cap(h)-len(h))
		}
	}
	if _, _, err := fr.next(); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}

func TestFrameReaderErrors(t *testing.T) {
	valid := encodeFrame([]byte("hdr"), []byte("payload"))
	tests := []struct {
		name     string
		in       []byte
		badFrame bool // wraps sdi.ErrBadFrame
	}{
		{"partial wire header", valid[:5], false},
		{"partial body", valid[:len(valid)-1], false},
		{"bad magic", append([]byte{0, 0}, valid[2:]...), true},
		{"flags", func() []byte { b := bytes.Clone(valid); b[3] = 1; return b }(), true},
		{"payload beyond MaxFrame", encodeFrame(nil, make([]byte, maxFrame+1)), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fr := newFrameReader(bytes.NewReader(tt.in), maxHeader, maxFrame)
			_, _, err := fr.next()
			if err == nil || err == io.EOF {
				t.Fatalf("next() = %v, want an error", err)
			}
			if got := errors.Is(err, sdi.ErrBadFrame); got != tt.badFrame {
				t.Fatalf("next() = %v; wraps ErrBadFrame: %v, want %v", err, got, tt.badFrame)
			}
			if tt.badFrame && cap(fr.buf) != 0 {
				t.Fatalf("allocated %d bytes for a frame it rejected", cap(fr.buf))
			}
		})
	}
}

// FuzzFrameReader feeds arbitrary streams to the frame reader: it must not
// panic, must return frames within the limits, and must never grow its
// buffer beyond what a valid frame needs.
func FuzzFrameReader(f *testing.F) {
	f.Add(encodeFrame([]byte("hdr"), []byte("payload")))
	f.Add(append(encodeFrame(nil, nil), encodeFrame([]byte{1}, bytes.Repeat([]byte{9}, 300))...))
	f.Add(encodeFrame(bytes.Repeat([]byte{1}, maxHeader), nil))
	f.Add([]byte{0x4d, 0x44, 1, 0, 0xff, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		// Small limits so the fuzzer reaches "too large" easily.
		const maxH, maxP = 16, 64
		fr := newFrameReader(bytes.NewReader(b), maxH, maxP)
		consumed := 0
		for {
			h, p, err := fr.next()
			if err != nil {
				if err == io.EOF && consumed != len(b) {
					t.Fatalf("clean EOF after %d of %d bytes", consumed, len(b))
				}
				break
			}
			if len(h) > maxH || len(p) > maxP {
				t.Fatalf("frame of %d+%d bytes beyond limits %d+%d", len(h), len(p), maxH, maxP)
			}
			if !bytes.Equal(encodeFrame(h, p), b[consumed:consumed+sdi.WireHeaderSize+len(h)+len(p)]) {
				t.Fatalf("frame at offset %d does not match its bytes", consumed)
			}
			consumed += sdi.WireHeaderSize + len(h) + len(p)
		}
		if cap(fr.buf) > maxH+maxP {
			t.Fatalf("buffer grew to %d bytes, limit %d", cap(fr.buf), maxH+maxP)
		}
	})
}
