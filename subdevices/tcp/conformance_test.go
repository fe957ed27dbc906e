package tcp

import (
	"net/netip"
	"testing"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// TestConformance runs the generic SDI conformance suite against tcp over
// IPv4 loopback, with a small queue so the backpressure check reaches the
// bound quickly: once as configured by default (frames may take several
// connections, so order is not promised), once with max_connections 1 (one
// connection per peer, FlagOrdered), and once with two connections per peer
// for real (two loopback addresses posing as two interfaces).
func TestConformance(t *testing.T) {
	const base = `"queue_bytes": 262144, "connect_timeout": "5s"`
	t.Run("default", func(t *testing.T) {
		sditest.Run(t, sditest.Harness{
			New:    func(t testing.TB) sdi.SubDevice { return New(nil) },
			Peers:  3,
			Config: []byte(`{"listen": "127.0.0.1:0", ` + base + `}`),
		})
	})
	t.Run("ordered", func(t *testing.T) {
		sditest.Run(t, sditest.Harness{
			New:    func(t testing.TB) sdi.SubDevice { return New(nil) },
			Peers:  3,
			Config: []byte(`{"listen": "127.0.0.1:0", "max_connections": 1, ` + base + `}`),
		})
	})
	t.Run("striped", func(t *testing.T) {
		sditest.Run(t, sditest.Harness{
			New:    func(t testing.TB) sdi.SubDevice { return newTwoLoopbacks() },
			Peers:  3,
			Config: []byte(`{"listen": "0.0.0.0:0", ` + base + `}`),
		})
	})
}

// newTwoLoopbacks returns an unopened tcp subdevice whose card shows two
// interfaces, 127.0.0.1 and 127.0.0.2, so ranks on this host open two
// connections to each other. It must listen on 0.0.0.0 to accept on both.
func newTwoLoopbacks() sdi.SubDevice {
	sd := New(nil).(*subDevice)
	sd.ifaces = []cardIface{
		{Name: "lo", Addrs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8")}},
		{Name: "lo2", Addrs: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/8")}},
	}
	return sd
}
