package plugin_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/internal/testlog"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/plugin"
	"github.com/hpc-multidevice/multidevice/subdevices/tcp"
)

// stderrLine is what the "stderr-in-open" helper writes to os.Stderr.
const stderrLine = "plain text on the plugin's stderr"

// stderrInOpen writes a line of plain text to os.Stderr in Open, as plugin
// code (or a library it uses) may, after go-plugin took os.Stderr over.
type stderrInOpen struct{ sdi.SubDevice }

func serveStderrInOpen() {
	plugin.Serve(func(l hclog.Logger) sdi.SubDevice { return stderrInOpen{tcp.New(l)} })
}

func (s stderrInOpen) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	fmt.Fprintln(os.Stderr, stderrLine)
	l, err := s.SubDevice.Open(ctx, p)
	l.Caps.Flags &^= sdi.FlagJobCards | sdi.FlagPoll | sdi.FlagIdle // the embedding hides their interfaces
	return l, err
}

// TestPluginLogs: what the host logs about a plugin says what happened. A
// plain line on the plugin's stderr reaches the host's log (it once went
// nowhere, though a panic's text did); a binary that never started is not
// said to have "failed to exit gracefully"; a plugin whose subdevice names
// itself differently from its plugins.hcl block is not accepted silently.
func TestPluginLogs(t *testing.T) {
	exe, _ := os.Executable()
	for _, tc := range []struct {
		name    string
		path    string
		args    []string
		want    []string // in the log, in time
		notWant string
	}{
		{"stderr line", exe, []string{helperArg, "stderr-in-open"}, []string{stderrLine}, ""},
		{"never started", filepath.Join(t.TempDir(), "missing"), nil, nil, "exit gracefully"},
		{"other name", exe, []string{helperArg, "v1"}, []string{"plugin=fab", "subdevice=tcp"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs testlog.Buffer
			log := hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Debug})
			ctx := context.Background()
			c, err := plugin.Start(ctx, plugin.Config{Name: "fab", Path: tc.path, Args: tc.args, Logger: log})
			if err == nil {
				defer c.Close(ctx)
				if _, err := c.Info(ctx); err != nil {
					t.Fatal(err)
				}
				if _, err := c.Open(ctx, sdi.OpenParams{Rank: 0, Size: 1, APIVersion: sdi.APIVersion, Handler: nopHandler{},
					Config: []byte(`{"listen": "127.0.0.1:0"}`)}); err != nil {
					t.Fatal(err)
				}
			}
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				l := logs.String()
				missing := ""
				for _, w := range tc.want {
					if !strings.Contains(l, w) {
						missing = w
					}
				}
				if tc.notWant != "" && strings.Contains(l, tc.notWant) {
					t.Fatalf("the log says %q:\n%s", tc.notWant, l)
				}
				if missing == "" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the log lacks %q:\n%s", missing, l)
				}
			}
		})
	}
}
