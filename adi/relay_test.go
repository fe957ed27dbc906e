package adi_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/bootstrap"
	"github.com/hpc-multidevice/multidevice/multidevice"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// apart is a loopback subdevice on which ranks 0 and 1 cannot reach each
// other, as two clusters on the same private range.
type apart struct {
	sdi.SubDevice
	rank sdi.Rank
}

func (a *apart) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	a.rank = p.Rank
	return a.SubDevice.Open(ctx, p)
}

func (a *apart) Connect(ctx context.Context, peer sdi.Rank, addr []byte) error {
	if a.rank+peer == 1 {
		return fmt.Errorf("apart: %w", sdi.ErrPeerUnreachable)
	}
	return a.SubDevice.Connect(ctx, peer, addr)
}

// TestRunRelay: two application ranks with no direct link and a relay as
// the job's last rank. The world has two ranks, messages pass through the
// relay, and RunRelay returns once both finalized.
func TestRunRelay(t *testing.T) {
	fab := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop"})
	opts := []adi.Option{
		adi.WithPlugins(&multidevice.PluginsConfig{SubDevices: []multidevice.SubDeviceSpec{{Name: "loop", Enabled: true}}}),
		adi.WithSubDevice("loop", func(l hclog.Logger) sdi.SubDevice { return &apart{SubDevice: fab.New(l)} }),
		adi.WithLogger(hclog.NewNullLogger()),
	}
	boots, err := bootstrap.InProcess(3, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := adi.RunRelay(ctxT(t), append(opts, adi.WithBootstrap(boots[2]))...); err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	for r := range 2 {
		wg.Go(func() {
			ctx := ctxT(t)
			w, err := adi.Init(ctx, append(opts, adi.WithBootstrap(boots[r]))...)
			if err != nil {
				t.Errorf("init rank %d: %v", r, err)
				return
			}
			defer w.Finalize(ctx)
			c := w.Comm()
			if c.Size() != 2 {
				t.Errorf("rank %d: world of %d ranks, want 2 (the relay is not one)", r, c.Size())
			}
			msg := make([]byte, 100000)
			msg[r] = 7
			sr, err := c.Isend(msg, 1-r, 3)
			if err != nil {
				t.Errorf("rank %d send: %v", r, err)
				return
			}
			buf := make([]byte, len(msg))
			if _, err := c.Recv(ctx, buf, 1-r, 3); err != nil || buf[1-r] != 7 {
				t.Errorf("rank %d recv: %v", r, err)
			}
			if _, err := sr.Wait(ctx); err != nil {
				t.Errorf("rank %d send: %v", r, err)
			}
			if sub, gw, err := w.Path(1-r, len(msg)); err != nil || sub != "loop" || !slices.Equal(gw, []int{2}) {
				t.Errorf("rank %d: Path(%d) = %q, %v, %v; want loop through the relay, rank 2", r, 1-r, sub, gw, err)
			}
			if fs := w.ForwardStats(); fs.Forwarded != 0 || fs.Resent != 0 {
				t.Errorf("rank %d, no gateway, lost nothing: %+v", r, fs)
			}
		})
	}
	wg.Wait()
}
