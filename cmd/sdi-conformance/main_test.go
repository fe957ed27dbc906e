package main

import (
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
	if out, err := exec.Command(conf).CombinedOutput(); err == nil || !strings.Contains(string(out), "usage: sdi-conformance") {
		t.Fatalf("no -plugin: %v\n%s", err, out)
	}
}
