package verbs

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func mustCard(t testing.TB, s string) []byte {
	t.Helper()
	b, err := formatCard(netip.MustParseAddrPort(s))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCardRoundTrip(t *testing.T) {
	for _, s := range []string{"10.1.0.7:47000", "192.168.1.1:1", "[fd00::7]:65535", "[2001:db8::1]:4791"} {
		b := mustCard(t, s)
		ap, err := parseCard(b)
		if err != nil || ap != netip.MustParseAddrPort(s) {
			t.Fatalf("parseCard(formatCard(%s)) = %v, %v", s, ap, err)
		}
	}
	if n := len(mustCard(t, "10.1.0.7:47000")); n != cardLen4 {
		t.Errorf("IPv4 card is %d bytes, want %d", n, cardLen4)
	}
	if n := len(mustCard(t, "[fd00::7]:47000")); n != cardLen6 {
		t.Errorf("IPv6 card is %d bytes, want %d", n, cardLen6)
	}
}

// TestCardLayout pins the wire format: peers built from other versions of
// this package read these bytes.
func TestCardLayout(t *testing.T) {
	got := mustCard(t, "10.1.0.7:4791")
	want := []byte{'m', 'd', 'v', 'b', 1, 10, 1, 0, 7, 0xb7, 0x12}
	if !bytes.Equal(got, want) {
		t.Fatalf("card = % x, want % x", got, want)
	}
}

func TestFormatCardRefuses(t *testing.T) {
	for _, ap := range []netip.AddrPort{
		{},
		netip.MustParseAddrPort("10.0.0.1:0"),
		netip.MustParseAddrPort("0.0.0.0:1"),
		netip.MustParseAddrPort("[::ffff:10.0.0.1]:1"),
		netip.MustParseAddrPort("[fe80::1%ib0]:1"),
		netip.MustParseAddrPort("[ff02::1]:1"),
	} {
		if b, err := formatCard(ap); err == nil {
			t.Errorf("formatCard(%v) = % x, want an error", ap, b)
		}
	}
}

func TestParseCardRefuses(t *testing.T) {
	good := mustCard(t, "10.1.0.7:47000")
	tests := []struct {
		name string
		card []byte
		want string
	}{
		{"empty", nil, "not a verbs card"},
		{"short", []byte("mdv"), "not a verbs card"},
		{"tcp card", []byte("mdtc\x02rest"), "not a verbs card"},
		{"newer version", append([]byte("mdvb\x02"), good[5:]...), "version 2"},
		{"truncated", good[:len(good)-1], "10 bytes"},
		{"trailing byte", append(append([]byte(nil), good...), 0), "12 bytes"},
		{"header only", []byte("mdvb\x01"), "5 bytes"},
		{"port zero", append([]byte("mdvb\x01"), 10, 1, 0, 7, 0, 0), "port 0"},
		{"unspecified", append([]byte("mdvb\x01"), 0, 0, 0, 0, 1, 0), "unspecified"},
		{"mapped v4", append(append([]byte("mdvb\x01"), netip.MustParseAddr("::ffff:10.0.0.1").AsSlice()...), 1, 0), "IPv4-mapped"},
		{"multicast", append(append([]byte("mdvb\x01"), netip.MustParseAddr("ff02::1").AsSlice()...), 1, 0), "multicast"},
		{"link-local v6", append(append([]byte("mdvb\x01"), netip.MustParseAddr("fe80::1").AsSlice()...), 1, 0), "link-local"},
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
// accepts is canonical and dialable: formatting the result gives the same
// bytes back.
func FuzzParseCard(f *testing.F) {
	f.Add(mustCard(f, "10.1.0.7:47000"))
	f.Add(mustCard(f, "[fd00::7]:47000"))
	f.Add([]byte("mdvb\x01"))
	f.Add([]byte("mdvb\x01\x0a\x00\x00\x01\x00\x00"))
	f.Add([]byte("mdtc"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ap, err := parseCard(b)
		if err != nil {
			if !errors.Is(err, errBadCard) {
				t.Fatalf("parseCard(% x): error %v does not wrap errBadCard", b, err)
			}
			return
		}
		again, err := formatCard(ap)
		if err != nil {
			t.Fatalf("parseCard(% x) = %v, which formatCard refuses: %v", b, ap, err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("parseCard(% x) = %v, which formats as % x", b, ap, again)
		}
		if ap.Port() == 0 || !ap.Addr().IsValid() || ap.Addr().Zone() != "" || ap.Addr().Is4In6() {
			t.Fatalf("parseCard(% x) accepted %v", b, ap)
		}
	})
}
