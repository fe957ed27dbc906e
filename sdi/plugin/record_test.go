package plugin

import (
	"bytes"
	"errors"
	"testing"

	"github.com/hpc-multidevice/multidevice/sdi"
)

var testLimits = limits{maxHeader: 64, maxPayload: 1000, size: 4}

func TestRecordRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name            string
		kind            uint8
		peer            sdi.Rank
		aux             uint32
		header, payload []byte
	}{
		{"empty frame", kindFrame, 0, 0, nil, nil},
		{"unaligned lengths", kindDeliver, 3, 0, []byte("hdr"), []byte("payload!x")},
		{"limits", kindFrame, 1, 0, bytes.Repeat([]byte{1}, 64), bytes.Repeat([]byte{2}, 1000)},
		{"peer down", kindPeerDown, 2, 0, nil, []byte("connection reset")},
		{"credit", kindCredit, 0, 123456, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := recordLen(len(tc.header), len(tc.payload))
			if n%recordAlign != 0 || n < recordPrefix+len(tc.header)+len(tc.payload) {
				t.Fatalf("recordLen = %d", n)
			}
			b := make([]byte, n+32) // room after it must not be taken
			if got := putRecord(b, tc.kind, tc.peer, tc.aux, tc.header, tc.payload); got != n {
				t.Fatalf("putRecord wrote %d, want %d", got, n)
			}
			r, used, err := decodeRecord(b, testLimits)
			if err != nil {
				t.Fatal(err)
			}
			if used != n || r.kind != tc.kind || r.peer != tc.peer || r.aux != tc.aux ||
				!bytes.Equal(r.header, tc.header) || !bytes.Equal(r.payload, tc.payload) {
				t.Fatalf("decoded %+v (%d bytes)", r, used)
			}
		})
	}
}

func TestRecordRejects(t *testing.T) {
	good := func() []byte {
		b := make([]byte, recordLen(3, 5))
		putRecord(b, kindFrame, 1, 0, []byte("abc"), []byte("12345"))
		return b
	}
	for _, tc := range []struct {
		name   string
		mangle func(b []byte) []byte
		want   string
	}{
		{"short prefix", func(b []byte) []byte { return b[:recordPrefix-1] }, "prefix"},
		{"truncated body", func(b []byte) []byte { return b[:recordPrefix+4] }, "left"},
		{"reserved byte", func(b []byte) []byte { b[1] = 9; return b }, "reserved"},
		{"pad kind", func(b []byte) []byte { b[0] = kindPad; return b }, "kind 0"},
		{"unknown kind", func(b []byte) []byte { b[0] = 77; return b }, "kind 77"},
		{"header too long", func(b []byte) []byte { b[2], b[3] = 65, 0; return b }, "header length 65"},
		{"payload too long", func(b []byte) []byte { b[4], b[5] = 0xe9, 3; return b }, "payload length 1001"},
		{"huge payload", func(b []byte) []byte { b[4], b[5], b[6], b[7] = 0xff, 0xff, 0xff, 0xff; return b }, "payload length"},
		{"peer out of range", func(b []byte) []byte { b[8] = 4; return b }, "peer 4"},
		{"negative peer", func(b []byte) []byte { b[8], b[9], b[10], b[11] = 0xff, 0xff, 0xff, 0xff; return b }, "peer -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := decodeRecord(tc.mangle(good()), testLimits)
			if !errors.Is(err, sdi.ErrBadFrame) || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
				t.Fatalf("err = %v, want ErrBadFrame mentioning %q", err, tc.want)
			}
		})
	}
}

func FuzzDecodeRecord(f *testing.F) {
	b := make([]byte, recordLen(3, 5))
	putRecord(b, kindFrame, 1, 0, []byte("abc"), []byte("12345"))
	f.Add(b)
	f.Add(make([]byte, recordPrefix))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, n, err := decodeRecord(b, testLimits)
		if err != nil {
			return
		}
		if n > len(b) || n%recordAlign != 0 || len(r.header) > testLimits.maxHeader || len(r.payload) > testLimits.maxPayload {
			t.Fatalf("accepted %+v using %d of %d bytes", r, n, len(b))
		}
	})
}

// A placed record carries the payload's length but not its bytes, and
// that length obeys the payload limit like any other.
func TestPlacedRecord(t *testing.T) {
	b := make([]byte, recordLen(3, 0)+32)
	if n := putPlacedRecord(b, 2, 7, []byte("hdr"), 1000); n != recordLen(3, 0) {
		t.Fatalf("putPlacedRecord wrote %d bytes", n)
	}
	r, used, err := decodeRecord(b, testLimits)
	if err != nil || used != recordLen(3, 0) || r.kind != kindPlaced || r.peer != 2 || r.aux != 7 ||
		r.placed != 1000 || r.payload != nil || string(r.header) != "hdr" {
		t.Fatalf("decoded %+v (%d bytes), %v", r, used, err)
	}
	putPlacedRecord(b, 2, 7, []byte("hdr"), 1001)
	if _, _, err := decodeRecord(b, testLimits); !errors.Is(err, sdi.ErrBadFrame) {
		t.Fatalf("a placed length beyond the limit: err = %v", err)
	}
}
