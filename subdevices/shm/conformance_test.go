package shm

import (
	"testing"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// TestConformance runs the shared SDI conformance suite against shm, with
// three ranks so ManyToOne and Concurrent/Sends exercise several rings.
func TestConformance(t *testing.T) {
	sditest.Run(t, sditest.Harness{
		New:   func(t testing.TB) sdi.SubDevice { return New(testLogger(t)) },
		Peers: 3,
	})
}
