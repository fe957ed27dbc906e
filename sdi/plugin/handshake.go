package plugin

import (
	"context"
	"errors"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/hpc-multidevice/multidevice/sdi/proto/sdiv1"
)

// ProtocolVersion is the newest SDI plugin protocol this build speaks; it
// is go-plugin's protocol version. A host offers every version it still
// loads and a plugin serves the newest it shares with the host, so a newer
// host loads an older plugin; a plugin with no version in common is refused
// at the handshake with both sides' versions in the error.
const ProtocolVersion = 1

// Handshake is what host and plugin check before anything else. The cookie
// only tells a plugin it was started by a host (run by hand, a plugin says
// so and exits); it is not a secret.
var handshake = goplugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   "MD_SDI_PLUGIN",
	MagicCookieValue: "multidevice-subdevice-c0c1c4a5",
}

// pluginName is the one plugin a binary serves.
const pluginName = "subdevice"

// envLogLevel tells a plugin the host's log level, so it formats nothing
// the host would drop.
const envLogLevel = "MD_SDI_LOG_LEVEL"

// maxMessage bounds one gRPC message: a chunk of the stream plane holds at
// most one window of records.
const maxMessage = maxPlaneBytes + 1<<20

// pluginSets returns the versioned plugin sets: the protocol versions this
// build speaks and what serves each. srv is nil on the host.
func pluginSets(srv *server) map[int]goplugin.PluginSet {
	return map[int]goplugin.PluginSet{
		1: {pluginName: &grpcPlugin{srv: srv}},
	}
}

// grpcPlugin is go-plugin's view of a subdevice: it registers the server
// in the plugin and makes the client stub in the host.
type grpcPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	srv *server
}

func (p *grpcPlugin) GRPCServer(_ *goplugin.GRPCBroker, s *grpc.Server) error {
	if p.srv == nil {
		return errors.New("sdi/plugin: no subdevice to serve")
	}
	sdiv1.RegisterSubDeviceServer(s, p.srv)
	return nil
}

// dispensed is what the host gets from go-plugin: the stub, and a context
// that go-plugin cancels when the plugin process exits.
type dispensed struct {
	rpc  sdiv1.SubDeviceClient
	done context.Context
}

func (p *grpcPlugin) GRPCClient(ctx context.Context, _ *goplugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &dispensed{rpc: sdiv1.NewSubDeviceClient(c), done: ctx}, nil
}
