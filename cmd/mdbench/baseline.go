package main

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

//go:embed baseline/osu.c
var osuSource []byte

// mpi is one MPI implementation used as a baseline.
type mpi struct {
	name   string // series name: mpich, openmpi
	cc     string // compiler wrapper
	run    string // launcher
	binary string // the built osu program
}

// mpis lists the implementations mdbench knows, by series name.
var mpis = []mpi{
	{name: "mpich", cc: "mpicc.mpich", run: "mpiexec.mpich"},
	{name: "openmpi", cc: "mpicc.openmpi", run: "mpirun.openmpi"},
}

// missing says what of m's compiler and launcher is not on PATH, with
// the Debian packages that bring them; "" when both are there.
func (m mpi) missing() string {
	if _, err := exec.LookPath(m.cc); err != nil {
		return fmt.Sprintf("%s not found (Debian: apt-get install %s)", m.cc, map[string]string{"mpich": "mpich libmpich-dev", "openmpi": "openmpi-bin libopenmpi-dev"}[m.name])
	}
	if _, err := exec.LookPath(m.run); err != nil {
		return fmt.Sprintf("%s not found", m.run)
	}
	return ""
}

// buildBaselines compiles baseline/osu.c with every requested MPI found on
// this machine into dir. It returns those it built and a note for each it
// could not.
func buildBaselines(ctx context.Context, want []string, dir string) ([]mpi, []string) {
	src := filepath.Join(dir, "osu.c")
	if err := os.WriteFile(src, osuSource, 0o644); err != nil {
		return nil, []string{fmt.Sprintf("baseline: write %s: %v", src, err)}
	}
	var built []mpi
	var notes []string
	for _, m := range mpis {
		if !contains(want, m.name) {
			continue
		}
		if missing := m.missing(); missing != "" {
			notes = append(notes, fmt.Sprintf("baseline %s skipped: %s", m.name, missing))
			continue
		}
		m.binary = filepath.Join(dir, "osu_"+m.name)
		cmd := exec.CommandContext(ctx, m.cc, "-O2", "-o", m.binary, src)
		if out, err := cmd.CombinedOutput(); err != nil {
			notes = append(notes, fmt.Sprintf("baseline %s skipped: %s failed: %v: %s", m.name, m.cc, err, bytes.TrimSpace(out)))
			continue
		}
		built = append(built, m)
	}
	return built, notes
}

// command returns the launch of the osu program on n ranks over the
// transport matching sub: MPICH's and Open MPI's shared memory by default,
// their TCP paths over loopback for sub "tcp".
//
// With bind set and no more ranks than cores, ranks are bound to cores, as
// mdbench binds its own (rankCores); otherwise binding is off for both.
func (m mpi) command(ctx context.Context, n int, sub string, bind bool, scale float64, args ...string) *exec.Cmd {
	var argv []string
	env := append(os.Environ(), "OSU_SCALE="+strconv.FormatFloat(scale, 'g', -1, 64))
	binding := "none"
	if cores, err := rankCores(n, bind); err == nil && cores != nil {
		binding = "core"
	}
	switch m.name {
	case "mpich":
		argv = []string{"-bind-to", binding, "-n", strconv.Itoa(n)}
		if sub == "tcp" {
			// ch4:ucx: route local ranks through the netmod, and UCX over TCP.
			env = append(env, "MPIR_CVAR_NOLOCAL=1", "UCX_TLS=tcp,self")
		}
	case "openmpi":
		argv = []string{"--allow-run-as-root", "--oversubscribe", "--bind-to", binding, "-x", "OSU_SCALE", "-n", strconv.Itoa(n)}
		if sub == "tcp" {
			argv = append(argv, "--mca", "pml", "ob1", "--mca", "btl", "self,tcp")
		}
		env = append(env, "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
	}
	argv = append(append(argv, m.binary), args...)
	cmd := exec.CommandContext(ctx, m.run, argv...)
	cmd.Env = env
	// On a timeout the whole launch goes, not just mpiexec: its proxies
	// and ranks would otherwise spin on, disturbing every later figure.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// runBaseline runs one test of the osu program and parses its lines.
func (m mpi) runBaseline(ctx context.Context, n int, sub string, bind bool, scale float64, args ...string) ([]sample, error) {
	cmd := m.command(ctx, n, sub, bind, scale, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %v: %s", m.name, strings.Join(cmd.Args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	samples, err := parseOSU(out)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", m.name, err)
	}
	return samples, nil
}

// parseOSU reads the osu program's lines, "<test> <size> <value>"; lines
// of another shape (an MPI's own chatter) are skipped.
func parseOSU(out []byte) ([]sample, error) {
	var samples []sample
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 || !slices.Contains(allTests, f[0]) {
			continue
		}
		size, err1 := strconv.Atoi(f[1])
		v, err2 := strconv.ParseFloat(f[2], 64)
		if err1 != nil || err2 != nil || size < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("cannot parse osu line %q", sc.Text())
		}
		samples = append(samples, sample{Test: f[0], Size: size, Value: v})
	}
	return samples, sc.Err()
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
