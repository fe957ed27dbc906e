package plugin_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/plugin"
	"github.com/hpc-multidevice/multidevice/subdevices/tcp"
)

// helperArg makes this test binary a plugin (see TestMain).
const helperArg = "sdi-plugin-test-helper"

func serveHelper(behaviour string) {
	exe, _ := os.Executable()
	if script, ok := strings.CutPrefix(behaviour, "host-of:"); ok {
		hostHelper(script, nil, hostStarted)
	}
	if n, ok := strings.CutPrefix(behaviour, "deliver-at-connect:"); ok {
		size, _ := strconv.Atoi(n)
		serveDeliverAtConnect(size)
	}
	if n, ok := strings.CutPrefix(behaviour, "abandon-then-carry:"); ok {
		size, _ := strconv.Atoi(n)
		serveAbandonThenCarry(size)
	}
	switch behaviour {
	case "v1":
		plugin.Serve(tcp.New)
	case "v99":
		plugin.ServeVersion(99, tcp.New)
	case "host":
		hostHelper(exe, []string{helperArg, "v1"}, hostOpened)
	case "host-unopened":
		hostHelper(exe, []string{helperArg, "v1"}, hostStarted)
	case "host-closed":
		hostHelper(exe, []string{helperArg, "v1"}, hostClosed)
	case "stderr-in-open":
		serveStderrInOpen()
	case "crash-in-open":
		plugin.Serve(func(l hclog.Logger) sdi.SubDevice { return crashInOpen{tcp.New(l)} })
	case "echo-open":
		plugin.Serve(func(l hclog.Logger) sdi.SubDevice { return echoOpen{tcp.New(l)} })
	case "own-timeout":
		plugin.Serve(func(l hclog.Logger) sdi.SubDevice { return ownTimeout{echoOpen{tcp.New(l)}} })
	case "bad-rank":
		plugin.Serve(func(l hclog.Logger) sdi.SubDevice { return &badRank{SubDevice: echoOpen{tcp.New(l)}} })
	case "slow-open":
		plugin.Serve(func(l hclog.Logger) sdi.SubDevice { return slowOpen{tcp.New(l)} })
	}
}

type crashInOpen struct{ sdi.SubDevice }

func (crashInOpen) Open(context.Context, sdi.OpenParams) (sdi.Local, error) {
	os.Exit(5)
	return sdi.Local{}, nil
}

func startHelper(t *testing.T, behaviour string, checksum []byte) (*plugin.Client, error) {
	return startHelperTimeout(t, behaviour, checksum, 5*time.Second)
}

func startHelperTimeout(t *testing.T, behaviour string, checksum []byte, timeout time.Duration) (*plugin.Client, error) {
	t.Helper()
	return startHelperConfig(t, behaviour, func(c *plugin.Config) { c.Checksum, c.Timeout = checksum, timeout })
}

// startHelperConfig starts the test binary as a plugin with behaviour, and
// a Config that adjust may change.
func startHelperConfig(t *testing.T, behaviour string, adjust func(*plugin.Config)) (*plugin.Client, error) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := plugin.Config{Name: "fab", Path: exe, Args: []string{helperArg, behaviour}, Timeout: 5 * time.Second}
	adjust(&cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := plugin.Start(ctx, cfg)
	if c != nil {
		t.Cleanup(func() { c.Close(context.Background()) })
	}
	return c, err
}

func sumOf(t *testing.T, path string) []byte {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	io.Copy(h, f)
	return h.Sum(nil)
}

// TestHandshake covers what is decided before a plugin serves: the version
// it speaks and the checksum of its binary.
func TestHandshake(t *testing.T) {
	exe, _ := os.Executable()
	good := sumOf(t, exe)
	bad := sha256.Sum256([]byte("another binary"))
	for _, tc := range []struct {
		name      string
		behaviour string
		checksum  []byte
		want      string // "" for success
	}{
		{"same version", "v1", nil, ""},
		{"matching checksum", "v1", good, ""},
		{"wrong checksum", "v1", bad[:], "SHA-256 does not match"},
		{"short checksum", "v1", good[:5], "a SHA-256 has 32"},
		{"unsupported version", "v99", nil, "incompatible API version with plugin. Plugin version: 99, Client versions: [1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := startHelper(t, tc.behaviour, tc.checksum)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				info, err := c.Info(context.Background())
				if err != nil || info.Name != "tcp" {
					t.Fatalf("Info = %+v, %v", info, err)
				}
				return
			}
			if !errors.Is(err, plugin.ErrStart) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `"fab"`) {
				t.Fatalf("err = %v, want ErrStart naming fab and saying %q", err, tc.want)
			}
		})
	}
}

// TestCrashInOpen: a plugin that dies during a control call fails that
// call with ErrPluginExited, and every later call too; nothing hangs.
func TestCrashInOpen(t *testing.T) {
	c, err := startHelper(t, "crash-in-open", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Open(context.Background(), sdi.OpenParams{Rank: 0, Size: 2, Handler: nopHandler{}, APIVersion: sdi.APIVersion})
	if !errors.Is(err, plugin.ErrPluginExited) || !strings.Contains(err.Error(), `"fab"`) {
		t.Fatalf("Open = %v, want ErrPluginExited naming fab", err)
	}
	if _, err := c.Info(context.Background()); !errors.Is(err, plugin.ErrPluginExited) {
		t.Fatalf("Info after the crash = %v, want ErrPluginExited", err)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatalf("Close after the crash = %v", err)
	}
}

// echoOpen answers Open with a card that repeats the host and site it was
// given, so the host can see what crossed the boundary. The wrapper hides
// tcp's optional interfaces, so it declares none of their flags.
type echoOpen struct{ sdi.SubDevice }

func (e echoOpen) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	l, err := e.SubDevice.Open(ctx, p)
	l.Addr = []byte(p.Host + "@" + p.Site)
	l.Caps.Flags &^= sdi.FlagJobCards | sdi.FlagPoll | sdi.FlagIdle
	return l, err
}

// TestOpenParamsCrossTheBoundary: what Open is given reaches a plugin's
// subdevice, the site included (tcp uses it to tell clusters apart).
func TestOpenParamsCrossTheBoundary(t *testing.T) {
	c, err := startHelper(t, "echo-open", nil)
	if err != nil {
		t.Fatal(err)
	}
	local, err := c.Open(context.Background(), sdi.OpenParams{Rank: 0, Size: 2, Host: "p01", Site: "P", JobID: "echo",
		Secret: []byte("s"), Config: []byte(`{"listen": "127.0.0.1:0"}`), Handler: nopHandler{}, APIVersion: sdi.APIVersion})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(local.Addr), "p01@P"; got != want {
		t.Errorf("the plugin saw host@site %q, want %q", got, want)
	}
}

type nopHandler struct{}

func (nopHandler) Deliver(sdi.Rank, []byte, []byte) {}
func (nopHandler) SendDone(uint64, error)           {}
func (nopHandler) PeerDown(sdi.Rank, error)         {}
