package shm

import (
	"testing"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// TestConformance runs the shared SDI conformance suite against shm, with
// three ranks so ManyToOne and Concurrent/Sends exercise several rings;
// once with the defaults, every frame through the ring, and once with the
// single copy on, where frames from 16 KiB go by descriptor and
// process_vm_readv (when the machine allows it).
func TestConformance(t *testing.T) {
	for _, tt := range []struct{ name, config string }{
		{"default", ""},
		{"single copy", `{"single_copy": true}`},
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
