package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/internal/netns"
)

// The tests run ordercheck under real launchers. The test binary plays the
// program: TestMain runs main when it is started under the name ordercheck
// (a symlink), so no binary is built for it.
//
// The multi-host tests stand for hosts with network namespaces. A launcher
// reaches a host through a script that behaves like ssh: it takes the host
// name (after any options) and a command line, and runs that command line
// through a shell inside the host's namespace.

const helperName = "ordercheck"

// helperDir holds the symlinks; helper is the program's path.
var helperDir, helper string

func TestMain(m *testing.M) {
	switch filepath.Base(os.Args[0]) {
	case helperName:
		main()
		os.Exit(0)
	case helperName + "-abort":
		os.Exit(abortMain())
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if helperDir, err = os.MkdirTemp("", "ordercheck-test-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Readable by the unprivileged users some launchers run ranks as.
	os.Chmod(helperDir, 0o755)
	helper = filepath.Join(helperDir, helperName)
	for _, name := range []string{helper, helper + "-abort"} {
		if err := os.Symlink(exe, name); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(helperDir)
	os.Exit(code)
}

// cleanEnv is this process's environment without any launcher's variables,
// so a test run under a launcher does not confuse the jobs it starts.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "MDRUN_") || strings.HasPrefix(kv, "PMI_") || strings.HasPrefix(kv, "MD_PMI=") || strings.HasPrefix(kv, "SLURM_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// watchdog turns a hung job into a failure; it asserts nothing about speed.
const watchdog = 2 * time.Minute

// runJob runs a launcher command and returns its exit status and output.
func runJob(t *testing.T, cmd *exec.Cmd) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), watchdog)
	defer cancel()
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		cmd.Process.Kill()
		<-done
		t.Fatalf("%s did not end within %v:\n%s", cmd, watchdog, out)
	}
	t.Logf("%s\n%s", cmd, out)
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	return 0, string(out)
}

var okLine = regexp.MustCompile(`(?m)rank (\d+) of (\d+) on (\S+): ring ok, order ok, collectives ok, exchange ok \(\d+ messages to each peer; subdevices ([a-z,]+); (\d+) ranks on this host\)`)

// checkRanks checks that every rank reported success and that ranks sit on
// the hosts wantHost names (ranks with equal names share a host), using
// shm inside a host and tcp between hosts.
func checkRanks(t *testing.T, out string, wantHost []string) {
	t.Helper()
	n := len(wantHost)
	hostOf := map[string]string{} // rank -> host it reported
	subs := map[string]string{}
	onHost := map[string]string{} // rank -> the size of its SplitHost communicator
	for _, m := range okLine.FindAllStringSubmatch(out, -1) {
		if m[2] != fmt.Sprint(n) {
			t.Errorf("rank %s reports a world of %s, want %d", m[1], m[2], n)
		}
		hostOf[m[1]] = m[3]
		subs[m[1]] = m[4]
		onHost[m[1]] = m[5]
	}
	if len(hostOf) != n {
		t.Fatalf("%d of %d ranks reported success", len(hostOf), n)
	}
	multi := false
	for a := range n {
		mates := 0
		for _, h := range wantHost {
			if h == wantHost[a] {
				mates++
			}
		}
		if onHost[fmt.Sprint(a)] != fmt.Sprint(mates) {
			t.Errorf("rank %d's SplitHost has %s ranks, want %d", a, onHost[fmt.Sprint(a)], mates)
		}
		for b := range n {
			same := wantHost[a] == wantHost[b]
			if got := hostOf[fmt.Sprint(a)] == hostOf[fmt.Sprint(b)]; got != same {
				t.Errorf("ranks %d and %d on hosts %q and %q; want same host %v", a, b, hostOf[fmt.Sprint(a)], hostOf[fmt.Sprint(b)], same)
			}
			multi = multi || !same
		}
	}
	want := "shm"
	if multi {
		want = "shm,tcp"
	}
	for r, s := range subs {
		if s != want {
			t.Errorf("rank %s used subdevices %s, want %s", r, s, want)
		}
	}
}

func needHydra(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts jobs under mpiexec")
	}
	p, err := exec.LookPath("mpiexec.hydra")
	if err != nil {
		t.Skip("MPICH's Hydra (mpiexec.hydra) is not installed; apt-get install mpich")
	}
	return p
}

// TestHydraOneHost: mpiexec -n 4 on this host, over PMI-2 (the default) and
// PMI-1.
func TestHydraOneHost(t *testing.T) {
	mpiexec := needHydra(t)
	for _, pmi := range []string{"", "1", "2"} {
		t.Run("pmi"+pmi, func(t *testing.T) {
			cmd := exec.Command(mpiexec, "-n", "4", helper, "-messages", "50")
			cmd.Env = cleanEnv("MD_PMI=" + pmi)
			status, out := runJob(t, cmd)
			if status != 0 {
				t.Fatalf("mpiexec exited %d", status)
			}
			checkRanks(t, out, []string{"a", "a", "a", "a"})
		})
	}
}

// abortMain is a rank that aborts (rank 1) or waits for a message that
// never comes (the others): the manager must end the job.
func abortMain() int {
	ctx, cancel := context.WithTimeout(context.Background(), watchdog)
	defer cancel()
	w, err := adi.Init(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if w.Comm().Rank() == 1 {
		w.Abort(3, "rank 1 gives up")
		// Stay, so only the manager acting on the abort ends the job.
		time.Sleep(watchdog)
	}
	w.Comm().Recv(ctx, make([]byte, 1), 0, 99)
	return 1
}

// TestHydraAbort: a rank's Abort ends the job under Hydra, with the
// reason in the output and a failing status.
func TestHydraAbort(t *testing.T) {
	mpiexec := needHydra(t)
	for _, pmi := range []string{"1", "2"} {
		t.Run("pmi"+pmi, func(t *testing.T) {
			cmd := exec.Command(mpiexec, "-n", "3", helper+"-abort")
			cmd.Env = cleanEnv("MD_PMI=" + pmi)
			status, out := runJob(t, cmd)
			if status == 0 {
				t.Errorf("mpiexec exited 0 after an abort")
			}
			if !strings.Contains(out, "rank 1 gives up") || !strings.Contains(out, "aborting the job") {
				t.Errorf("output does not give the abort's reason")
			}
		})
	}
}

// twoHosts is netns.LAN with two hosts.
func twoHosts(t *testing.T) (head *netns.Host, script string) {
	t.Helper()
	return netns.LAN(t, 2)
}

// TestHydraTwoHosts: mpiexec on a head node starts 2 ranks on each of two
// hosts through the launch script.
func TestHydraTwoHosts(t *testing.T) {
	mpiexec := needHydra(t)
	head, script := twoHosts(t)
	for _, pmi := range []string{"1", "2"} {
		t.Run("pmi"+pmi, func(t *testing.T) {
			cmd := head.Command(context.Background(), mpiexec,
				"-launcher", "ssh", "-launcher-exec", script,
				"-hosts", "10.77.0.1:2,10.77.0.2:2", "-localhost", "10.77.0.10",
				"-n", "4", helper, "-messages", "50")
			cmd.Env = cleanEnv("MD_PMI=" + pmi)
			status, out := runJob(t, cmd)
			if status != 0 {
				t.Fatalf("mpiexec exited %d", status)
			}
			checkRanks(t, out, []string{"h1", "h1", "h2", "h2"})
		})
	}
}

// freePort returns a TCP port nobody listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestSlurm: srun --mpi=pmi2 -n 4 on a private one-node Slurm cluster that
// testdata/slurm-one-node.sh starts. It skips when not root, when Slurm or
// munge is not installed, or when the daemons do not come up in 20 s.
func TestSlurm(t *testing.T) {
	conf := startSlurm(t)
	for _, pmi := range []string{"", "1", "2"} {
		t.Run("pmi"+pmi, func(t *testing.T) {
			cmd := exec.Command("srun", "--mpi=pmi2", "-n", "4", helper, "-messages", "50")
			cmd.Env = cleanEnv(conf, "MD_PMI="+pmi)
			status, out := runJob(t, cmd)
			if status != 0 {
				t.Fatalf("srun exited %d", status)
			}
			checkRanks(t, out, []string{"a", "a", "a", "a"})
		})
	}
	// Slurm ends the step on an abort of either version, without -K: a
	// PMI-2 abort sent isworldabort=TRUE, which Slurm does not read, and
	// the step stayed until the watchdog (its stepd ends the step only
	// for isworld=TRUE).
	for _, pmi := range []string{"1", "2"} {
		t.Run("abort-pmi"+pmi, func(t *testing.T) {
			cmd := exec.Command("srun", "--mpi=pmi2", "-n", "3", helper+"-abort")
			cmd.Env = cleanEnv("MD_PMI="+pmi, conf)
			status, out := runJob(t, cmd)
			if status == 0 {
				t.Errorf("srun exited 0 after an abort")
			}
			if !strings.Contains(out, "rank 1 gives up") {
				t.Errorf("output does not give the abort's reason")
			}
		})
	}
}

var (
	mdrunOnce sync.Once
	mdrunPath string
	mdrunErr  error
)

// buildMdrun builds cmd/mdrun once per test binary.
func buildMdrun(t *testing.T) string {
	t.Helper()
	mdrunOnce.Do(func() {
		mdrunPath = filepath.Join(helperDir, "mdrun")
		out, err := exec.Command("go", "build", "-o", mdrunPath, "github.com/hpc-multidevice/multidevice/cmd/mdrun").CombinedOutput()
		if err != nil {
			mdrunErr = fmt.Errorf("build mdrun: %v\n%s", err, out)
		}
	})
	if mdrunErr != nil {
		t.Fatal(mdrunErr)
	}
	return mdrunPath
}

// helperProcs lists the processes still running the helper.
func helperProcs() []string {
	var procs []string
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range cmdlines {
		b, err := os.ReadFile(f)
		if err == nil && strings.HasPrefix(string(b), helper) {
			procs = append(procs, filepath.Base(filepath.Dir(f)))
		}
	}
	return procs
}

// TestMdrunSites: mdrun starts 2 ranks on each of three hosts, the first
// two in site A and the third in B, so that the collectives ordercheck
// checks go by hosts and then by sites, across processes and tcp.
func TestMdrunSites(t *testing.T) {
	if testing.Short() {
		t.Skip("builds mdrun and starts a job on namespace hosts")
	}
	head, script := netns.LAN(t, 3)
	cmd := head.Command(context.Background(), buildMdrun(t), "-hosts", "10.77.0.1:2@A,10.77.0.2:2@A,10.77.0.3:2@B",
		"-launcher", script, "-n", "6", helper, "-messages", "30")
	cmd.Env = cleanEnv()
	status, out := runJob(t, cmd)
	if status != 0 {
		t.Fatalf("mdrun exited %d", status)
	}
	checkRanks(t, out, []string{"h1", "h1", "h2", "h2", "h3", "h3"})
	for r, site := range "AAAABB" {
		if !regexp.MustCompile(fmt.Sprintf(`(?m)\brank %d of 6 on \S+: .* in site %c$`, r, site)).MatchString(out) {
			t.Errorf("rank %d does not report site %c", r, site)
		}
	}
}

// TestMdrunTwoHosts: mdrun on a head node starts 2 ranks on each of two
// hosts through the ssh-like launch script; when a rank aborts, mdrun ends
// the remote ranks too.
func TestMdrunTwoHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds mdrun and starts jobs on namespace hosts")
	}
	head, script := twoHosts(t)
	mdrun := buildMdrun(t)
	t.Run("ordercheck", func(t *testing.T) {
		cmd := head.Command(context.Background(), mdrun, "-hosts", "10.77.0.1:2,10.77.0.2:2", "-launcher", script,
			"-n", "4", helper, "-messages", "50")
		cmd.Env = cleanEnv()
		status, out := runJob(t, cmd)
		if status != 0 {
			t.Fatalf("mdrun exited %d", status)
		}
		checkRanks(t, out, []string{"h1", "h1", "h2", "h2"})
	})
	t.Run("abort", func(t *testing.T) {
		cmd := head.Command(context.Background(), mdrun, "-hosts", "10.77.0.1,10.77.0.2", "-launcher", script,
			"-n", "4", helper+"-abort")
		cmd.Env = cleanEnv()
		status, out := runJob(t, cmd)
		if status != 3 {
			t.Errorf("mdrun exited %d, want 3", status)
		}
		if !regexp.MustCompile(`mdrun: rank 1 on 10\.77\.0\.2 \(launcher pid \d+\) aborted with code 3: rank 1 gives up`).MatchString(out) {
			t.Errorf("mdrun does not name the aborting rank and its host")
		}
		deadline := time.Now().Add(10 * time.Second)
		for len(helperProcs()) > 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if p := helperProcs(); len(p) > 0 {
			t.Errorf("ranks still running after mdrun ended: pids %v", p)
		}
	})
}

// The tests below run ordercheck under Open MPI's mpirun, whose ranks join
// through the bootstrap's pmix backend: they need this test binary (the
// ranks' program) built with it, go test -tags pmix ./examples/ordercheck.

// pmixBuilt reports whether this binary has the pmix bootstrap backend:
// built with the pmix tag and cgo.
func pmixBuilt() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	tagged, cgo := false, false
	for _, s := range bi.Settings {
		switch s.Key {
		case "-tags":
			tagged = slices.Contains(strings.Split(s.Value, ","), "pmix")
		case "CGO_ENABLED":
			cgo = s.Value == "1"
		}
	}
	return tagged && cgo
}

func needOpenMPI(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts jobs under mpirun.openmpi")
	}
	p, err := exec.LookPath("mpirun.openmpi")
	if err != nil {
		t.Skip("Open MPI's mpirun.openmpi is not installed; apt-get install openmpi-bin")
	}
	if !pmixBuilt() {
		t.Skip("the ranks need the bootstrap's pmix backend: go test -tags pmix ./examples/ordercheck (needs libpmix-dev)")
	}
	return p
}

// openMPIArgs are the mpirun flags every Open MPI job here takes: root
// runs it in CI, and this machine may have fewer cores than ranks, which
// Open MPI binds to by default.
var openMPIArgs = []string{"--allow-run-as-root", "--oversubscribe", "--bind-to", "none"}

// pmixCleanEnv is cleanEnv without PMIx's variables either.
func pmixCleanEnv(extra ...string) []string {
	return append(slices.DeleteFunc(cleanEnv(), func(kv string) bool { return strings.HasPrefix(kv, "PMIX_") }), extra...)
}

// TestOpenMPIOneHost: mpirun.openmpi -n 4 on this host, over PMIx.
func TestOpenMPIOneHost(t *testing.T) {
	mpirun := needOpenMPI(t)
	cmd := exec.Command(mpirun, append(openMPIArgs, "-n", "4", helper, "-messages", "50")...)
	cmd.Env = pmixCleanEnv()
	status, out := runJob(t, cmd)
	if status != 0 {
		t.Fatalf("mpirun exited %d", status)
	}
	checkRanks(t, out, []string{"a", "a", "a", "a"})
}

// TestOpenMPIAbort: a rank's Abort ends the job under mpirun, with the
// reason in the output and a failing status.
func TestOpenMPIAbort(t *testing.T) {
	mpirun := needOpenMPI(t)
	cmd := exec.Command(mpirun, append(openMPIArgs, "-n", "3", helper+"-abort")...)
	cmd.Env = pmixCleanEnv()
	status, out := runJob(t, cmd)
	if status == 0 {
		t.Errorf("mpirun exited 0 after an abort")
	}
	if !strings.Contains(out, "rank 1 gives up") || !strings.Contains(out, "aborting the job") {
		t.Errorf("output does not give the abort's reason")
	}
}

// TestOpenMPITwoHosts: mpirun on a head node starts 2 ranks on each of two
// hosts through the launch script, standing for ssh. The hosts share this
// machine's host name, so only PMIx's node ids tell them apart; the
// collecting fence carries each host's business cards to the other.
func TestOpenMPITwoHosts(t *testing.T) {
	mpirun := needOpenMPI(t)
	head, script := twoHosts(t)
	// The remote daemon (orted) of Open MPI 4.1.4 shares its hwloc
	// topology through a shared-memory segment; writing it segfaulted in
	// hwloc_shmem_topology_write in one start of five here, failing the
	// job before any rank ran: rtc ^hwloc leaves that component out.
	args := append(slices.Clone(openMPIArgs), "--mca", "rtc", "^hwloc", "--mca", "plm_rsh_agent", script,
		"--host", "10.77.0.1:2,10.77.0.2:2", "-n", "4", helper, "-messages", "50")
	cmd := head.Command(context.Background(), mpirun, args...)
	cmd.Env = pmixCleanEnv()
	status, out := runJob(t, cmd)
	if status != 0 {
		t.Fatalf("mpirun exited %d", status)
	}
	checkRanks(t, out, []string{"h1", "h1", "h2", "h2"})
}

// startSlurm starts the private one-node Slurm cluster of
// testdata/slurm-one-node.sh until the test ends and returns its
// SLURM_CONF setting. It skips when the test is short, not root, or
// Slurm is missing or does not start here.
func startSlurm(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts Slurm daemons")
	}
	if os.Getuid() != 0 {
		t.Skip("starting slurmctld and slurmd needs root")
	}
	for _, prog := range []string{"srun", "slurmctld", "slurmd", "munged", "sinfo"} {
		if _, err := exec.LookPath(prog); err != nil {
			t.Skipf("%s not found; apt-get install slurm-wlm munge", prog)
		}
	}
	script, err := filepath.Abs("testdata/slurm-one-node.sh")
	if err != nil {
		t.Fatal(err)
	}
	// A short directory: munged's socket path must fit a sockaddr_un.
	dir, err := os.MkdirTemp("", "mdslurm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("sh", script, "stop", dir).CombinedOutput(); err != nil {
			t.Errorf("stopping Slurm: %v\n%s", err, out)
		}
		os.RemoveAll(dir)
	})
	start := exec.Command("sh", script, "start", dir)
	start.Env = cleanEnv(fmt.Sprintf("SLURMCTLD_PORT=%d", freePort(t)), fmt.Sprintf("SLURMD_PORT=%d", freePort(t)))
	if out, err := start.CombinedOutput(); err != nil {
		t.Skipf("a one-node Slurm cluster did not start here: %v\n%s", err, out)
	}
	return "SLURM_CONF=" + filepath.Join(dir, "slurm.conf")
}

// TestSlurmPMIx: srun --mpi=pmix -n 4 on the one-node Slurm cluster, and
// a rank's Abort there; the ranks join through the pmix backend.
func TestSlurmPMIx(t *testing.T) {
	if !pmixBuilt() {
		t.Skip("the ranks need the bootstrap's pmix backend: go test -tags pmix ./examples/ordercheck (needs libpmix-dev)")
	}
	conf := startSlurm(t)
	list := exec.Command("srun", "--mpi=list")
	list.Env = pmixCleanEnv(conf)
	if out, err := list.CombinedOutput(); err != nil || !strings.Contains(string(out), "pmix") {
		t.Skipf("this Slurm has no pmix plugin (srun --mpi=list: %v)\n%s", err, out)
	}
	t.Run("ordercheck", func(t *testing.T) {
		cmd := exec.Command("srun", "--mpi=pmix", "-n", "4", helper, "-messages", "50")
		cmd.Env = pmixCleanEnv(conf)
		status, out := runJob(t, cmd)
		if status != 0 {
			t.Fatalf("srun exited %d", status)
		}
		checkRanks(t, out, []string{"a", "a", "a", "a"})
	})
	t.Run("abort", func(t *testing.T) {
		cmd := exec.Command("srun", "--mpi=pmix", "-n", "3", helper+"-abort")
		cmd.Env = pmixCleanEnv(conf)
		status, out := runJob(t, cmd)
		if status == 0 {
			t.Errorf("srun exited 0 after an abort")
		}
		if !strings.Contains(out, "rank 1 gives up") {
			t.Errorf("output does not give the abort's reason")
		}
	})
}
