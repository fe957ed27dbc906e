package sditest

import (
	"context"
	"testing"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/plugin"
)

// Plugin returns a Harness.New that starts the plugin binary cfg describes
// once per instance, so the whole catalogue runs against a subdevice out of
// process, through the same glue the multidevice uses. Closing an instance
// ends its process; a test's cleanup ends any left.
//
//	sditest.Run(t, sditest.Harness{New: sditest.Plugin(plugin.Config{Path: bin}), Peers: 3})
func Plugin(cfg plugin.Config) func(t testing.TB) sdi.SubDevice {
	return func(t testing.TB) sdi.SubDevice {
		t.Helper()
		c := cfg
		if c.Logger == nil {
			w := &tbWriter{t: t}
			t.Cleanup(w.stop)
			c.Logger = newLogger(w)
		}
		ctx, cancel := context.WithTimeout(context.Background(), defaultTiming.patience)
		defer cancel()
		sd, err := plugin.Start(ctx, c)
		if err != nil {
			t.Fatalf("sditest: %v", err)
		}
		t.Cleanup(func() { sd.Close(context.Background()) })
		return sd
	}
}
