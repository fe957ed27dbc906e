package adi_test

import (
	"testing"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/conntable"
	"github.com/hpc-multidevice/multidevice/multidevice"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// matchWorlds starts n in-process ranks whose traffic all goes over a
// subdevice that matches on its own (sditest.MatchFabric), and returns
// them with the fabric, for tests that lose a rank (Kill). The windows'
// tests use it because a window's server takes its requests with a
// matched probe, which a matching subdevice's messages do not allow, and
// because such a subdevice's messages are probed at the subdevice, not
// in the device's own queues.
func matchWorlds(t testing.TB, n int) ([]*adi.World, *sditest.MatchFabric) {
	f := sditest.NewMatchFabric()
	ws := jobEach(t, n, nil, func(r int) []adi.Option {
		return []adi.Option{adi.WithSubDevice("tm", f.New),
			adi.WithPlugins(&multidevice.PluginsConfig{SubDevices: []multidevice.SubDeviceSpec{{Name: "tm", Enabled: true}}}),
			adi.WithConnTable(&conntable.Table{Version: conntable.Version, Peers: []conntable.Entry{{To: conntable.SelectAll, Routes: map[string][]conntable.Route{conntable.AllClasses: {{SubDevice: "tm"}}}}}})}
	})
	return ws, f
}
