package mdconfig

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
)

// WriteTables writes dir/<host>.json for every host and returns how many it
// wrote. The tables go into a temporary directory beside dir first and are
// moved into place only when every one of them was written, so a failure
// leaves dir as it was: a new dir is created by a single rename; an
// existing one receives each file by rename, after every target was checked,
// and the tables it replaces are kept until all are in place and put back if
// one fails, so that a job never loads tables of two generations. Files in
// an existing dir that this description does not produce are left alone.
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
	keep := false // the previous tables left in tmp/old are their only copy
	defer func() {
		if !keep {
			os.RemoveAll(tmp) // a no-op once renamed into place
		}
	}()
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
	if err := replaceFiles(tmp, dir, names); err != nil {
		keep = errors.Is(err, errMixed)
		return 0, fmt.Errorf("write tables: %w", err)
	}
	return len(names), nil
}

// errMixed marks a WriteTables failure that left dir with tables of two
// generations; the replaced ones stay in the temporary directory.
var errMixed = errors.New("some tables could not be put back")

// renameFile is os.Rename; tests replace it to fail partway.
var renameFile = os.Rename

// replaceFiles moves the named files from tmp into dir, all or none. The
// whole directory cannot be swapped for tmp: dir may hold files that are
// not ours. So every target is checked first (a directory in the way is
// the failure a rename meets after others succeeded), and each file a
// rename replaces is kept in tmp/old, as a second link where the file
// system allows it so that the target never goes missing, to be put back
// if a later rename fails.
func replaceFiles(tmp, dir string, names []string) error {
	for _, name := range names {
		if info, err := os.Lstat(filepath.Join(dir, name)); err == nil && info.IsDir() {
			return fmt.Errorf("%s is a directory; remove it or write the tables elsewhere", filepath.Join(dir, name))
		}
	}
	old := filepath.Join(tmp, "old")
	if err := os.Mkdir(old, 0o700); err != nil {
		return err
	}
	type moved struct {
		name   string
		backup bool // the target existed and is kept in old
	}
	var done []moved
	undo := func(cause error) error {
		var errs []error
		for _, m := range slices.Backward(done) {
			target := filepath.Join(dir, m.name)
			var err error
			if m.backup {
				err = renameFile(filepath.Join(old, m.name), target)
			} else if err = os.Remove(target); errors.Is(err, fs.ErrNotExist) {
				err = nil // its rename was the one that failed
			}
			if err != nil {
				errs = append(errs, err)
			}
		}
		if len(errs) > 0 {
			return fmt.Errorf("%w; putting the previous tables back also failed, so %s mixes old and new tables (%w; the previous ones are kept in %s): %w",
				cause, dir, errMixed, old, errors.Join(errs...))
		}
		return cause
	}
	for _, name := range names {
		target := filepath.Join(dir, name)
		m := moved{name: name}
		if _, err := os.Lstat(target); err == nil {
			bak := filepath.Join(old, name)
			if os.Link(target, bak) != nil {
				if err := renameFile(target, bak); err != nil {
					return undo(err)
				}
			}
			m.backup = true
		} else if !errors.Is(err, fs.ErrNotExist) {
			return undo(err)
		}
		// Recorded before the rename: if it fails after the target was
		// moved aside, undo puts the old table back.
		done = append(done, m)
		if err := renameFile(filepath.Join(tmp, name), target); err != nil {
			return undo(err)
		}
	}
	return nil
}
