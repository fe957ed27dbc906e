package plugin

import (
	"encoding/binary"
	"fmt"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Records are the unit of the data plane, in the shared-memory rings and in
// the stream's chunks alike:
//
//	0      1      2      4       8       12      16
//	+------+------+------+-------+-------+-------+-----------------------+
//	| kind |  0   |hdrlen|paylen | peer  |  aux  | header | payload | pad |
//	+------+------+------+-------+-------+-------+-----------------------+
//
// Integers are little-endian. A record occupies recordLen(hdrlen, paylen)
// bytes: the 16-byte prefix, the header, the payload, padded to 16. A placed
// delivery (kindPlaced) carries no payload bytes: paylen is the length of
// the payload waiting in the place area's slot aux (place.go), and the
// record occupies recordLen(hdrlen, 0).
const (
	recordPrefix = 16
	recordAlign  = 16
)

// Record kinds. Frames go from the host to the plugin; deliveries, lost
// peers and credits come back.
const (
	kindPad      uint8 = 0 // ring only: the rest of the ring's space is unused; go to its start
	kindFrame    uint8 = 1 // a frame for peer
	kindDeliver  uint8 = 2 // a frame from peer
	kindPeerDown uint8 = 3 // peer is lost; the payload is the reason, as text
	kindCredit   uint8 = 4 // stream only: aux more bytes of frame records are released
	kindPlaced   uint8 = 5 // ring only: a frame from peer whose payload is in place-area slot aux
	kindLast           = kindPlaced
)

// record is one decoded record. header and payload alias the buffer it was
// decoded from.
type record struct {
	kind    uint8
	peer    sdi.Rank
	aux     uint32
	header  []byte
	payload []byte
	placed  int // kindPlaced: the payload's length in slot aux; payload is nil
}

// recordLen is the space a record with these lengths occupies.
func recordLen(hdr, payload int) int {
	n := recordPrefix + hdr + payload
	return (n + recordAlign - 1) &^ (recordAlign - 1)
}

// putRecord writes r into b, which must hold recordLen bytes.
func putRecord(b []byte, kind uint8, peer sdi.Rank, aux uint32, header, payload []byte) int {
	n := recordLen(len(header), len(payload))
	_ = b[n-1]
	b[0] = kind
	b[1] = 0
	binary.LittleEndian.PutUint16(b[2:], uint16(len(header)))
	binary.LittleEndian.PutUint32(b[4:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(b[8:], uint32(peer))
	binary.LittleEndian.PutUint32(b[12:], aux)
	copy(b[recordPrefix:], header)
	copy(b[recordPrefix+len(header):], payload)
	return n
}

// putPlacedRecord writes a kindPlaced record into b, which must hold
// recordLen(len(header), 0) bytes: the payload of n bytes is in slot.
func putPlacedRecord(b []byte, peer sdi.Rank, slot uint32, header []byte, n int) int {
	used := putRecord(b, kindPlaced, peer, slot, header, nil)
	binary.LittleEndian.PutUint32(b[4:], uint32(n))
	return used
}

// limits bound what a record may claim; anything beyond is malformed.
type limits struct {
	maxHeader  int
	maxPayload int
	// maxPlaced bounds the payload of a placed record (kindPlaced), which
	// may exceed maxPayload (plane.go); 0 means maxPayload.
	maxPlaced int
	size      int // ranks in the job: peer must be in [0, size)
}

// decodeRecord parses the record at the start of b. It returns the record
// and the bytes it occupies, or an error wrapping sdi.ErrBadFrame. The other
// process writes b and may be broken or hostile: the fields are read once and
// checked before anything is sliced, and it never panics.
func decodeRecord(b []byte, lim limits) (record, int, error) {
	if len(b) < recordPrefix {
		return record{}, 0, fmt.Errorf("%w: record prefix needs %d bytes, %d left", sdi.ErrBadFrame, recordPrefix, len(b))
	}
	kind := b[0]
	hl := int(binary.LittleEndian.Uint16(b[2:]))
	pl := uint64(binary.LittleEndian.Uint32(b[4:]))
	r := record{kind: kind, peer: sdi.Rank(int32(binary.LittleEndian.Uint32(b[8:]))), aux: binary.LittleEndian.Uint32(b[12:])}
	maxPayload := lim.maxPayload
	if kind == kindPlaced {
		maxPayload = max(maxPayload, lim.maxPlaced)
	}
	switch {
	case b[1] != 0:
		return record{}, 0, fmt.Errorf("%w: record reserved byte is %#x", sdi.ErrBadFrame, b[1])
	case kind == kindPad || kind > kindLast:
		return record{}, 0, fmt.Errorf("%w: record kind %d", sdi.ErrBadFrame, kind)
	case hl > lim.maxHeader:
		return record{}, 0, fmt.Errorf("%w: record header length %d exceeds %d", sdi.ErrBadFrame, hl, lim.maxHeader)
	case pl > uint64(maxPayload):
		return record{}, 0, fmt.Errorf("%w: record payload length %d exceeds %d", sdi.ErrBadFrame, pl, maxPayload)
	case kind != kindCredit && (r.peer < 0 || int(r.peer) >= lim.size):
		return record{}, 0, fmt.Errorf("%w: record peer %d not in [0,%d)", sdi.ErrBadFrame, r.peer, lim.size)
	}
	body := int(pl)
	if kind == kindPlaced {
		body = 0
		r.placed = int(pl)
	}
	n := recordLen(hl, body)
	if n > len(b) {
		return record{}, 0, fmt.Errorf("%w: record of %d bytes, %d left", sdi.ErrBadFrame, n, len(b))
	}
	r.header = b[recordPrefix : recordPrefix+hl : recordPrefix+hl]
	if kind != kindPlaced {
		r.payload = b[recordPrefix+hl : recordPrefix+hl+body : recordPrefix+hl+body]
	}
	return r, n, nil
}
