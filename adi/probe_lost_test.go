package adi_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
)

// TestProbeLostSource checks that every probe of one source that is lost
// fails with ErrPeerDown, whether the rank's messages go through the
// device's own matching or a subdevice that matches on its own. Over the
// latter, Improbe answered "nothing yet" for ever, so Mprobe waited out
// its ctx while Probe failed at once.
func TestProbeLostSource(t *testing.T) {
	for _, tt := range []struct {
		name  string
		world func(t *testing.T) ([]*adi.World, func())
	}{
		{"own matching", func(t *testing.T) ([]*adi.World, func()) {
			ws, f := loopWorlds(t, 2)
			return ws, func() { f.Sever(1) }
		}},
		{"matching subdevice", func(t *testing.T) ([]*adi.World, func()) {
			ws, f := matchWorlds(t, 2)
			return ws, func() { f.Kill(1) }
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ws, lose := tt.world(t)
			cs := comms(ws)
			lose()
			time.Sleep(50 * time.Millisecond)
			ctx, cancel := context.WithTimeout(ctxT(t), 2*time.Second)
			defer cancel()
			if _, err := cs[0].Probe(ctx, 1, 5); !errors.Is(err, adi.ErrPeerDown) {
				t.Errorf("Probe of lost rank 1: %v, want ErrPeerDown", err)
			}
			if _, _, err := cs[0].Mprobe(ctx, 1, 5); !errors.Is(err, adi.ErrPeerDown) {
				t.Errorf("Mprobe of lost rank 1: %v, want ErrPeerDown", err)
			}
			if _, _, ok, err := cs[0].Improbe(1, 5); !errors.Is(err, adi.ErrPeerDown) {
				t.Errorf("Improbe of lost rank 1: ok=%v err=%v, want ErrPeerDown", ok, err)
			}
		})
	}
}
