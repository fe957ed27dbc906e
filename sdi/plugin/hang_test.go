package plugin_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/internal/testlog"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/plugin"
)

// downHandler records PeerDown calls.
type downHandler struct {
	nopHandler
	mu    sync.Mutex
	downs []error
	ch    chan struct{}
}

func (h *downHandler) PeerDown(_ sdi.Rank, err error) {
	h.mu.Lock()
	h.downs = append(h.downs, err)
	h.mu.Unlock()
	select {
	case h.ch <- struct{}{}:
	default:
	}
}

// TestHangMidJob: a plugin that stops answering mid-job (here: stopped by
// SIGSTOP) is taken out within its timeout; its peers are reported down and
// sends fail instead of waiting.
func TestHangMidJob(t *testing.T) {
	var cs [2]*plugin.Client
	for i := range cs {
		c, err := startHelperTimeout(t, "v1", nil, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		cs[i] = c
	}
	hs, locals := openPair(t, cs, "hang")
	ctx := context.Background()
	if !locals[1].Caps.Flags.Has(sdi.FlagPoll) {
		t.Fatal("the helper has no ring plane: the polls below would test nothing")
	}
	cs[1].Poll() // a polling spell is on when the plugin is taken out
	pid := cs[1].PID()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	start := time.Now()
	select {
	case <-hs[1].ch:
	case <-time.After(20 * time.Second):
		t.Fatal("the stopped plugin was not taken out")
	}
	t.Logf("taken out after %v", time.Since(start).Round(time.Millisecond))
	hs[1].mu.Lock()
	err := hs[1].downs[0]
	hs[1].mu.Unlock()
	if !errors.Is(err, plugin.ErrPluginExited) {
		t.Errorf("PeerDown(%v), want it to wrap ErrPluginExited", err)
	}
	if _, err := cs[1].Send(&sdi.Frame{Peer: 0, Payload: []byte("x")}); !errors.Is(err, sdi.ErrPeerUnreachable) || !errors.Is(err, plugin.ErrPluginExited) {
		t.Errorf("Send after the plugin hung = %v, want ErrPeerUnreachable and ErrPluginExited", err)
	}
	// A rank may still poll it: the ring's segment is unmapped, and Poll
	// and Idle once wrote into it and crashed the process (the spell's
	// ticks, its end, a new spell's start).
	for range 100 {
		cs[1].Poll()
	}
	cs[1].Idle()
	cs[1].Poll()
	done := make(chan error, 1)
	go func() { done <- cs[1].Close(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Close = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close of a hung plugin hangs")
	}
}

// TestCloseIsGraceful: Close lets the plugin exit on its own, with both
// data planes; only a plugin that was taken out is killed.
func TestCloseIsGraceful(t *testing.T) {
	exe, _ := os.Executable()
	for _, stream := range []bool{false, true} {
		var logs testlog.Buffer
		log := hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Debug})
		c, err := plugin.Start(context.Background(), plugin.Config{Name: "fab", Path: exe, Args: []string{helperArg, "v1"}, Stream: stream, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Open(context.Background(), sdi.OpenParams{Rank: 0, Size: 1, APIVersion: sdi.APIVersion, Handler: nopHandler{},
			Config: []byte(`{"listen": "127.0.0.1:0"}`)}); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		l := logs.String()
		if !strings.Contains(l, "plugin process exited") || strings.Contains(l, "killed") || strings.Contains(l, "taken out") {
			t.Errorf("stream=%v: the plugin did not exit on its own:\n%s", stream, l)
		}
		if testing.Verbose() {
			t.Log(l)
		}
	}
}

// openPair opens the tcp helper plugins cs as ranks 0 and 1 of job, each
// with a handler that records PeerDown, and connects them.
func openPair(t *testing.T, cs [2]*plugin.Client, job string) ([2]*downHandler, [2]sdi.Local) {
	t.Helper()
	var hs [2]*downHandler
	var locals [2]sdi.Local
	ctx := context.Background()
	for i, c := range cs {
		hs[i] = &downHandler{ch: make(chan struct{}, 1)}
		var err error
		locals[i], err = c.Open(ctx, sdi.OpenParams{Rank: sdi.Rank(i), Size: 2, Host: "h", JobID: job, Secret: []byte("s"),
			APIVersion: sdi.APIVersion, Handler: hs[i], Config: []byte(`{"listen": "127.0.0.1:0"}`)})
		if err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range cs {
		if err := c.Connect(ctx, sdi.Rank(1-i), locals[1-i].Addr); err != nil {
			t.Fatal(err)
		}
	}
	return hs, locals
}
