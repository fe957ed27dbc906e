package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Exit statuses of mdrun itself; a failing rank's status is passed through.
const (
	exitFailed  = 1   // mdrun could not run the job
	exitUsage   = 2   // bad command line
	exitTimeout = 124 // -timeout expired, as timeout(1) reports it
)

// config is the parsed command line.
type config struct {
	n         int
	plugins   string // absolute path or ""
	conntable string // absolute path or ""
	prefix    bool
	timeout   time.Duration
	verbose   bool
	prog      string // resolved path of the program
	args      []string
	// hosts places the ranks, from -hosts or -hostfile; nil runs every
	// rank on this machine.
	hosts    []hostSpec
	launcher []string // remote-exec command, host and command line follow
	listen   string   // -listen: the rendezvous address for remote ranks
	exports  []string // -x: variables passed to remote ranks
	// relays are the hosts of dedicated relays, ranks n.. of the job.
	relays   []string
	relayCmd []string // the relay program (absolute) and its arguments
	// wdir is where ranks start (-wdir, or mdrun's own directory);
	// wdirSet says -wdir named it, so a host without it is an error.
	wdir    string
	wdirSet bool
	// bind is what each rank is bound to before it starts (-bind).
	bind bindMode
}

// stringList is a flag that may be given several times.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// usageError is a command-line mistake; mdrun prints it and exits 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// run is mdrun without the process around it: args are the arguments after
// the command name, sigs delivers the signals to pass on to the ranks, and
// ctx ending terminates the job like a failure. It returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, sigs <-chan os.Signal) int {
	errw := &syncWriter{w: stderr}
	cfg, err := parseArgs(args, errw)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		var ue *usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(errw, "mdrun: %v\nusage: mdrun [flags] -n N prog [args...]; mdrun -h lists the flags\n", err)
			return exitUsage
		}
		fmt.Fprintf(errw, "mdrun: %v\n", err)
		return exitFailed
	}
	level := hclog.Off
	if cfg.verbose {
		level = hclog.Debug
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "mdrun", Level: level, Output: errw})
	j := &job{
		cfg:    cfg,
		logger: logger,
		stdout: &syncWriter{w: stdout},
		stderr: errw,
	}
	return j.run(ctx, sigs)
}

// parseArgs reads the command line; flag's own messages go to errw.
func parseArgs(args []string, errw io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("mdrun", flag.ContinueOnError)
	fs.SetOutput(errw)
	fs.IntVar(&cfg.n, "n", 0, "number of ranks to start (required)")
	fs.StringVar(&cfg.plugins, "plugins", "", "plugins.hcl for the ranks, passed as MD_PLUGINS")
	fs.StringVar(&cfg.conntable, "conntable", "", "connection table file, or directory of per-host tables, passed as MD_CONNTABLE")
	fs.BoolVar(&cfg.prefix, "prefix", true, `prefix each line of output with "[rank] "`)
	fs.DurationVar(&cfg.timeout, "timeout", 0, "end the job after this wall-clock time, e.g. 10m (0: no limit)")
	fs.BoolVar(&cfg.verbose, "v", false, "log what the launcher does to stderr")
	hosts := fs.String("hosts", "", "comma-separated hosts to place ranks on, each `host[:slots][@site]` (default: all on this machine); a host's ranks get MD_SITE=site, naming the cluster it is in")
	hostfile := fs.String("hostfile", "", "file naming the hosts, one per line: host, host:slots or host slots=N, each optionally with site=NAME (as @site in -hosts)")
	launcher := fs.String("launcher", "ssh", "command that runs a command line on a remote host, called as: launcher host command...")
	fs.StringVar(&cfg.listen, "listen", "", "host:port where remote ranks reach the rendezvous service (default: this machine's address towards the first remote host, any port)")
	relays := fs.String("relay", "", "comma-separated hosts that each run a dedicated relay (`host[:count]`): extra ranks after the N, outside the application's world, that forward between ranks with no direct link")
	relayCmd := fs.String("relay-cmd", "mdrelay", "the relay program and its arguments; a bare name is looked up next to mdrun, then in PATH")
	fs.StringVar(&cfg.wdir, "wdir", "", "directory ranks start in, on every host (default: mdrun's own; a remote host without that one starts them where the launcher does)")
	bind := fs.String("bind", "none", "`none`, core or hwthread: bind each rank before it starts to a core of its own (all its hardware threads) or to one hardware thread, in order on each host (here: of the CPUs mdrun may use; elsewhere: from CPU 0, through taskset), as mpiexec -bind-to does")
	var exports stringList
	fs.Var(&exports, "x", "pass environment variable `NAME` to remote ranks (repeatable; MD_* variables always pass)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: mdrun [flags] -n N prog [args...]\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, err
		}
		return cfg, &usageError{err.Error()}
	}
	if cfg.n < 1 {
		return cfg, &usageError{fmt.Sprintf("-n %d: need at least 1 rank", cfg.n)}
	}
	mode, err := parseBind(*bind)
	if err != nil {
		return cfg, &usageError{err.Error()}
	}
	cfg.bind = mode
	if cfg.timeout < 0 {
		return cfg, &usageError{fmt.Sprintf("-timeout %v is negative", cfg.timeout)}
	}
	if fs.NArg() == 0 {
		return cfg, &usageError{"no program to run"}
	}
	if *hosts != "" && *hostfile != "" {
		return cfg, &usageError{"give -hosts or -hostfile, not both"}
	}
	switch {
	case *hosts != "":
		cfg.hosts, err = parseHosts(*hosts)
	case *hostfile != "":
		cfg.hosts, err = parseHostfile(*hostfile)
	}
	if err != nil {
		return cfg, &usageError{err.Error()}
	}
	cfg.wdirSet = cfg.wdir != ""
	if !cfg.wdirSet {
		if cfg.wdir, err = os.Getwd(); err != nil {
			return cfg, fmt.Errorf("the current directory: %w", err)
		}
	} else {
		// Relative to this directory here; on remote hosts, the same path.
		if cfg.wdir, err = filepath.Abs(cfg.wdir); err != nil {
			return cfg, &usageError{fmt.Sprintf("-wdir: %v", err)}
		}
		// Every rank starts here without -hosts: say so now, not as a
		// failed start of rank 0.
		if fi, err := os.Stat(cfg.wdir); cfg.hosts == nil && (err != nil || !fi.IsDir()) {
			var pe *os.PathError
			switch {
			case err == nil:
				err = errors.New("not a directory")
			case errors.As(err, &pe):
				err = pe.Err // the path is in the message already
			}
			return cfg, &usageError{fmt.Sprintf("-wdir %s: %v", cfg.wdir, err)}
		}
	}
	if cfg.launcher = strings.Fields(*launcher); len(cfg.launcher) == 0 {
		return cfg, &usageError{"-launcher is empty"}
	}
	for _, name := range exports {
		if name == "" || strings.Contains(name, "=") {
			return cfg, &usageError{fmt.Sprintf("-x %q: want a variable name", name)}
		}
	}
	cfg.exports = exports
	prog, err := exec.LookPath(fs.Arg(0))
	if err != nil {
		return cfg, &usageError{fmt.Sprintf("program %q not found: %v", fs.Arg(0), err)}
	}
	// Absolute, so remote hosts (which share the path) and ranks that
	// change directory find it.
	if prog, err = filepath.Abs(prog); err != nil {
		return cfg, &usageError{fmt.Sprintf("program %q: %v", fs.Arg(0), err)}
	}
	cfg.prog, cfg.args = prog, fs.Args()[1:]
	if *relays != "" {
		var specs []hostSpec
		count := 0
		for _, e := range strings.Split(*relays, ",") {
			h, err := parseHostEntry(strings.TrimSpace(e))
			if err != nil {
				return cfg, &usageError{fmt.Sprintf("-relay: %v", err)}
			}
			specs, count = append(specs, h), count+h.slots
		}
		cfg.relays = placeRanks(count, specs)
		if cfg.relayCmd, err = relayCommand(*relayCmd); err != nil {
			return cfg, &usageError{fmt.Sprintf("-relay-cmd: %v", err)}
		}
	}
	for _, p := range []struct {
		flag string
		path *string
	}{{"-plugins", &cfg.plugins}, {"-conntable", &cfg.conntable}} {
		if *p.path == "" {
			continue
		}
		// Absolute, so a rank that changes directory still finds it.
		abs, err := filepath.Abs(*p.path)
		if err == nil {
			_, err = os.Stat(abs)
		}
		if err != nil {
			return cfg, &usageError{fmt.Sprintf("%s: %v", p.flag, err)}
		}
		*p.path = abs
	}
	return cfg, nil
}

// relayCommand resolves the relay program: a bare name next to mdrun's own
// executable first (they are built together), then in PATH. The path is
// absolute, so remote hosts, which share it, find it.
func relayCommand(line string) ([]string, error) {
	argv := strings.Fields(line)
	if len(argv) == 0 {
		return nil, errors.New("empty")
	}
	prog := argv[0]
	if !strings.Contains(prog, "/") {
		if exe, err := os.Executable(); err == nil {
			if p := filepath.Join(filepath.Dir(exe), prog); isExecutable(p) {
				prog = p
			}
		}
	}
	prog, err := exec.LookPath(prog)
	if err != nil {
		return nil, fmt.Errorf("relay program %q not found (build it with go build -o bin/ ./cmd/mdrelay): %w", argv[0], err)
	}
	if prog, err = filepath.Abs(prog); err != nil {
		return nil, err
	}
	argv[0] = prog
	return argv, nil
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}
