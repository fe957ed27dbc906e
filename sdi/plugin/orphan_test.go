package plugin_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/plugin"
)

// hostStage is how far a host helper gets with its plugin before it
// waits to be killed.
type hostStage int

const (
	hostStarted hostStage = iota // Info answered
	hostOpened                   // and the subdevice opened
	hostClosed                   // and closed, without the shutdown that Close follows it with
)

// hostHelper is main of a host process that starts the plugin path args,
// asks its Info and goes on to stage (a rank may die between Info and
// Open, in an Open that takes long, or in its Close), prints the plugin's
// pid and waits to be killed.
func hostHelper(path string, args []string, stage hostStage) {
	ctx := context.Background()
	c, err := plugin.Start(ctx, plugin.Config{Name: "fab", Path: path, Args: args})
	if err == nil {
		_, err = c.Info(ctx)
	}
	if err == nil && stage >= hostOpened {
		_, err = c.Open(ctx, sdi.OpenParams{Rank: 0, Size: 1, APIVersion: sdi.APIVersion, Handler: nopHandler{},
			Config: []byte(`{"listen": "127.0.0.1:0"}`)})
	}
	if err == nil && stage >= hostClosed {
		err = c.CloseSubDevice(ctx)
	}
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println(c.PID())
	select {}
}

// TestPluginExitsWithoutHost: when the host dies (SIGKILL), its plugin
// notices and exits; no process is left behind. A plugin that was never
// opened has no Transfer stream to see end, and once ran on; so did one
// whose host died between closing the subdevice and shutting the plugin
// down, which took the end of its host for the expected end of a Close.
// Each plugin has a process group of its own, which the kill of the
// rank's group does not reach.
func TestPluginExitsWithoutHost(t *testing.T) {
	exe, _ := os.Executable()
	for _, helper := range []string{"host", "host-unopened", "host-closed"} {
		t.Run(helper, func(t *testing.T) {
			host, line := startHost(t, exe, helper)
			pid, err := strconv.Atoi(strings.TrimSpace(line))
			if err != nil {
				t.Fatalf("host helper said %q", line)
			}
			host.Process.Kill()
			host.Wait()
			deadline := time.Now().Add(15 * time.Second)
			for alive(pid) {
				if time.Now().After(deadline) {
					if p, err := os.FindProcess(pid); err == nil {
						p.Kill()
					}
					t.Fatalf("plugin %d still runs 15s after its host was killed", pid)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// alive reports whether pid runs (a zombie waiting for init counts as gone).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z" && f[2] != "X"
}

// startHost starts this test binary as a host helper with args and returns
// it, with the first line it printed; the test's end kills it.
func startHost(t *testing.T, exe string, args ...string) (*exec.Cmd, string) {
	t.Helper()
	host := exec.Command(exe, append([]string{helperArg}, args...)...)
	out, err := host.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Process.Kill(); host.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.HasPrefix(line, "error") {
		t.Fatalf("host helper: %q, %v", line, err)
	}
	return host, line
}
