//go:build !(pmix && cgo)

package bootstrap

import (
	"context"
	"strings"
	"testing"
)

// TestPMIxNotBuilt: under a PMIx launcher, a binary without the pmix
// backend fails to Open, saying how to rebuild, rather than becoming one
// of N singletons.
func TestPMIxNotBuilt(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		mark string
	}{
		{"open mpi", openMPIEnv, "(PMIX_RANK=1)"},
		{"server address alone", []string{"PMIX_SERVER_URI4=x"}, "(PMIX_SERVER_URI4=x)"},
	}
	// A rank's child, in a binary without the backend too, fails as a
	// rank's child.
	t.Run("rank's child", func(t *testing.T) {
		bs, err := open(context.Background(), testLogger(t), envSnapshot([]string{EnvPMIxParent + "=389349377.0"}), nil)
		if err == nil {
			bs.Close()
			t.Fatalf("open succeeded with a %T", bs)
		}
		if want := "MD_PMIX_PARENT=389349377.0: this process was started by that rank"; !strings.Contains(err.Error(), want) {
			t.Errorf("open error %q lacks %q", err, want)
		}
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bs, err := open(context.Background(), testLogger(t), envSnapshot(tt.env), nil)
			if err == nil {
				bs.Close()
				t.Fatalf("open succeeded with a %T", bs)
			}
			for _, want := range []string{"bootstrap: pmix: started by a PMIx launcher " + tt.mark, "built without -tags pmix", "go build -tags pmix", "libpmix-dev", "mdrun or a PMI-2 launcher"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("open error %q lacks %q", err, want)
				}
			}
		})
	}
}
