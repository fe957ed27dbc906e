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

// hostHelper is main of a host process that starts the plugin path args,
// asks its Info, opens it if open says so (a rank may die between the two,
// or in an Open that takes long), prints the plugin's pid and waits to be
// killed.
func hostHelper(path string, args []string, open bool) {
	c, err := plugin.Start(context.Background(), plugin.Config{Name: "fab", Path: path, Args: args})
	if err == nil {
		_, err = c.Info(context.Background())
	}
	if err == nil && open {
		_, err = c.Open(context.Background(), sdi.OpenParams{Rank: 0, Size: 1, APIVersion: sdi.APIVersion, Handler: nopHandler{},
			Config: []byte(`{"listen": "127.0.0.1:0"}`)})
	}
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println(c.PID())
	select {}
}

// TestPluginExitsWithoutHost: when the host dies without closing (SIGKILL),
// its plugin notices and exits; no process is left behind. A plugin that
// was never opened has no Transfer stream to see end, and once ran on.
func TestPluginExitsWithoutHost(t *testing.T) {
	exe, _ := os.Executable()
	for _, helper := range []string{"host", "host-unopened"} {
		t.Run(helper, func(t *testing.T) {
			host := exec.Command(exe, helperArg, helper)
			out, err := host.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := host.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { host.Process.Kill(); host.Wait() })
			line, err := bufio.NewReader(out).ReadString('\n')
			if err != nil {
				t.Fatalf("host helper: %v", err)
			}
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
