package rdma

import (
	"encoding/binary"
	"fmt"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Every message the engine sends fills one receive slot and starts with an
// 8-byte header:
//
//	0  kind      1 byte
//	1  ctlBack   1 byte   control slots the sender reposted since it last said
//	2  credits   2 bytes  data slots the sender reposted since it last said
//	4  hdrLen    2 bytes  the SDI frame header that follows (eager, rts)
//	6  zero      2 bytes
//
// then, by kind:
//
//	eager   the frame's header, then its payload (the rest of the message)
//	rts     token 8, addr 8, rkey 4, zero 4, len 8; then the frame's header:
//	        the payload waits in the sender's region for the peer to read
//	fin     token 8: the read of that rts is done, the region may go
//	credit  nothing: the header's counts are the message
//	bye     nothing: the sender closes this connection; no failure follows.
//	        It comes after the fins of every frame the sender delivered,
//	        so a frame with no fin by then was not, and fails
//
// All integers are little-endian.
const (
	kindEager uint8 = iota + 1
	kindRTS
	kindFIN
	kindCredit
	kindBye

	baseLen = 8
	rtsLen  = 32
	finLen  = 8

	// MaxHeader is the largest SDI frame header the engine carries.
	MaxHeader = 128
)

type wireHeader struct {
	kind    uint8
	ctlBack uint8
	credits uint16
	hdrLen  uint16
}

type rts struct {
	token uint64
	addr  uint64
	rkey  uint32
	n     uint64
}

func putBase(b []byte, h wireHeader) {
	b[0] = h.kind
	b[1] = h.ctlBack
	binary.LittleEndian.PutUint16(b[2:], h.credits)
	binary.LittleEndian.PutUint16(b[4:], h.hdrLen)
	b[6], b[7] = 0, 0
}

func putRTS(b []byte, r rts) {
	binary.LittleEndian.PutUint64(b[0:], r.token)
	binary.LittleEndian.PutUint64(b[8:], r.addr)
	binary.LittleEndian.PutUint32(b[16:], r.rkey)
	binary.LittleEndian.PutUint32(b[20:], 0)
	binary.LittleEndian.PutUint64(b[24:], r.n)
}

// message is one decoded arrival. header and payload alias the slot.
type message struct {
	wireHeader
	rts     rts    // kindRTS
	token   uint64 // kindFIN
	header  []byte // kindEager, kindRTS
	payload []byte // kindEager
}

// decode checks one arrival of a peer against the limits both ends agreed
// on: eager payloads up to eager bytes, read payloads up to maxFrame.
func decode(b []byte, eager, maxFrame int) (message, error) {
	var m message
	if len(b) < baseLen {
		return m, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", sdi.ErrBadFrame, len(b), baseLen)
	}
	m.kind, m.ctlBack = b[0], b[1]
	m.credits = binary.LittleEndian.Uint16(b[2:])
	m.hdrLen = binary.LittleEndian.Uint16(b[4:])
	if b[6] != 0 || b[7] != 0 {
		return m, fmt.Errorf("%w: reserved header bytes %#x %#x are not zero", sdi.ErrBadFrame, b[6], b[7])
	}
	if m.ctlBack > ctlSlots {
		return m, fmt.Errorf("%w: %d control slots returned, there are %d", sdi.ErrBadFrame, m.ctlBack, ctlSlots)
	}
	rest := b[baseLen:]
	switch m.kind {
	case kindEager:
		if int(m.hdrLen) > len(rest) || m.hdrLen > MaxHeader {
			return m, fmt.Errorf("%w: eager frame: header of %d bytes in %d (at most %d)", sdi.ErrBadFrame, m.hdrLen, len(rest), MaxHeader)
		}
		m.header, m.payload = rest[:m.hdrLen], rest[m.hdrLen:]
		if len(m.payload) > eager {
			return m, fmt.Errorf("%w: eager frame: payload of %d bytes, at most %d", sdi.ErrBadFrame, len(m.payload), eager)
		}
	case kindRTS:
		if len(rest) != rtsLen+int(m.hdrLen) || m.hdrLen > MaxHeader {
			return m, fmt.Errorf("%w: rts: %d bytes for a header of %d", sdi.ErrBadFrame, len(rest), m.hdrLen)
		}
		m.rts = rts{
			token: binary.LittleEndian.Uint64(rest[0:]),
			addr:  binary.LittleEndian.Uint64(rest[8:]),
			rkey:  binary.LittleEndian.Uint32(rest[16:]),
			n:     binary.LittleEndian.Uint64(rest[24:]),
		}
		if binary.LittleEndian.Uint32(rest[20:]) != 0 {
			return m, fmt.Errorf("%w: rts: reserved bytes are not zero", sdi.ErrBadFrame)
		}
		if m.rts.n <= uint64(eager) || m.rts.n > uint64(maxFrame) {
			return m, fmt.Errorf("%w: rts: payload of %d bytes, must be in (%d, %d]", sdi.ErrBadFrame, m.rts.n, eager, maxFrame)
		}
		if m.rts.addr+m.rts.n < m.rts.addr {
			return m, fmt.Errorf("%w: rts: region at %#x of %d bytes wraps", sdi.ErrBadFrame, m.rts.addr, m.rts.n)
		}
		m.header = rest[rtsLen:]
	case kindFIN:
		if len(rest) != finLen || m.hdrLen != 0 {
			return m, fmt.Errorf("%w: fin of %d bytes with a header of %d", sdi.ErrBadFrame, len(rest), m.hdrLen)
		}
		m.token = binary.LittleEndian.Uint64(rest)
	case kindCredit, kindBye:
		if len(rest) != 0 || m.hdrLen != 0 {
			return m, fmt.Errorf("%w: %s of %d bytes", sdi.ErrBadFrame, kindName(m.kind), len(b))
		}
	default:
		return m, fmt.Errorf("%w: unknown kind %d", sdi.ErrBadFrame, m.kind)
	}
	return m, nil
}

func kindName(k uint8) string {
	switch k {
	case kindEager:
		return "eager"
	case kindRTS:
		return "rts"
	case kindFIN:
		return "fin"
	case kindCredit:
		return "credit"
	case kindBye:
		return "bye"
	}
	return fmt.Sprintf("kind %d", k)
}
