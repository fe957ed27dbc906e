package main

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestCouplingUnderMdrun runs the two programs as one job through mdrun
// at several sizes of each; the monitor checks the solver's rod against
// its serial run at every check. Jobs that are not two programs fail on
// every rank with a message saying how to run it.
func TestCouplingUnderMdrun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds mdrun and the example")
	}
	dir := t.TempDir()
	for _, pkg := range []string{"../../cmd/mdrun", "."} {
		if out, err := exec.Command("go", "build", "-o", dir+"/", pkg).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	prog := filepath.Join(dir, "coupling")
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
			out, err := exec.Command(filepath.Join(dir, "mdrun"), tc.args...).CombinedOutput()
			if (err != nil) != tc.fail {
				t.Fatalf("mdrun %s: %v, want failure %v\n%s", strings.Join(tc.args, " "), err, tc.fail, out)
			}
			if !regexp.MustCompile(tc.want).Match(out) {
				t.Fatalf("output lacks %q:\n%s", tc.want, out)
			}
		})
	}
}
