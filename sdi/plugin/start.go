package plugin

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
)

// DefaultTimeout bounds each control call to a plugin, and its start, when
// Config.Timeout is zero.
const DefaultTimeout = 30 * time.Second

// sockDirPrefix names the directories that hold plugins' sockets.
const sockDirPrefix = "mdsdi-plugin-"

// Config says how to start one subdevice plugin.
type Config struct {
	// Name is the subdevice's name in plugins.hcl; errors and logs use it.
	Name string
	// Path is the plugin binary; Args are its arguments.
	Path string
	Args []string
	// Checksum is the binary's SHA-256. When set, go-plugin hashes the
	// file and refuses to start it unless it matches.
	Checksum []byte
	// Timeout bounds the start, every control call (on top of the
	// caller's context) and the liveness check; 0 means DefaultTimeout. A
	// plugin that does not answer within it is taken out.
	Timeout time.Duration
	// Stream makes the data plane use the gRPC stream even where shared
	// memory is possible (tests; hosts without a usable /dev/shm).
	Stream bool
	// Logger receives the glue's messages and the plugin's own log lines;
	// nil discards them.
	Logger hclog.Logger
}

// Start launches the plugin binary, checks its checksum, completes the
// handshake over mutual TLS and returns the subdevice it serves, unopened.
// The caller must Close it, which also stops the process. Every failure
// wraps ErrStart and names the plugin; one before the handshake carries
// the last lines the plugin wrote to its stderr. Cancelling ctx abandons
// the start at once, and kills the plugin.
func Start(ctx context.Context, c Config) (*Client, error) {
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.Name == "" {
		c.Name = c.Path
	}
	fail := func(what string, err error) error {
		return fmt.Errorf("%w: %q (%s): %s: %w", ErrStart, c.Name, c.Path, what, err)
	}
	if c.Checksum != nil && len(c.Checksum) != sha256.Size {
		return nil, fail("checksum", fmt.Errorf("%d bytes, a SHA-256 has %d", len(c.Checksum), sha256.Size))
	}
	startTimeout := c.Timeout
	if dl, ok := ctx.Deadline(); ok {
		startTimeout = min(startTimeout, time.Until(dl))
	}
	// The plugin's socket goes in a directory of ours, removed when the
	// plugin ends, so a plugin that dies leaves nothing in /tmp.
	sockDir, err := os.MkdirTemp("", sockDirPrefix)
	if err != nil {
		return nil, fail("socket directory", err)
	}
	// The plugin's end of a pipe whose other end only this process holds:
	// it reads EOF when the host dies, however it was started (serve.go).
	pluginEnd, hostEnd, err := os.Pipe()
	if err != nil {
		os.RemoveAll(sockDir)
		return nil, fail("host pipe", err)
	}
	defer pluginEnd.Close()
	// abort kills the plugin's process group should Start give up on its
	// handshake: go-plugin offers no way to, and the process is go-plugin's
	// to start, so only exec's own cancellation sees it safely.
	abort, abortStart := context.WithCancel(context.Background())
	cmd := exec.CommandContext(abort, c.Path, c.Args...)
	cmd.Cancel = func() error {
		killGroup(cmd.Process.Pid)
		return nil
	}
	cmd.Env = append(cmd.Environ(), envLogLevel+"="+levelName(c.Logger), goplugin.EnvUnixSocketDir+"="+sockDir, envHostFD+"=3")
	cmd.ExtraFiles = []*os.File{pluginEnd} // fd 3
	// Its own process group, so that killing it also kills what a wrapper
	// script started without exec (procgroup.go).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	tail := &stderrTail{}
	var secure *goplugin.SecureConfig
	if c.Checksum != nil {
		secure = &goplugin.SecureConfig{Checksum: c.Checksum, Hash: sha256.New()}
	}
	pc := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  handshake,
		VersionedPlugins: pluginSets(nil),
		Cmd:              cmd,
		SecureConfig:     secure,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		AutoMTLS:         true,
		StartTimeout:     startTimeout,
		Logger:           c.Logger,
		// go-plugin hands what the plugin writes to os.Stderr and
		// os.Stdout once it serves (not the logger's JSON) to these;
		// unset, it discards them.
		SyncStderr: &lineLogger{log: c.Logger.Named("stderr"), level: hclog.Info},
		// Before it serves, go-plugin logs the raw lines at Debug only:
		// the end of them says why a plugin exited before its handshake.
		Stderr:     tail,
		SyncStdout: &lineLogger{log: c.Logger.Named("stdout"), level: hclog.Debug},
		GRPCDialOptions: []grpc.DialOption{
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage), grpc.MaxCallSendMsgSize(maxMessage)),
		},
	})
	stop := func() {
		defer abortStart()
		hostEnd.Close()
		// A binary that never started has nothing to stop; go-plugin's
		// Kill would log that it "failed to exit gracefully".
		if cmd.Process != nil {
			killGroup(cmd.Process.Pid)
			if !within(killGrace, pc.Kill) {
				c.Logger.Warn("plugin still holds its output open after it was killed; not waiting for it", "plugin", c.Name, "pid", cmd.Process.Pid)
			}
		}
		os.RemoveAll(sockDir)
	}
	type handshook struct {
		proto goplugin.ClientProtocol
		err   error
	}
	ch := make(chan handshook, 1)
	go func() {
		proto, err := pc.Client()
		ch <- handshook{proto, err}
	}()
	var hs handshook
	select {
	case hs = <-ch:
	case <-ctx.Done():
		abortStart() // kills the plugin: go-plugin gives up at once
		<-ch
		stop()
		return nil, fail("handshake", fmt.Errorf("abandoned before the plugin completed it: %w", ctx.Err()))
	}
	proto, err := hs.proto, hs.err
	if err != nil {
		stop() // go-plugin has read all of the plugin's stderr then
		if errors.Is(err, goplugin.ErrChecksumsDoNotMatch) {
			return nil, fail("checksum", fmt.Errorf("the binary's SHA-256 does not match plugins.hcl: %w", err))
		}
		if last := tail.lines(); last != "" {
			err = fmt.Errorf("%w\nthe plugin's last lines on stderr:\n%s", err, last)
		}
		return nil, fail("handshake", err)
	}
	tail.stop()
	raw, err := proto.Dispense(pluginName)
	if err != nil {
		stop()
		return nil, fail("dispense", err)
	}
	d, ok := raw.(*dispensed)
	if !ok {
		stop()
		return nil, fail("dispense", fmt.Errorf("got %T", raw))
	}
	return newClient(c, pc, d, sockDir, hostEnd, abortStart), nil
}

// stderrTail keeps the end of what a plugin writes to its stderr until its
// handshake, for the error of a plugin that exits before it. Safe for
// concurrent use.
type stderrTail struct {
	mu      sync.Mutex
	buf     []byte
	cut     bool // the start of buf is not the start of a line
	stopped bool
}

// maxStderrTail bounds what stderrTail keeps, and stderrTailLines how many
// of its lines the error carries.
const (
	maxStderrTail   = 4 << 10
	stderrTailLines = 10
)

func (t *stderrTail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return len(p), nil
	}
	if len(p) >= maxStderrTail {
		t.buf, t.cut = append(t.buf[:0], p[len(p)-maxStderrTail:]...), true
		return len(p), nil
	}
	if over := len(t.buf) + len(p) - maxStderrTail; over > 0 {
		t.buf, t.cut = append(t.buf[:0], t.buf[over:]...), true
	}
	t.buf = append(t.buf, p...)
	return len(p), nil
}

// stop ends the keeping: the plugin serves, and its stderr goes to the log.
func (t *stderrTail) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped, t.buf = true, nil
}

// lines returns the last whole lines kept, at most stderrTailLines.
func (t *stderrTail) lines() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	text := string(t.buf)
	if t.cut {
		if _, rest, ok := strings.Cut(text, "\n"); ok {
			text = rest
		}
	}
	lines := strings.Split(strings.TrimRight(text, "\r\n"), "\n")
	return strings.Join(lines[max(len(lines)-stderrTailLines, 0):], "\n")
}

func levelName(l hclog.Logger) string {
	switch {
	case l.IsTrace():
		return "trace"
	case l.IsDebug():
		return "debug"
	case l.IsInfo():
		return "info"
	case l.IsWarn():
		return "warn"
	case l.IsError():
		return "error"
	}
	return "off"
}
