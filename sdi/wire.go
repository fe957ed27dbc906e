package sdi

import (
	"encoding/binary"
	"fmt"
)

// Wire format shared by every subdevice that carries frames over a byte
// stream or a ring. A frame on the wire is a WireHeader followed by the
// opaque multidevice header and the payload:
//
//	0      2      3      4      6      8             12
//	+------+------+------+------+------+-------------+
//	|magic |vers  |flags |hdrlen|  0   | payload len |   WireHeaderSize = 12
//	+------+------+------+------+------+-------------+
//	| header (hdrlen bytes) | payload (payload len bytes) |
//
// All integers are little-endian. The version changes whenever the layout
// does; a receiver refuses versions it does not speak.
const (
	WireMagic      uint16 = 0x444d // "MD" little-endian
	WireVersion    uint8  = 1
	WireHeaderSize        = 12
)

// WireHeader is the fixed prefix of every frame on a stream or ring.
type WireHeader struct {
	Flags      uint8  // transport-private bits; 0 unless a subdevice defines them
	HeaderLen  uint16 // bytes of opaque multidevice header that follow
	PayloadLen uint32 // bytes of payload after the header
}

// Put writes h into b[:WireHeaderSize]. It panics if b is shorter, which is a
// programming error in the calling subdevice.
func (h WireHeader) Put(b []byte) {
	_ = b[WireHeaderSize-1]
	binary.LittleEndian.PutUint16(b[0:], WireMagic)
	b[2] = WireVersion
	b[3] = h.Flags
	binary.LittleEndian.PutUint16(b[4:], h.HeaderLen)
	binary.LittleEndian.PutUint16(b[6:], 0)
	binary.LittleEndian.PutUint32(b[8:], h.PayloadLen)
}

// FrameLen is the number of bytes the frame occupies on the wire.
func (h WireHeader) FrameLen() int {
	return WireHeaderSize + int(h.HeaderLen) + int(h.PayloadLen)
}

// DecodeWireHeader parses the fixed prefix in b and checks it against the
// receiver's limits. Every failure wraps [ErrBadFrame] and says what was
// wrong; it never panics, whatever b holds.
func DecodeWireHeader(b []byte, maxHeader, maxPayload int) (WireHeader, error) {
	if len(b) < WireHeaderSize {
		return WireHeader{}, fmt.Errorf("%w: %d bytes, need %d for the wire header", ErrBadFrame, len(b), WireHeaderSize)
	}
	if m := binary.LittleEndian.Uint16(b[0:]); m != WireMagic {
		return WireHeader{}, fmt.Errorf("%w: bad magic %#04x, want %#04x", ErrBadFrame, m, WireMagic)
	}
	if v := b[2]; v != WireVersion {
		return WireHeader{}, fmt.Errorf("%w: wire version %d, this build speaks %d", ErrBadFrame, v, WireVersion)
	}
	if r := binary.LittleEndian.Uint16(b[6:]); r != 0 {
		return WireHeader{}, fmt.Errorf("%w: reserved field is %#x, want 0", ErrBadFrame, r)
	}
	h := WireHeader{
		Flags:      b[3],
		HeaderLen:  binary.LittleEndian.Uint16(b[4:]),
		PayloadLen: binary.LittleEndian.Uint32(b[8:]),
	}
	if int(h.HeaderLen) > maxHeader {
		return WireHeader{}, fmt.Errorf("%w: header length %d exceeds limit %d", ErrBadFrame, h.HeaderLen, maxHeader)
	}
	if uint64(h.PayloadLen) > uint64(maxPayload) {
		return WireHeader{}, fmt.Errorf("%w: payload length %d exceeds limit %d", ErrBadFrame, h.PayloadLen, maxPayload)
	}
	return h, nil
}
