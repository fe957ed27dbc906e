package tcp

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/subdevices/tcp/addrsel"
)

// Business card layout, version 2. Integers are little-endian like
// [sdi.WireHeader].
//
//	0     4     5     6           10          18    20    21
//	+-----+-----+-----+-----------+-----------+-----+-----+----------+------+------------------+------------+
//	|"mdtc"|vers |  0  |   rank    |  job tag  |port |hlen | host     |nifs  | nifs interfaces  | extensions |
//	+-----+-----+-----+-----------+-----------+-----+-----+----------+------+------------------+------------+
//
//	interface: name length (1..64) | name | link speed in Mbit/s (4 bytes, 0 unknown) | naddr | naddr addresses
//	address:   family (4 or 6) | 4 or 16 address bytes | prefix length
//	extension: type (1 byte) | length (2 bytes) | value; decoders skip types they do not know
//	site:      extension type 1, at most once, when the launcher names one; value: the site name (1..255 bytes)
//
// The job tag is the first 8 bytes of SHA-256(job id): enough to refuse a
// card from another job with a clear message, without publishing the id.
// An address's scope (loopback, link-local, private, public) follows from
// the address itself, so the card does not repeat it. Interfaces are those
// that are up; loopback is listed like the others and used only between
// ranks on one host (see package addrsel). The site travels as an
// extension rather than a new version so that cards with and without one
// stay readable both ways: a reader older than sites sees the site-less card
// it always did.
const (
	cardMagic            = "mdtc"
	cardVersion          = 2
	cardFixedLen         = 21 // up to and including the host length byte
	maxCardIfaces        = 64
	maxCardAddrs         = 64 // over all interfaces
	maxIfaceNameLen      = 64
	maxCardLen           = 8192
	maxCardHostLen       = 255
	maxCardSiteLen       = 255
	cardExtSite     byte = 1
	familyIPv4      byte = 4
	familyIPv6      byte = 6
)

var errBadCard = errors.New("tcp: bad business card")

// card is the decoded business card of one rank.
type card struct {
	Rank   sdi.Rank
	JobTag [8]byte
	Port   uint16
	Host   string
	Site   string // [sdi.OpenParams.Site]; "" when the launcher names none
	// Ifaces are the interfaces the listener can be reached on, in the
	// owner's order, each with the addresses it publishes.
	Ifaces []cardIface
}

// cardIface is one interface on a card.
type cardIface struct {
	Name  string
	Speed uint32         // Mbit/s from /sys/class/net/<name>/speed; 0 unknown
	Addrs []netip.Prefix // each address with its interface's prefix length
}

func (c card) numAddrs() int {
	n := 0
	for _, f := range c.Ifaces {
		n += len(f.Addrs)
	}
	return n
}

// endpoint is the card as address selection sees it. A card without a
// host name (a launcher that does not say) is identified by its addresses,
// which ranks on one host publish alike.
func (c card) endpoint() addrsel.Endpoint {
	ep := addrsel.Endpoint{Host: c.Host, Site: c.Site, Ifaces: make([]addrsel.Interface, len(c.Ifaces))}
	var addrs []string
	for i, f := range c.Ifaces {
		ep.Ifaces[i] = addrsel.Interface{Name: f.Name, Addrs: f.Addrs, Speed: f.Speed}
		for _, p := range f.Addrs {
			if !p.Addr().IsLoopback() {
				addrs = append(addrs, p.String())
			}
		}
	}
	if ep.Host == "" {
		slices.Sort(addrs)
		ep.Host = "addresses:" + strings.Join(addrs, ",")
	}
	return ep
}

func jobTag(jobID string) [8]byte {
	sum := sha256.Sum256([]byte(jobID))
	return [8]byte(sum[:8])
}

// encode serializes c. It fails only on a card that could not be decoded
// again (too many interfaces or addresses, a name too long), which Open
// reports.
func (c card) encode() ([]byte, error) {
	if len(c.Host) > maxCardHostLen {
		return nil, fmt.Errorf("%w: host name is %d bytes, at most %d fit", errBadCard, len(c.Host), maxCardHostLen)
	}
	if len(c.Site) > maxCardSiteLen {
		return nil, fmt.Errorf("%w: site name is %d bytes, at most %d fit", errBadCard, len(c.Site), maxCardSiteLen)
	}
	if len(c.Ifaces) > maxCardIfaces {
		return nil, fmt.Errorf("%w: %d interfaces, at most %d fit", errBadCard, len(c.Ifaces), maxCardIfaces)
	}
	if n := c.numAddrs(); n > maxCardAddrs {
		return nil, fmt.Errorf("%w: %d addresses, at most %d fit", errBadCard, n, maxCardAddrs)
	}
	b := make([]byte, 0, cardFixedLen+len(c.Host)+1+len(c.Ifaces)*24+c.numAddrs()*18+3+len(c.Site))
	b = append(b, cardMagic...)
	b = append(b, cardVersion, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(c.Rank))
	b = append(b, c.JobTag[:]...)
	b = binary.LittleEndian.AppendUint16(b, c.Port)
	b = append(b, byte(len(c.Host)))
	b = append(b, c.Host...)
	b = append(b, byte(len(c.Ifaces)))
	for i, f := range c.Ifaces {
		if len(f.Name) == 0 || len(f.Name) > maxIfaceNameLen {
			return nil, fmt.Errorf("%w: interface %d name %q must be 1 to %d bytes", errBadCard, i, f.Name, maxIfaceNameLen)
		}
		b = append(b, byte(len(f.Name)))
		b = append(b, f.Name...)
		b = binary.LittleEndian.AppendUint32(b, f.Speed)
		b = append(b, byte(len(f.Addrs)))
		for _, p := range f.Addrs {
			a := p.Addr()
			if !a.IsValid() || !p.IsValid() || a.Zone() != "" || a.Is4In6() {
				return nil, fmt.Errorf("%w: interface %s: invalid address %v", errBadCard, f.Name, p)
			}
			if a.Is4() {
				b = append(b, familyIPv4)
			} else {
				b = append(b, familyIPv6)
			}
			b = append(b, a.AsSlice()...)
			b = append(b, byte(p.Bits()))
		}
	}
	if c.Site != "" {
		b = append(b, cardExtSite)
		b = binary.LittleEndian.AppendUint16(b, uint16(len(c.Site)))
		b = append(b, c.Site...)
	}
	return b, nil
}

// decodeCard parses a business card. Every failure wraps errBadCard and
// names the offending field and its byte offset; it never panics and
// allocates at most what the (length-checked) input holds.
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
		return c, fmt.Errorf("%w: version %d, this build reads %d (ranks built from different versions?)", errBadCard, b[4], cardVersion)
	}
	if b[5] != 0 {
		return c, fmt.Errorf("%w: reserved byte 5 is %#x, want 0", errBadCard, b[5])
	}
	c.Rank = sdi.Rank(binary.LittleEndian.Uint32(b[6:]))
	copy(c.JobTag[:], b[10:18])
	c.Port = binary.LittleEndian.Uint16(b[18:])
	if c.Port == 0 {
		return c, fmt.Errorf("%w: port 0 at byte 18", errBadCard)
	}
	d := cardDecoder{b: b, off: cardFixedLen}
	hl := int(b[cardFixedLen-1])
	host, ok := d.take(hl)
	if !ok {
		return c, fmt.Errorf("%w: host name of %d bytes at byte %d runs past the end (%d bytes)", errBadCard, hl, cardFixedLen, len(b))
	}
	c.Host = string(host)
	nif, ok := d.byte()
	if !ok {
		return c, fmt.Errorf("%w: interface count missing at byte %d", errBadCard, d.off)
	}
	if int(nif) > maxCardIfaces {
		return c, fmt.Errorf("%w: %d interfaces at byte %d, at most %d", errBadCard, nif, d.off-1, maxCardIfaces)
	}
	c.Ifaces = make([]cardIface, 0, nif)
	naddrs := 0
	for i := range int(nif) {
		f, err := d.iface(i, &naddrs)
		if err != nil {
			return c, err
		}
		for _, g := range c.Ifaces {
			if g.Name == f.Name {
				return c, fmt.Errorf("%w: interface %d: name %q listed twice", errBadCard, i, f.Name)
			}
		}
		c.Ifaces = append(c.Ifaces, f)
	}
	for d.off < len(b) {
		start := d.off
		hdr, ok := d.take(3)
		if !ok {
			return c, fmt.Errorf("%w: truncated extension header at byte %d", errBadCard, start)
		}
		l := int(binary.LittleEndian.Uint16(hdr[1:]))
		v, ok := d.take(l)
		if !ok {
			return c, fmt.Errorf("%w: extension type %d of %d bytes at byte %d runs past the end", errBadCard, hdr[0], l, start)
		}
		if hdr[0] != cardExtSite {
			continue
		}
		switch {
		case c.Site != "":
			return c, fmt.Errorf("%w: second site extension at byte %d", errBadCard, start)
		case l == 0 || l > maxCardSiteLen:
			return c, fmt.Errorf("%w: site extension at byte %d: name length %d, want 1 to %d", errBadCard, start, l, maxCardSiteLen)
		}
		c.Site = string(v)
	}
	return c, nil
}

// cardDecoder walks a card's variable part.
type cardDecoder struct {
	b   []byte
	off int
}

func (d *cardDecoder) take(n int) ([]byte, bool) {
	if n > len(d.b)-d.off {
		return nil, false
	}
	s := d.b[d.off : d.off+n]
	d.off += n
	return s, true
}

func (d *cardDecoder) byte() (byte, bool) {
	s, ok := d.take(1)
	if !ok {
		return 0, false
	}
	return s[0], true
}

// iface decodes interface i; naddrs counts addresses over the whole card.
func (d *cardDecoder) iface(i int, naddrs *int) (cardIface, error) {
	var f cardIface
	start := d.off
	nl, ok := d.byte()
	if !ok {
		return f, fmt.Errorf("%w: interface %d missing at byte %d", errBadCard, i, start)
	}
	if nl == 0 || int(nl) > maxIfaceNameLen {
		return f, fmt.Errorf("%w: interface %d at byte %d: name length %d, want 1 to %d", errBadCard, i, start, nl, maxIfaceNameLen)
	}
	name, ok := d.take(int(nl))
	if !ok {
		return f, fmt.Errorf("%w: interface %d at byte %d: name of %d bytes runs past the end", errBadCard, i, start, nl)
	}
	f.Name = string(name)
	sp, ok := d.take(4)
	if !ok {
		return f, fmt.Errorf("%w: interface %d (%s): link speed truncated at byte %d", errBadCard, i, f.Name, d.off)
	}
	f.Speed = binary.LittleEndian.Uint32(sp)
	n, ok := d.byte()
	if !ok {
		return f, fmt.Errorf("%w: interface %d (%s): address count missing at byte %d", errBadCard, i, f.Name, d.off)
	}
	*naddrs += int(n)
	if *naddrs > maxCardAddrs {
		return f, fmt.Errorf("%w: interface %d (%s): %d addresses in all, at most %d", errBadCard, i, f.Name, *naddrs, maxCardAddrs)
	}
	f.Addrs = make([]netip.Prefix, 0, n)
	for k := range int(n) {
		at := d.off
		fam, ok := d.byte()
		if !ok {
			return f, fmt.Errorf("%w: interface %d (%s): address %d missing at byte %d", errBadCard, i, f.Name, k, at)
		}
		var alen, maxBits int
		switch fam {
		case familyIPv4:
			alen, maxBits = 4, 32
		case familyIPv6:
			alen, maxBits = 16, 128
		default:
			return f, fmt.Errorf("%w: interface %d (%s): address %d at byte %d has family %d, want 4 or 6", errBadCard, i, f.Name, k, at, fam)
		}
		raw, ok := d.take(alen + 1)
		if !ok {
			return f, fmt.Errorf("%w: interface %d (%s): address %d at byte %d truncated", errBadCard, i, f.Name, k, at)
		}
		a, _ := netip.AddrFromSlice(raw[:alen])
		bits := int(raw[alen])
		if bits > maxBits {
			return f, fmt.Errorf("%w: interface %d (%s): address %d (%v) at byte %d has prefix length %d, at most %d", errBadCard, i, f.Name, k, a, at, bits, maxBits)
		}
		if a.IsUnspecified() || a.IsMulticast() || a.Is4In6() {
			return f, fmt.Errorf("%w: interface %d (%s): address %d at byte %d is %v, not a unicast address", errBadCard, i, f.Name, k, at, a)
		}
		f.Addrs = append(f.Addrs, netip.PrefixFrom(a, bits))
	}
	return f, nil
}
