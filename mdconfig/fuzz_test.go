package mdconfig

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse feeds arbitrary text to Parse: it must never panic, and a
// description it accepts must give tables that validate and routes that
// explain.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("../examples/networks/*.hcl")
	for _, p := range files {
		if src, err := os.ReadFile(p); err == nil {
			f.Add(src)
		}
	}
	f.Add([]byte(base))
	f.Add([]byte(base + "penalty = \"off\"\nnetwork \"x\" {\n  subdevice = \"tcp\"\n  hosts = [\"a04\", \"b[1-3]\"]\n}\n"))
	f.Add([]byte(base + "size_class \"s\" {\n  max = \"1KiB\"\n  typical = 100\n}\nsize_class \"l\" {}\n"))
	f.Add([]byte("network \"n\" {\n  subdevice = \"tcp\"\n  hosts = \"a[01-16\"\n}\n"))
	f.Add([]byte("subdevice \"tcp\" {\n  class \"small\" {}\n}\n"))
	f.Fuzz(func(t *testing.T, src []byte) {
		d, diags := Parse(src, "fuzz.hcl")
		_ = FormatDiagnostics(diags, src)
		if diags.HasErrors() {
			if d != nil {
				t.Fatal("a Description came back with errors")
			}
			return
		}
		if len(d.hosts) > 64 {
			return // large but valid: routing them is for benchmarks, not fuzzing
		}
		for tab := range d.Tables() {
			if _, err := tab.Encode(); err != nil {
				t.Fatalf("table of %s: %v", tab.Host, err)
			}
		}
		if len(d.hosts) > 1 {
			if _, err := d.Route(d.hosts[0], d.hosts[len(d.hosts)-1], 0); err != nil && d.island[0] == d.island[len(d.hosts)-1] {
				t.Fatalf("route: %v", err)
			}
			if _, err := d.Dot(DotOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	})
}
