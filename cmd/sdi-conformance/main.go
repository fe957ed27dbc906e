// Command sdi-conformance runs the SDI conformance suite (sdi/sditest)
// against a subdevice plugin binary, the way the multidevice would load it:
//
//	sdi-conformance -plugin ./sdi-myfabric -config '{"port": 7000}'
//
// Get it with go install github.com/hpc-multidevice/multidevice/cmd/sdi-conformance@latest,
// or, in a module that requires github.com/hpc-multidevice/multidevice (as
// one that runs sditest does), go run
// github.com/hpc-multidevice/multidevice/cmd/sdi-conformance at the version
// your go.mod names.
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

const usage = "usage: sdi-conformance -plugin BINARY [-config JSON] [-args ARGS] [-peers N] [-stream] [-skip CHECK=REASON,...]"

func main() {
	testing.Init()
	path := flag.String("plugin", "", "plugin binary to test (required)")
	args := flag.String("args", "", "arguments for the plugin binary, separated by spaces")
	config := flag.String("config", "", "JSON config handed to every instance's Open, as plugins.hcl's config block would be")
	peers := flag.Int("peers", 3, "instances per check (ranks of one job), at least 2")
	stream := flag.Bool("stream", false, "use the gRPC stream data plane instead of shared memory")
	timeout := flag.Duration("timeout", 10*time.Second, "bound on the plugin's start and each control call")
	skip := flag.String("skip", "", "checks to skip, comma-separated, each CHECK=REASON; the reason is printed with the skip and may not be empty")
	flag.Set("test.v", "true")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), usage)
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
		// A skip prints its reason instead of the check's result; without
		// one the report would not say why a check did not run.
		name, reason, _ := strings.Cut(s, "=")
		if name == "" || strings.TrimSpace(reason) == "" {
			fmt.Fprintf(flag.CommandLine.Output(), "sdi-conformance: -skip %q has no reason; write CHECK=REASON, e.g. -skip 'Ordering/PerPeerFIFO=frames are not ordered'\n%s\n", s, usage)
			os.Exit(2)
		}
		h.Skip[name] = reason
	}
	tests := []testing.InternalTest{{Name: "Conformance", F: func(t *testing.T) { sditest.Run(t, h) }}}
	testing.Main(regexp.MatchString, tests, nil, nil)
}
