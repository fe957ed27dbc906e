package plugin_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/plugin"
)

// TestStartFailureSaysWhy: a plugin that exits before its handshake and
// says why on stderr (a missing device, a missing library) has its last
// lines in Start's error. go-plugin logs such raw lines at Debug only, so
// at the default level the reason was lost. Only the end of a long stderr
// is kept.
func TestStartFailureSaysWhy(t *testing.T) {
	const why = "sdi-mine: cannot open /dev/infiniband/uverbs0: no such device"
	for _, tc := range []struct {
		name, script string
	}{
		{"one line", "echo '" + why + "' >&2\nexit 1\n"},
		{"after much output", "i=0\nwhile [ $i -lt 500 ]; do echo \"noise line $i of the plugin's start\" >&2; i=$((i+1)); done\necho '" + why + "' >&2\nexit 1\n"},
		{"after a very long line", "head -c 100000 /dev/zero | tr '\\0' x >&2\necho >&2\necho '" + why + "' >&2\nexit 1\n"},
		{"no newline", "printf '%s' '" + why + "' >&2\nexit 1\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			script := filepath.Join(t.TempDir(), "sdi-mine")
			if err := os.WriteFile(script, []byte("#!/bin/sh\n"+tc.script), 0o755); err != nil {
				t.Fatal(err)
			}
			_, err := plugin.Start(context.Background(), plugin.Config{Name: "mine", Path: script, Timeout: 5 * time.Second})
			if !errors.Is(err, plugin.ErrStart) || !strings.Contains(err.Error(), why) {
				t.Fatalf("Start = %v; want ErrStart with the plugin's reason %q", err, why)
			}
			if len(err.Error()) > 8<<10 {
				t.Fatalf("Start's error has %d bytes: the plugin's stderr is not bounded", len(err.Error()))
			}
		})
	}
}

// TestStartHonoursCancel: a Start whose context is cancelled (the job
// aborted) while the plugin hangs before its handshake returns at once and
// leaves no process behind. It used ctx only for its deadline, and waited
// out the whole timeout.
func TestStartHonoursCancel(t *testing.T) {
	script, pidFile := writeWrapper(t, "sleep 60")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		readPID(t, pidFile) // the program runs: Start is waiting for its handshake
		cancel()
	}()
	start := time.Now()
	_, err := plugin.Start(ctx, plugin.Config{Name: "slow", Path: script, Timeout: 10 * time.Second})
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Start returned %v after %v, though its context was cancelled at once", err, d.Round(time.Millisecond))
	}
	if !errors.Is(err, plugin.ErrStart) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Start = %v; want ErrStart wrapping context.Canceled", err)
	}
	waitGone(t, readPID(t, pidFile), 5*time.Second, "the program behind a wrapper whose Start was cancelled")
}

// slowOpen's Open waits as long as its caller lets it (a fabric that waits
// for its device or its peers).
type slowOpen struct{ sdi.SubDevice }

func (slowOpen) Open(ctx context.Context, _ sdi.OpenParams) (sdi.Local, error) {
	<-ctx.Done()
	return sdi.Local{}, ctx.Err()
}

// TestCloseDuringOpen: Close while Open is in flight (a rank shutting down
// while it starts) ends the plugin promptly and fails that Open with
// sdi.ErrClosed. Close once waited for Open's lock, so for Open's whole
// timeout, whatever its own ctx said.
func TestCloseDuringOpen(t *testing.T) {
	c, err := startHelperTimeout(t, "slow-open", nil, 8*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	opened := make(chan error, 1)
	go func() {
		_, err := c.Open(context.Background(), sdi.OpenParams{Rank: 0, Size: 2, APIVersion: sdi.APIVersion, Handler: nopHandler{}})
		opened <- err
	}()
	time.Sleep(200 * time.Millisecond) // Open is in the plugin
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	err = c.Close(ctx)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Close = %v after %v (its ctx allowed 1s, Open's timeout is 8s)", err, d.Round(time.Millisecond))
	}
	select {
	case err := <-opened:
		if !errors.Is(err, sdi.ErrClosed) {
			t.Errorf("Open cut short by Close = %v, want sdi.ErrClosed", err)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("Open did not return after Close")
	}
}
