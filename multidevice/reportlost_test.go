package multidevice

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/bootstrap"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// reportingBoot is a bootstrap that takes reports of lost ranks, as
// mdrun's does, and notes whether a request was done before each report.
type reportingBoot struct {
	bootstrap.Bootstrap
	mu      sync.Mutex
	pending *Request // must not be done when a report comes
	reports []string
}

func (b *reportingBoot) ReportLost(rank int, why string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := fmt.Sprintf("rank %d: %s", rank, why)
	if b.pending != nil && b.pending.isDone() {
		r += " (after the receive failed)"
	}
	b.reports = append(b.reports, r)
}

// TestPeerDownReportedLost: a device whose subdevice lost a peer tells a
// bootstrap that takes such reports, before the receives from the peer
// fail: mdrun names the rank that died first from these reports, and a
// rank that exits on the failure must have sent its report already.
// Peers closing links while this rank finalizes are no loss.
func TestPeerDownReportedLost(t *testing.T) {
	for _, tc := range []struct {
		name       string
		finalizing bool
		want       []string
	}{
		{"running", false, []string{`rank 1: over "loop": link gone`}},
		{"finalizing", true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			boots, err := bootstrap.InProcess(2, nil)
			if err != nil {
				t.Fatal(err)
			}
			rb := &reportingBoot{Bootstrap: boots[0]}
			boots[0] = rb
			fab := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: smallCaps})
			factories := map[string]sdi.Factory{"loop": func(log hclog.Logger) sdi.SubDevice { return fab.New(log) }}
			plugins := &PluginsConfig{SubDevices: []SubDeviceSpec{{Name: "loop", Enabled: true}}}
			devs := make([]*Device, 2)
			errs := make([]error, 2)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			for r := range 2 {
				wg.Go(func() {
					devs[r], errs[r] = Open(ctx, Options{Bootstrap: boots[r], Plugins: plugins, Factories: factories, Logger: testLogger(t).Named(fmt.Sprint(r))})
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { closeJob(t, devs) })
			d := devs[0]
			var r *Request
			if !tc.finalizing { // a finalizing rank posts no receive
				if r, err = d.Irecv(make([]byte, 8), 1, 1, 0); err != nil {
					t.Fatal(err)
				}
				rb.mu.Lock()
				rb.pending = r
				rb.mu.Unlock()
			}
			d.finalizing.Store(tc.finalizing)
			sub := slices.IndexFunc(d.subs, func(s *subdev) bool { return s.name == "loop" })
			(&handler{d: d, sub: sub}).PeerDown(1, errors.New("link gone"))
			if r != nil {
				if _, err := wait(t, r); !errors.Is(err, ErrPeerDown) {
					t.Fatalf("the receive from the lost peer: got %v, want ErrPeerDown", err)
				}
			}
			rb.mu.Lock()
			defer rb.mu.Unlock()
			if !slices.Equal(rb.reports, tc.want) {
				t.Errorf("reports %q, want %q", rb.reports, tc.want)
			}
		})
	}
}
