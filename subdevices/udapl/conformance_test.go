//go:build udapl && cgo

package udapl

import (
	"context"
	"errors"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// TestConformance runs the SDI conformance suite over the engine and this
// provider, three ranks in this process on one adapter, where an IA opens.
func TestConformance(t *testing.T) {
	p, _, err := open(context.Background(), sdi.OpenParams{Logger: hclog.NewNullLogger()})
	if errors.Is(err, rdma.ErrNoDevice) {
		t.Skipf("no uDAPL interface adapter opens here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	sditest.Run(t, sditest.Harness{
		New:   func(testing.TB) sdi.SubDevice { return New(hclog.NewNullLogger()) },
		Peers: 3,
	})
}
