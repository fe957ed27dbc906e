package main

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/bootstrap"
	"github.com/hpc-multidevice/multidevice/conntable"
	"github.com/hpc-multidevice/multidevice/multidevice"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// TestRingManyRanks runs the demo's ring on 130 ranks in one process: its
// hop count was one byte and wrapped at 128, so the demo, a new user's
// first job, failed on a cluster of that size.
func TestRingManyRanks(t *testing.T) {
	const n = 130
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := sditest.NewFabric(sditest.LoopbackOptions{})
	boots, err := bootstrap.InProcess(n, nil)
	if err != nil {
		t.Fatal(err)
	}
	table := &conntable.Table{Version: conntable.Version, Peers: []conntable.Entry{{To: conntable.SelectAll,
		Routes: map[string][]conntable.Route{conntable.AllClasses: {{SubDevice: "loop"}}}}}}
	plugins := &multidevice.PluginsConfig{SubDevices: []multidevice.SubDeviceSpec{{Name: "loop", Enabled: true}}}
	ws, errs := make([]*adi.World, n), make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			ws[r], errs[r] = adi.Init(ctx, adi.WithBootstrap(boots[r]), adi.WithSubDevice("loop", f.New),
				adi.WithPlugins(plugins), adi.WithConnTable(table))
		})
	}
	wg.Wait()
	for r := range n {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
	}
	defer func() {
		for r := range n {
			wg.Go(func() { ws[r].Finalize(ctx) })
		}
		wg.Wait()
	}()
	for r := range n {
		wg.Go(func() { errs[r] = ring(ctx, ws[r].Comm()) })
	}
	wg.Wait()
	for r := range n {
		if errs[r] != nil {
			t.Errorf("rank %d: %v", r, errs[r])
		}
	}
}
