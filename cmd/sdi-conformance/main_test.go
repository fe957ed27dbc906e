package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestAgainstExample builds the command and the example plugin and runs a
// few checks, passing and failing.
func TestAgainstExample(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries; skipped with -short")
	}
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", dir+"/", ".", "../../examples/subdevice-plugin")
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	conf := filepath.Join(dir, "sdi-conformance")
	plugin := filepath.Join(dir, "subdevice-plugin")
	config := `{"dir": "` + dir + `"}`

	out, err := exec.Command(conf, "-plugin", plugin, "-config", config, "-test.run", "Conformance/(Info|Send|PingPong)").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: Conformance/Send/Sizes") || !strings.Contains(string(out), "\nPASS") {
		t.Fatalf("passing run: %v\n%s", err, out)
	}
	// A config the subdevice refuses fails the checks, and the exit status says so.
	out, err = exec.Command(conf, "-plugin", plugin, "-config", `{"colour": 1}`, "-test.run", "Conformance/Open").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "unknown field") || !strings.Contains(string(out), "FAIL") {
		t.Fatalf("failing run: %v\n%s", err, out)
	}
	// Usage errors exit with status 2 and say what is wrong, before any check runs.
	usage := []struct {
		name string
		args []string
		want string
	}{
		{"no -plugin", nil, "usage: sdi-conformance"},
		// The help promises every skip states its reason; an empty one
		// would print a skip that explains nothing.
		{"-skip without a reason", []string{"-plugin", plugin, "-skip", "Send/Sizes"}, `-skip "Send/Sizes" has no reason`},
		{"-skip with an empty reason", []string{"-plugin", plugin, "-skip", "PingPong/1000=ok,Send/Sizes="}, `-skip "Send/Sizes=" has no reason`},
	}
	for _, tc := range usage {
		out, err := exec.Command(conf, tc.args...).CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), tc.want) {
			t.Errorf("%s: %v, want exit status 2 and %q in:\n%s", tc.name, err, tc.want, out)
		}
	}
}
