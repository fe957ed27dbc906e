package mdconfig

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// WriteTables writes dir/<host>.json for every host and returns how many it
// wrote. The tables go into a temporary directory beside dir first and are
// moved into place only when every one of them was written, so a failure
// leaves dir as it was: a new dir is created by a single rename, an existing
// one receives each file by rename. Files in an existing dir that this
// description does not produce are left alone.
func WriteTables(d *Description, dir string) (int, error) {
	dir = filepath.Clean(dir)
	info, err := os.Stat(dir)
	exists := err == nil
	switch {
	case exists && !info.IsDir():
		return 0, fmt.Errorf("write tables: %s exists and is not a directory", dir)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return 0, fmt.Errorf("write tables: %w", err)
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return 0, fmt.Errorf("write tables: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".tmp-*")
	if err != nil {
		return 0, fmt.Errorf("write tables: %w", err)
	}
	defer os.RemoveAll(tmp) // a no-op once renamed into place
	var names []string
	for t := range d.Tables() {
		data, err := t.Encode()
		if err != nil {
			return 0, fmt.Errorf("write tables: host %s: %w", t.Host, err)
		}
		name := t.Host + ".json"
		if err := os.WriteFile(filepath.Join(tmp, name), data, 0o644); err != nil {
			return 0, fmt.Errorf("write tables: %w", err)
		}
		names = append(names, name)
	}
	if !exists {
		if err := os.Chmod(tmp, 0o755); err != nil {
			return 0, fmt.Errorf("write tables: %w", err)
		}
		if err := os.Rename(tmp, dir); err != nil {
			return 0, fmt.Errorf("write tables: %w", err)
		}
		return len(names), nil
	}
	for _, name := range names {
		if err := os.Rename(filepath.Join(tmp, name), filepath.Join(dir, name)); err != nil {
			return 0, fmt.Errorf("write tables: %w", err)
		}
	}
	return len(names), nil
}
