//go:build verbs && cgo

package verbs

import (
	"context"
	"errors"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/internal/testlog"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// TestConformance runs the SDI conformance suite over the engine and this
// provider: three ranks in this process on one device port, on the
// fakeverbs stand-in or on a real device.
func TestConformance(t *testing.T) {
	h := testHost(t)
	p, _, err := h.open(context.Background(), sdi.OpenParams{Logger: hclog.NewNullLogger()})
	if errors.Is(err, rdma.ErrNoDevice) {
		t.Skipf("no usable RDMA device: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// The ranks log into a buffer, not t.Log: their goroutines may still
	// log while a subtest ends. Warnings are shown with -v or on failure.
	var logs testlog.Buffer
	defer func() {
		if s := logs.String(); s != "" {
			t.Logf("warnings logged by the ranks:\n%s", s)
		}
	}()
	sditest.Run(t, sditest.Harness{
		New: func(testing.TB) sdi.SubDevice {
			return newOn(h, hclog.New(&hclog.LoggerOptions{Name: "verbs", Level: hclog.Warn, Output: &logs}))
		},
		Peers: 3,
	})
}
