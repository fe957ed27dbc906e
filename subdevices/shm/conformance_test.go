package shm

import (
	"testing"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// TestConformance runs the shared SDI conformance suite against shm, with
// three ranks so ManyToOne and Concurrent/Sends exercise several rings;
// once with the defaults, where frames of MaxFrame go by descriptor and
// process_vm_readv (when the machine allows it), and once with every
// frame through the ring.
func TestConformance(t *testing.T) {
	for _, tt := range []struct{ name, config string }{
		{"default", ""},
		{"ring only", `{"single_copy": false}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sditest.Run(t, sditest.Harness{
				New:    func(t testing.TB) sdi.SubDevice { return New(testLogger(t)) },
				Peers:  3,
				Config: []byte(tt.config),
			})
		})
	}
}
