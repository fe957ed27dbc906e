package multidevice

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The multidevice header travels as the opaque sdi header of every frame.
//
//	0       1      2      3      4           8           12          16
//	+-------+------+------+------+-----------+-----------+-----------+
//	|version| kind |flags | rsvd |   tag     |  source   |   dest    |
//	+-------+------+------+------+-----------+-----------+-----------+
//	|        context (u64)       |         sequence (u64)            |  16..32
//	|     message length (u64)   |   sender request id (u64)         |  32..48
//	|  receiver request id (u64) |   offset / capacity (u64)         |  48..64
//
// Little-endian. Source and dest are world ranks of the original sender and
// the final receiver (they differ from the frame's peer once messages are
// forwarded). Only eager and ready-to-send frames carry a sequence number;
// system messages are unsequenced and addressed by request ids.
//
// A standard-mode eager message sent straight to its destination carries
// the short form instead, the first 24 bytes with the source and
// destination fields left out:
//
//	0       1      2      3      4           8                       16                      24
//	+-------+------+------+------+-----------+-----------------------+-----------------------+
//	|version| kind |flags | rsvd |   tag     |     context (u64)     |    sequence (u64)     |
//	+-------+------+------+------+-----------+-----------------------+-----------------------+
//
// The source is the frame's sender, the destination its receiver and the
// length the payload's. The frame is what the bytes of the smallest
// messages travel in, and with shm a 24-byte header puts an 8-byte
// message in one cache line of the ring where 64 bytes needed two, which
// the receiving core misses one after the other. Frames the receiver
// must pass on (forwarded blocks and what they wrap) keep the long form.
const (
	headerVersion   = 1
	headerSize      = 64
	shortHeaderSize = 24
)

// shortWord is the first four bytes of every short header read as one
// little-endian word: the version, kind eager, no flags.
const shortWord = uint32(headerVersion) | uint32(kindEager)<<8

type kind uint8

const (
	kindEager kind = iota + 1 // envelope + whole payload
	kindRTS                   // rendezvous ready-to-send: envelope, no payload
	kindSys                   // system message; Tag (negative) selects the handler
)

func (k kind) String() string {
	switch k {
	case kindEager:
		return "eager"
	case kindRTS:
		return "rts"
	case kindSys:
		return "sys"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

const (
	flagSync uint8 = 1 << iota // synchronous send: the receiver acknowledges the match
	// flagCredit: a forwarded block that also returns credit for the line
	// the other way: every block below rreq arrived (credit.go).
	flagCredit
	// flagUrgent: a forwarded block whose source has half its window
	// unacknowledged and wants credit now rather than soon.
	flagUrgent
	knownFlags = flagSync | flagCredit | flagUrgent
)

// header is the decoded multidevice header.
type header struct {
	kind    kind
	flags   uint8
	tag     int32
	src     int32
	dst     int32
	context uint64
	seq     uint64
	length  uint64
	sreq    uint64
	rreq    uint64
	offset  uint64
}

var errBadHeader = errors.New("multidevice: malformed header")

func (h *header) put(b []byte) {
	_ = b[headerSize-1]
	b[0] = headerVersion
	b[1] = byte(h.kind)
	b[2] = h.flags
	b[3] = 0
	binary.LittleEndian.PutUint32(b[4:], uint32(h.tag))
	binary.LittleEndian.PutUint32(b[8:], uint32(h.src))
	binary.LittleEndian.PutUint32(b[12:], uint32(h.dst))
	binary.LittleEndian.PutUint64(b[16:], h.context)
	binary.LittleEndian.PutUint64(b[24:], h.seq)
	binary.LittleEndian.PutUint64(b[32:], h.length)
	binary.LittleEndian.PutUint64(b[40:], h.sreq)
	binary.LittleEndian.PutUint64(b[48:], h.rreq)
	binary.LittleEndian.PutUint64(b[56:], h.offset)
}

// putShort writes the short form of an eager header (see above) from its
// fields: senders have no header struct to fill first.
func putShort(b []byte, tag int32, context, seq uint64) {
	_ = b[shortHeaderSize-1]
	binary.LittleEndian.PutUint32(b, shortWord)
	binary.LittleEndian.PutUint32(b[4:], uint32(tag))
	binary.LittleEndian.PutUint64(b[8:], context)
	binary.LittleEndian.PutUint64(b[16:], seq)
}

// decodeShort parses and checks, into h, the short form of an eager header
// that rank from sent to rank self with plen payload bytes, in a job of
// size ranks. It fills h in place, which spares the copy of a returned
// struct on every small message; after an error h holds garbage. It never
// panics; every error wraps errBadHeader.
func (h *header) decodeShort(b []byte, from, self int32, size, plen int) error {
	// One test for every check on a message's path, the first four bytes
	// compared as one word; shortError says which check failed.
	if len(b) != shortHeaderSize || binary.LittleEndian.Uint32(b) != shortWord ||
		int32(binary.LittleEndian.Uint32(b[4:])) < 0 || uint(from) >= uint(size) || uint64(plen) > maxMessage {
		return shortError(b, from, size, plen)
	}
	// Field by field: a composite literal is built on the stack and then
	// copied in 16-byte moves that each wait for the narrower stores
	// before them (a store-forwarding stall), which showed up as a fifth
	// of this function's time.
	h.kind, h.flags = kindEager, 0
	h.tag, h.src, h.dst = int32(binary.LittleEndian.Uint32(b[4:])), from, self
	h.context = binary.LittleEndian.Uint64(b[8:])
	h.seq = binary.LittleEndian.Uint64(b[16:])
	h.length = uint64(plen)
	h.sreq, h.rreq, h.offset = 0, 0, 0
	return nil
}

// shortError explains why decodeShort refused b.
func shortError(b []byte, from int32, size, plen int) error {
	if len(b) != shortHeaderSize {
		return fmt.Errorf("%w: %d bytes, want %d", errBadHeader, len(b), shortHeaderSize)
	}
	switch tag := int32(binary.LittleEndian.Uint32(b[4:])); {
	case b[0] != headerVersion:
		return fmt.Errorf("%w: version %d, this build speaks %d", errBadHeader, b[0], headerVersion)
	case kind(b[1]) != kindEager:
		return fmt.Errorf("%w: short header of kind %d, only eager messages use it", errBadHeader, b[1])
	case b[2] != 0 || b[3] != 0:
		return fmt.Errorf("%w: unknown flags %#x/%#x in a short header", errBadHeader, b[2], b[3])
	case tag < 0:
		return fmt.Errorf("%w: eager message with reserved negative tag %d", errBadHeader, tag)
	case from < 0 || int(from) >= size:
		return fmt.Errorf("%w: source rank %d outside a job of %d", errBadHeader, from, size)
	default:
		return fmt.Errorf("%w: message length %d exceeds %d", errBadHeader, plen, uint64(maxMessage))
	}
}

// isData reports whether hb, a header this rank encoded or one checked
// already, is a rendezvous data frame's: a look at two fields where a
// whole decode would be wasted (every forwarded block asks).
func isData(hb []byte) bool {
	return len(hb) == headerSize && kind(hb[1]) == kindSys && int32(binary.LittleEndian.Uint32(hb[4:])) == sysData
}

// dataPlace returns the offset and message length of the data frame whose
// header is hb (isData).
func dataPlace(hb []byte) (offset, length uint64) {
	return binary.LittleEndian.Uint64(hb[56:]), binary.LittleEndian.Uint64(hb[32:])
}

// decodeHeader parses and checks a header for a job of size ranks. It never
// panics; every error wraps errBadHeader and says what was wrong.
func decodeHeader(b []byte, size int) (header, error) {
	if len(b) != headerSize {
		return header{}, fmt.Errorf("%w: %d bytes, want %d", errBadHeader, len(b), headerSize)
	}
	if b[0] != headerVersion {
		return header{}, fmt.Errorf("%w: version %d, this build speaks %d", errBadHeader, b[0], headerVersion)
	}
	h := header{
		kind:    kind(b[1]),
		flags:   b[2],
		tag:     int32(binary.LittleEndian.Uint32(b[4:])),
		src:     int32(binary.LittleEndian.Uint32(b[8:])),
		dst:     int32(binary.LittleEndian.Uint32(b[12:])),
		context: binary.LittleEndian.Uint64(b[16:]),
		seq:     binary.LittleEndian.Uint64(b[24:]),
		length:  binary.LittleEndian.Uint64(b[32:]),
		sreq:    binary.LittleEndian.Uint64(b[40:]),
		rreq:    binary.LittleEndian.Uint64(b[48:]),
		offset:  binary.LittleEndian.Uint64(b[56:]),
	}
	switch {
	case h.kind != kindEager && h.kind != kindRTS && h.kind != kindSys:
		return header{}, fmt.Errorf("%w: unknown kind %d", errBadHeader, b[1])
	case h.src < 0 || int(h.src) >= size:
		return header{}, fmt.Errorf("%w: source rank %d outside a job of %d", errBadHeader, h.src, size)
	case h.dst < 0 || int(h.dst) >= size:
		return header{}, fmt.Errorf("%w: destination rank %d outside a job of %d", errBadHeader, h.dst, size)
	case h.kind == kindSys && h.tag >= 0:
		return header{}, fmt.Errorf("%w: system message with non-negative tag %d", errBadHeader, h.tag)
	case h.kind != kindSys && h.tag < 0:
		return header{}, fmt.Errorf("%w: %v message with reserved negative tag %d", errBadHeader, h.kind, h.tag)
	case b[2]&^knownFlags != 0 || b[3] != 0:
		return header{}, fmt.Errorf("%w: unknown flags %#x/%#x", errBadHeader, b[2], b[3])
	case h.length > maxMessage:
		return header{}, fmt.Errorf("%w: message length %d exceeds %d", errBadHeader, h.length, uint64(maxMessage))
	}
	return h, nil
}

// maxMessage bounds one message so lengths from the wire never overflow int.
const maxMessage = 1 << 40
