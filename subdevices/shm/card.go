package shm

import (
	"encoding/binary"
	"fmt"

	"github.com/hpc-multidevice/multidevice/internal/shmem"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// Business card encoding, version 1. Integers are little-endian:
//
//	"MDSC" | version u8 | reserved u8 (0) | rank i32 |
//	host len u16 | host | job len u16 | job | segment len u16 | segment
//
// Nothing may follow the segment name.
const (
	cardMagic   = "MDSC"
	cardVersion = 1
	maxHostLen  = 255
	maxJobLen   = 1024
)

// card is what a rank publishes so that peers can map its segment.
type card struct {
	Host    string
	JobID   string
	Rank    sdi.Rank
	Segment string
}

// encode returns the card's bytes, or an error when a field is too long to
// encode.
func (c card) encode() ([]byte, error) {
	switch {
	case len(c.Host) > maxHostLen:
		return nil, fmt.Errorf("shm: host name of %d bytes exceeds %d", len(c.Host), maxHostLen)
	case len(c.JobID) > maxJobLen:
		return nil, fmt.Errorf("shm: job id of %d bytes exceeds %d", len(c.JobID), maxJobLen)
	}
	if err := shmem.ValidName(c.Segment); err != nil {
		return nil, fmt.Errorf("shm: card: %w", err)
	}
	b := make([]byte, 0, 16+len(c.Host)+len(c.JobID)+len(c.Segment))
	b = append(b, cardMagic...)
	b = append(b, cardVersion, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(c.Rank))
	for _, s := range []string{c.Host, c.JobID, c.Segment} {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
		b = append(b, s...)
	}
	return b, nil
}

// decodeCard parses a business card. It never panics; every error says what
// was wrong.
func decodeCard(b []byte) (card, error) {
	if len(b) < 10 {
		return card{}, fmt.Errorf("card of %d bytes is shorter than its 10-byte prefix", len(b))
	}
	if string(b[:4]) != cardMagic {
		return card{}, fmt.Errorf("card has magic %q, want %q (not an shm card)", b[:4], cardMagic)
	}
	if b[4] != cardVersion {
		return card{}, fmt.Errorf("card version %d, this build speaks %d", b[4], cardVersion)
	}
	if b[5] != 0 {
		return card{}, fmt.Errorf("card reserved byte is %#x, want 0", b[5])
	}
	c := card{Rank: sdi.Rank(int32(binary.LittleEndian.Uint32(b[6:])))}
	if c.Rank < 0 {
		return card{}, fmt.Errorf("card has negative rank %d", c.Rank)
	}
	rest := b[10:]
	fields := []struct {
		name string
		max  int
		dst  *string
	}{
		{"host", maxHostLen, &c.Host},
		{"job id", maxJobLen, &c.JobID},
		{"segment name", shmem.MaxNameLen, &c.Segment},
	}
	for _, f := range fields {
		if len(rest) < 2 {
			return card{}, fmt.Errorf("card truncated before the %s length", f.name)
		}
		n := int(binary.LittleEndian.Uint16(rest))
		rest = rest[2:]
		if n > f.max || n > len(rest) {
			return card{}, fmt.Errorf("card %s length %d exceeds limit %d or the %d bytes left", f.name, n, f.max, len(rest))
		}
		*f.dst = string(rest[:n])
		rest = rest[n:]
	}
	if len(rest) != 0 {
		return card{}, fmt.Errorf("card has %d trailing bytes", len(rest))
	}
	if err := shmem.ValidName(c.Segment); err != nil {
		return card{}, fmt.Errorf("card: %w", err)
	}
	return c, nil
}
