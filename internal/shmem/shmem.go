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
// # Stale segments
//
// A process that is killed or aborts never unlinks the segments it
// created, and under a process manager other than mdrun nobody removes
// them for it: their memory would stay in /dev/shm until reboot. So the
// creator holds a shared flock(2) on its segment for as long as it lives
// (the kernel drops it when the process dies, however it dies), and
// [RemoveStale] unlinks the segments whose lock nobody holds. A segment
// gets its name only once it is locked, sized and mapped, so a sweep
// never mistakes one that is being created for a stale one. Until then it
// is an unnamed file (O_TMPFILE), which dies with its process however
// that ends, even in the middle of reserving a large segment's memory;
// where the kernel has no O_TMPFILE it is made under a hidden temporary
// name instead, which a kill at that moment leaves behind.
//
// [JobPrefix] starts the names of a job's segments, so that a launcher
// can remove what its crashed ranks left (shm.RemoveJobSegments).
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
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

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
	name string
	mem  []byte
	// lock is the creator's open descriptor, holding the flock that
	// tells RemoveStale the segment is alive; nil for an opener.
	lock *os.File
	// file is an opener's descriptor, for CreatorLives; nil for the
	// creator.
	file *os.File
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

// JobPrefix starts the name of every segment of job jobID, whichever
// part of the library makes it: "mdshm.", 12 hex digits of the job's
// SHA-256, ".". A launcher that outlives the job removes them all
// (shm.RemoveJobSegments), and RemoveStale("mdshm.") finds them too.
func JobPrefix(jobID string) string {
	h := sha256.Sum256([]byte(jobID))
	return "mdshm." + hex.EncodeToString(h[:6]) + "."
}

// Create makes a new zero-filled segment of size bytes and maps it. It fails
// if a segment with that name exists. The caller owns the segment: it
// holds the segment's lock until Close, which unlinks it.
func Create(name string, size int) (*Segment, error) { return create(name, size, false) }

// CreateReserved is Create with the segment's memory allocated at once.
// tmpfs allocates a page when it is first touched, and a touch that finds
// Dir full kills the process with SIGBUS; a segment its creator will fill
// (a shared window) fails here instead, with an error that says so.
func CreateReserved(name string, size int) (*Segment, error) { return create(name, size, true) }

func create(name string, size int, reserve bool) (*Segment, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, fmt.Errorf("shmem: create %s: size %d must be > 0", name, size)
	}
	path := filepath.Join(Dir, name)
	f, link, discard, err := unnamed(name)
	if err != nil {
		return nil, fmt.Errorf("shmem: create %s: %w", path, err)
	}
	defer discard()
	fail := func(what string, err error) (*Segment, error) {
		f.Close()
		return nil, fmt.Errorf("shmem: %s %s: %w", what, path, err)
	}
	if err := lockFile(f, unix.LOCK_SH); err != nil {
		return fail("lock", err)
	}
	if err := f.Truncate(int64(size)); err != nil {
		return fail("size", err)
	}
	if reserve {
		if err := fallocateRange(f, 0, int64(size)); err != nil {
			return fail("reserve memory for", fmt.Errorf("%w%s", err, roomLeft(err)))
		}
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("map", err)
	}
	// Linking fails if the name exists, as O_EXCL would.
	if err := link(path); err != nil {
		unix.Munmap(mem)
		return fail("create", err)
	}
	return &Segment{name: name, mem: mem, lock: f}, nil
}

// unnamed opens a new file in Dir that has no name yet, the function
// that gives it one, and the one that removes what is left of it once it
// has its name or failed. The file is unnamed (O_TMPFILE) where the
// kernel allows it and /proc is there to name it through, and otherwise
// a hidden temporary that no sweep matches.
func unnamed(name string) (f *os.File, link func(path string) error, discard func(), err error) {
	fd, err := unix.Open(Dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err == nil {
		// Linking an unnamed file takes /proc/self/fd (AT_EMPTY_PATH
		// would need CAP_DAC_READ_SEARCH); a sandbox or chroot without
		// /proc takes the temporary instead.
		proc := fmt.Sprintf("/proc/self/fd/%d", fd)
		if unix.Access(proc, unix.F_OK) == nil {
			f := os.NewFile(uintptr(fd), filepath.Join(Dir, name))
			return f, func(path string) error {
				return unix.Linkat(unix.AT_FDCWD, proc, unix.AT_FDCWD, path, unix.AT_SYMLINK_FOLLOW)
			}, func() {}, nil
		}
		unix.Close(fd)
	}
	if f, err = os.CreateTemp(Dir, "."+name+"-"); err != nil {
		return nil, nil, nil, err
	}
	tmp := f.Name()
	return f, func(path string) error { return os.Link(tmp, path) }, func() { os.Remove(tmp) }, nil
}

// fallocateRange allocates n bytes of f from off, retrying when a signal
// interrupts it (a large tmpfs allocation takes long enough to meet one).
func fallocateRange(f *os.File, off, n int64) error {
	for {
		err := unix.Fallocate(int(f.Fd()), 0, off, n)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// lockFile takes flock(2) how on f, retrying when a signal interrupts it.
func lockFile(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// RemoveStale unlinks the segments in Dir whose names start with prefix
// and whose creator is gone: nobody holds their lock. It skips what is
// not a regular file of this user and what it cannot open, and returns
// how many it removed. Segments made by a build without the lock look
// stale to it.
func RemoveStale(prefix string) (int, error) {
	if err := ValidName(prefix); err != nil {
		return 0, err
	}
	names, err := filepath.Glob(filepath.Join(Dir, prefix+"*"))
	if err != nil {
		return 0, fmt.Errorf("shmem: remove stale segments %s*: %w", prefix, err)
	}
	removed := 0
	var errs []error
	for _, path := range names {
		if !strings.HasPrefix(filepath.Base(path), prefix) {
			continue
		}
		gone, err := removeIfStale(path)
		if err != nil {
			errs = append(errs, err)
		}
		if gone {
			removed++
		}
	}
	return removed, errors.Join(errs...)
}

// removeIfStale unlinks path if it is a segment of this user whose lock
// nobody holds, and reports whether it did.
func removeIfStale(path string) (bool, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return false, nil // gone meanwhile, a symlink, or not ours to read
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Getuid() {
		return false, nil
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return false, nil // its creator lives (or a sweep beside this one has it)
	}
	// Still the file this descriptor locked: a name is never reused, but
	// a sweep beside this one may have removed it already.
	var now unix.Stat_t
	if err := unix.Lstat(path, &now); err != nil || now.Ino != st.Ino || now.Dev != st.Dev {
		return false, nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("shmem: remove stale segment: %w", err)
	}
	return true, nil
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
	fail := func(err error) (*Segment, error) {
		f.Close()
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		return fail(fmt.Errorf("shmem: stat %s: %w", path, err))
	}
	if !fi.Mode().IsRegular() || fi.Size() <= 0 || fi.Size() != int64(int(fi.Size())) {
		return fail(fmt.Errorf("shmem: open %s: not a usable segment (mode %v, size %d)", path, fi.Mode(), fi.Size()))
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("shmem: map %s: %w", path, err))
	}
	return &Segment{name: name, mem: mem, file: f}, nil
}

// CreatorLives reports whether the process that created the segment
// still runs, on an opener's mapping: the creator holds the segment's
// lock for as long as it lives (see "Stale segments"), so a try for it
// that succeeds means it is gone. Unlike its pid, this tells across pid
// namespaces, where the creator's pid names no process, or another one.
// On the creator's own mapping, and after Close, it reports true.
func (s *Segment) CreatorLives() (bool, error) {
	if s.file == nil {
		return true, nil
	}
	for {
		err := unix.Flock(int(s.file.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case err == nil:
			// Let go at once: a sweep (RemoveStale) may remove it now.
			unix.Flock(int(s.file.Fd()), unix.LOCK_UN)
			return false, nil
		case errors.Is(err, unix.EWOULDBLOCK):
			// Held: by the creator, or for a moment by a sweep or
			// another opener asking the same, which a creator that
			// lives would have kept from taking it.
			return true, nil
		case errors.Is(err, unix.EINTR):
			continue
		}
		return false, fmt.Errorf("shmem: lock of %s: %w", s.name, err)
	}
}

// Reserve allocates the memory of bytes [off, off+n) of the segment, on
// the creator's mapping or an opener's, before they are first touched:
// tmpfs allocates a page when it is first read or written, and a touch
// that finds Dir full kills the process with SIGBUS. It fails instead,
// with an error that says how full Dir is. Reserving memory that is
// already allocated does nothing.
func (s *Segment) Reserve(off, n int) error {
	f := s.lock
	if f == nil {
		f = s.file
	}
	if f == nil || s.mem == nil {
		return fmt.Errorf("shmem: reserve in %s: segment is closed", s.name)
	}
	if off < 0 || n <= 0 || off > len(s.mem)-n {
		return fmt.Errorf("shmem: reserve [%d, %d+%d) in %s: outside its %d bytes", off, off, n, s.name, len(s.mem))
	}
	if err := fallocateRange(f, int64(off), int64(n)); err != nil {
		return fmt.Errorf("shmem: reserve %d bytes of %s: %w%s", n, filepath.Join(Dir, s.name), err, roomLeft(err))
	}
	return nil
}

// roomLeft says, after an allocation in Dir failed for want of room, how
// much room Dir has, so that a user knows what to grow.
func roomLeft(err error) string {
	if !errors.Is(err, unix.ENOSPC) && !errors.Is(err, unix.ENOMEM) {
		return ""
	}
	var st unix.Statfs_t
	if unix.Statfs(Dir, &st) != nil {
		return ""
	}
	bs := uint64(st.Bsize)
	return fmt.Sprintf(" (%s holds %s, %s of it free; give it more room, such as docker run --shm-size)",
		Dir, sizeText(st.Blocks*bs), sizeText(st.Bavail*bs))
}

// sizeText writes n bytes in the largest of KiB, MiB and GiB that keeps
// three digits.
func sizeText(n uint64) string {
	switch {
	case n >= 100<<30:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 100<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	default:
		return fmt.Sprintf("%d KiB", n>>10)
	}
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
	if s.lock != nil {
		// Unlinked before the lock goes, so that no sweep sees the name
		// unlocked while this process lives.
		errs = append(errs, s.Unlink(), s.lock.Close())
		s.lock = nil
	}
	if s.file != nil {
		errs = append(errs, s.file.Close())
		s.file = nil
	}
	return errors.Join(errs...)
}
