package uds_test

import (
	"testing"

	"github.com/hpc-multidevice/multidevice/examples/subdevice-plugin/uds"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// TestConformance is all a subdevice author needs: the SDI conformance
// suite against the subdevice in process. The same suite runs against the
// plugin binary in sdi/plugin's tests.
func TestConformance(t *testing.T) {
	sditest.Run(t, sditest.Harness{
		New:    func(t testing.TB) sdi.SubDevice { return uds.New(nil) },
		Peers:  3,
		Config: []byte(`{"dir": "` + t.TempDir() + `", "queue_bytes": 1048576}`),
	})
}
