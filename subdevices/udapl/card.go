package udapl

import (
	"errors"
	"fmt"
	"net/netip"
)

// Business card layout, version 1:
//
//	0      1         2                       2+4 or 2+16   +2
//	+------+---------+-----------------------+-------------+
//	| 0xDA | version | IA address (4 or 16)  | qualifier   |
//	+------+---------+-----------------------+-------------+
//
// After the two header bytes comes netip.AddrPort's binary form: the IA
// address that dat_ia_query reports (IPv4 or IPv6, without zone) and the
// PSP's connection qualifier, little-endian. A peer dials that address and
// qualifier with dat_ep_connect. The format is canonical: a card parses
// only if encoding the result gives the same bytes back, which
// FuzzParseCard checks.
const (
	cardMagic   byte = 0xDA
	cardVersion byte = 1
)

var errBadCard = errors.New("udapl: bad business card")

// encodeCard returns the card for a listener at ap.
func encodeCard(ap netip.AddrPort) []byte {
	b := []byte{cardMagic, cardVersion}
	b, _ = ap.AppendBinary(b) // AppendBinary never fails
	return b
}

// parseCard decodes and validates a card. It never panics, whatever b holds.
func parseCard(b []byte) (netip.AddrPort, error) {
	if len(b) < 2 || b[0] != cardMagic {
		return netip.AddrPort{}, fmt.Errorf("%w: %d bytes without the uDAPL magic (is it another subdevice's card?)", errBadCard, len(b))
	}
	if b[1] != cardVersion {
		return netip.AddrPort{}, fmt.Errorf("%w: version %d, this build reads version %d", errBadCard, b[1], cardVersion)
	}
	body := b[2:]
	// netip accepts a zone after an IPv6 address and an empty address; a
	// card carries neither, so only the two exact lengths are read.
	if n := len(body); n != 4+2 && n != 16+2 {
		return netip.AddrPort{}, fmt.Errorf("%w: %d address bytes, want 6 (IPv4) or 18 (IPv6)", errBadCard, n)
	}
	var ap netip.AddrPort
	if err := ap.UnmarshalBinary(body); err != nil {
		return netip.AddrPort{}, fmt.Errorf("%w: %w", errBadCard, err)
	}
	if ap.Port() == 0 {
		return netip.AddrPort{}, fmt.Errorf("%w: connection qualifier 0", errBadCard)
	}
	if ap.Addr().IsUnspecified() || ap.Addr().IsMulticast() {
		return netip.AddrPort{}, fmt.Errorf("%w: address %v cannot be dialed", errBadCard, ap.Addr())
	}
	return ap, nil
}
