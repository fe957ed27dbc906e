package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/internal/netns"
)

// TestCouplingUnderMdrun runs the two programs as one job through mdrun
// at several sizes of each; the monitor checks the solver's rod against
// its serial run at every check. Jobs that are not two programs fail on
// every rank with a message saying how to run it.
func TestCouplingUnderMdrun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds mdrun and the example")
	}
	mdrun, prog := build(t)
	for _, tc := range []struct {
		name string
		args []string
		want string // a regexp the output matches
		fail bool
	}{
		{"3+2", []string{"-n", "3", prog, ":", "-n", "2", prog},
			`coupling: 3 solver ranks, 2 monitor ranks: stopped after step 1500, every check matched the serial run`, false},
		{"1+1", []string{"-n", "1", prog, "-cells", "10", ":", "-n", "1", prog, "-cells", "10"},
			`coupling: 1 solver ranks, 1 monitor ranks: stopped after step \d+, every check matched`, false},
		{"4+1 to the last step", []string{"-n", "4", prog, "-steps", "333", "-every", "100", ":", "-n", "1", prog, "-steps", "333", "-every", "100"},
			`(?s)step 300: .*coupling: 4 solver ranks, 1 monitor ranks: stopped after step 333, every check matched`, false},
		{"programs disagree", []string{"-n", "2", prog, "-cells", "10", ":", "-n", "1", prog, "-cells", "12"},
			`rank 2 runs with -cells 12 -steps 20000 -every 500, rank 0 with -cells 10 .*: give both programs the same`, true},
		{"one program", []string{"-n", "2", prog}, `one program only: run it as mdrun -n S coupling : -n M coupling`, true},
		{"three programs", []string{"-n", "1", prog, ":", "-n", "1", prog, ":", "-n", "1", prog},
			`rank 2 runs program 2: this job couples two programs`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := exec.Command(mdrun, tc.args...).CombinedOutput()
			if (err != nil) != tc.fail {
				t.Fatalf("mdrun %s: %v, want failure %v\n%s", strings.Join(tc.args, " "), err, tc.fail, out)
			}
			if !regexp.MustCompile(tc.want).Match(out) {
				t.Fatalf("output lacks %q:\n%s", tc.want, out)
			}
		})
	}
}

// TestCouplingAcrossSites runs the solver on the hosts of one cluster
// and the monitor on another's, namespace hosts that reach each other
// over tcp: the intercommunicator's traffic crosses between the sites,
// and the solver's own collectives go host by host.
func TestCouplingAcrossSites(t *testing.T) {
	if testing.Short() {
		t.Skip("builds mdrun and the example and starts a job on namespace hosts")
	}
	head, launch := netns.LAN(t, 3)
	mdrun, prog := build(t)
	// A job that hangs is killed rather than left to go test's timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := head.Command(ctx, mdrun, "-hosts", "10.77.0.1:2@A,10.77.0.2:2@A,10.77.0.3:2@B", "-launcher", launch,
		"-n", "4", prog, ":", "-n", "2", prog)
	// Not this process's launcher variables, if a launcher started it.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MD_") && !strings.HasPrefix(kv, "MDRUN_") && !strings.HasPrefix(kv, "PMI_") && !strings.HasPrefix(kv, "SLURM_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	want := regexp.MustCompile(`\[4\] coupling: 4 solver ranks, 2 monitor ranks: stopped after step \d+, every check matched the serial run`)
	if err != nil || !want.Match(out) {
		t.Fatalf("mdrun: %v, want the monitor (rank 4, on the second site) to report a match\n%s", err, out)
	}
}

// build builds mdrun and the example, and returns their paths.
func build(t *testing.T) (mdrun, prog string) {
	t.Helper()
	dir := t.TempDir()
	for _, pkg := range []string{"../../cmd/mdrun", "."} {
		if out, err := exec.Command("go", "build", "-o", dir+"/", pkg).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return filepath.Join(dir, "mdrun"), filepath.Join(dir, "coupling")
}
