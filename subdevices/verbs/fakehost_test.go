package verbs

import (
	"net/netip"
	"testing"
)

// The fakeverbs stand-in (testdata/fakeverbs/fakeverbs.c) models one
// InfiniBand adapter, fake0, whose port 1 is ACTIVE and whose only address
// on the fabric is fakeAddr. The address is not loopback, which the card
// parser refuses, and it need not exist on any interface: the fake never
// opens a socket.
const (
	fakeDevice = "fake0"
	fakeAddr   = "10.255.0.1"
)

// fakeHost describes the fake's machine to Open: the sysfs tree of an
// InfiniBand adapter with one IPoIB interface on port 1, and that
// interface's addresses.
func fakeHost(t *testing.T) host {
	t.Helper()
	s := fakeSys(t, map[string]string{
		ib + fakeDevice + "/ports/1/state":             "4: ACTIVE\n",
		ib + fakeDevice + "/ports/1/gid_attrs/ndevs/0": "", // unreadable on an IB port
		ib + fakeDevice + "/device/net/fib0/dev_port":  "0\n",
	})
	return host{sys: s, addrs: fakeAddrs(map[string][]string{"fib0": {"fe80::1", fakeAddr}})}
}

// TestFakeHost checks that Open, given fakeHost, picks the fake's device,
// port and address, and can publish a card for it.
func TestFakeHost(t *testing.T) {
	h := fakeHost(t)
	got, err := findTarget(h.sys, config{}, h.addrs)
	want := target{addr: netip.MustParseAddr(fakeAddr), device: fakeDevice, port: 1}
	if err != nil || got != want {
		t.Fatalf("findTarget on the fake host = %+v, %v; want %+v", got, err, want)
	}
	card, err := formatCard(netip.AddrPortFrom(got.addr, 32768))
	if err != nil {
		t.Fatal(err)
	}
	if ap, err := parseCard(card); err != nil || ap.Addr() != want.addr {
		t.Fatalf("parseCard(formatCard) = %v, %v", ap, err)
	}
	if realHost.sys != "/sys" || realHost.addrs == nil {
		t.Fatalf("realHost = %+v, want /sys and the kernel's interface addresses", realHost)
	}
}
