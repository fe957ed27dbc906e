package plugin

import (
	"context"
	"os"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/proto/sdiv1"
)

// ServeVersion serves factory's subdevice as protocol version v only, as a
// plugin built against another version would; tests use it.
func ServeVersion(v int, factory sdi.Factory) {
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: os.Stderr, JSONFormat: true})
	srv := newServer(factory(log), log, nil)
	hs := handshake
	hs.ProtocolVersion = uint(v)
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig:  hs,
		VersionedPlugins: map[int]goplugin.PluginSet{v: {pluginName: &grpcPlugin{srv: srv}}},
	})
}

// PID is the plugin process's id.
func (c *Client) PID() int { return c.pc.ReattachConfig().Pid }

// CloseSubDevice makes only Close's call to the plugin, not the shutdown
// of the process that follows it, as a host killed in between does.
func (c *Client) CloseSubDevice(ctx context.Context) error {
	_, err := c.rpc.Close(ctx, &sdiv1.Close_Request{})
	return err
}
