package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hpc-multidevice/multidevice/conntable"
)

const example = "../../examples/networks/two-clusters.hcl"

func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return code, o.String(), e.String()
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const good = `subdevice "tcp" {
  latency   = "50us"
  bandwidth = "1Gbit/s"
}
network "eth" {
  subdevice = "tcp"
  hosts     = ["a[01-04]"]
}
`

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		code      int
		stderr    []string
	}{
		{"ok", good, 0, nil},
		{"warnings only", good + "network \"b\" {\n  subdevice = \"tcp\"\n  hosts = [\"b1\", \"b2\"]\n}\n", 0, []string{"net.hcl:7:16: warning: separate islands"}},
		{"error", strings.Replace(good, `"1Gbit/s"`, `"0Gbit/s"`, 1), 1, []string{"net.hcl:3:15: error: invalid bandwidth", "greater than zero", `3 |   bandwidth = "0Gbit/s"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, "net.hcl", tc.src)
			code, _, stderr := runCmd(t, "check", p)
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, tc.code, stderr)
			}
			for _, w := range tc.stderr {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr)
				}
			}
		})
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{}, {"frobnicate"}, {"check"}, {"check", "a.hcl", "b.hcl"}, {"generate", example},
		{"route", example, "--from", "a03"}, {"route", example, "--from", "a03", "--to", "b11", "--size", "big"},
		{"graph", example, "--from", "a03"}, {"check", "--nope", example},
	} {
		if code, _, _ := runCmd(t, args...); code != exitUsage {
			t.Errorf("mdconfig %v: exit %d, want %d", args, code, exitUsage)
		}
	}
	if code, _, _ := runCmd(t, "check", filepath.Join(t.TempDir(), "missing.hcl")); code != exitError {
		t.Errorf("missing file: exit %d, want %d", code, exitError)
	}
}

func TestGenerate(t *testing.T) {
	out := filepath.Join(t.TempDir(), "tables")
	code, stdout, stderr := runCmd(t, "generate", example, "-o", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "wrote 32 tables") {
		t.Errorf("stdout: %s", stdout)
	}
	files, _ := filepath.Glob(filepath.Join(out, "*.json"))
	if len(files) != 32 {
		t.Fatalf("%d files, want 32", len(files))
	}
	tab, err := conntable.Load(filepath.Join(out, "a03.json"))
	if err != nil {
		t.Fatal(err)
	}
	if tab.Host != "a03" || len(tab.Peers) != 32 { // @local + 31 hosts
		t.Errorf("a03.json: host %q, %d entries", tab.Host, len(tab.Peers))
	}
	// Regenerating into the existing directory works and keeps other files.
	keep := filepath.Join(out, "notes.txt")
	os.WriteFile(keep, []byte("mine"), 0o644)
	if code, _, stderr := runCmd(t, "generate", example, "-o", out); code != 0 {
		t.Fatalf("second run: exit %d: %s", code, stderr)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("generate removed an unrelated file: %v", err)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(out), ".tables.tmp-*")); len(leftovers) != 0 {
		t.Errorf("temporary directories left behind: %v", leftovers)
	}
}

func TestGenerateWritesNothingOnError(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "tables")
	bad := writeFile(t, "net.hcl", strings.Replace(good, `subdevice = "tcp"`, `subdevice = "tpc"`, 1))
	if code, _, _ := runCmd(t, "generate", bad, "-o", out); code != exitError {
		t.Errorf("exit %d, want %d", code, exitError)
	}
	// A file where the directory should go: refused before writing anything.
	blocker := filepath.Join(dir, "file")
	os.WriteFile(blocker, nil, 0o644)
	if code, _, stderr := runCmd(t, "generate", example, "-o", blocker); code != exitError || !strings.Contains(stderr, "not a directory") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %v, want only the blocking file", entries)
	}
}

func TestRoute(t *testing.T) {
	code, stdout, stderr := runCmd(t, "route", example, "--from", "a03", "--to", "b11", "--size", "1MiB")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, w := range []string{"a03 -> b11, class large", "a03        -> a15        verbs  on a-ib", "penalty 8us at a15", "for 1MiB", "alternative 1 (+0.0%)", "a16"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("stdout lacks %q:\n%s", w, stdout)
		}
	}
	if strings.Contains(stdout, "class small") {
		t.Errorf("--size 1MiB printed other classes:\n%s", stdout)
	}
	code, stdout, _ = runCmd(t, "route", "--from", "a03", "--to", "a04", example)
	if code != 0 || strings.Count(stdout, "class ") != 3 {
		t.Errorf("flags first, no size: exit %d, want three classes:\n%s", code, stdout)
	}
	if code, _, stderr := runCmd(t, "route", example, "--from", "a03", "--to", "zz"); code != exitError || !strings.Contains(stderr, `unknown host "zz"`) {
		t.Errorf("unknown host: exit %d, %q", code, stderr)
	}
}

func TestGraph(t *testing.T) {
	code, stdout, stderr := runCmd(t, "graph", example, "--from", "a03", "--to", "b11")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, w := range []string{"graph network {", `"net:campus"`, "fillcolor=gold", "color=red, penwidth=3"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("dot lacks %q", w)
		}
	}
}

// TestGraphSVG runs graph -o with a stand-in for Graphviz's dot, or none.
// With no dot, -o x.svg used to exit 0 with only a notice, having
// written no SVG and overwritten x.dot; and -o x.SVG wrote DOT text.
func TestGraphSVG(t *testing.T) {
	fake := t.TempDir()
	// dot -Tsvg: DOT on stdin, the drawing on stdout.
	script := "#!/bin/sh\necho '<svg>'; cat; echo '</svg>'\n"
	if err := os.WriteFile(filepath.Join(fake, "dot"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	withDot := fake + string(os.PathListSeparator) + os.Getenv("PATH")
	for _, tc := range []struct {
		name, path, out string
		code            int
		stderr          []string
	}{
		{name: "svg", path: withDot, out: "net.svg"},
		{name: "upper-case extension", path: withDot, out: "net.SVG"},
		{name: "no dot", path: t.TempDir(), out: "net.svg", code: exitError,
			stderr: []string{"graphviz dot not found", "install graphviz", "net.dot"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PATH", tc.path)
			dir := t.TempDir()
			mine := filepath.Join(dir, "net.dot")
			if err := os.WriteFile(mine, []byte("mine"), 0o644); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(dir, tc.out)
			code, _, stderr := runCmd(t, "graph", example, "-o", out)
			if code != tc.code {
				t.Fatalf("exit %d, want %d: %s", code, tc.code, stderr)
			}
			for _, w := range tc.stderr {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q: %s", w, stderr)
				}
			}
			if got, _ := os.ReadFile(mine); string(got) != "mine" {
				t.Errorf("%s was overwritten: %.40q", mine, got)
			}
			svg, err := os.ReadFile(out)
			switch {
			case tc.code != exitOK && err == nil:
				t.Errorf("failed, yet wrote %s", out)
			case tc.code == exitOK && !strings.HasPrefix(string(svg), "<svg>"):
				t.Errorf("%s is not what dot rendered: %.40q (%v)", out, svg, err)
			}
		})
	}
}

func TestBenchSmall(t *testing.T) {
	code, stdout, stderr := runCmd(t, "bench", "-clusters", "3", "-hosts", "5", "-encode")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, w := range []string{"15 hosts", "generated 15 tables", "peak RSS", "Lookup"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("stdout lacks %q:\n%s", w, stdout)
		}
	}
}
