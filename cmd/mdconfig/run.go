package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/hpc-multidevice/multidevice/mdconfig"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the description is wrong or a step failed
	exitUsage = 2
)

const usage = `usage:
  mdconfig check    FILE                       report errors and warnings
  mdconfig generate FILE -o DIR                one connection table per host: DIR/<host>.json
  mdconfig route    FILE --from A --to B [--size 1MiB]
                                               the path hop by hop and its alternatives
  mdconfig graph    FILE [-o out.dot|out.svg] [--from A --to B [--size N]]
                                               Graphviz drawing; .svg needs dot installed
  mdconfig bench    [-clusters 100] [-hosts 100] [-encode]
                                               time and memory to generate every table
`

// run is main without the process: it returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "check":
		return runCheck(rest, stdout, stderr)
	case "generate":
		return runGenerate(rest, stdout, stderr)
	case "route":
		return runRoute(rest, stdout, stderr)
	case "graph":
		return runGraph(rest, stdout, stderr)
	case "bench":
		return runBench(rest, stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "mdconfig: unknown command %q\n%s", cmd, usage)
	return exitUsage
}

// parseArgs parses flags that may come before or after the one positional
// argument, so that both "route net.hcl --from a" and "route --from a
// net.hcl" work.
func parseArgs(fs *flag.FlagSet, args []string, stderr io.Writer) (string, bool) {
	fs.SetOutput(stderr)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return "", false
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) != 1 {
		fmt.Fprintf(stderr, "mdconfig %s: want exactly one description file, got %d\n%s", fs.Name(), len(pos), usage)
		return "", false
	}
	return pos[0], true
}

// load reads and checks a description, printing its diagnostics to stderr.
// The description is nil when it has errors.
func load(path string, stderr io.Writer) *mdconfig.Description {
	src, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(stderr, "mdconfig: %v\n", err)
		return nil
	}
	d, diags := mdconfig.Parse(src, path)
	fmt.Fprint(stderr, mdconfig.FormatDiagnostics(diags, src))
	if diags.HasErrors() {
		return nil
	}
	return d
}

func runCheck(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	path, ok := parseArgs(fs, args, stderr)
	if !ok {
		return exitUsage
	}
	d := load(path, stderr)
	if d == nil {
		return exitError
	}
	fmt.Fprintf(stdout, "%s: ok: %d hosts, %d size classes\n", path, len(d.Hosts()), len(d.Classes()))
	return exitOK
}

func runGenerate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("generate", flag.ContinueOnError)
	out := fs.String("o", "", "directory to write the tables to (required)")
	path, ok := parseArgs(fs, args, stderr)
	if !ok {
		return exitUsage
	}
	if *out == "" {
		fmt.Fprintf(stderr, "mdconfig generate: -o DIR is required\n")
		return exitUsage
	}
	d := load(path, stderr)
	if d == nil {
		return exitError
	}
	n, err := mdconfig.WriteTables(d, *out)
	if err != nil {
		fmt.Fprintf(stderr, "mdconfig generate: %v\n", err)
		return exitError
	}
	fmt.Fprintf(stdout, "wrote %d tables to %s\n", n, *out)
	return exitOK
}

func runRoute(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("route", flag.ContinueOnError)
	from := fs.String("from", "", "source host (required)")
	to := fs.String("to", "", "destination host (required)")
	size := fs.String("size", "", "message size, e.g. 1MiB; default: every size class")
	path, ok := parseArgs(fs, args, stderr)
	if !ok {
		return exitUsage
	}
	if *from == "" || *to == "" {
		fmt.Fprintf(stderr, "mdconfig route: --from and --to are required\n")
		return exitUsage
	}
	var n int64
	if *size != "" {
		v, err := mdconfig.ParseSize(*size)
		if err != nil {
			fmt.Fprintf(stderr, "mdconfig route: --size: %v\n", err)
			return exitUsage
		}
		n = v
	}
	d := load(path, stderr)
	if d == nil {
		return exitError
	}
	reports, err := d.Route(*from, *to, n)
	if err != nil {
		fmt.Fprintf(stderr, "mdconfig route: %v\n", err)
		return exitError
	}
	for i, r := range reports {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		fmt.Fprint(stdout, r.String())
	}
	return exitOK
}

func runGraph(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("graph", flag.ContinueOnError)
	out := fs.String("o", "", "output file: .dot, or .svg (needs Graphviz dot); default: dot to stdout")
	from := fs.String("from", "", "highlight the route from this host")
	to := fs.String("to", "", "highlight the route to this host")
	size := fs.String("size", "", "message size of the highlighted route; default: the first class")
	path, ok := parseArgs(fs, args, stderr)
	if !ok {
		return exitUsage
	}
	if (*from == "") != (*to == "") {
		fmt.Fprintf(stderr, "mdconfig graph: give both --from and --to, or neither\n")
		return exitUsage
	}
	var n int64
	if *size != "" {
		v, err := mdconfig.ParseSize(*size)
		if err != nil {
			fmt.Fprintf(stderr, "mdconfig graph: --size: %v\n", err)
			return exitUsage
		}
		n = v
	}
	d := load(path, stderr)
	if d == nil {
		return exitError
	}
	dot, err := d.Dot(mdconfig.DotOptions{From: *from, To: *to, Size: n})
	if err != nil {
		fmt.Fprintf(stderr, "mdconfig graph: %v\n", err)
		return exitError
	}
	switch {
	case *out == "":
		_, err = stdout.Write(dot)
	case strings.EqualFold(filepath.Ext(*out), ".svg"):
		err = writeSVG(dot, *out, stdout)
	default:
		err = os.WriteFile(*out, dot, 0o644)
	}
	if err != nil {
		fmt.Fprintf(stderr, "mdconfig graph: %v\n", err)
		return exitError
	}
	return exitOK
}

// errNoDot is reported when an SVG is asked for without Graphviz installed.
var errNoDot = errors.New("graphviz dot not found")

// writeSVG renders dot into out, and nothing else: a DOT file beside it
// could be one the user keeps. Without Graphviz it fails, rather than
// succeed having written no SVG, and says how to get the drawing.
func writeSVG(dot []byte, out string, stdout io.Writer) error {
	svg, err := renderSVG(dot)
	if errors.Is(err, errNoDot) {
		return fmt.Errorf("-o %s: %w in PATH; install graphviz, or write DOT with -o %s and render it with dot -Tsvg elsewhere",
			out, err, strings.TrimSuffix(out, filepath.Ext(out))+".dot")
	}
	if err != nil {
		return err
	}
	if err := os.WriteFile(out, svg, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s\n", out)
	return nil
}
