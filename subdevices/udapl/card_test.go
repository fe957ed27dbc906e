package udapl

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestCardRoundTrip(t *testing.T) {
	for _, s := range []string{"192.168.10.7:47000", "10.0.0.1:1", "[fe80::1]:65535", "[2001:db8::42]:47001", "[::ffff:10.1.2.3]:5000"} {
		ap := netip.MustParseAddrPort(s)
		card := encodeCard(ap)
		if card[0] != cardMagic || card[1] != cardVersion {
			t.Fatalf("card of %v starts % x, want magic and version", ap, card[:2])
		}
		got, err := parseCard(card)
		if err != nil {
			t.Fatalf("parseCard(encodeCard(%v)): %v", ap, err)
		}
		if got != ap {
			t.Fatalf("parseCard(encodeCard(%v)) = %v", ap, got)
		}
	}
}

func TestCardLength(t *testing.T) {
	if n := len(encodeCard(netip.MustParseAddrPort("10.0.0.1:47000"))); n != 8 {
		t.Fatalf("IPv4 card is %d bytes, want 8", n)
	}
	if n := len(encodeCard(netip.MustParseAddrPort("[2001:db8::1]:47000"))); n != 20 {
		t.Fatalf("IPv6 card is %d bytes, want 20", n)
	}
}

func TestParseCardRejects(t *testing.T) {
	good := encodeCard(netip.MustParseAddrPort("10.0.0.1:47000"))
	with := func(i int, b byte) []byte {
		c := bytes.Clone(good)
		c[i] = b
		return c
	}
	tests := []struct {
		name string
		card []byte
		want string
	}{
		{"nil", nil, "without the uDAPL magic"},
		{"magic only", []byte{cardMagic}, "without the uDAPL magic"},
		{"tcp card", []byte("mdtc\x02\x00"), "without the uDAPL magic"},
		{"version", with(1, 2), "version 2"},
		{"no address", []byte{cardMagic, cardVersion}, "0 address bytes"},
		{"short", good[:len(good)-1], "5 address bytes"},
		{"long", append(bytes.Clone(good), 0), "7 address bytes"},
		{"ipv6 with zone", append(append([]byte{cardMagic, cardVersion}, netip.MustParseAddr("fe80::1").AsSlice()...), 'e', 't', 'h', '0', 1, 0), "22 address bytes"},
		{"qualifier 0", append(good[:6:6], 0, 0), "qualifier 0"},
		{"unspecified", encodeCard(netip.MustParseAddrPort("0.0.0.0:47000")), "cannot be dialed"},
		{"multicast", encodeCard(netip.MustParseAddrPort("[ff02::1]:47000")), "cannot be dialed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ap, err := parseCard(tt.card)
			if err == nil {
				t.Fatalf("parseCard(% x) = %v, want an error", tt.card, ap)
			}
			if !errors.Is(err, errBadCard) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("parseCard(% x) error %q, want errBadCard saying %q", tt.card, err, tt.want)
			}
		})
	}
}

// FuzzParseCard checks that parseCard never panics and that whatever it
// accepts is canonical: encoding the result gives the same bytes back.
func FuzzParseCard(f *testing.F) {
	f.Add(encodeCard(netip.MustParseAddrPort("10.0.0.1:47000")))
	f.Add(encodeCard(netip.MustParseAddrPort("[2001:db8::1]:47000")))
	f.Add([]byte{cardMagic, cardVersion})
	f.Add([]byte{cardMagic, cardVersion, 10, 0, 0, 1, 0, 0})
	f.Add([]byte("mdtc"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ap, err := parseCard(b)
		if err != nil {
			if !errors.Is(err, errBadCard) {
				t.Fatalf("parseCard(% x): error %v does not wrap errBadCard", b, err)
			}
			return
		}
		if again := encodeCard(ap); !bytes.Equal(again, b) {
			t.Fatalf("parseCard(% x) = %v, which encodes as % x", b, ap, again)
		}
		if ap.Port() == 0 || !ap.Addr().IsValid() || ap.Addr().Zone() != "" {
			t.Fatalf("parseCard(% x) accepted %v", b, ap)
		}
	})
}
