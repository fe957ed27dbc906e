package plugin

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Serve runs a subdevice as a plugin: it is the whole main of a plugin
// binary,
//
//	func main() { plugin.Serve(myfabric.New) }
//
// It answers the host's handshake, makes one subdevice with factory and
// serves it until the host closes it or goes away, then exits the process.
// Started by hand rather than by a host, it says so and exits with status 1.
//
// The subdevice logs through the logger it is given, as JSON on stderr,
// which the host re-logs under the subdevice's name at the host's level.
func Serve(factory sdi.Factory) {
	level := hclog.LevelFromString(os.Getenv(envLogLevel))
	if level == hclog.NoLevel {
		level = hclog.Info
	}
	// go-plugin swaps os.Stderr for a pipe once it serves; the logger
	// keeps the real one, which the host reads line by line.
	log := hclog.New(&hclog.LoggerOptions{Level: level, Output: os.Stderr, JSONFormat: true})
	srv := newServer(factory(log), log, func() {
		// Exiting here skips go-plugin's cleanup of its socket; the
		// socket directory a host of ours made goes with it.
		if dir := os.Getenv(goplugin.EnvUnixSocketDir); strings.HasPrefix(filepath.Base(dir), sockDirPrefix) {
			os.RemoveAll(dir)
		}
		os.Exit(3)
	})
	go watchHost(srv, os.Getppid(), time.Second)
	if fd, err := strconv.Atoi(os.Getenv(envHostFD)); err == nil && fd > 2 {
		// Only a pipe: a wrapper script may have reused the number for a
		// file of its own, which an *os.File would close when collected.
		var st syscall.Stat_t
		if syscall.Fstat(fd, &st) == nil && st.Mode&syscall.S_IFMT == syscall.S_IFIFO {
			go watchHostPipe(srv, os.NewFile(uintptr(fd), "host"))
		}
	}
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig:  handshake,
		VersionedPlugins: pluginSets(srv),
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			return grpc.NewServer(append(opts, grpc.MaxRecvMsgSize(maxMessage), grpc.MaxSendMsgSize(maxMessage))...)
		},
		Logger: log,
	})
}

// watchHostPipe shuts the plugin down when the host ends: r is a pipe only
// the host writes to, and it never does, so any read ends with the host.
// Unlike watchHost, it sees the host behind a wrapper script.
func watchHostPipe(srv *server, r *os.File) {
	var b [1]byte
	_, err := r.Read(b[:])
	r.Close()
	srv.hostEnded(fmt.Errorf("the host process ended (its pipe read %v)", err))
}

// watchHost shuts the plugin down when the process that started it ends.
// Once the host opened the subdevice the end of the Transfer stream says
// so at once; before that (a rank killed while it starts, between Info
// and Open, or in an Open that takes long) nothing else would, and the
// plugin would run on for good.
// ppid is read before the goroutine starts, so that a host that ends
// before it runs is noticed too.
func watchHost(srv *server, ppid int, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for range tick.C {
		if os.Getppid() != ppid {
			srv.hostEnded(fmt.Errorf("the host process (pid %d) ended", ppid))
			return
		}
	}
}
