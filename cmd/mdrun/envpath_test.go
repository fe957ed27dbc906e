package main

import (
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestEnvPathsMadeAbsolute: MD_PLUGINS and MD_CONNTABLE from mdrun's
// environment reach the ranks as absolute paths, as the flags do, so a
// rank started elsewhere (-wdir, a remote host) finds the same files; a
// flag wins over the variable.
func TestEnvPathsMadeAbsolute(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	flagFile := filepath.Join(t.TempDir(), "flag.hcl")
	if err := os.WriteFile(flagFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name             string
		plugEnv, ctEnv   string
		flags            []string
		wantPlug, wantCT string
	}{
		{"relative", "plugins.hcl", "tables", nil, filepath.Join(wd, "plugins.hcl"), filepath.Join(wd, "tables")},
		{"absolute", "/etc/md/plugins.hcl", "", nil, "/etc/md/plugins.hcl", ""},
		{"unset", "", "", nil, "", ""},
		{"flag wins", "plugins.hcl", "tables", []string{"-plugins", flagFile}, flagFile, filepath.Join(wd, "tables")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("MD_PLUGINS", tc.plugEnv)
			t.Setenv("MD_CONNTABLE", tc.ctEnv)
			cfg, err := parseArgs(append(tc.flags, "-n", "1", "true"), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.plugins != tc.wantPlug || cfg.conntable != tc.wantCT {
				t.Fatalf("plugins %q, conntable %q; want %q, %q", cfg.plugins, cfg.conntable, tc.wantPlug, tc.wantCT)
			}
		})
	}
}
