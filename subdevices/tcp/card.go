package tcp

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Business card layout, version 1. Integers are little-endian like
// [sdi.WireHeader].
//
//	0     4     5     6           10          18    20    21
//	+-----+-----+-----+-----------+-----------+-----+-----+----------+-----+-----------------+------------+
//	|"mdtc"|vers |  0  |   rank    |  job tag  |port |hlen | host     |naddr| naddr addresses | extensions |
//	+-----+-----+-----+-----------+-----------+-----+-----+----------+-----+-----------------+------------+
//
//	address:   family (4 or 6) | 4 or 16 address bytes | prefix length of its interface
//	extension: type (1 byte) | length (2 bytes) | value; decoders skip types they do not know
//
// The job tag is the first 8 bytes of SHA-256(job id): enough to refuse a
// card from another job with a clear message, without publishing the id.
// Prefix lengths travel now so a later peer-side address selection (which
// local interface matches which peer network) needs no new card version.
const (
	cardMagic           = "mdtc"
	cardVersion         = 1
	cardFixedLen        = 21 // up to and including the host length byte
	maxCardAddrs        = 64
	maxCardLen          = 4096
	maxCardHostLen      = 255
	familyIPv4     byte = 4
	familyIPv6     byte = 6
)

var errBadCard = errors.New("tcp: bad business card")

// card is the decoded business card of one rank.
type card struct {
	Rank   sdi.Rank
	JobTag [8]byte
	Port   uint16
	Host   string
	// Addrs are the listener's addresses, each with the prefix length of the
	// interface it sits on, in the order the owner lists them (loopback
	// first).
	Addrs []netip.Prefix
}

func jobTag(jobID string) [8]byte {
	sum := sha256.Sum256([]byte(jobID))
	return [8]byte(sum[:8])
}

// encode serializes c. It fails only on a card that could not be decoded
// again (too many addresses, a host name too long), which Open reports.
func (c card) encode() ([]byte, error) {
	if len(c.Host) > maxCardHostLen {
		return nil, fmt.Errorf("%w: host name is %d bytes, at most %d fit", errBadCard, len(c.Host), maxCardHostLen)
	}
	if len(c.Addrs) > maxCardAddrs {
		return nil, fmt.Errorf("%w: %d addresses, at most %d fit", errBadCard, len(c.Addrs), maxCardAddrs)
	}
	b := make([]byte, 0, cardFixedLen+len(c.Host)+1+len(c.Addrs)*18)
	b = append(b, cardMagic...)
	b = append(b, cardVersion, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(c.Rank))
	b = append(b, c.JobTag[:]...)
	b = binary.LittleEndian.AppendUint16(b, c.Port)
	b = append(b, byte(len(c.Host)))
	b = append(b, c.Host...)
	b = append(b, byte(len(c.Addrs)))
	for _, p := range c.Addrs {
		a := p.Addr()
		if !a.IsValid() || !p.IsValid() {
			return nil, fmt.Errorf("%w: invalid address %v", errBadCard, p)
		}
		if a.Is4() {
			b = append(b, familyIPv4)
		} else {
			b = append(b, familyIPv6)
		}
		b = append(b, a.AsSlice()...)
		b = append(b, byte(p.Bits()))
	}
	return b, nil
}

// decodeCard parses a business card. Every failure wraps errBadCard and
// names the offending field; it never panics and allocates at most what the
// (length-checked) input holds.
func decodeCard(b []byte) (card, error) {
	var c card
	if len(b) > maxCardLen {
		return c, fmt.Errorf("%w: %d bytes, at most %d", errBadCard, len(b), maxCardLen)
	}
	if len(b) < cardFixedLen {
		return c, fmt.Errorf("%w: %d bytes, shorter than the %d-byte fixed part", errBadCard, len(b), cardFixedLen)
	}
	if string(b[:4]) != cardMagic {
		return c, fmt.Errorf("%w: magic %q, want %q (not a tcp card?)", errBadCard, b[:4], cardMagic)
	}
	if b[4] != cardVersion {
		return c, fmt.Errorf("%w: version %d, this build reads %d", errBadCard, b[4], cardVersion)
	}
	if b[5] != 0 {
		return c, fmt.Errorf("%w: reserved byte is %#x, want 0", errBadCard, b[5])
	}
	c.Rank = sdi.Rank(binary.LittleEndian.Uint32(b[6:]))
	copy(c.JobTag[:], b[10:18])
	c.Port = binary.LittleEndian.Uint16(b[18:])
	if c.Port == 0 {
		return c, fmt.Errorf("%w: port 0", errBadCard)
	}
	rest := b[cardFixedLen:]
	hl := int(b[cardFixedLen-1])
	if len(rest) < hl+1 {
		return c, fmt.Errorf("%w: host name of %d bytes runs past the end", errBadCard, hl)
	}
	c.Host = string(rest[:hl])
	n := int(rest[hl])
	rest = rest[hl+1:]
	if n > maxCardAddrs {
		return c, fmt.Errorf("%w: %d addresses, at most %d", errBadCard, n, maxCardAddrs)
	}
	c.Addrs = make([]netip.Prefix, 0, n)
	for i := range n {
		if len(rest) < 1 {
			return c, fmt.Errorf("%w: address %d missing", errBadCard, i)
		}
		var alen, maxBits int
		switch rest[0] {
		case familyIPv4:
			alen, maxBits = 4, 32
		case familyIPv6:
			alen, maxBits = 16, 128
		default:
			return c, fmt.Errorf("%w: address %d has family %d, want 4 or 6", errBadCard, i, rest[0])
		}
		if len(rest) < 1+alen+1 {
			return c, fmt.Errorf("%w: address %d truncated", errBadCard, i)
		}
		a, _ := netip.AddrFromSlice(rest[1 : 1+alen])
		bits := int(rest[1+alen])
		if bits > maxBits {
			return c, fmt.Errorf("%w: address %d (%v) has prefix length %d, at most %d", errBadCard, i, a, bits, maxBits)
		}
		c.Addrs = append(c.Addrs, netip.PrefixFrom(a, bits))
		rest = rest[1+alen+1:]
	}
	for len(rest) > 0 {
		if len(rest) < 3 {
			return c, fmt.Errorf("%w: truncated extension header", errBadCard)
		}
		l := int(binary.LittleEndian.Uint16(rest[1:]))
		if len(rest) < 3+l {
			return c, fmt.Errorf("%w: extension type %d of %d bytes runs past the end", errBadCard, rest[0], l)
		}
		rest = rest[3+l:]
	}
	return c, nil
}

// dialOrder returns the addresses a rank on localHost should try, in order.
// A peer on the same host is reached over loopback first, since that path
// never leaves the kernel; a peer on another host skips loopback, which would
// only reach a process on this host. When either host name is unknown both
// kinds are tried, loopback first: the handshake proves who answered.
func (c card) dialOrder(localHost string) []netip.AddrPort {
	sameHost := localHost == "" || c.Host == "" || localHost == c.Host
	var loop, other []netip.AddrPort
	for _, p := range c.Addrs {
		ap := netip.AddrPortFrom(p.Addr(), c.Port)
		if p.Addr().IsLoopback() {
			if sameHost {
				loop = append(loop, ap)
			}
			continue
		}
		other = append(other, ap)
	}
	return slices.Concat(loop, other)
}
