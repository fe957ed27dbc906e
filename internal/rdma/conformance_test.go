package rdma_test

import (
	"context"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/internal/softrdma"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// softOpen opens providers on fab with the engine's settings set.
func softOpen(fab *softrdma.Fabric, set rdma.Settings) rdma.OpenFunc {
	return func(ctx context.Context, p sdi.OpenParams) (rdma.Provider, rdma.Settings, error) {
		return fab.Open(), set, nil
	}
}

func newSoft(fab *softrdma.Fabric, set rdma.Settings) *rdma.SubDevice {
	return rdma.New(sdi.Info{Name: "soft", Version: "test", APIVersions: []string{sdi.APIVersion}}, softOpen(fab, set), hclog.NewNullLogger())
}

func TestConformance(t *testing.T) {
	tight := rdma.Limits{MaxSendWR: 64, MaxRecvWR: 64, MaxMsg: 64 << 10, MaxPrivate: 56, CQSize: 4096}
	for _, tc := range []struct {
		name     string
		set      rdma.Settings
		lim      rdma.Limits
		deferred bool
		// race: also run under the race detector, where each suite takes
		// 35-45 s; default and tight-deferred take every engine path the
		// other two do, which run without it.
		race bool
	}{
		{"default", rdma.Settings{}, rdma.Limits{}, false, true},
		// Few slots and small eager frames: credits run out and most
		// frames go by read, in several pieces each.
		{"tight", rdma.Settings{EagerBytes: 256, RecvSlots: 4}, tight, false, false},
		// Work done behind the engine's back, as a device does it: a
		// buffer reused or released before its completion shows.
		{"deferred", rdma.Settings{}, rdma.Limits{}, true, false},
		{"tight-deferred", rdma.Settings{EagerBytes: 256, RecvSlots: 4}, tight, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if raceEnabled && !tc.race {
				t.Skip("under the race detector, default and tight-deferred take this configuration's paths; it runs without it")
			}
			fab := softrdma.New(tc.lim)
			fab.Deferred = tc.deferred
			sditest.Run(t, sditest.Harness{
				New:   func(testing.TB) sdi.SubDevice { return newSoft(fab, tc.set) },
				Peers: 3,
			})
			if n := fab.Violations.Load(); n != 0 {
				t.Errorf("the engine broke the fabric's rules %d times: %q", n, fab.Errs())
			}
		})
	}
}
