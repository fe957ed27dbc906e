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
	// n is the number of the application's ranks, those of all apps.
	n int
	// apps are the programs, one per section of the command line, in
	// rank order; a single-program job has one.
	apps      []app
	plugins   string // absolute path or ""
	conntable string // absolute path or ""
	// inherited lists which of plugins and conntable came from mdrun's
	// environment rather than a flag, by variable name: -x NAME=VALUE
	// replaces those, as it replaces any variable of mdrun's.
	inherited map[string]bool
	prefix    bool
	timeout   time.Duration
	verbose   bool
	// hosts places the ranks, from -hosts or -hostfile; nil runs every
	// rank on this machine.
	hosts []hostSpec
	// mapBy is how the ranks are placed on hosts (-map-by).
	mapBy    mapBy
	launcher []string // remote-exec command, host and command line follow
	listen   string   // -listen: the rendezvous address for remote ranks
	// exports are the -x words of the job, for the ranks of every app:
	// NAME (mdrun's value, passed to remote ranks) or NAME=VALUE (set in
	// every rank's environment).
	exports []string
	// relays are the hosts of dedicated relays, ranks n.. of the job.
	relays []string
	// relayHosts are the entries of -relay, for the sites they name.
	relayHosts []hostSpec
	relayCmd   []string // the relay program (absolute) and its arguments
	// wdir is where ranks start (-wdir, or mdrun's own directory), unless
	// their app names another; wdirSet says -wdir named it, so a host
	// without it is an error.
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
			fmt.Fprintf(errw, "mdrun: %v\nusage: %s; mdrun -h lists the flags\n", err, usageLine)
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
		stdout: &syncWriter{w: stdout, lost: make(chan struct{})},
		stderr: errw,
	}
	return j.run(ctx, sigs)
}

// usageLine is the synopsis, for -h and usage errors.
const usageLine = "mdrun [flags] -n N prog [args...] [: -n M [-x NAME[=VALUE]] [-wdir DIR] prog2 [args...]]..."

// usageMPMD follows the flags in -h.
const usageMPMD = `
Several programs (MPMD): separate them with ':' words, each after the first
with its own -n and optionally -x NAME or -x NAME=VALUE (on top of the
job's, for its own ranks) and -wdir DIR (in place of the job's); the other
flags are the job's and come first:

  mdrun -hosts h1:2,h2:3 -n 2 ocean -c o.cfg : -n 3 atmos

Ranks are numbered across the programs in order (ocean 0-1, atmos 2-4) and
placed on the hosts as one list. Every rank gets MD_APPNUM, the index of its
program from 0 (0 in a job of one program). A ':' word always separates, as
in mpiexec; pass one to a program inside a single word, e.g. through a
shell: sh -c 'exec prog a : b'.
`

// rawFlags are the job's flags that parseArgs checks and converts after
// flag has read them.
type rawFlags struct {
	n, ppn                                                   int
	hosts, hostfile, launcher, relays, relayCmd, bind, mapBy string
	exports                                                  stringList
}

// jobFlags is the flag set of the job's flags, those before the first
// program; it reads them into cfg and raw, and writes flag's messages and
// -h to errw.
func jobFlags(cfg *config, raw *rawFlags, errw io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("mdrun", flag.ContinueOnError)
	fs.SetOutput(errw)
	fs.IntVar(&raw.n, "n", 0, "number of ranks of the (first) program (required; each program after ':' gives its own)")
	fs.StringVar(&cfg.plugins, "plugins", "", "plugins.hcl for the ranks, passed as MD_PLUGINS")
	fs.StringVar(&cfg.conntable, "conntable", "", "connection table file, or directory of per-host tables, passed as MD_CONNTABLE")
	fs.BoolVar(&cfg.prefix, "prefix", true, `prefix each line of output with "[rank] " (false: pass the ranks' output on unchanged, not cut into lines)`)
	fs.DurationVar(&cfg.timeout, "timeout", 0, "end the job after this wall-clock time, e.g. 10m (0: no limit)")
	fs.BoolVar(&cfg.verbose, "v", false, "log what the launcher does to stderr")
	fs.StringVar(&raw.hosts, "hosts", "", "comma-separated hosts to place ranks on, each `host[:slots][@site]` (default: all on this machine); a host's ranks get MD_SITE=site, naming the cluster it is in")
	fs.StringVar(&raw.mapBy, "map-by", "slot", "`policy` placing ranks on the hosts: slot fills each host's slots with consecutive ranks before the next host's; node puts one rank on each host in turn, skipping full ones, as mpirun --map-by node (beyond the slots of all hosts both start over)")
	fs.IntVar(&raw.ppn, "ppn", 0, "ranks per host: each host of -hosts or -hostfile that gives no slots gets `N`, as mpiexec -ppn (without it: 1)")
	fs.StringVar(&raw.hostfile, "hostfile", "", "file naming the hosts, one per line: host, host:slots or host slots=N, each optionally with site=NAME (as @site in -hosts)")
	fs.StringVar(&raw.launcher, "launcher", "ssh", "command that runs a command line on a remote host, called as: launcher host command...")
	fs.StringVar(&cfg.listen, "listen", "", "host:port where remote ranks reach the rendezvous service (default: this machine's address towards the first remote host, any port)")
	fs.StringVar(&raw.relays, "relay", "", "comma-separated hosts that each run a dedicated relay (`host[:count][@site]`, as -hosts): extra ranks after the N, outside the application's world, that forward between ranks with no direct link")
	fs.StringVar(&raw.relayCmd, "relay-cmd", "mdrelay", "the relay program and its arguments; a bare name is looked up next to mdrun, then in PATH")
	fs.StringVar(&cfg.wdir, "wdir", "", "directory ranks start in, on every host (default: mdrun's own; a remote host without that one starts them where the launcher does); a program after ':' may give its own")
	fs.StringVar(&raw.bind, "bind", "none", "`none`, core or hwthread: bind each rank before it starts to a core of its own (all its hardware threads) or to one hardware thread, in order on each host (here: of the CPUs mdrun may use; elsewhere: from CPU 0, through taskset), as mpiexec -bind-to does")
	fs.Var(&raw.exports, "x", "pass environment variable `NAME` to remote ranks, or with NAME=VALUE set it to VALUE in every rank's environment (repeatable, the last of a name counts; MD_* variables always pass; where mdrun sets a variable itself, its value wins); a program after ':' may add its own")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: %s\n", usageLine)
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), usageMPMD)
	}
	return fs
}

// parseArgs reads the command line; flag's own messages go to errw.
func parseArgs(args []string, errw io.Writer) (config, error) {
	var cfg config
	var raw rawFlags
	fs := jobFlags(&cfg, &raw, errw)
	sections := splitSections(args)
	if len(sections) > 1 {
		for k, sec := range sections {
			if len(sec) == 0 {
				return cfg, &usageError{emptySection(k, len(sections))}
			}
		}
	}
	if err := fs.Parse(sections[0]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, err
		}
		return cfg, &usageError{err.Error()}
	}
	later := make([]section, 0, len(sections)-1)
	for k, words := range sections[1:] {
		sec, err := parseSection(words, fs)
		if errors.Is(err, flag.ErrHelp) {
			fs.Usage()
			return cfg, err
		}
		if err != nil {
			return cfg, &usageError{sectionPrefix(k+1) + err.Error()}
		}
		later = append(later, sec)
	}
	n := raw.n
	nGiven := false
	fs.Visit(func(f *flag.Flag) { nGiven = nGiven || f.Name == "n" })
	if !nGiven {
		return cfg, &usageError{"-n is missing: give the number of ranks to start (mdrun -n 4 prog)"}
	}
	if err := checkRanks(n); err != nil {
		return cfg, &usageError{err.Error()}
	}
	mode, err := parseBind(raw.bind)
	if err != nil {
		return cfg, &usageError{err.Error()}
	}
	cfg.bind = mode
	if cfg.mapBy, err = parseMapBy(raw.mapBy); err != nil {
		return cfg, &usageError{err.Error()}
	}
	if cfg.timeout < 0 {
		return cfg, &usageError{fmt.Sprintf("-timeout %v is negative", cfg.timeout)}
	}
	if fs.NArg() == 0 {
		return cfg, &usageError{"no program to run"}
	}
	if raw.hosts != "" && raw.hostfile != "" {
		return cfg, &usageError{"give -hosts or -hostfile, not both"}
	}
	switch {
	case raw.hosts != "":
		cfg.hosts, err = parseHosts(raw.hosts)
	case raw.hostfile != "":
		cfg.hosts, err = parseHostfile(raw.hostfile)
	}
	if err != nil {
		return cfg, &usageError{err.Error()}
	}
	ppnGiven := false
	fs.Visit(func(f *flag.Flag) { ppnGiven = ppnGiven || f.Name == "ppn" })
	if err := checkPPN(raw.ppn, ppnGiven, cfg.hosts); err != nil {
		return cfg, &usageError{err.Error()}
	}
	cfg.wdirSet = cfg.wdir != ""
	if !cfg.wdirSet {
		if cfg.wdir, err = os.Getwd(); err != nil {
			return cfg, fmt.Errorf("the current directory: %w", err)
		}
	} else if cfg.wdir, err = absWdir(cfg.wdir, cfg.hosts == nil); err != nil {
		return cfg, &usageError{err.Error()}
	}
	if cfg.launcher = strings.Fields(raw.launcher); len(cfg.launcher) == 0 {
		return cfg, &usageError{"-launcher is empty"}
	}
	if err := checkExports(raw.exports); err != nil {
		return cfg, &usageError{err.Error()}
	}
	cfg.exports = raw.exports
	prog, err := lookProgram(fs.Arg(0))
	if err != nil {
		return cfg, &usageError{err.Error()}
	}
	cfg.apps = []app{{n: n, prog: prog, args: fs.Args()[1:], wdir: cfg.wdir, wdirSet: cfg.wdirSet}}
	cfg.n = n
	for k, sec := range later {
		a := app{n: sec.n, args: sec.argv[1:], exports: sec.exports, wdir: cfg.wdir, wdirSet: cfg.wdirSet}
		if a.prog, err = lookProgram(sec.argv[0]); err == nil && sec.wdir != "" {
			a.wdir, err = absWdir(sec.wdir, cfg.hosts == nil)
			a.wdirSet = true
		}
		if err == nil && a.n > maxRanks-cfg.n {
			err = fmt.Errorf("-n %d: a job has at most %d ranks, and the programs before have %d", a.n, maxRanks, cfg.n)
		}
		if err != nil {
			return cfg, &usageError{sectionPrefix(k+1) + err.Error()}
		}
		cfg.apps = append(cfg.apps, a)
		cfg.n += a.n
	}
	if raw.relays != "" {
		specs, err := parseRelays(raw.relays)
		if err != nil {
			return cfg, &usageError{err.Error()}
		}
		count := 0
		for _, h := range specs {
			if count += h.slots; count > maxRanks-cfg.n {
				return cfg, &usageError{fmt.Sprintf("-relay: %d relays: a job has at most %d ranks, and the programs have %d", count, maxRanks, cfg.n)}
			}
		}
		cfg.relays, cfg.relayHosts = placeRanks(count, specs), specs
		if cfg.relayCmd, err = relayCommand(raw.relayCmd); err != nil {
			return cfg, &usageError{fmt.Sprintf("-relay-cmd: %v", err)}
		}
	}
	for _, p := range []struct {
		flag, env string
		path      *string
	}{{"-plugins", "MD_PLUGINS", &cfg.plugins}, {"-conntable", "MD_CONNTABLE", &cfg.conntable}} {
		if *p.path == "" {
			// mdrun's own variable, made absolute as the flag is: with
			// -wdir, or on a remote host, a relative path would name
			// another file. It need not exist here, as on a remote host
			// it may be a path of that host's only.
			if v := os.Getenv(p.env); v != "" {
				abs, err := filepath.Abs(v)
				if err != nil {
					return cfg, &usageError{fmt.Sprintf("%s=%s: %v", p.env, v, err)}
				}
				*p.path = abs
				if cfg.inherited == nil {
					cfg.inherited = make(map[string]bool)
				}
				cfg.inherited[p.env] = true
			}
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

// lookProgram finds a program as the shell would, and makes its path
// absolute, so remote hosts (which share the path) and ranks that change
// directory find it.
func lookProgram(name string) (string, error) {
	prog, err := exec.LookPath(name)
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("program %q not found: %v", name, err)
		}
		return "", fmt.Errorf("program %q cannot be run: %v", name, err)
	}
	if prog, err = filepath.Abs(prog); err != nil {
		return "", fmt.Errorf("program %q: %v", name, err)
	}
	return prog, nil
}

// absWdir makes a -wdir absolute: relative to this directory here, and
// the same path on remote hosts. When every rank starts here (here), it
// must be a directory: say so now, not as a failed start of a rank.
func absWdir(dir string, here bool) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("-wdir: %v", err)
	}
	if !here {
		return abs, nil
	}
	if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
		var pe *os.PathError
		switch {
		case err == nil:
			err = errors.New("not a directory")
		case errors.As(err, &pe):
			err = pe.Err // the path is in the message already
		}
		return "", fmt.Errorf("-wdir %s: %v", abs, err)
	}
	return abs, nil
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
