package mdconfig

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// goldenCases are what the golden files pin for each example: the tables
// of a few hosts (as written by generate), route explanations and the dot
// drawing.
var goldenCases = []struct {
	example string
	tables  []string
	routes  [][2]string
}{
	{"oscar", []string{"oscar03", "oscar08", "oscar11"}, [][2]string{{"oscar03", "oscar11"}, {"oscar01", "oscar02"}}},
	{"two-clusters", []string{"a03", "a15", "b11"}, [][2]string{{"a03", "b11"}, {"a15", "b16"}}},
	{"relays", []string{"p03", "p-relay", "q-relay"}, [][2]string{{"p03", "q11"}, {"q-relay", "p-relay"}}},
	{"spare", []string{"c01", "login"}, [][2]string{{"c01", "c05"}, {"login", "c03"}}},
}

func TestGolden(t *testing.T) {
	for _, gc := range goldenCases {
		t.Run(gc.example, func(t *testing.T) {
			path := filepath.Join("..", "examples", "networks", gc.example+".hcl")
			src, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			d, diags := Parse(src, gc.example+".hcl")
			if diags.HasErrors() {
				t.Fatal(FormatDiagnostics(diags, src))
			}
			dir := filepath.Join("testdata", gc.example)
			check(t, filepath.Join(dir, "check.txt"), []byte(FormatDiagnostics(diags, src)))
			for _, h := range gc.tables {
				tab, err := d.Table(h)
				if err != nil {
					t.Fatal(err)
				}
				data, err := tab.Encode()
				if err != nil {
					t.Fatal(err)
				}
				check(t, filepath.Join(dir, "tables", h+".json"), data)
			}
			var routes strings.Builder
			for _, pair := range gc.routes {
				reps, err := d.Route(pair[0], pair[1], 0)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range reps {
					routes.WriteString(r.String())
					routes.WriteString("\n")
				}
			}
			check(t, filepath.Join(dir, "routes.txt"), []byte(routes.String()))
			dot, err := d.Dot(DotOptions{From: gc.routes[0][0], To: gc.routes[0][1], Size: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			check(t, filepath.Join(dir, "graph.dot"), dot)
		})
	}
}

// check compares got with a golden file, or rewrites it under -update.
func check(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./mdconfig -run TestGolden -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from what the code produces now; if the change is intended, rerun with -update.\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}
