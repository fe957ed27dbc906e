package tcp

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func sampleCard() card {
	return card{
		Rank:   3,
		JobTag: jobTag("job"),
		Port:   7000,
		Host:   "node-17",
		Addrs: []netip.Prefix{
			netip.MustParsePrefix("127.0.0.1/8"),
			netip.MustParsePrefix("::1/128"),
			netip.MustParsePrefix("10.0.0.5/24"),
			netip.MustParsePrefix("2001:db8::5/64"),
		},
	}
}

func cardsEqual(a, b card) bool {
	return a.Rank == b.Rank && a.JobTag == b.JobTag && a.Port == b.Port && a.Host == b.Host && slices.Equal(a.Addrs, b.Addrs)
}

func TestCardRoundTrip(t *testing.T) {
	c := sampleCard()
	b, err := c.encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeCard(b)
	if err != nil || !cardsEqual(got, c) {
		t.Fatalf("decodeCard(encode(%+v)) = %+v, %v", c, got, err)
	}
	// A later version may append extension records; this one skips them.
	ext := append(bytes.Clone(b), 42, 3, 0, 'a', 'b', 'c')
	if got, err := decodeCard(ext); err != nil || !cardsEqual(got, c) {
		t.Fatalf("card with an unknown extension: %+v, %v", got, err)
	}
}

func TestCardEncodeLimits(t *testing.T) {
	long := sampleCard()
	long.Host = strings.Repeat("h", maxCardHostLen+1)
	many := sampleCard()
	many.Addrs = make([]netip.Prefix, maxCardAddrs+1)
	for i := range many.Addrs {
		many.Addrs[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), 8)
	}
	invalid := sampleCard()
	invalid.Addrs = []netip.Prefix{{}}
	for name, c := range map[string]card{"long host": long, "too many addresses": many, "invalid address": invalid} {
		if _, err := c.encode(); err == nil {
			t.Errorf("%s: encode succeeded", name)
		}
	}
}

func TestDecodeCardErrors(t *testing.T) {
	good, err := sampleCard().encode()
	if err != nil {
		t.Fatal(err)
	}
	hostEnd := cardFixedLen + len("node-17")
	mut := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	tests := []struct {
		name string
		in   []byte
		want string
	}{
		{"empty", nil, "shorter than"},
		{"truncated fixed part", good[:cardFixedLen-1], "shorter than"},
		{"magic", mut(func(b []byte) []byte { b[0] = 'x'; return b }), "magic"},
		{"version", mut(func(b []byte) []byte { b[4] = 2; return b }), "version 2"},
		{"reserved", mut(func(b []byte) []byte { b[5] = 1; return b }), "reserved"},
		{"port zero", mut(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[18:], 0); return b }), "port 0"},
		{"host past end", good[:cardFixedLen+3], "host name"},
		{"too many addresses", mut(func(b []byte) []byte { b[hostEnd] = maxCardAddrs + 1; return b }), "addresses, at most"},
		{"address missing", mut(func(b []byte) []byte { b[hostEnd] = 5; return b }), "address 4 missing"},
		{"bad family", mut(func(b []byte) []byte { b[hostEnd+1] = 5; return b }), "family 5"},
		{"address truncated", good[:hostEnd+4], "address 0 truncated"},
		{"prefix too long", mut(func(b []byte) []byte { b[hostEnd+6] = 33; return b }), "prefix length 33"},
		{"truncated extension", append(bytes.Clone(good), 1, 2), "truncated extension"},
		{"extension past end", append(bytes.Clone(good), 1, 9, 0, 1), "runs past the end"},
		{"oversized", append(bytes.Clone(good), make([]byte, maxCardLen)...), "at most"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeCard(tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("decodeCard() error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// FuzzDecodeCard feeds arbitrary bytes to the card decoder: it must not
// panic, and whatever it accepts must survive a round trip.
func FuzzDecodeCard(f *testing.F) {
	good, err := sampleCard().encode()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(append(bytes.Clone(good), 7, 1, 0, 'x'))
	f.Add([]byte{})
	f.Add([]byte(cardMagic))
	f.Add(good[:cardFixedLen+2])
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeCard(b)
		if err != nil {
			return
		}
		if len(c.Addrs) > maxCardAddrs || len(c.Host) > maxCardHostLen || c.Port == 0 {
			t.Fatalf("accepted a card beyond the limits: %+v", c)
		}
		enc, err := c.encode()
		if err != nil {
			t.Fatalf("re-encoding an accepted card: %v", err)
		}
		again, err := decodeCard(enc)
		if err != nil || !cardsEqual(again, c) {
			t.Fatalf("round trip changed the card: %+v -> %+v, %v", c, again, err)
		}
		_ = c.dialOrder("node-17")
	})
}
