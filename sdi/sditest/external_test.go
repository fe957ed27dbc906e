package sditest

import (
	"os"
	"strings"
	"testing"

	"github.com/hpc-multidevice/multidevice/sdi/plugin"
)

// TestExternalPlugin runs the catalogue against any plugin binary:
//
//	SDI_CONFORMANCE_PLUGIN=./sdi-myfabric \
//	SDI_CONFORMANCE_CONFIG='{"port": 7000}' go test ./sdi/sditest -run ExternalPlugin
//
// SDI_CONFORMANCE_ARGS holds the binary's arguments, separated by spaces.
// cmd/sdi-conformance does the same without a Go toolchain.
func TestExternalPlugin(t *testing.T) {
	path := os.Getenv("SDI_CONFORMANCE_PLUGIN")
	if path == "" {
		t.Skip("set SDI_CONFORMANCE_PLUGIN to a plugin binary to run the suite against it")
	}
	Run(t, Harness{
		New:    Plugin(plugin.Config{Name: path, Path: path, Args: strings.Fields(os.Getenv("SDI_CONFORMANCE_ARGS"))}),
		Peers:  3,
		Config: []byte(os.Getenv("SDI_CONFORMANCE_CONFIG")),
	})
}
