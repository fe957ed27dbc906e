package multidevice

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/bootstrap"
	"github.com/hpc-multidevice/multidevice/conntable"
	"github.com/hpc-multidevice/multidevice/internal/testlog"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/plugin"
	"github.com/hpc-multidevice/multidevice/subdevices/tcp"
)

// The plugins of these tests are this test binary, started again by the
// plugin loader with "sdi-test-plugin" and a behaviour as arguments.
const helperArg = "sdi-test-plugin"

func TestMain(m *testing.M) {
	if len(os.Args) == 3 && os.Args[1] == helperArg {
		servePluginHelper(os.Args[2])
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// servePluginHelper is main of a plugin process.
func servePluginHelper(behaviour string) {
	switch {
	case behaviour == "tcp":
		plugin.Serve(tcp.New)
	case behaviour == "not-a-plugin":
		fmt.Println("hello, I am not a plugin")
	case behaviour == "hang-open":
		plugin.Serve(func(l hclog.Logger) sdi.SubDevice { return hangOpen{tcp.New(l)} })
	case strings.HasPrefix(behaviour, "crash-after-"):
		var n int64
		fmt.Sscan(strings.TrimPrefix(behaviour, "crash-after-"), &n)
		plugin.Serve(func(l hclog.Logger) sdi.SubDevice {
			c := &crashAfter{SubDevice: tcp.New(l)}
			c.left.Store(n)
			return c
		})
	default:
		fmt.Fprintf(os.Stderr, "unknown helper behaviour %q\n", behaviour)
		os.Exit(2)
	}
}

type hangOpen struct{ sdi.SubDevice }

func (hangOpen) Open(context.Context, sdi.OpenParams) (sdi.Local, error) { select {} }

// crashAfter exits the plugin process abruptly on its n+1st frame.
type crashAfter struct {
	sdi.SubDevice
	left atomic.Int64
}

// SetJobCards, Poll and Idle pass on to tcp, which declares FlagJobCards,
// FlagPoll and FlagIdle; the embedding alone would hide them.
func (c *crashAfter) SetJobCards(ctx context.Context, cards [][]byte) error {
	return c.SubDevice.(sdi.JobCards).SetJobCards(ctx, cards)
}

func (c *crashAfter) Poll() int { return c.SubDevice.(sdi.Poller).Poll() }
func (c *crashAfter) Idle()     { c.SubDevice.(sdi.Idler).Idle() }

func (c *crashAfter) Send(f *sdi.Frame) (bool, error) {
	if c.left.Add(-1) < 0 {
		os.Exit(7)
	}
	return c.SubDevice.Send(f)
}

const loopbackTCP = `{"listen": "127.0.0.1:0", "connect_timeout": "5s"}`

// helperSpec is a plugins.hcl block for the helper plugin.
func helperSpec(name, behaviour string) SubDeviceSpec {
	exe, _ := os.Executable()
	return SubDeviceSpec{Name: name, Enabled: true, Command: exe, Path: exe, Args: []string{helperArg, behaviour},
		SharedMemory: true, Config: []byte(loopbackTCP), Where: "test.hcl:1,1", Timeout: 5 * time.Second}
}

// openPluginJob opens n ranks in this process with the given plugins and
// returns the devices and the errors of Open.
func openPluginJob(t testing.TB, n int, plugins *PluginsConfig, table *conntable.Table, log hclog.Logger) ([]*Device, []error) {
	t.Helper()
	boots, err := bootstrap.InProcess(n, nil)
	if err != nil {
		t.Fatal(err)
	}
	devs := make([]*Device, n)
	errs := make([]error, n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			devs[r], errs[r] = Open(ctx, Options{Bootstrap: boots[r], Plugins: plugins, Table: table, Logger: log.Named(fmt.Sprint(r))})
		})
	}
	wg.Wait()
	return devs, errs
}

// closeAll closes the devices that opened, in parallel, and returns their errors.
func closeAll(devs []*Device) []error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make([]error, len(devs))
	var wg sync.WaitGroup
	for r, d := range devs {
		if d != nil {
			wg.Go(func() { errs[r] = d.Close(ctx) })
		}
	}
	wg.Wait()
	return errs
}

// TestExternalPluginJob runs messages of every protocol between three ranks
// whose only subdevice is tcp served by a plugin, over both data planes.
func TestExternalPluginJob(t *testing.T) {
	for _, shared := range []bool{true, false} {
		t.Run(fmt.Sprintf("shared_memory=%v", shared), func(t *testing.T) {
			spec := helperSpec("tcp", "tcp")
			spec.SharedMemory = shared
			devs, errs := openPluginJob(t, 3, &PluginsConfig{SubDevices: []SubDeviceSpec{spec}}, nil, testLogger(t))
			t.Cleanup(func() {
				for r, err := range closeAll(devs) {
					if err != nil {
						t.Errorf("close rank %d: %v", r, err)
					}
				}
			})
			for r, err := range errs {
				if err != nil {
					t.Fatalf("open rank %d: %v", r, err)
				}
			}
			if name, _ := devs[0].Route(1, 8); name != "tcp" {
				t.Fatalf("route to rank 1 is %q, want the plugin's tcp", name)
			}
			for _, size := range []int{0, 8, 100 << 10, 3 << 20} {
				msg := pattern(size, size)
				var wg sync.WaitGroup
				for from := range devs {
					to := (from + 1) % len(devs)
					wg.Go(func() {
						buf := make([]byte, size)
						rr := must(t)(devs[to].Irecv(buf, from, 9, 1))
						sr := must(t)(devs[from].Isend(msg, to, 9, 1, false))
						if _, err := wait(t, sr); err != nil {
							t.Errorf("send %d bytes %d->%d: %v", size, from, to, err)
						}
						st, err := wait(t, rr)
						if err != nil || st.Count != size || !bytes.Equal(buf, msg) {
							t.Errorf("recv %d bytes %d->%d: %+v, %v, intact %v", size, from, to, st, err, bytes.Equal(buf, msg))
						}
					})
				}
				wg.Wait()
			}
		})
	}
}

// TestExternalPluginSkipped: a plugin that cannot be used is skipped with a
// warning that names it, and the job runs on the built-in subdevice; a
// connection table that needs the plugin gets an error saying why it is
// missing.
func TestExternalPluginSkipped(t *testing.T) {
	exe, _ := os.Executable()
	wrong := sha256.Sum256([]byte("not this binary"))
	for _, tc := range []struct {
		name string
		spec func(SubDeviceSpec) SubDeviceSpec
		want string
	}{
		{"missing binary", func(s SubDeviceSpec) SubDeviceSpec {
			s.Path = exe + ".does-not-exist"
			return s
		}, "no such file"},
		{"wrong checksum", func(s SubDeviceSpec) SubDeviceSpec {
			s.Checksum = "sha256:" + hex.EncodeToString(wrong[:])
			return s
		}, "SHA-256 does not match"},
		{"not a plugin", func(s SubDeviceSpec) SubDeviceSpec {
			s.Args = []string{helperArg, "not-a-plugin"}
			return s
		}, "handshake"},
		{"hangs in open", func(s SubDeviceSpec) SubDeviceSpec {
			s.Args = []string{helperArg, "hang-open"}
			// The same bound covers the plugin's start (exec, TLS
			// keys, handshake), which took over 2 s on a loaded CI host.
			s.Timeout = 6 * time.Second
			return s
		}, "did not answer within 6s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fab := tc.spec(helperSpec("fab", "tcp"))
			plugins := &PluginsConfig{SubDevices: []SubDeviceSpec{
				{Name: "tcp", Enabled: true, Config: []byte(loopbackTCP)},
				fab,
			}}
			var logs testlog.Buffer
			log := hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Warn})
			devs, errs := openPluginJob(t, 2, plugins, nil, log)
			for r, err := range errs {
				if err != nil {
					t.Errorf("open rank %d: %v", r, err)
				}
			}
			if t.Failed() {
				closeAll(devs)
				return
			}
			if l := logs.String(); !strings.Contains(l, "skipping subdevice plugin:") || !strings.Contains(l, "subdevice=fab") || !strings.Contains(l, tc.want) {
				t.Errorf("log does not name the skipped plugin fab and say %q:\n%s", tc.want, logs.String())
			}
			if name, _ := devs[0].Route(1, 8); name != "tcp" {
				t.Errorf("route is %q, want the built-in tcp", name)
			}
			buf := make([]byte, 4)
			rr := must(t)(devs[1].Irecv(buf, 0, 1, 1))
			must(t)(devs[0].Isend([]byte("ping"), 1, 1, 1, false))
			if _, err := wait(t, rr); err != nil || string(buf) != "ping" {
				t.Errorf("message over the built-in tcp: %q, %v", buf, err)
			}
			for r, err := range closeAll(devs) {
				if err != nil {
					t.Errorf("close rank %d: %v", r, err)
				}
			}

			// The same plugin, required by a table.
			table := &conntable.Table{Version: conntable.Version, Peers: []conntable.Entry{{To: conntable.SelectAll, Routes: map[string][]conntable.Route{conntable.AllClasses: {{SubDevice: "fab"}}}}}}
			devs, errs = openPluginJob(t, 2, plugins, table, hclog.NewNullLogger())
			closeAll(devs)
			for r, err := range errs {
				if !errors.Is(err, ErrNoRoute) || !strings.Contains(err.Error(), `"fab", whose plugin was skipped`) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("open rank %d with a table routing over fab: %v; want ErrNoRoute saying the plugin was skipped and %q", r, err, tc.want)
				}
			}

			// The plugin alone: the error says why it is missing, not
			// that plugins.hcl enables nothing.
			devs, errs = openPluginJob(t, 2, &PluginsConfig{SubDevices: []SubDeviceSpec{fab}}, nil, hclog.NewNullLogger())
			closeAll(devs)
			for r, err := range errs {
				if err == nil || !strings.Contains(err.Error(), `"fab"`) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("open rank %d with fab the only subdevice: %v; want an error naming fab and saying %q", r, err, tc.want)
				}
			}
		})
	}
}

// TestExternalPluginCrash: a plugin process that dies mid-job takes its
// subdevice out; both sides see the peer down, pending and new operations
// fail with errors, and nothing hangs, Close included.
func TestExternalPluginCrash(t *testing.T) {
	spec := helperSpec("tcp", "crash-after-3")
	devs, errs := openPluginJob(t, 2, &PluginsConfig{SubDevices: []SubDeviceSpec{spec}}, nil, testLogger(t))
	defer closeAll(devs)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("open rank %d: %v", r, err)
		}
	}
	// Rank 1 waits for more than rank 0's plugin will ever carry.
	var recvs []*Request
	for i := range 6 {
		recvs = append(recvs, must(t)(devs[1].Irecv(make([]byte, 8), 0, i, 1)))
	}
	back := must(t)(devs[0].Irecv(make([]byte, 8), 1, 0, 1))
	var sendErr error
	for i := range 6 {
		r, err := devs[0].Isend(pattern(8, i), 1, i, 1, false)
		if err == nil {
			_, err = wait(t, r)
		}
		if err != nil {
			sendErr = err
			break
		}
		time.Sleep(20 * time.Millisecond) // let the plugin take each frame in turn
	}
	deadline := time.Now().Add(10 * time.Second)
	for sendErr == nil && time.Now().Before(deadline) {
		_, sendErr = devs[0].Isend(pattern(8, 0), 1, 99, 1, false)
		time.Sleep(10 * time.Millisecond)
	}
	if !errors.Is(sendErr, ErrPeerDown) && !errors.Is(sendErr, plugin.ErrPluginExited) {
		t.Errorf("send after the plugin crashed: %v, want ErrPeerDown or plugin.ErrPluginExited", sendErr)
	}
	if _, err := wait(t, back); !errors.Is(err, ErrPeerDown) || !strings.Contains(err.Error(), "plugin exited") {
		t.Errorf("rank 0's pending receive from rank 1: %v, want ErrPeerDown naming the exited plugin", err)
	}
	got := 0
	for _, r := range recvs {
		if _, err := wait(t, r); err == nil {
			got++
		} else if !errors.Is(err, ErrPeerDown) {
			t.Errorf("rank 1's receive: %v, want success or ErrPeerDown", err)
		}
	}
	if got != 3 {
		t.Errorf("rank 1 received %d messages, want the 3 the plugin carried before it crashed", got)
	}
}

// TestTableRoutesOverSelf: "self" is the device's path to its own rank. A
// table that routes another rank over it once opened, and the first send
// there failed with the peer down; plugins.hcl could even define a
// subdevice of that name beside it. Open now says what is wrong.
func TestTableRoutesOverSelf(t *testing.T) {
	table := &conntable.Table{Version: conntable.Version, Peers: []conntable.Entry{{To: conntable.SelectAll, Routes: map[string][]conntable.Route{conntable.AllClasses: {{SubDevice: "self"}}}}}}
	plugins := &PluginsConfig{SubDevices: []SubDeviceSpec{{Name: "shm", Enabled: true}}}
	devs, errs := openPluginJob(t, 2, plugins, table, hclog.NewNullLogger())
	closeAll(devs)
	for r, err := range errs {
		if !errors.Is(err, ErrNoRoute) || !strings.Contains(err.Error(), `over "self", the path to this rank itself`) || !strings.Contains(err.Error(), "(loaded: [shm])") {
			t.Errorf("open rank %d with a table routing over self: %v; want ErrNoRoute naming self and the loaded [shm]", r, err)
		}
	}
}

// TestUnknownBuiltin: a subdevice that is neither registered nor a plugin
// is named in Open's error, by its block in plugins.hcl or, in a config
// made in code, by its name (the error once began "multidevice: : sdi").
func TestUnknownBuiltin(t *testing.T) {
	for _, tc := range []struct{ where, want string }{
		{"", `multidevice: subdevice "tpc": sdi: unknown subdevice "tpc"`},
		{"p.hcl:3,1-16", `multidevice: p.hcl:3,1-16: sdi: unknown subdevice "tpc"`},
	} {
		plugins := &PluginsConfig{SubDevices: []SubDeviceSpec{{Name: "tpc", Enabled: true, Where: tc.where}}}
		devs, errs := openPluginJob(t, 1, plugins, nil, hclog.NewNullLogger())
		closeAll(devs)
		if err := errs[0]; !errors.Is(err, sdi.ErrUnknownSubDevice) || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Open = %v, want ErrUnknownSubDevice starting %q", err, tc.want)
		}
	}
}
