package tcp

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/hpc-multidevice/multidevice/subdevices/tcp/addrsel"
)

func sampleCard() card {
	pfx := netip.MustParsePrefix
	return card{
		Rank:   3,
		JobTag: jobTag("job"),
		Port:   7000,
		Host:   "node-17",
		Site:   "cluster-a",
		Ifaces: []cardIface{
			{Name: "lo", Addrs: []netip.Prefix{pfx("127.0.0.1/8"), pfx("::1/128")}},
			{Name: "eth0", Speed: 10000, Addrs: []netip.Prefix{pfx("10.0.0.5/24"), pfx("2001:db8::5/64"), pfx("fe80::5/64")}},
		},
	}
}

func cardsEqual(a, b card) bool {
	return a.Rank == b.Rank && a.JobTag == b.JobTag && a.Port == b.Port && a.Host == b.Host && a.Site == b.Site &&
		slices.EqualFunc(a.Ifaces, b.Ifaces, func(x, y cardIface) bool {
			return x.Name == y.Name && x.Speed == y.Speed && slices.Equal(x.Addrs, y.Addrs)
		})
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
	// A card without a site, as a launcher that names none (or a build
	// older than sites) makes it, carries no site extension.
	nosite := c
	nosite.Site = ""
	if b, err := nosite.encode(); err != nil {
		t.Fatal(err)
	} else if got, err := decodeCard(b); err != nil || !cardsEqual(got, nosite) {
		t.Fatalf("card without a site: %+v, %v", got, err)
	} else if want, _ := c.encode(); !bytes.Equal(b, want[:len(b)]) || len(want) != len(b)+3+len(c.Site) {
		t.Fatalf("the site is not one extension at the end: %x vs %x", b, want)
	}
	// No interfaces at all is a valid card (Connect refuses it).
	empty := card{Rank: 1, Port: 1}
	if b, err := empty.encode(); err != nil {
		t.Fatal(err)
	} else if got, err := decodeCard(b); err != nil || len(got.Ifaces) != 0 {
		t.Fatalf("empty card: %+v, %v", got, err)
	}
}

func TestCardEncodeLimits(t *testing.T) {
	long := sampleCard()
	long.Host = strings.Repeat("h", maxCardHostLen+1)
	longSite := sampleCard()
	longSite.Site = strings.Repeat("s", maxCardSiteLen+1)
	many := sampleCard()
	many.Ifaces = []cardIface{{Name: "eth0", Addrs: make([]netip.Prefix, maxCardAddrs+1)}}
	for i := range many.Ifaces[0].Addrs {
		many.Ifaces[0].Addrs[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), 8)
	}
	ifaces := sampleCard()
	ifaces.Ifaces = make([]cardIface, maxCardIfaces+1)
	for i := range ifaces.Ifaces {
		ifaces.Ifaces[i].Name = "eth" + strconv.Itoa(i)
	}
	invalid := sampleCard()
	invalid.Ifaces[1].Addrs = []netip.Prefix{{}}
	noName := sampleCard()
	noName.Ifaces[0].Name = ""
	for name, c := range map[string]card{"long host": long, "long site": longSite, "too many addresses": many, "too many interfaces": ifaces,
		"invalid address": invalid, "unnamed interface": noName} {
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
	siteExt := func(name string) []byte {
		return append([]byte{cardExtSite}, append(binary.LittleEndian.AppendUint16(nil, uint16(len(name))), name...)...)
	}
	// bare is good without its site, for rows that need the interfaces to
	// end the card.
	bare := good[:len(good)-len(siteExt("cluster-a"))]
	hostEnd := cardFixedLen + len("node-17") // the interface count
	lo := hostEnd + 1                        // interface 0: name length, "lo", speed, count
	loAddrs := lo + 1 + 2 + 4                // interface 0's address count
	eth := loAddrs + 1 + (1 + 4 + 1) + (1 + 16 + 1)
	mut := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	tests := []struct {
		name string
		in   []byte
		want string
	}{
		{"empty", nil, "shorter than"},
		{"truncated fixed part", good[:cardFixedLen-1], "shorter than"},
		{"magic", mut(func(b []byte) []byte { b[0] = 'x'; return b }), "magic"},
		{"version", mut(func(b []byte) []byte { b[4] = 1; return b }), "version 1"},
		{"reserved", mut(func(b []byte) []byte { b[5] = 1; return b }), "reserved"},
		{"port zero", mut(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[18:], 0); return b }), "port 0"},
		{"host past end", good[:cardFixedLen+3], "host name"},
		{"interface count missing", good[:hostEnd], "interface count missing at byte 28"},
		{"too many interfaces", mut(func(b []byte) []byte { b[hostEnd] = maxCardIfaces + 1; return b }), "interfaces at byte 28, at most"},
		{"interface missing", func() []byte { b := bytes.Clone(bare); b[hostEnd] = 3; return b }(), "interface 2 missing"},
		{"empty name", mut(func(b []byte) []byte { b[lo] = 0; return b }), "interface 0 at byte 29: name length 0"},
		{"name past end", good[:lo+2], "name of 2 bytes runs past the end"},
		{"speed truncated", good[:lo+4], "interface 0 (lo): link speed truncated"},
		{"address count missing", good[:loAddrs], "interface 0 (lo): address count missing"},
		{"too many addresses", mut(func(b []byte) []byte { b[loAddrs] = maxCardAddrs + 1; return b }), "addresses in all, at most"},
		{"bad family", mut(func(b []byte) []byte { b[loAddrs+1] = 5; return b }), "interface 0 (lo): address 0 at byte 37 has family 5"},
		{"address truncated", good[:loAddrs+4], "interface 0 (lo): address 0 at byte 37 truncated"},
		{"prefix too long", mut(func(b []byte) []byte { b[loAddrs+6] = 33; return b }), "prefix length 33"},
		{"multicast", mut(func(b []byte) []byte { b[loAddrs+2] = 224; return b }), "not a unicast address"},
		{"duplicate name", mut(func(b []byte) []byte { copy(b[eth+1:], "lo\x00\x00"); b[eth] = 2; return b }), ""},
		{"truncated extension", append(bytes.Clone(good), 1, 2), "truncated extension"},
		{"extension past end", append(bytes.Clone(good), 1, 9, 0, 1), "runs past the end"},
		{"second site", append(bytes.Clone(good), siteExt("b")...), "second site extension"},
		{"empty site", append(bytes.Clone(bare), siteExt("")...), "name length 0"},
		{"site too long", append(bytes.Clone(bare), siteExt(strings.Repeat("s", maxCardSiteLen+1))...), "name length 256"},
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
// panic, and whatever it accepts must survive a round trip and be usable by
// address selection.
func FuzzDecodeCard(f *testing.F) {
	good, err := sampleCard().encode()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(append(bytes.Clone(good), 7, 1, 0, 'x'))
	f.Add(append(bytes.Clone(good), cardExtSite, 1, 0, 'x'))
	f.Add(append(bytes.Clone(good), cardExtSite, 0, 0))
	f.Add([]byte{})
	f.Add([]byte(cardMagic))
	f.Add(good[:cardFixedLen+2])
	f.Add(good[:len(good)-5])
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeCard(b)
		if err != nil {
			return
		}
		if len(c.Ifaces) > maxCardIfaces || c.numAddrs() > maxCardAddrs || len(c.Host) > maxCardHostLen || len(c.Site) > maxCardSiteLen || c.Port == 0 {
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
		own := sampleCard().endpoint()
		addrsel.Select(nil, own, c.endpoint(), true)
		addrsel.Select(nil, own, c.endpoint(), false)
	})
}
