// Command sdi-conformance runs the SDI conformance suite (sdi/sditest)
// against a subdevice plugin binary, the way the multidevice would load it:
//
//	sdi-conformance -plugin ./sdi-myfabric -config '{"port": 7000}'
//
// Each check starts fresh plugin processes (-peers of them), connects
// them, runs, and closes them. Flags of go test work too, with their test.
// prefix: -test.run 'Conformance/PingPong' picks checks, -test.v=false
// prints only failures. The exit status is 0 when every check passed or was
// skipped for a reason it states.
package main

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi/plugin"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

func main() {
	testing.Init()
	path := flag.String("plugin", "", "plugin binary to test (required)")
	args := flag.String("args", "", "arguments for the plugin binary, separated by spaces")
	config := flag.String("config", "", "JSON config handed to every instance's Open, as plugins.hcl's config block would be")
	peers := flag.Int("peers", 3, "instances per check (ranks of one job), at least 2")
	stream := flag.Bool("stream", false, "use the gRPC stream data plane instead of shared memory")
	timeout := flag.Duration("timeout", 10*time.Second, "bound on the plugin's start and each control call")
	skip := flag.String("skip", "", "checks to skip, comma-separated, each name=reason")
	flag.Set("test.v", "true")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: sdi-conformance -plugin BINARY [-config JSON] [-args ARGS] [-peers N] [-stream] [-skip CHECK=REASON,...]\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *path == "" {
		flag.Usage()
		os.Exit(2)
	}
	h := sditest.Harness{
		New:    sditest.Plugin(plugin.Config{Name: *path, Path: *path, Args: strings.Fields(*args), Stream: *stream, Timeout: *timeout}),
		Peers:  *peers,
		Config: []byte(*config),
		Skip:   map[string]string{},
	}
	for _, s := range strings.Split(*skip, ",") {
		if s == "" {
			continue
		}
		name, reason, _ := strings.Cut(s, "=")
		h.Skip[name] = reason
	}
	tests := []testing.InternalTest{{Name: "Conformance", F: func(t *testing.T) { sditest.Run(t, h) }}}
	testing.Main(regexp.MatchString, tests, nil, nil)
}
