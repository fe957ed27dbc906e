package sditest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hpc-multidevice/multidevice/sdi/plugin"
)

// TestExternalPlugin runs the catalogue against any plugin binary, from
// this repository or, by the full import path, from any module that
// requires it:
//
//	SDI_CONFORMANCE_PLUGIN=$PWD/sdi-myfabric SDI_CONFORMANCE_CONFIG='{"port": 7000}' \
//		go test github.com/hpc-multidevice/multidevice/sdi/sditest -run ExternalPlugin
//
// The path is absolute because go test runs the test in this package's
// directory, not where it was typed. SDI_CONFORMANCE_ARGS holds the
// binary's arguments, separated by spaces. cmd/sdi-conformance does the
// same without a Go toolchain, and takes paths as typed.
func TestExternalPlugin(t *testing.T) {
	path := os.Getenv("SDI_CONFORMANCE_PLUGIN")
	if path == "" {
		t.Skip("set SDI_CONFORMANCE_PLUGIN to a plugin binary to run the suite against it")
	}
	if _, err := os.Stat(path); err != nil && !filepath.IsAbs(path) {
		wd, _ := os.Getwd()
		t.Fatalf("SDI_CONFORMANCE_PLUGIN=%s: %v: go test runs this test in %s; give the binary's absolute path (e.g. $PWD/%s)", path, err, wd, filepath.Clean(path))
	}
	Run(t, Harness{
		New:    Plugin(plugin.Config{Name: path, Path: path, Args: strings.Fields(os.Getenv("SDI_CONFORMANCE_ARGS"))}),
		Peers:  3,
		Config: []byte(os.Getenv("SDI_CONFORMANCE_CONFIG")),
	})
}
