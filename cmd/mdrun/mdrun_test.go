package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/bootstrap"
	"github.com/hpc-multidevice/multidevice/internal/sched"
)

// helperName is the name the test binary runs under when it plays a rank;
// TestMain sees it in os.Args[0]. Choosing the behaviour by name rather than
// by an environment variable keeps the tests free to run in parallel.
const helperName = "mdrun-test-rank"

// helperName2 is a second name for a rank, the other program of an MPMD
// test job.
const helperName2 = "mdrun-test-other"

// helper and helper2 are the paths of symlinks to the test binary named
// helperName and helperName2.
var helper, helper2 string

// fakeSSH is a launcher that runs the command line on this machine the way
// ssh runs it on a remote one: through a shell, in a session of its own,
// so that a signal to the launcher does not reach the rank.
var fakeSSH string

const fakeSSHScript = `#!/bin/sh
shift # the host
exec setsid -w sh -c "$*"
`

// cleanSSH is fakeSSH that, as ssh, passes on none of the launcher's
// environment: the rank sees only what its command line sets.
var cleanSSH string

const cleanSSHScript = `#!/bin/sh
shift # the host
exec env -i PATH="$PATH" HOME="$HOME" setsid -w sh -c "$*"
`

// mdrunName is the name the test binary runs under when it plays mdrun
// itself, main and all: which signals mdrun takes is main's doing, out of
// reach of the tests that call run.
const mdrunName = "mdrun-test-mdrun"

// mdrunExe is the path of a symlink to the test binary named mdrunName.
var mdrunExe string

func TestMain(m *testing.M) {
	switch filepath.Base(os.Args[0]) {
	case helperName, helperName2:
		os.Exit(rankMain(os.Args[1:]))
	case mdrunName:
		main()
	}
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "mdrun-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	fakeSSH = filepath.Join(dir, "fake-ssh")
	if err := os.WriteFile(fakeSSH, []byte(fakeSSHScript), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cleanSSH = filepath.Join(dir, "clean-ssh")
	if err := os.WriteFile(cleanSSH, []byte(cleanSSHScript), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	helper = filepath.Join(dir, helperName)
	helper2 = filepath.Join(dir, helperName2)
	mdrunExe = filepath.Join(dir, mdrunName)
	for _, link := range []string{helper, helper2, mdrunExe} {
		if err := os.Symlink(exe, link); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return m.Run()
}

// rankMain is a rank of a test job; args[0] picks what it does.
func rankMain(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "helper: no behaviour")
		return 1
	}
	switch args[0] {
	case "plain": // does not use the library at all
		fmt.Println("hello from a plain program")
		fmt.Print("no newline at the end")
		return 0
	case "cpus":
		cpus, err := sched.Affinity()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("cpus %v gomaxprocs %d\n", cpus, runtime.GOMAXPROCS(0))
		return 0
	case leaveInInit:
		return leavingRank()
	case dieKilled, dieExit0:
		return dyingRank(args[0])
	case abortLate:
		return lateAbortingRank(args[1:])
	case abortAfterLoss:
		return lossAbortingRank(args[1:])
	case "noinit": // rank 1 ends before it joins; the others' fence must fail
		if os.Getenv("MDRUN_RANK") == "1" {
			return 0
		}
	case "env":
		wd, _ := os.Getwd()
		fmt.Printf("MD_PLUGINS=%s\nMD_CONNTABLE=%s\nMDRUN_SECRET=%s\nPWD=%s\n", os.Getenv("MD_PLUGINS"), os.Getenv("MD_CONNTABLE"), os.Getenv("MDRUN_SECRET"), wd)
		site, ok := os.LookupEnv("MD_SITE")
		if !ok {
			site = "(unset)"
		}
		fmt.Printf("MD_SITE=%s\n", site)
		// Where placement put it, and -x's variable, quoted: a value
		// with spaces, quotes or '$' must arrive as it was given.
		fmt.Printf("MDRUN_RANK=%s MDRUN_HOST=%s\n", os.Getenv("MDRUN_RANK"), os.Getenv("MDRUN_HOST"))
		fmt.Printf("MDRUN_TEST_X=%q\n", envOr("MDRUN_TEST_X"))
		return 0
	}
	ctx := context.Background()
	bs, err := bootstrap.Open(ctx, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rank, size := bs.Rank(), bs.Size()
	// Exchange business cards the way a subdevice would.
	card := func(r int) string { return fmt.Sprintf("shm:%s:%d", bs.JobID(), r) }
	if err := bs.Put("card", []byte(card(rank))); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := bs.Fence(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for p := range size {
		got, err := bs.Get(ctx, p, "card")
		if err != nil || string(got) != card(p) {
			fmt.Fprintf(os.Stderr, "card of %d: %q, %v\n", p, got, err)
			return 1
		}
	}
	fmt.Printf("pid %d\n", os.Getpid())
	// A second fence: every rank has printed its pid before any of them
	// fails, so the test knows which processes must be gone.
	if err := bs.Fence(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	switch args[0] {
	case "appnum":
		// Which program this is, where the world put it, and what it
		// was told.
		wd, _ := os.Getwd()
		fmt.Printf("rank %d of %d: %s appnum %s args %q plugins %s x %s wd %s\n", rank, size, filepath.Base(os.Args[0]),
			envOr("MD_APPNUM"), args[1:], envOr("MD_PLUGINS"), envOr("MDRUN_TEST_X"), wd)
		if err := bs.Close(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	case "exchange":
		fmt.Printf("rank %d has all %d cards\n", rank, size)
		if err := bs.Close(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	case "exit3":
		if rank == 1 {
			return 3
		}
	case "exit0":
		if rank == 1 {
			return 0 // without Close: the others could not finish
		}
	case "panic":
		if rank == 2 {
			panic("boom")
		}
	case "abort":
		if rank == 0 {
			if err := bs.Abort(7, "bad input"); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		}
	case "kill":
		if rank == 1 {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	case "block":
	default:
		fmt.Fprintf(os.Stderr, "helper: unknown behaviour %q\n", args[0])
		return 1
	}
	fmt.Println("ready")
	// Blocks until mdrun ends the job; the test's watchdog ends it otherwise.
	time.Sleep(time.Hour)
	return 0
}

// envOr is the variable's value, or "(unset)".
func envOr(name string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return "(unset)"
}

// lockedBuffer is a goroutine-safe buffer that can announce how many lines
// containing some text it has seen.
type lockedBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	watch string
	want  int
	seen  chan struct{} // closed once want lines contained watch
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if b.seen != nil && strings.Count(b.buf.String(), b.watch) >= b.want {
		select {
		case <-b.seen:
		default:
			close(b.seen)
		}
	}
	return len(p), nil
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// watchdog is how long a test job may take before the test gives up on it;
// it only turns a hang into a failure, it asserts nothing about speed.
const watchdog = 60 * time.Second

func runMdrun(t *testing.T, args []string, stdout *lockedBuffer, sigs <-chan os.Signal) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeoutCause(context.Background(), watchdog, errors.New("test watchdog expired"))
	defer cancel()
	if stdout == nil {
		stdout = &lockedBuffer{}
	}
	var stderr lockedBuffer
	status := run(ctx, args, stdout, &stderr, sigs)
	t.Logf("mdrun %s -> %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), status, stdout, &stderr)
	return status, stdout.String(), stderr.String()
}

// pids returns the pids the ranks printed.
func pids(t *testing.T, stdout string) []int {
	t.Helper()
	var out []int
	for _, m := range regexp.MustCompile(`(?m)pid (\d+)$`).FindAllStringSubmatch(stdout, -1) {
		pid, _ := strconv.Atoi(m[1])
		out = append(out, pid)
	}
	return out
}

// checkGone fails if any of the pids still exists.
func checkGone(t *testing.T, pids []int) {
	t.Helper()
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("rank process %d still exists after mdrun returned (kill 0: %v)", pid, err)
		}
	}
}

func TestJobs(t *testing.T) {
	dir := t.TempDir()
	plugins := filepath.Join(dir, "plugins.hcl")
	if err := os.WriteFile(plugins, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	allowed, err := sched.Affinity()
	if err != nil {
		t.Fatal(err)
	}
	cpu := func(i int) string {
		if l := allowed.List(); i < len(l) {
			return strconv.Itoa(l[i])
		}
		return "(no such CPU)"
	}
	cores := sched.Cores(allowed)
	// coreCPUs is what a rank bound to the i-th core prints.
	coreCPUs := func(i int) string {
		if i >= len(cores) {
			return "(no such core)"
		}
		return regexp.QuoteMeta(cores[i].String()) + " gomaxprocs " + strconv.Itoa(cores[i].Count())
	}
	// A remote host's first core, all of it: what "far" (this machine)
	// binds its first rank to.
	core0 := sched.CPUs(0)
	if b, err := os.ReadFile("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list"); err == nil {
		if core0, err = sched.ParseCPUList(string(b)); err != nil {
			t.Fatal(err)
		}
	}
	// What a rank on a host without a site sees: mdrun's own MD_SITE.
	mySite, ok := os.LookupEnv("MD_SITE")
	if !ok {
		mySite = "(unset)"
	}
	// A value the remote shell would change if mdrun did not quote it:
	// spaces, both quotes, '$', a backquote, a backslash, '=' and '*'.
	tricky := `it's "a" $HOME  b=c ` + "`id`" + ` \n *`
	// host says rank r landed on host h.
	host := func(r int, h string) *regexp.Regexp {
		return regexp.MustCompile(fmt.Sprintf(`(?m)^\[%d\] MDRUN_RANK=%d MDRUN_HOST=%s$`, r, r, h))
	}
	hostfile := filepath.Join(dir, "hosts")
	if err := os.WriteFile(hostfile, []byte("localhost slots=1 site=A\nfar:1 site=B\nnear\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		flags     []string
		n         int
		behaviour string
		status    int
		stdout    []*regexp.Regexp // each must match
		stderr    []*regexp.Regexp
		notStdout *regexp.Regexp
		pidsPrint int    // ranks that print their pid and must be gone afterwards
		minCPUs   int    // CPUs this test may use that the case needs
		minCores  int    // cores of those that the case needs
		needs     string // a program the case needs in PATH
		cpus01    bool   // the case binds a rank to CPU 0 and one to CPU 1
	}{
		{
			name: "exchange", n: 4, behaviour: "exchange", status: 0,
			stdout: []*regexp.Regexp{
				regexp.MustCompile(`(?m)^\[0\] rank 0 has all 4 cards$`),
				regexp.MustCompile(`(?m)^\[1\] rank 1 has all 4 cards$`),
				regexp.MustCompile(`(?m)^\[2\] rank 2 has all 4 cards$`),
				regexp.MustCompile(`(?m)^\[3\] rank 3 has all 4 cards$`),
			},
			pidsPrint: 4,
		},
		{
			// Relays are ranks 2 and 3 of a job of 4, running the relay
			// command (here the helper) on their host.
			name: "relays", flags: []string{"-relay", "localhost:2", "-relay-cmd", helper + " exchange"}, n: 2, behaviour: "exchange", status: 0,
			stdout: []*regexp.Regexp{
				regexp.MustCompile(`(?m)^\[0\] rank 0 has all 4 cards$`),
				regexp.MustCompile(`(?m)^\[1\] rank 1 has all 4 cards$`),
				regexp.MustCompile(`(?m)^\[2\] rank 2 has all 4 cards$`),
				regexp.MustCompile(`(?m)^\[3\] rank 3 has all 4 cards$`),
			},
			pidsPrint: 4,
		},
		{
			name: "no prefix", flags: []string{"-prefix=false"}, n: 2, behaviour: "exchange", status: 0,
			stdout: []*regexp.Regexp{
				regexp.MustCompile(`(?m)^rank 0 has all 2 cards$`),
				regexp.MustCompile(`(?m)^rank 1 has all 2 cards$`),
			},
			notStdout: regexp.MustCompile(`\[\d\]`),
			pidsPrint: 2,
		},
		{
			name: "rank exits 3", n: 4, behaviour: "exit3", status: 3,
			stderr:    []*regexp.Regexp{regexp.MustCompile(`(?m)^mdrun: rank 1 \(pid \d+\) exited with status 3; terminating the job$`)},
			pidsPrint: 4,
		},
		{
			// Once ignored: the others waited for it until -timeout.
			name: "rank exits 0 without finalizing", flags: []string{"-timeout", "50s"}, n: 3, behaviour: "exit0", status: exitFailed,
			stderr:    []*regexp.Regexp{regexp.MustCompile(`(?m)^mdrun: rank 1 \(pid \d+\) exited with status 0 without finalizing; terminating the job$`)},
			pidsPrint: 3,
		},
		{
			name: "rank panics", n: 4, behaviour: "panic", status: 2,
			stderr: []*regexp.Regexp{
				regexp.MustCompile(`(?m)^\[2\] panic: boom$`),
				regexp.MustCompile(`(?m)^mdrun: rank 2 \(pid \d+\) panicked and exited with status 2; terminating the job$`),
			},
			pidsPrint: 4,
		},
		{
			name: "rank aborts", n: 3, behaviour: "abort", status: 7,
			stderr:    []*regexp.Regexp{regexp.MustCompile(`(?m)^mdrun: rank 0 \(pid \d+\) aborted with code 7: bad input; terminating the job$`)},
			pidsPrint: 3,
		},
		{
			name: "rank killed", n: 2, behaviour: "kill", status: 128 + 9,
			stderr:    []*regexp.Regexp{regexp.MustCompile(`(?m)^mdrun: rank 1 \(pid \d+\) was killed by signal 9 \(killed\); terminating the job$`)},
			pidsPrint: 2,
		},
		{
			// Until mdrun told the service, the others waited in their
			// first fence for it until the timeout.
			name: "rank exits without joining", flags: []string{"-timeout", "50s"}, n: 3, behaviour: "noinit", status: 1,
			stderr: []*regexp.Regexp{
				regexp.MustCompile(`(?m)^\[[02]\] .*rank 1 exited without joining the job \(did it call Init\?\); the fence cannot complete$`),
				regexp.MustCompile(`(?m)^mdrun: rank [02] \(pid \d+\) exited with status 1; terminating the job$`),
			},
		},
		{
			name: "timeout", flags: []string{"-timeout", "2s"}, n: 2, behaviour: "block", status: exitTimeout,
			stderr:    []*regexp.Regexp{regexp.MustCompile(`(?m)^mdrun: the job ran longer than -timeout 2s; terminating the job$`)},
			pidsPrint: 2,
		},
		{
			name: "plain program", n: 2, behaviour: "plain", status: 0,
			stdout: []*regexp.Regexp{
				regexp.MustCompile(`(?m)^\[1\] hello from a plain program$`),
				regexp.MustCompile(`(?m)^\[0\] no newline at the end$`),
			},
		},
		{
			name: "environment", flags: []string{"-plugins", plugins, "-conntable", dir}, n: 1, behaviour: "env", status: 0,
			stdout: []*regexp.Regexp{
				regexp.MustCompile(`(?m)^\[0\] MD_PLUGINS=` + regexp.QuoteMeta(plugins) + `$`),
				regexp.MustCompile(`(?m)^\[0\] MD_CONNTABLE=` + regexp.QuoteMeta(dir) + `$`),
				// A local rank gets it in its environment, which only its user reads.
				regexp.MustCompile(`(?m)^\[0\] MDRUN_SECRET=[0-9a-f]{64}$`),
			},
		},
		{
			name: "remote exchange", flags: remoteFlags("localhost,far:3"), n: 4, behaviour: "exchange", status: 0,
			stdout: []*regexp.Regexp{
				regexp.MustCompile(`(?m)^\[0\] rank 0 has all 4 cards$`),
				regexp.MustCompile(`(?m)^\[3\] rank 3 has all 4 cards$`),
			},
			pidsPrint: 4,
		},
		{
			// Ranks 2 and 3 on "far" only end because the service closes.
			name: "remote rank exits 3", flags: remoteFlags("localhost,far:3"), n: 4, behaviour: "exit3", status: 3,
			stderr:    []*regexp.Regexp{regexp.MustCompile(`(?m)^mdrun: rank 1 on far \(launcher pid \d+\) exited with status 3; terminating the job$`)},
			pidsPrint: 4,
		},
		{
			name: "remote ranks after an abort", flags: remoteFlags("localhost:1,far:2"), n: 3, behaviour: "abort", status: 7,
			stderr:    []*regexp.Regexp{regexp.MustCompile(`(?m)^mdrun: rank 0 \(pid \d+\) aborted with code 7: bad input; terminating the job$`)},
			pidsPrint: 3,
		},
		{
			name: "remote environment", flags: append(remoteFlags("far"), "-plugins", plugins, "-conntable", dir, "-wdir", dir), n: 1, behaviour: "env", status: 0,
			stdout: []*regexp.Regexp{
				regexp.MustCompile(`(?m)^\[0\] MD_PLUGINS=` + regexp.QuoteMeta(plugins) + `$`),
				regexp.MustCompile(`(?m)^\[0\] MD_CONNTABLE=` + regexp.QuoteMeta(dir) + `$`),
				// The secret comes on standard input, not on ssh's command line.
				regexp.MustCompile(`(?m)^\[0\] MDRUN_SECRET=-$`),
				regexp.MustCompile(`(?m)^\[0\] PWD=` + regexp.QuoteMeta(dir) + `$`),
			},
		},
		{
			// Each rank gets its host's site, here and through the
			// launcher; a host without one leaves mdrun's own.
			name: "sites", flags: remoteFlags("localhost:1@A,far:2@B,near:1"), n: 4, behaviour: "env", status: 0,
			stdout: []*regexp.Regexp{
				regexp.MustCompile(`(?m)^\[0\] MD_SITE=A$`),
				regexp.MustCompile(`(?m)^\[1\] MD_SITE=B$`),
				regexp.MustCompile(`(?m)^\[2\] MD_SITE=B$`),
				regexp.MustCompile(`(?m)^\[3\] MD_SITE=` + regexp.QuoteMeta(mySite) + `$`),
			},
		},
		{
			// Block placement (the default): each host's slots in turn.
			name: "map by slot", flags: remoteFlags("localhost:2,far:1,near:2"), n: 5, behaviour: "env", status: 0,
			stdout: []*regexp.Regexp{host(0, "localhost"), host(1, "localhost"), host(2, "far"), host(3, "near"), host(4, "near")},
		},
		{
			// Round-robin: one rank per host in turn, far being full
			// after rank 1.
			name: "map by node", flags: append(remoteFlags("localhost:2,far:1,near:2"), "-map-by", "node"), n: 5, behaviour: "env", status: 0,
			stdout: []*regexp.Regexp{host(0, "localhost"), host(1, "far"), host(2, "near"), host(3, "localhost"), host(4, "near")},
		},
		{
			// More ranks than the 3 slots: the hosts start over.
			name: "map by node beyond the slots", flags: append(remoteFlags("localhost:2,far:1"), "-map-by", "node"), n: 5, behaviour: "env", status: 0,
			stdout: []*regexp.Regexp{host(0, "localhost"), host(1, "far"), host(2, "localhost"), host(3, "localhost"), host(4, "far")},
		},
		{
			// -ppn gives hosts without slots that many.
			name: "ppn", flags: append(remoteFlags("localhost,far"), "-ppn", "2"), n: 4, behaviour: "env", status: 0,
			stdout: []*regexp.Regexp{host(0, "localhost"), host(1, "localhost"), host(2, "far"), host(3, "far")},
		},
		{
			// -x NAME=VALUE reaches the rank here and, through a launcher
			// that passes on none of mdrun's environment, the one on far,
			// unchanged by the remote shell.
			name: "-x with a value", flags: []string{"-hosts", "localhost,far", "-launcher", cleanSSH, "-listen", "127.0.0.1:0", "-x", "MDRUN_TEST_X=" + tricky},
			n: 2, behaviour: "env", status: 0,
			stdout: []*regexp.Regexp{
				regexp.MustCompile(`(?m)^\[0\] MDRUN_TEST_X=` + regexp.QuoteMeta(strconv.Quote(tricky)) + `$`),
				regexp.MustCompile(`(?m)^\[1\] MDRUN_TEST_X=` + regexp.QuoteMeta(strconv.Quote(tricky)) + `$`),
				host(1, "far"),
			},
		},
		{
			name: "sites from a hostfile", flags: []string{"-hostfile", hostfile, "-launcher", fakeSSH, "-listen", "127.0.0.1:0"}, n: 3, behaviour: "env", status: 0,
			stdout: []*regexp.Regexp{
				regexp.MustCompile(`(?m)^\[0\] MD_SITE=A$`),
				regexp.MustCompile(`(?m)^\[1\] MD_SITE=B$`),
				regexp.MustCompile(`(?m)^\[2\] MD_SITE=` + regexp.QuoteMeta(mySite) + `$`),
			},
		},
		{
			name: "unbound", n: 1, behaviour: "cpus", status: 0,
			stdout: []*regexp.Regexp{regexp.MustCompile(`(?m)^\[0\] cpus ` + regexp.QuoteMeta(allowed.String()) + ` gomaxprocs ` + strconv.Itoa(allowed.Count()) + `$`)},
		},
		{
			// Bound before it starts: one processor from the first
			// instruction on.
			name: "bound", flags: []string{"-bind", "core"}, n: 2, behaviour: "cpus", status: 0, minCores: 2,
			stdout: []*regexp.Regexp{
				regexp.MustCompile(`(?m)^\[0\] cpus ` + coreCPUs(0) + `$`),
				regexp.MustCompile(`(?m)^\[1\] cpus ` + coreCPUs(1) + `$`),
			},
		},
		{
			name: "bound to hardware threads", flags: []string{"-bind", "hwthread"}, n: 2, behaviour: "cpus", status: 0, minCPUs: 2,
			stdout: []*regexp.Regexp{
				regexp.MustCompile(`(?m)^\[0\] cpus ` + cpu(0) + ` gomaxprocs 1$`),
				regexp.MustCompile(`(?m)^\[1\] cpus ` + cpu(1) + ` gomaxprocs 1$`),
			},
		},
		{
			// Each host's ranks count from its first core; "far" binds
			// through taskset, to the host's first core, all of it.
			name: "bound remote", flags: append(remoteFlags("localhost:1,far:1"), "-bind", "core"), n: 2, behaviour: "cpus", status: 0, needs: "taskset",
			stdout: []*regexp.Regexp{
				regexp.MustCompile(`(?m)^\[0\] cpus ` + coreCPUs(0) + `$`),
				regexp.MustCompile(`(?m)^\[1\] cpus ` + regexp.QuoteMeta(core0.String()) + ` gomaxprocs ` + strconv.Itoa(core0.Count()) + `$`),
			},
		},
		{
			// Each host's ranks take its CPUs in their order on it,
			// whatever the placement: here ranks 0 and 2, on far 1 and 3.
			name: "bound remote by node", flags: append(remoteFlags("localhost:2,far:2"), "-map-by", "node", "-bind", "hwthread"), n: 4, behaviour: "cpus", status: 0,
			needs: "taskset", minCPUs: 2, cpus01: true,
			stdout: []*regexp.Regexp{
				regexp.MustCompile(`(?m)^\[0\] cpus ` + cpu(0) + ` gomaxprocs 1$`),
				regexp.MustCompile(`(?m)^\[1\] cpus 0 gomaxprocs 1$`),
				regexp.MustCompile(`(?m)^\[2\] cpus ` + cpu(1) + ` gomaxprocs 1$`),
				regexp.MustCompile(`(?m)^\[3\] cpus 1 gomaxprocs 1$`),
			},
		},
		{
			name: "too many to bind", flags: []string{"-bind", "core"}, n: len(cores) + 1, behaviour: "plain", status: exitFailed,
			stderr: []*regexp.Regexp{regexp.MustCompile(`(?m)^mdrun: -bind core: rank ` + strconv.Itoa(len(cores)) + ` would be the \d+(st|nd|rd|th) rank on this host, and mdrun may use ` + strconv.Itoa(len(cores)) + ` cores \(CPUs ` + regexp.QuoteMeta(allowed.String()) + `\)$`)},
		},
		{
			name: "too many to bind to hardware threads", flags: []string{"-bind", "hwthread"}, n: allowed.Count() + 1, behaviour: "plain", status: exitFailed,
			stderr: []*regexp.Regexp{regexp.MustCompile(`(?m)^mdrun: -bind hwthread: rank ` + strconv.Itoa(allowed.Count()) + ` would be the \d+(st|nd|rd|th) rank on this host, and mdrun may use ` + strconv.Itoa(allowed.Count()) + ` CPUs \(` + regexp.QuoteMeta(allowed.String()) + `\)$`)},
		},
		{
			name: "verbose", flags: []string{"-v"}, n: 1, behaviour: "exchange", status: 0,
			stderr:    []*regexp.Regexp{regexp.MustCompile(`mdrun: rank started: rank=0`)},
			pidsPrint: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if allowed.Count() < tt.minCPUs || len(cores) < tt.minCores {
				t.Skipf("needs %d CPUs and %d cores, this test may use %v (%d cores)", tt.minCPUs, tt.minCores, allowed, len(cores))
			}
			if _, err := exec.LookPath(tt.needs); tt.needs != "" && err != nil {
				t.Skipf("needs %s in PATH", tt.needs)
			}
			if tt.cpus01 && !(allowed.Has(0) && allowed.Has(1)) {
				t.Skipf("needs CPUs 0 and 1, this test may use %v", allowed)
			}
			args := append(append([]string{}, tt.flags...), "-n", strconv.Itoa(tt.n), helper, tt.behaviour)
			status, stdout, stderr := runMdrun(t, args, nil, nil)
			if status != tt.status {
				t.Errorf("exit status %d, want %d", status, tt.status)
			}
			matchOutput(t, stdout, stderr, tt.stdout, tt.stderr)
			if tt.notStdout != nil && tt.notStdout.MatchString(stdout) {
				t.Errorf("stdout matches %v", tt.notStdout)
			}
			if got := pids(t, stdout); len(got) != tt.pidsPrint {
				t.Errorf("%d ranks printed their pid, want %d", len(got), tt.pidsPrint)
			} else {
				checkGone(t, got)
			}
		})
	}
}

// remoteFlags places ranks on hosts, starting those not named localhost
// through fakeSSH.
func remoteFlags(hosts string) []string {
	return []string{"-hosts", hosts, "-launcher", fakeSSH, "-listen", "127.0.0.1:0"}
}

func TestUsageErrors(t *testing.T) {
	// A file that is there but not executable is not "not found".
	noExec := filepath.Join(t.TempDir(), "prog.txt")
	if err := os.WriteFile(noExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	checkUsageErrors(t, []usageCase{
		{"nothing", nil, "-n is missing"},
		{"n missing", []string{helper}, "-n is missing: give the number of ranks"},
		{"program not executable", []string{"-n", "2", noExec}, fmt.Sprintf("program %q cannot be run", noExec)},
		{"n zero", []string{"-n", "0", helper}, "-n 0"},
		{"n negative", []string{"-n", "-2", helper}, "-n -2"},
		{"n not a number", []string{"-n", "four", helper}, `invalid value "four" for flag -n`},
		{"no program", []string{"-n", "2"}, "no program to run"},
		{"program not found", []string{"-n", "2", "/nonexistent/prog"}, `program "/nonexistent/prog" not found`},
		{"program not in PATH", []string{"-n", "2", "no-such-mdrun-program"}, `program "no-such-mdrun-program" not found`},
		{"unknown flag", []string{"-bogus", "-n", "2", helper}, "flag provided but not defined: -bogus"},
		{"plugins missing", []string{"-plugins", "/nonexistent/plugins.hcl", "-n", "1", helper}, "-plugins: stat /nonexistent/plugins.hcl"},
		{"conntable missing", []string{"-conntable", "/nonexistent/ct", "-n", "1", helper}, "-conntable: stat /nonexistent/ct"},
		{"negative timeout", []string{"-timeout", "-1s", "-n", "1", helper}, "-timeout -1s is negative"},
		{"bind to what", []string{"-bind", "socket", "-n", "1", helper}, `-bind "socket": want none, core or hwthread`},
		{"hosts and hostfile", []string{"-hosts", "a", "-hostfile", "/dev/null", "-n", "1", helper}, "give -hosts or -hostfile, not both"},
		{"bad slots", []string{"-hosts", "a,b:0", "-n", "1", helper}, `-hosts: host "b:0": slots "0" is not a number from 1 to 65536`},
		{"bad host", []string{"-hosts", "a,,b", "-n", "1", helper}, `-hosts: host "" is not a host name`},
		{"empty launcher", []string{"-hosts", "a", "-launcher", " ", "-n", "1", helper}, "-launcher is empty"},
		{"wdir missing", []string{"-wdir", "/nonexistent/wdir", "-n", "1", helper}, "-wdir /nonexistent/wdir: no such file or directory"},
		{"wdir a file", []string{"-wdir", "/etc/hostname", "-n", "1", helper}, "-wdir /etc/hostname: not a directory"},
		{"bad export", []string{"-x", "=1", "-n", "1", helper}, `-x "=1": want NAME or NAME=VALUE, with a variable name`},
		{"empty export", []string{"-x", "", "-n", "1", helper}, `-x "": want NAME or NAME=VALUE`},
		{"export of mdrun's own", []string{"-x", "MDRUN_RANK=3", "-n", "1", helper}, `-x "MDRUN_RANK=3": mdrun sets MDRUN_RANK itself`},
		{"export of mdrun's MD_APPNUM", []string{"-x", "MD_APPNUM=3", "-n", "1", helper}, `-x "MD_APPNUM=3": mdrun sets MD_APPNUM itself`},
		{"map by what", []string{"-map-by", "socket", "-n", "1", helper}, `-map-by "socket": want slot or node`},
		{"map by nothing", []string{"-map-by", "", "-n", "1", helper}, `-map-by "": want slot or node`},
		{"ppn zero", []string{"-hosts", "a", "-ppn", "0", "-n", "1", helper}, "-ppn 0: want a number of ranks per host from 1 to 65536"},
		{"ppn negative", []string{"-hosts", "a", "-ppn", "-1", "-n", "1", helper}, "-ppn -1: want a number"},
		{"ppn too many", []string{"-hosts", "a", "-ppn", "65537", "-n", "1", helper}, "-ppn 65537: want a number of ranks per host from 1 to 65536"},
		{"ppn not a number", []string{"-hosts", "a", "-ppn", "two", "-n", "1", helper}, `invalid value "two" for flag -ppn`},
		{"ppn without hosts", []string{"-ppn", "2", "-n", "1", helper}, "-ppn 2: give -hosts or -hostfile too"},
		{"ppn and slots", []string{"-hosts", "a,b:3", "-ppn", "2", "-n", "1", helper}, "-ppn 2: host b gives its own slots (3); give the slots there or -ppn, not both"},
		{"ppn and a hostfile's slots", []string{"-hostfile", slotsFile(t), "-ppn", "2", "-n", "1", helper}, "-ppn 2: host b gives its own slots (4)"},
		{"hostfile missing", []string{"-hostfile", "/nonexistent/hosts", "-n", "1", helper}, "-hostfile: open /nonexistent/hosts"},
		{"relay program missing", []string{"-relay", "localhost", "-relay-cmd", "no-such-mdrelay", "-n", "1", helper}, `-relay-cmd: relay program "no-such-mdrelay" not found`},
		{"empty site", []string{"-hosts", "a:2@,b", "-n", "1", helper}, `-hosts: host "a:2@": the site is empty`},
		{"two sites for a host", []string{"-hosts", "a@A,b@A,a@B", "-n", "1", helper}, "-hosts: host a is in site B here and in site A before"},
		{"bad relay host", []string{"-relay", "a,,b", "-n", "1", helper}, `-relay: host "" is not a host name`},
		{"empty relay site", []string{"-relay", "gw:2@", "-n", "1", helper}, `-relay: host "gw:2@": the site is empty`},
		{"bad relay site", []string{"-relay", "gw@A/B", "-n", "1", helper}, `-relay: host "gw@A/B": site "A/B": use only letters`},
		{"two sites for a relay host", []string{"-relay", "gw@A,gw@B", "-n", "1", helper}, "-relay: host gw is in site B here and in site A before"},
	})
}

// slotsFile writes a hostfile whose second host gives its slots.
func slotsFile(t *testing.T) string {
	path := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(path, []byte("a\nb slots=4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// matchOutput fails t for each of outREs that stdout does not match and
// each of errREs that stderr does not.
func matchOutput(t *testing.T, stdout, stderr string, outREs, errREs []*regexp.Regexp) {
	t.Helper()
	for _, re := range outREs {
		if !re.MatchString(stdout) {
			t.Errorf("stdout does not match %v", re)
		}
	}
	for _, re := range errREs {
		if !re.MatchString(stderr) {
			t.Errorf("stderr does not match %v", re)
		}
	}
}

// usageCase is a command line mdrun must refuse, and what it must say.
type usageCase struct {
	name string
	args []string
	want string
}

// checkUsageErrors runs mdrun on each case: it must exit with the usage
// status, say what is wrong, show the usage and print nothing else.
func checkUsageErrors(t *testing.T, tests []usageCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, stdout, stderr := runMdrun(t, tt.args, nil, nil)
			if status != exitUsage {
				t.Errorf("exit status %d, want %d", status, exitUsage)
			}
			if !strings.Contains(stderr, tt.want) || !strings.Contains(stderr, "usage: mdrun") {
				t.Errorf("stderr %q does not say %q and show the usage", stderr, tt.want)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
		})
	}
}

// TestFailedJobEndsWhatRanksStarted: when a job fails, the processes its
// ranks started go with it, also those of a rank that had already exited
// (mdrun once signalled only ranks it had not reaped).
func TestFailedJobEndsWhatRanksStarted(t *testing.T) {
	dir := t.TempDir()
	// Rank 0 starts a child and exits 0; rank 1, once mdrun has reaped
	// rank 0 (kill -0 finds a zombie too), starts one and fails.
	script := `pids=` + dir + `; sleep 300 </dev/null >/dev/null 2>&1 & echo $! > $pids/child$MDRUN_RANK
if [ "$MDRUN_RANK" = 0 ]; then echo $$ > $pids/rank0.tmp; mv $pids/rank0.tmp $pids/rank0; exit 0; fi
until [ -f $pids/rank0 ]; do sleep 0.01; done
while kill -0 $(cat $pids/rank0) 2>/dev/null; do sleep 0.01; done
exit 5`
	if status, _, _ := runMdrun(t, []string{"-n", "2", "sh", "-c", script}, nil, nil); status != 5 {
		t.Fatalf("status %d, want 5", status)
	}
	for r := range 2 {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("child%d", r)))
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		// The signal is sent before mdrun returns; dying takes a moment.
		// An orphan's zombie counts as gone: its reaper is not ours.
		for deadline := time.Now().Add(watchdog); running(pid); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				syscall.Kill(pid, syscall.SIGKILL)
				t.Fatalf("rank %d's child %d still runs after the job failed", r, pid)
			}
		}
	}
}

// TestClosedStdout: mdrun's reader goes away (mdrun ... | head) while the
// ranks run. mdrun once died of SIGPIPE at its next line, leaving its
// ranks running without it and its rendezvous directory behind. It now
// ends the job as a failure, with SIGPIPE's status.
func TestClosedStdout(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	closed := filepath.Join(t.TempDir(), "closed")
	script := `echo pid $$; if [ "$MDRUN_RANK" = 0 ]; then until [ -f ` + closed + ` ]; do sleep 0.01; done; echo more; fi; exec sleep 300`
	var stderr lockedBuffer
	status := make(chan int, 1)
	go func() { status <- run(t.Context(), []string{"-n", "2", "sh", "-c", script}, w, &stderr, nil) }()
	var out strings.Builder
	for br := bufio.NewReader(r); len(pids(t, out.String())) < 2; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading mdrun's output: %v", err)
		}
		out.WriteString(line)
	}
	r.Close()
	if err := os.WriteFile(closed, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-status:
		if s != 128+int(syscall.SIGPIPE) {
			t.Errorf("status %d, want %d; stderr:\n%s", s, 128+int(syscall.SIGPIPE), &stderr)
		}
	case <-time.After(watchdog):
		t.Fatal("watchdog: mdrun did not end the job")
	}
	if want := "mdrun: standard output is closed"; !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr %q, want %q", &stderr, want)
	}
	checkGone(t, pids(t, out.String()))
}

// TestStdoutWriteError: a standard output that fails otherwise than by a
// closed pipe (a full disk; /dev/full here) ends the job naming the error,
// not as if its reader had gone away; one whose reader went away ends it
// as SIGPIPE would. Also when the failed write is the last rank's last
// line, one without a newline, written only as mdrun reaps the rank:
// mdrun once had stopped watching for failed writes by then and exited 0,
// the output lost without a word.
func TestStdoutWriteError(t *testing.T) {
	full := func(t *testing.T) *os.File {
		f, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
		if err != nil {
			t.Skipf("no /dev/full to write to: %v", err)
		}
		return f
	}
	closedPipe := func(t *testing.T) *os.File {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		r.Close()
		return w
	}
	const noSpace = "mdrun: writing standard output: write /dev/full: no space left on device; terminating the job"
	const gone = "mdrun: standard output is closed (its reader went away); terminating the job"
	tests := []struct {
		name   string
		out    func(*testing.T) *os.File
		script string
		status int
		stderr string
	}{
		{"full, a line", full, "echo hi", exitFailed, noSpace},
		{"full, the last line unterminated", full, "printf hi", exitFailed, noSpace},
		{"closed, the last line unterminated", closedPipe, "printf hi", 128 + int(syscall.SIGPIPE), gone},
		// The rank's own failure came first and stands.
		{"full, the rank failed", full, "printf hi; exit 3", 3, "exited with status 3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := tt.out(t)
			defer out.Close()
			var stderr lockedBuffer
			if status := run(t.Context(), []string{"-n", "1", "sh", "-c", tt.script}, out, &stderr, nil); status != tt.status {
				t.Errorf("status %d, want %d", status, tt.status)
			}
			if !strings.Contains(stderr.String(), tt.stderr) {
				t.Errorf("stderr %q, want %q", &stderr, tt.stderr)
			}
		})
	}
}

// TestTerminationEndsWhatRanksLeft: a rank's process group may outlive
// the rank, holding a process it started that ignores SIGINT or SIGTERM
// (sh starts a background job with SIGINT ignored). Once the job ends by
// a signal, a failure or -timeout, mdrun still sends SIGKILL after the
// grace period to every group with a member left; it once returned as
// soon as the last rank was reaped, leaving such a process orphaned. A
// job that succeeds does not wait for the grace period, and leaves what
// its ranks started alone, as mpirun does: a rank may start a daemon on
// purpose.
func TestTerminationEndsWhatRanksLeft(t *testing.T) {
	// child starts a process that ignores what the job sends, and waits
	// until it does: its pid is in the file child once it ignores them.
	const child = `sh -c 'trap "" INT TERM; echo $$ > "$0.tmp"; mv "$0.tmp" "$0"; exec sleep 300' "$D/child" </dev/null >/dev/null 2>&1 &
until [ -f "$D/child" ]; do sleep 0.01; done; `
	tests := []struct {
		name   string
		flags  []string
		script string // rank 0's; $D is a directory of the test's
		sig    os.Signal
		status int
		left   bool // the child must still run when mdrun returns
	}{
		// sh ignores SIGINT in its background job by itself.
		{"SIGINT", nil, `sleep 300 </dev/null >/dev/null 2>&1 & echo $! > "$D/child"; echo ready; wait`, syscall.SIGINT, 128 + int(syscall.SIGINT), false},
		{"failure", nil, child + `exit 5`, nil, 5, false},
		{"timeout", []string{"-timeout", "300ms"}, child + `echo ready; wait`, nil, exitTimeout, false},
		{"success", nil, child + `exit 0`, nil, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			script := strings.ReplaceAll(tt.script, "$D", dir)
			stdout := &lockedBuffer{watch: "ready", want: 1, seen: make(chan struct{})}
			var sigs chan os.Signal
			if tt.sig != nil {
				sigs = make(chan os.Signal, 1)
				go func() { <-stdout.seen; sigs <- tt.sig }()
			}
			start := time.Now()
			status, _, _ := runMdrun(t, append(append([]string{}, tt.flags...), "-n", "1", "sh", "-c", script), stdout, sigs)
			took := time.Since(start)
			b, err := os.ReadFile(filepath.Join(dir, "child"))
			if err != nil {
				t.Fatal(err)
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatal(err)
			}
			defer syscall.Kill(pid, syscall.SIGKILL)
			if status != tt.status {
				t.Errorf("status %d, want %d", status, tt.status)
			}
			if tt.left {
				if !running(pid) {
					t.Errorf("the child %d of a rank that succeeded was ended", pid)
				}
				if took >= killGrace {
					t.Errorf("a job that succeeded took %v, as long as the grace period", took)
				}
				return
			}
			// SIGKILL was sent before mdrun returned; dying takes a
			// moment. An orphan's zombie counts as gone.
			for deadline := time.Now().Add(2 * time.Second); running(pid); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("rank 0's child %d still runs after mdrun returned %d (orphaned)", pid, status)
				}
			}
		})
	}
}

// TestFailedJobSparesReusedPid: rank 0 exits 0 and is reaped; its process
// group is empty, so its pid is free and the kernel hands it to an
// unrelated process that leads a group of its own (another job's rank, a
// shell's job). When rank 1 then fails, mdrun's SIGTERM to the exited
// rank's group must not reach that stranger. The pid is made to repeat at
// once through ns_last_pid, in a pid namespace of the test's own; on a
// busy machine it takes pid_max forks.
func TestFailedJobSparesReusedPid(t *testing.T) {
	if os.Getenv("MDRUN_PIDNS_INNER") != "1" {
		if os.Geteuid() != 0 {
			t.Skip("needs root for a pid namespace")
		}
		exe, _ := os.Executable()
		cmd := exec.Command(exe, "-test.run=^TestFailedJobSparesReusedPid$", "-test.v", "-test.timeout=60s")
		cmd.Env = append(os.Environ(), "MDRUN_PIDNS_INNER=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
		out, err := cmd.CombinedOutput()
		t.Logf("in a pid namespace:\n%s", out)
		if err != nil {
			t.Fatalf("inner test: %v", err)
		}
		return
	}
	dir := t.TempDir()
	fifo := filepath.Join(dir, "go")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// Rank 1 waits without forking, so it takes no pid meanwhile.
	script := `if [ "$MDRUN_RANK" = 0 ]; then echo $$ > ` + dir + `/r0.tmp; mv ` + dir + `/r0.tmp ` + dir + `/r0; exit 0; fi
read x < ` + fifo + `; exit 5`
	status := make(chan int, 1)
	go func() {
		s, _, _ := runMdrun(t, []string{"-n", "2", "sh", "-c", script}, nil, nil)
		status <- s
	}()
	var pid int
	for deadline := time.Now().Add(watchdog); ; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("rank 0 never wrote its pid")
		}
		b, err := os.ReadFile(filepath.Join(dir, "r0"))
		if err != nil {
			continue
		}
		if pid, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
			t.Fatal(err)
		}
		break
	}
	// Until mdrun reaped rank 0 (kill 0 finds a zombie).
	for deadline := time.Now().Add(watchdog); !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("rank 0 was never reaped")
		}
	}
	var victim *exec.Cmd
	for try := 0; ; try++ {
		if try == 100 {
			t.Fatalf("could not get pid %d again", pid)
		}
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0); err != nil {
			t.Skipf("ns_last_pid: %v", err)
		}
		c := exec.Command("sleep", "300")
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // leads its own group, as a shell's job or another job's rank
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		if c.Process.Pid == pid {
			victim = c
			break
		}
		c.Process.Kill()
		c.Wait()
	}
	t.Logf("unrelated process %d, group %d, has rank 0's old pid", victim.Process.Pid, victim.Process.Pid)
	f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(f, "fail")
	f.Close()
	if s := <-status; s != 5 {
		t.Errorf("mdrun status %d, want 5", s)
	}
	victim.Process.Signal(syscall.SIGKILL)
	victim.Wait()
	ws := victim.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() && ws.Signal() == syscall.SIGTERM {
		t.Errorf("mdrun's SIGTERM for rank 0's group killed unrelated process %d, which had rank 0's pid after it was reaped", victim.Process.Pid)
	}
}

// running reports whether pid exists and is not a zombie.
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command, which is in parentheses.
	_, after, ok := strings.Cut(string(b), ") ")
	return ok && !strings.HasPrefix(after, "Z")
}

func TestSignalForwarding(t *testing.T) {
	tests := []struct {
		name string
		sig  syscall.Signal
	}{
		{"SIGTERM", syscall.SIGTERM},
		{"SIGINT", syscall.SIGINT},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			const n = 3
			stdout := &lockedBuffer{watch: "ready", want: n, seen: make(chan struct{})}
			sigs := make(chan os.Signal, 1)
			go func() {
				<-stdout.seen
				sigs <- tt.sig
			}()
			status, out, stderr := runMdrun(t, []string{"-n", strconv.Itoa(n), helper, "block"}, stdout, sigs)
			if want := 128 + int(tt.sig); status != want {
				t.Errorf("exit status %d, want %d", status, want)
			}
			if want := fmt.Sprintf("mdrun: received %v; passing it on to the ranks", tt.sig); !strings.Contains(stderr, want) {
				t.Errorf("stderr does not say %q", want)
			}
			got := pids(t, out)
			if len(got) != n {
				t.Fatalf("%d ranks printed their pid, want %d", len(got), n)
			}
			checkGone(t, got)
		})
	}
}

// TestTerminalSignalsEndJob: mdrun takes the signals a terminal sends
// when it closes (SIGHUP) or on Ctrl-\ (SIGQUIT) as it takes SIGTERM: it
// passes them on to the ranks' process groups, SIGKILLs what is left
// after the grace period, and exits 128+S. The terminal's signal reaches
// only mdrun, the ranks being in process groups of their own; mdrun
// once died of it, and Pdeathsig ended the rank process alone, orphaning
// what it started (here a sleep, which sh starts ignoring SIGQUIT).
func TestTerminalSignalsEndJob(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			var stderr lockedBuffer
			cmd, line := startJob(t, &stderr, "-n", "1", "sh", "-c", `sleep 300 </dev/null >/dev/null 2>&1 & echo child $!; wait`)
			child, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "[0] child ")))
			if err != nil {
				t.Fatalf("rank 0 said %q: %v", line, err)
			}
			defer syscall.Kill(child, syscall.SIGKILL)
			cmd.Process.Signal(sig)
			cmd.Wait()
			if got, want := cmd.ProcessState.String(), fmt.Sprintf("exit status %d", 128+int(sig)); got != want {
				t.Errorf("mdrun ended with %s, want %s", got, want)
			}
			if want := fmt.Sprintf("mdrun: received %v; passing it on to the ranks", sig); !strings.Contains(stderr.String(), want) {
				t.Errorf("stderr does not say %q; mdrun's first line is %q", want, firstMdrunLine(stderr.String()))
			}
			// SIGKILL was sent before mdrun returned; dying takes a
			// moment. An orphan's zombie counts as gone.
			for deadline := time.Now().Add(2 * time.Second); running(child); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("rank 0's child %d still runs after mdrun ended (orphaned)", child)
				}
			}
		})
	}
}

// TestLocalNamesOneHost: ranks placed on this machine through "localhost"
// and through its host name, relays included, are on one host, and get one
// MDRUN_HOST and one MD_SITE: the library tells hosts apart by MDRUN_HOST,
// and took such ranks for two hosts (no shared memory between them; TCP
// refused them, both hosts having the same addresses). The name is the
// first of this machine's in -hosts, else its host name.
func TestLocalNamesOneHost(t *testing.T) {
	self, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if self == "localhost" || self == "far" {
		t.Skipf("this machine is called %s, a name this test needs for another", self)
	}
	tests := []struct {
		name   string
		flags  []string
		n      int    // ranks of the application; all but relays
		hosts  string // every rank's MDRUN_HOST
		site   string // every rank's MD_SITE, "" not checked
		status int
		stderr string
	}{
		{"localhost first", []string{"-hosts", "localhost," + self}, 2, "localhost", "", 0, ""},
		{"host name first", []string{"-hosts", self + ",localhost"}, 2, self, "", 0, ""},
		{"in a site", []string{"-hosts", "localhost@A," + self + "@A"}, 2, "localhost", "A", 0, ""},
		{"a relay here", []string{"-relay", "localhost", "-relay-cmd", helper + " env"}, 1, self, "", 0, ""},
		{"a relay beside -hosts", []string{"-hosts", self, "-relay", "localhost", "-relay-cmd", helper + " env"}, 1, self, "", 0, ""},
		{"in two sites", []string{"-hosts", "localhost@A," + self}, 2, "", "", exitUsage,
			"mdrun: -hosts: localhost and " + self + " are both this machine, in site A and in no site: a host is in one site or in none"},
		{"a relay here in the site of -hosts", []string{"-hosts", self + "@A", "-relay", "localhost@A", "-relay-cmd", helper + " env"}, 1, self, "A", 0, ""},
		{"a relay here taking the site of -hosts", []string{"-hosts", self + "@A", "-relay", "localhost", "-relay-cmd", helper + " env"}, 1, self, "A", 0, ""},
		{"a relay here in another site than -hosts'", []string{"-hosts", self + "@A", "-relay", "localhost@B", "-relay-cmd", helper + " env"}, 1, "", "", exitUsage,
			"mdrun: -relay: localhost is in site B, and -hosts has " + self + " in site A: a host is in one site or in none"},
		{"a relay here in a site without -hosts", []string{"-relay", "localhost@A", "-relay-cmd", helper + " env"}, 1, "", "", exitUsage,
			"mdrun: -relay: localhost is in site A, and without -hosts the programs' ranks run there, in no site"},
		{"relays here in two sites", []string{"-hosts", "far", "-launcher", "false", "-listen", "127.0.0.1:0", "-relay", "localhost@A," + self + "@B", "-relay-cmd", helper + " env"}, 1, "", "", exitUsage,
			"mdrun: -relay: localhost and " + self + " are both this machine, in site A and in site B: a host is in one site or in none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := append(append([]string{}, tt.flags...), "-n", strconv.Itoa(tt.n), helper, "env")
			status, stdout, stderr := runMdrun(t, args, nil, nil)
			if status != tt.status {
				t.Errorf("exit status %d, want %d", status, tt.status)
			}
			if !strings.Contains(stderr, tt.stderr) {
				t.Errorf("stderr does not say %q", tt.stderr)
			}
			if tt.status != 0 {
				return
			}
			ranks := 0
			for _, m := range regexp.MustCompile(`(?m)^\[(\d+)\] MDRUN_RANK=\d+ MDRUN_HOST=(.*)$`).FindAllStringSubmatch(stdout, -1) {
				ranks++
				if m[2] != tt.hosts {
					t.Errorf("rank %s: MDRUN_HOST=%s, want %s", m[1], m[2], tt.hosts)
				}
			}
			if want := tt.n + strings.Count(strings.Join(tt.flags, " "), "-relay "); ranks != want {
				t.Errorf("%d ranks said their host, want %d", ranks, want)
			}
			if tt.site != "" {
				for _, m := range regexp.MustCompile(`(?m)^\[(\d+)\] MD_SITE=(.*)$`).FindAllStringSubmatch(stdout, -1) {
					if m[2] != tt.site {
						t.Errorf("rank %s: MD_SITE=%s, want %s", m[1], m[2], tt.site)
					}
				}
			}
		})
	}
}

// TestLocalRankMissingWdir: a -wdir missing here, for a rank that -hosts
// or -relay places here, is named as the missing directory before any
// rank starts, as without -hosts. It was reported as the program's
// failure to start ("fork/exec /usr/bin/true: no such file or
// directory").
func TestLocalRankMissingWdir(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none")
	tests := []struct {
		name string
		args []string
	}{
		{"-hosts localhost", []string{"-hosts", "localhost", "-wdir", missing, "-n", "1", "true"}},
		{"a program's -wdir", []string{"-hosts", "localhost:2", "-n", "1", "true", ":", "-n", "1", "-wdir", missing, "true"}},
		{"a relay here", append(remoteFlags("far"), "-relay", "localhost", "-relay-cmd", helper, "-wdir", missing, "-n", "1", "true")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			status, _, stderr := runMdrun(t, tt.args, nil, nil)
			if status != exitUsage {
				t.Errorf("exit status %d, want %d", status, exitUsage)
			}
			if want := "mdrun: -wdir " + missing + ": no such file or directory\n"; stderr != want {
				t.Errorf("stderr %q, want %q", stderr, want)
			}
		})
	}
}

// TestNoPrefixPassesOutputThrough: with -prefix=false the ranks' output
// reaches mdrun's as they wrote it, binary output included (mdrun
// -prefix=false -n 1 gzip -c f > f.gz). mdrun once still cut lines at
// 64 KiB and ended an unterminated last line with a newline.
func TestNoPrefixPassesOutputThrough(t *testing.T) {
	tests := []struct {
		name           string
		script         string
		stdout, stderr string
	}{
		{"a long last line", `head -c 100000 /dev/zero | tr '\0' x; printf end`, strings.Repeat("x", 100000) + "end", ""},
		{"binary", `printf 'a\000b\r\n\377'`, "a\x00b\r\n\xff", ""},
		{"standard error", `printf 'no newline' >&2`, "", "no newline"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			status, stdout, stderr := runMdrun(t, []string{"-prefix=false", "-n", "1", "sh", "-c", tt.script}, nil, nil)
			if status != 0 {
				t.Errorf("exit status %d, want 0", status)
			}
			if stdout != tt.stdout {
				t.Errorf("stdout: %d bytes, %d newlines, want %d bytes, %d newlines", len(stdout), strings.Count(stdout, "\n"), len(tt.stdout), strings.Count(tt.stdout, "\n"))
			}
			if stderr != tt.stderr {
				t.Errorf("stderr %q, want %q", stderr, tt.stderr)
			}
		})
	}
}

// TestRepeatedHangupKeepsGrace: a closing terminal hangs mdrun up twice
// (the shell passes SIGHUP to its jobs, and the kernel sends the
// foreground group another as the shell, the session leader, exits).
// That is no impatient user: the ranks keep killGrace to clean up. mdrun
// took the second for one and killed them at once, so a rank's SIGHUP
// handler never finished.
func TestRepeatedHangupKeepsGrace(t *testing.T) {
	done := filepath.Join(t.TempDir(), "cleaned")
	cmd, _ := startJob(t, nil, "-n", "1", "sh", "-c",
		`trap "sleep 0.5; echo cleaned > `+done+`; exit 0" HUP; echo ready; while :; do sleep 0.05; done`)
	cmd.Process.Signal(syscall.SIGHUP)
	time.Sleep(50 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGHUP)
	cmd.Wait()
	if _, err := os.Stat(done); err != nil {
		t.Errorf("the rank's SIGHUP handler did not finish after two hangups (%v); mdrun ended with %s", err, cmd.ProcessState)
	}
}

// startJob starts mdrun with args, its stderr to stderr, and returns it
// once rank 0 has written its first line, which it returns too. The job
// is killed when the test ends.
func startJob(t *testing.T, stderr io.Writer, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(mdrunExe, args...)
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("no word from rank 0: %v", err)
	}
	return cmd, line
}
