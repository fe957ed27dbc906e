package tcp

import (
	"testing"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// TestConformance runs the generic SDI conformance suite against tcp over
// IPv4 loopback, with a small queue so the backpressure check reaches the
// bound quickly.
func TestConformance(t *testing.T) {
	sditest.Run(t, sditest.Harness{
		New:    func(t testing.TB) sdi.SubDevice { return New(nil) },
		Peers:  3,
		Config: []byte(`{"listen": "127.0.0.1:0", "queue_bytes": 262144, "connect_timeout": "5s"}`),
	})
}
