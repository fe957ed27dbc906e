package sdi

import (
	"errors"
	"testing"
)

// FuzzDecodeWireHeader feeds DecodeWireHeader arbitrary prefixes and
// limits, as a subdevice reading a stream from an unauthenticated peer
// does: it must never panic, must refuse with ErrBadFrame, and what it
// accepts must lie within the limits and survive Put and a second decode
// unchanged.
func FuzzDecodeWireHeader(f *testing.F) {
	good := make([]byte, WireHeaderSize)
	WireHeader{Flags: 1, HeaderLen: 40, PayloadLen: 8}.Put(good)
	f.Add(good, 64, 1<<20)
	f.Add(good[:5], 64, 1<<20)
	f.Add(good, 16, 4)
	f.Add([]byte("MD\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00"), 64, 64)
	f.Fuzz(func(t *testing.T, b []byte, maxHeader, maxPayload int) {
		if maxHeader < 0 || maxPayload < 0 {
			return // a limit a subdevice cannot have
		}
		h, err := DecodeWireHeader(b, maxHeader, maxPayload)
		if err != nil {
			if !errors.Is(err, ErrBadFrame) {
				t.Fatalf("DecodeWireHeader(%x): %v does not wrap ErrBadFrame", b, err)
			}
			return
		}
		if int(h.HeaderLen) > maxHeader || int64(h.PayloadLen) > int64(maxPayload) {
			t.Fatalf("DecodeWireHeader(%x, %d, %d) = %+v, beyond the limits", b, maxHeader, maxPayload, h)
		}
		again := make([]byte, WireHeaderSize)
		h.Put(again)
		if h2, err := DecodeWireHeader(again, maxHeader, maxPayload); err != nil || h2 != h {
			t.Fatalf("Put then decode of %+v: %+v, %v", h, h2, err)
		}
		if string(again) != string(b[:WireHeaderSize]) {
			t.Fatalf("accepted %x, which Put writes as %x", b[:WireHeaderSize], again)
		}
	})
}
