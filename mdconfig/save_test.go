package mdconfig

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWriteTablesAllOrNothing: WriteTables promises that a failure leaves
// dir as it was. Into an existing dir it moved the tables one by one, so a
// failure partway left some replaced and a job would load tables of two
// generations. Each failing case checks dir is exactly as before.
func TestWriteTablesAllOrNothing(t *testing.T) {
	d := mustParse(t, []byte(base))
	for _, tc := range []struct {
		name    string
		setup   func(t *testing.T, dir string)
		failOn  string // renameFile fails moving this file into dir
		wantErr string // "" for success
	}{{
		name: "replaces its tables, keeps other files",
		setup: func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "a01.json"), "old")
			writeFile(t, filepath.Join(dir, "notes.txt"), "mine")
		},
	}, {
		name: "a target is a directory",
		setup: func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "a01.json"), "old")
			writeFile(t, filepath.Join(dir, "a02.json", "x"), "in the way")
		},
		wantErr: "a02.json is a directory",
	}, {
		name: "a rename fails after others succeeded",
		setup: func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "a01.json"), "old")
			writeFile(t, filepath.Join(dir, "a04.json"), "old4")
		},
		failOn:  "a03.json",
		wantErr: "injected",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "tables")
			tc.setup(t, dir)
			before := dirContents(t, dir)
			if tc.failOn != "" {
				defer func(f func(string, string) error) { renameFile = f }(renameFile)
				renameFile = func(from, to string) error {
					if to == filepath.Join(dir, tc.failOn) {
						return errors.New("injected")
					}
					return os.Rename(from, to)
				}
			}
			n, err := WriteTables(d, dir)
			after := dirContents(t, dir)
			if tc.wantErr == "" {
				if err != nil || n != 4 {
					t.Fatalf("WriteTables = %d, %v; want 4 tables", n, err)
				}
				if after["notes.txt"] != "mine" || !strings.Contains(after["a01.json"], `"host": "a01"`) {
					t.Errorf("after WriteTables: %v", after)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("WriteTables = %d, %v; want an error containing %q", n, err, tc.wantErr)
			}
			if !maps.Equal(before, after) {
				t.Errorf("WriteTables failed (%v) but changed dir:\nbefore %.60q\nafter  %.60q", err, before, after)
			}
		})
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// dirContents maps the names in dir to their contents ("<dir>" for a
// directory).
func dirContents(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range ents {
		if e.IsDir() {
			out[e.Name()] = "<dir>"
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = string(data)
	}
	return out
}

// TestWriteTablesKeepsOldWhenPutBackFails: when a rename fails and putting
// a replaced table back fails too, dir mixes generations and the error
// says so; the replaced table must then survive, in the temporary
// directory the error names. It was removed with that directory, the
// only copy left.
func TestWriteTablesKeepsOldWhenPutBackFails(t *testing.T) {
	d := mustParse(t, []byte(base))
	dir := filepath.Join(t.TempDir(), "tables")
	writeFile(t, filepath.Join(dir, "a01.json"), "OLD-a01")
	defer func(f func(string, string) error) { renameFile = f }(renameFile)
	renameFile = func(from, to string) error {
		if to == filepath.Join(dir, "a02.json") || filepath.Base(filepath.Dir(from)) == "old" {
			return errors.New("injected")
		}
		return os.Rename(from, to)
	}
	_, err := WriteTables(d, dir)
	if err == nil || !strings.Contains(err.Error(), "mixes old and new tables") {
		t.Fatalf("WriteTables = %v; want an error saying dir mixes generations", err)
	}
	kept, _ := filepath.Glob(filepath.Join(filepath.Dir(dir), ".tables.tmp-*", "old", "a01.json"))
	if len(kept) != 1 || !strings.Contains(err.Error(), filepath.Dir(kept[0])) {
		t.Fatalf("the previous a01.json kept in %v; the error %q should name where", kept, err)
	}
	if b, _ := os.ReadFile(kept[0]); string(b) != "OLD-a01" {
		t.Errorf("kept a01.json holds %q", b)
	}
}
