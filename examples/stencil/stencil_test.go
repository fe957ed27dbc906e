package main

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// TestStencilUnderMdrun runs the example through mdrun on grids of ranks
// of one and two dimensions, even and uneven splits of the plate; each
// run checks itself against the serial solution.
func TestStencilUnderMdrun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds mdrun and the example")
	}
	dir := t.TempDir()
	for _, pkg := range []string{"../../cmd/mdrun", "."} {
		if out, err := exec.Command("go", "build", "-o", dir+"/", pkg).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	ok := regexp.MustCompile(`stencil: 37x37 plate on (\d+)x(\d+) ranks, 60 iterations, .*matches the serial run`)
	for _, tc := range []struct{ ranks, want string }{{"1", "1x1"}, {"3", "3x1"}, {"4", "2x2"}, {"6", "3x2"}} {
		t.Run(tc.ranks, func(t *testing.T) {
			cmd := exec.Command(filepath.Join(dir, "mdrun"), "-n", tc.ranks, filepath.Join(dir, "stencil"), "-size", "37", "-iterations", "60")
			out, err := cmd.CombinedOutput()
			m := ok.FindSubmatch(out)
			if err != nil || m == nil || string(m[1])+"x"+string(m[2]) != tc.want {
				t.Fatalf("mdrun -n %s stencil: %v, want a %s grid that matches\n%s", tc.ranks, err, tc.want, out)
			}
		})
	}
}
