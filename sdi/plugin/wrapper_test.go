package plugin_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi/plugin"
)

// writeWrapper writes a plugins.hcl `command` of the common kind that runs
// its program without exec (after module loads, LD_LIBRARY_PATH, ...): the
// shell stays the host's child and the program is its child. The program's
// pid goes to the returned file.
func writeWrapper(t *testing.T, program string) (script, pidFile string) {
	t.Helper()
	dir := t.TempDir()
	script, pidFile = filepath.Join(dir, "wrap.sh"), filepath.Join(dir, "pid")
	body := "#!/bin/sh\n" + program + " &\necho $! > " + pidFile + "\nwait\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return script, pidFile
}

// readPID waits for the pid a wrapper script wrote.
func readPID(t *testing.T, file string) int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile(file)
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && strings.HasSuffix(string(b), "\n") {
			return pid
		}
	}
	t.Fatalf("no pid in %s", file)
	return 0
}

// waitGone fails the test if pid still runs after d, and kills it then.
func waitGone(t *testing.T, pid int, d time.Duration, what string) {
	t.Helper()
	for deadline := time.Now().Add(d); alive(pid); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("%s: process %d still runs %v later", what, pid, d)
		}
	}
}

// TestWrapperScriptHang: behind a wrapper script, a plugin that stops
// answering keeps the plugin's stderr pipe open after the shell is killed.
// The host must still report its peers down promptly ("Nothing waits for
// it", plugins.hcl.md) and kill the program too, not only the shell.
func TestWrapperScriptHang(t *testing.T) {
	exe, _ := os.Executable()
	var cs [2]*plugin.Client
	var pidFiles [2]string
	ctx := context.Background()
	for i := range cs {
		var script string
		script, pidFiles[i] = writeWrapper(t, "'"+exe+"' "+helperArg+" v1")
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		c, err := plugin.Start(sctx, plugin.Config{Name: "fab", Path: script, Timeout: time.Second})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		cs[i] = c
	}
	hs, _ := openPair(t, cs, "wrap")
	pid := readPID(t, pidFiles[1])
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL); syscall.Kill(pid, syscall.SIGCONT) })
	select {
	case <-hs[1].ch:
	case <-time.After(10 * time.Second):
		t.Fatal("a plugin behind a wrapper script stopped answering: no PeerDown 10s later, with timeout = 1s")
	}
	waitGone(t, pid, 5*time.Second, "the hung program behind the wrapper after it was taken out")
}

// TestWrapperScriptStartFails: a wrapper whose program never completes the
// handshake fails Start within the timeout, though the program holds the
// plugin's stdout and stderr open, and the program is not left behind.
func TestWrapperScriptStartFails(t *testing.T) {
	script, pidFile := writeWrapper(t, "sleep 60")
	start := time.Now()
	_, err := plugin.Start(context.Background(), plugin.Config{Name: "fab", Path: script, Timeout: time.Second})
	took := time.Since(start)
	if err == nil {
		t.Fatal("Start of a program that never handshakes succeeded")
	}
	if took > 4*time.Second {
		t.Errorf("Start failed after %v, with timeout = 1s: %v", took.Round(time.Millisecond), err)
	}
	waitGone(t, readPID(t, pidFile), 5*time.Second, "the program behind a wrapper that failed its start")
}

// TestWrapperScriptOutlivesHost: when the host dies without closing
// (SIGKILL), a plugin behind a wrapper script exits too, though its parent,
// the shell, lives on. It is not opened: an open plugin sees its Transfer
// stream end, an unopened one has only its watch of the host.
func TestWrapperScriptOutlivesHost(t *testing.T) {
	exe, _ := os.Executable()
	script, pidFile := writeWrapper(t, "'"+exe+"' "+helperArg+" v1")
	host, _ := startHost(t, exe, "host-of:"+script)
	pid := readPID(t, pidFile)
	host.Process.Kill()
	host.Wait()
	waitGone(t, pid, 5*time.Second, "the plugin behind a wrapper after its host was killed")
}

// TestWrapperScriptChildEndsWithClose: what a wrapper script starts besides
// the plugin ends with a normal Close too, even when it does not hold the
// plugin's output open (so go-plugin does not wait for it) and outlives
// the shell, which go-plugin reaps: Close kills the plugin's process group
// after a graceful exit as well.
func TestWrapperScriptChildEndsWithClose(t *testing.T) {
	exe, _ := os.Executable()
	dir := t.TempDir()
	script, pidFile := filepath.Join(dir, "wrap.sh"), filepath.Join(dir, "pid")
	body := "#!/bin/sh\nsleep 60 </dev/null >/dev/null 2>&1 &\necho $! > " + pidFile + "\n'" + exe + "' " + helperArg + " v1\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c, err := plugin.Start(ctx, plugin.Config{Name: "fab", Path: script, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	pid := readPID(t, pidFile)
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid, 2*time.Second, "a process the wrapper script started, after Close")
}
