package verbs

import (
	"errors"
	"fmt"
	"net/netip"
)

// Business card layout, version 1:
//
//	0        4      5                        5+n     7+n
//	+--------+------+------------------------+-------+
//	| "mdvb" | vers | address (n = 4 or 16)  | port  |
//	+--------+------+------------------------+-------+
//
// The address and port are the binary form of [netip.AddrPort] (address
// bytes in network order, then the port little-endian): the IP address and
// port the rank's connection manager listens on. A card is 11 bytes for
// IPv4 and 23 for IPv6. It carries no rank or job: the engine's private data
// on the connection request does that.
const (
	cardMagic   = "mdvb"
	cardVersion = 1
	cardHeader  = len(cardMagic) + 1
	cardLen4    = cardHeader + 4 + 2
	cardLen6    = cardHeader + 16 + 2
)

var errBadCard = errors.New("verbs: bad business card")

// formatCard encodes the listener's address. It refuses what parseCard
// would refuse, so every card it makes can be dialed.
func formatCard(ap netip.AddrPort) ([]byte, error) {
	if err := checkCardAddr(ap); err != nil {
		return nil, fmt.Errorf("verbs: business card for %v: %w", ap, err)
	}
	b := make([]byte, 0, cardLen6)
	b = append(b, cardMagic...)
	b = append(b, cardVersion)
	return ap.AppendBinary(b)
}

// parseCard decodes a peer's card. Every byte is checked: a card either
// names a dialable address or is refused with errBadCard.
func parseCard(b []byte) (netip.AddrPort, error) {
	if len(b) < cardHeader || string(b[:len(cardMagic)]) != cardMagic {
		return netip.AddrPort{}, fmt.Errorf("%w: not a verbs card", errBadCard)
	}
	if v := b[len(cardMagic)]; v != cardVersion {
		return netip.AddrPort{}, fmt.Errorf("%w: version %d, this build reads version %d", errBadCard, v, cardVersion)
	}
	if len(b) != cardLen4 && len(b) != cardLen6 {
		return netip.AddrPort{}, fmt.Errorf("%w: %d bytes, want %d (IPv4) or %d (IPv6)", errBadCard, len(b), cardLen4, cardLen6)
	}
	var ap netip.AddrPort
	if err := ap.UnmarshalBinary(b[cardHeader:]); err != nil {
		return netip.AddrPort{}, fmt.Errorf("%w: %w", errBadCard, err)
	}
	if err := checkCardAddr(ap); err != nil {
		return netip.AddrPort{}, fmt.Errorf("%w: %v: %w", errBadCard, ap, err)
	}
	return ap, nil
}

// checkCardAddr keeps cards canonical (IPv4 is never written as IPv4-mapped
// IPv6), which makes a parsed card format back to the same bytes.
func checkCardAddr(ap netip.AddrPort) error {
	a := ap.Addr()
	if !a.IsValid() {
		return errors.New("no address")
	}
	if a.Is4In6() {
		return errors.New("IPv4-mapped IPv6 address: write it as IPv4")
	}
	if ap.Port() == 0 {
		return errors.New("port 0")
	}
	return checkListenAddr(a)
}
