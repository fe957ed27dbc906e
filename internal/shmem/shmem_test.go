package shmem

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestValidName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"mdshm.abc.r0.ff", true},
		{"a-b_c", true},
		{"", false},
		{".hidden", false},
		{"../etc/passwd", false},
		{"a/b", false},
		{"a\x00b", false},
		{string(make([]byte, MaxNameLen+1)), false},
	}
	for _, tt := range tests {
		if err := ValidName(tt.name); (err == nil) != tt.ok {
			t.Errorf("ValidName(%q) = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}

func TestCreateOpenShareAndUnlink(t *testing.T) {
	name := fmt.Sprintf("shmem-test-%d", os.Getpid())
	a, err := Create(name, 8192)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if _, err := Create(name, 8192); err == nil {
		t.Fatal("second Create of the same name succeeded")
	}
	b, err := Open(name)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if len(b.Bytes()) != 8192 {
		t.Fatalf("Open mapped %d bytes, want 8192", len(b.Bytes()))
	}
	a.Bytes()[4000] = 42
	if got := b.Bytes()[4000]; got != 42 {
		t.Fatalf("byte written through one mapping reads %d through the other", got)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close opener: %v", err)
	}
	if _, err := os.Stat(filepath.Join(Dir, name)); err != nil {
		t.Fatalf("opener's Close removed the file: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close creator: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := os.Stat(filepath.Join(Dir, name)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("creator's Close left the file: %v", err)
	}
}

func TestOpenMissing(t *testing.T) {
	if _, err := Open("shmem-test-does-not-exist"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Open missing = %v, want ErrNotExist", err)
	}
}

// crashEnv makes the test binary a process that creates the segment it
// names and exits without closing it, as a killed rank would.
const crashEnv = "SHMEM_TEST_CREATE_AND_DIE"

// reserveEnv makes the test binary reserve a 1 GiB segment of that name
// and wait to be killed.
const reserveEnv = "SHMEM_TEST_RESERVE_AND_WAIT"

func TestMain(m *testing.M) {
	if name := os.Getenv(reserveEnv); name != "" {
		CreateReserved(name, 1<<30)
		select {}
	}
	if name := os.Getenv(crashEnv); name != "" {
		if _, err := Create(name, 4096); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// liveAndCrashed makes prefix+"live", a segment of this process, and
// prefix+"crashed", whose creating process exited without closing it; the
// test's end closes the one and removes every name with prefix.
func liveAndCrashed(t *testing.T, prefix string) {
	t.Helper()
	t.Cleanup(func() {
		names, _ := filepath.Glob(filepath.Join(Dir, prefix+"*"))
		for _, n := range names {
			os.Remove(n)
		}
	})
	live, err := Create(prefix+"live", 4096)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { live.Close() })
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashEnv+"="+prefix+"crashed")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("creating process: %v: %s", err, out)
	}
}

// TestRemoveStale checks that a sweep removes the segments whose creator
// is gone, and only those: not a live one, not another prefix, not
// through a symlink.
func TestRemoveStale(t *testing.T) {
	prefix := fmt.Sprintf("shmem-stale-test-%d.", os.Getpid())
	path := func(n string) string { return filepath.Join(Dir, prefix+n) }
	t.Cleanup(func() { os.Remove(filepath.Join(Dir, "other-"+prefix+"x")) })
	liveAndCrashed(t, prefix)
	if err := os.WriteFile(path("old-build"), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(target, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, path("link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(Dir, "other-"+prefix+"x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	n, err := RemoveStale(prefix)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path string
		kept bool
	}{
		{path("live"), true},
		{path("crashed"), false},
		{path("old-build"), false},
		{path("link"), true},
		{target, true},
		{filepath.Join(Dir, "other-"+prefix+"x"), true},
	}
	for _, tt := range tests {
		_, err := os.Lstat(tt.path)
		if kept := err == nil; kept != tt.kept {
			t.Errorf("%s: kept = %v, want %v", tt.path, kept, tt.kept)
		}
	}
	if n != 2 {
		t.Errorf("RemoveStale removed %d, want 2", n)
	}
	if _, err := Open(prefix + "live"); err != nil {
		t.Errorf("live segment no longer opens: %v", err)
	}
	if _, err := RemoveStale("../x"); err == nil {
		t.Error("RemoveStale accepted a prefix with a slash")
	}
}

// TestCreatorLives: an opener sees the creator live while it runs, here
// or in this process, and gone once its process exited without closing.
func TestCreatorLives(t *testing.T) {
	prefix := fmt.Sprintf("shmem-lives-test-%d.", os.Getpid())
	liveAndCrashed(t, prefix)
	for _, tc := range []struct {
		name string
		want bool
	}{{"live", true}, {"crashed", false}} {
		seg, err := Open(prefix + tc.name)
		if err != nil {
			t.Fatal(err)
		}
		for range 2 { // asking does not change the answer
			if lives, err := seg.CreatorLives(); lives != tc.want || err != nil {
				t.Errorf("%s: CreatorLives = %v, %v; want %v", tc.name, lives, err, tc.want)
			}
		}
		if err := seg.Close(); err != nil {
			t.Error(err)
		}
	}
	// Asking left no lock behind: a sweep still removes the crashed one.
	if n, err := RemoveStale(prefix); n != 1 || err != nil {
		t.Errorf("RemoveStale after the questions = %d, %v; want the crashed segment", n, err)
	}
}

// TestCreateLeavesNoTemporary checks that Create, successful or not,
// leaves only the segment's own name in Dir.
func TestCreateLeavesNoTemporary(t *testing.T) {
	name := fmt.Sprintf("shmem-tmp-test-%d", os.Getpid())
	s, err := Create(name, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := Create(name, 4096); err == nil {
		t.Fatal("second Create of the same name succeeded")
	}
	if tmps, _ := filepath.Glob(filepath.Join(Dir, "."+name+"*")); len(tmps) != 0 {
		t.Fatalf("temporary files left: %v", tmps)
	}
}

// TestCreateReserved: a reserved segment has its memory allocated before
// anything touches it; a plain one has none. A reservation Dir has no
// room for fails at creation.
func TestCreateReserved(t *testing.T) {
	const size = 1 << 20
	for _, tc := range []struct {
		name   string
		create func(string, int) (*Segment, error)
		want   int64 // bytes allocated at least (reserved) or at most (plain)
	}{
		{"plain", Create, 0},
		{"reserved", CreateReserved, size},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("shmem-test-%s-%d", tc.name, os.Getpid())
			s, err := tc.create(name, size)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(Dir, name), &st); err != nil {
				t.Fatal(err)
			}
			got := st.Blocks * 512
			if tc.want == 0 && got != 0 || tc.want > 0 && got < tc.want {
				t.Fatalf("%d bytes allocated, want %s %d", got, map[bool]string{true: "at least", false: "exactly"}[tc.want > 0], tc.want)
			}
		})
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(Dir, &fs); err != nil {
		t.Fatal(err)
	}
	// Beyond the whole file system, so that tmpfs refuses before it
	// allocates a page rather than filling Dir first.
	tooBig := int(fs.Blocks*uint64(fs.Bsize)) + 1<<30
	if s, err := CreateReserved(fmt.Sprintf("shmem-test-full-%d", os.Getpid()), tooBig); err == nil {
		s.Close()
		t.Fatalf("CreateReserved of %d bytes, more than %s holds, succeeded", tooBig, Dir)
	} else if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("CreateReserved beyond %s's size: %v, want ENOSPC", Dir, err)
	}
}

// TestTermWhileReserving: a process killed the usual way (SIGTERM, as
// mdrun ends the ranks of a failed job) while it reserves a large
// segment leaves nothing in Dir, named or hidden: until it is named the
// segment is a file of the process alone. Its memory goes with it.
func TestTermWhileReserving(t *testing.T) {
	if testing.Short() {
		t.Skip("reserves 1 GiB of " + Dir)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(Dir, &fs); err != nil || fs.Bavail*uint64(fs.Bsize) < 4<<30 {
		t.Skipf("%s has less than 4 GiB free (%v)", Dir, err)
	}
	name := fmt.Sprintf("shmem-test-term-%d", os.Getpid())
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), reserveEnv+"="+name)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, p := range leftIn(name) {
			os.Remove(p)
		}
	}()
	// Once the process has a file of Dir open, it is making the segment:
	// let it reserve a little, then end it.
	fds := fmt.Sprintf("/proc/%d/fd", cmd.Process.Pid)
	for opened := false; !opened; {
		links, _ := os.ReadDir(fds)
		for _, l := range links {
			if to, _ := os.Readlink(filepath.Join(fds, l.Name())); strings.HasPrefix(to, Dir+"/") {
				opened = true
			}
		}
		if !opened {
			time.Sleep(100 * time.Microsecond)
		}
	}
	time.Sleep(20 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	if left := leftIn(name); len(left) > 0 {
		t.Fatalf("left in %s after SIGTERM: %v", Dir, left)
	}
}

// leftIn lists the files of Dir whose names hold name, hidden ones too
// (Glob's * matches a leading dot).
func leftIn(name string) []string {
	left, _ := filepath.Glob(filepath.Join(Dir, "*"+name+"*"))
	return left
}

func TestJobPrefix(t *testing.T) {
	a, b := JobPrefix("job-1"), JobPrefix("job-2")
	if a == b || a != JobPrefix("job-1") || !strings.HasPrefix(a, "mdshm.") || !strings.HasSuffix(a, ".") {
		t.Fatalf("JobPrefix: %q and %q", a, b)
	}
	if err := ValidName(a + "win.1"); err != nil {
		t.Fatal(err)
	}
}

// TestReserve: Reserve allocates exactly the range asked, on the
// creator's mapping and an opener's, and refuses a range outside the
// segment or a closed segment with an error naming both.
func TestReserve(t *testing.T) {
	const size = 1 << 20
	name := fmt.Sprintf("shmem-test-reserve-%d", os.Getpid())
	s, err := Create(name, size)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	o, err := Open(name)
	if err != nil {
		t.Fatal(err)
	}
	allocated := func() int64 {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(Dir, name), &st); err != nil {
			t.Fatal(err)
		}
		return st.Blocks * 512
	}
	if err := s.Reserve(4096, 8192); err != nil {
		t.Fatal(err)
	}
	if err := o.Reserve(size-4096, 4096); err != nil {
		t.Fatal(err)
	}
	if err := s.Reserve(4096, 8192); err != nil { // again: nothing to do
		t.Fatal(err)
	}
	if got := allocated(); got != 3*4096 {
		t.Fatalf("%d bytes allocated after reserving 3 pages", got)
	}
	for _, r := range [][2]int{{-1, 10}, {0, 0}, {0, -1}, {size - 10, 11}, {size, 1}, {1, size}} {
		if err := s.Reserve(r[0], r[1]); err == nil || !strings.Contains(err.Error(), "outside") || !strings.Contains(err.Error(), name) {
			t.Errorf("Reserve(%d, %d) = %v, want an error naming the segment and the range outside it", r[0], r[1], err)
		}
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if err := o.Reserve(0, 4096); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("Reserve after Close = %v, want an error saying the segment is closed", err)
	}
	if got := allocated(); got != 3*4096 {
		t.Fatalf("%d bytes allocated after failed reservations, want 3 pages", got)
	}
}

// TestCreateWithoutProc: in a sandbox or chroot without /proc, Create
// still makes the segment, through a temporary name, and leaves no
// temporary behind. It used to fail with "create /dev/shm/NAME: no such
// file or directory", /proc/self/fd being what was missing.
func TestCreateWithoutProc(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root, to mount an empty /proc in a mount namespace")
	}
	name := fmt.Sprintf("shmem-noproc-test-%d", os.Getpid())
	t.Cleanup(func() { os.Remove(filepath.Join(Dir, name)) })
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c",
		`mount -t tmpfs none /proc && exec "$0" -test.run=^$`, os.Args[0])
	cmd.Env = append(os.Environ(), crashEnv+"="+name)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("Create without /proc: %v: %s", err, out)
	}
	if _, err := os.Stat(filepath.Join(Dir, name)); err != nil {
		t.Errorf("segment made without /proc: %v", err)
	}
	if tmps, _ := filepath.Glob(filepath.Join(Dir, "."+name+"*")); len(tmps) != 0 {
		t.Errorf("temporary files left: %v", tmps)
	}
}
