// Package shmem creates and maps named shared-memory segments.
//
// A segment is a file in /dev/shm (tmpfs), created with mode 0600 so only the
// same user can map it, and mapped MAP_SHARED. Names are plain file names; a
// name from an untrusted source (a peer's business card) is checked with
// [ValidName] before use, so it can never point outside the directory.
//
// A named file is used because the SDI has no channel for passing file
// descriptors between processes; an fd channel would allow memfd_create with
// seals instead.
//
// # Usage
//
//	seg, err := shmem.Create("mdshm.job.r0.abcd", 1<<20)
//	...
//	defer seg.Close() // unmaps and, for the creator, unlinks
//
//	peer, err := shmem.Open("mdshm.job.r1.ef01")
package shmem

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Dir is where segments live. tmpfs keeps them in memory and allocates pages
// only when they are first touched, so a large, mostly unused segment is cheap.
const Dir = "/dev/shm"

// MaxNameLen bounds a segment name.
const MaxNameLen = 200

// Segment is one mapping of a named shared-memory file.
//
// Bytes may be used concurrently; Close must not race with uses of Bytes.
type Segment struct {
	name  string
	mem   []byte
	owner bool
}

// ValidName reports whether name is usable as a segment name: non-empty, at
// most MaxNameLen bytes, only ASCII letters, digits, '.', '_' and '-', and not
// starting with '.'.
func ValidName(name string) error {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("shmem: segment name length %d not in [1, %d]", len(name), MaxNameLen)
	}
	if name[0] == '.' {
		return fmt.Errorf("shmem: segment name %q starts with a dot", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == '-'
		if !ok {
			return fmt.Errorf("shmem: segment name %q has invalid byte %#x at %d", name, c, i)
		}
	}
	return nil
}

// Create makes a new zero-filled segment of size bytes and maps it. It fails
// if a segment with that name exists. The caller owns the segment: Close
// unlinks it.
func Create(name string, size int) (*Segment, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, fmt.Errorf("shmem: create %s: size %d must be > 0", name, size)
	}
	path := filepath.Join(Dir, name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("shmem: create: %w", err)
	}
	defer f.Close() // the mapping outlives the descriptor
	if err := f.Truncate(int64(size)); err != nil {
		return nil, errors.Join(fmt.Errorf("shmem: size %s: %w", path, err), os.Remove(path))
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("shmem: map %s: %w", path, err), os.Remove(path))
	}
	return &Segment{name: name, mem: mem, owner: true}, nil
}

// Open maps an existing segment, whole. Close unmaps it and leaves the file.
func Open(name string) (*Segment, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	path := filepath.Join(Dir, name)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("shmem: open: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("shmem: stat %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() || fi.Size() <= 0 || fi.Size() != int64(int(fi.Size())) {
		return nil, fmt.Errorf("shmem: open %s: not a usable segment (mode %v, size %d)", path, fi.Mode(), fi.Size())
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shmem: map %s: %w", path, err)
	}
	return &Segment{name: name, mem: mem}, nil
}

// Name returns the segment's name.
func (s *Segment) Name() string { return s.name }

// Bytes returns the mapping. It is valid until Close.
func (s *Segment) Bytes() []byte { return s.mem }

// Unlink removes the segment's name; existing mappings stay valid. Removing
// a name that is already gone is not an error.
func (s *Segment) Unlink() error {
	if err := os.Remove(filepath.Join(Dir, s.name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("shmem: unlink: %w", err)
	}
	return nil
}

// Close unmaps the segment and, if this mapping created it, unlinks it.
// Calling Close again does nothing.
func (s *Segment) Close() error {
	if s.mem == nil {
		return nil
	}
	var errs []error
	if err := unix.Munmap(s.mem); err != nil {
		errs = append(errs, fmt.Errorf("shmem: unmap %s: %w", s.name, err))
	}
	s.mem = nil
	if s.owner {
		errs = append(errs, s.Unlink())
	}
	return errors.Join(errs...)
}
