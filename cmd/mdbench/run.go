package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	_ "github.com/hpc-multidevice/multidevice/adi" // links the built-in subdevices for --direct
	"github.com/hpc-multidevice/multidevice/internal/loglevel"
)

const usage = `usage: mdbench [flags] [test...]

Measures point-to-point speed between ranks this command starts itself on
this host, OSU style. Tests (default: lat bw bibw):

  lat    half round-trip latency, µs
  bw     one-way bandwidth with a window of messages in flight, MB/s
  bibw   bandwidth both ways at once, MB/s
  mr     message rate of --pairs pairs streaming at once, messages/s
  idle   CPU share of a rank blocked in Recv for --seconds (runs once)

Collectives, on -n ranks, OSU style: µs a call, each rank's mean over
its calls, the largest of the ranks' means reported:

  allreduce  Allreduce summing size/8 float64s (at least one)
  bcast      Bcast of size bytes from rank 0
  barrier    Barrier (no message: runs once, reported at size 0)
  alltoall   Alltoall of size bytes from every rank to every rank

With -hosts K the ranks of every launch are placed in blocks on K
pretend hosts of this machine (mdbench-h0, ...): shm carries what stays
within one, tcp what goes between them (over loopback: tcp is told the
real host name), and the table counts the bytes each carried.

Every repetition launches the ranks afresh; with --direct, --baseline,
--vs-plugins, --vs-conntable, --vs-env or --vs-build the series are
interleaved within each repetition (their order alternates) and the
report gives medians, minima and maxima. md/x, our figure divided by
series x's, is taken within each repetition and its median reported:
launches seconds apart see the same machine, while over minutes a noisy
host can slow every series down and back.

Flags:
`

// options are the parsed command line.
type options struct {
	tests     []string
	sizes     []int
	sub       string
	plugins   string
	conntable string
	vsPlugins string
	vsTable   string
	variants  []variant // -vs-env and -vs-build, in the order given
	direct    bool
	baseline  bool
	bind      bool
	mpis      []string
	reps      int
	window    int
	pairs     int
	ranks     int
	hosts     int
	scale     float64
	seconds   float64
	timeout   time.Duration
	format    string
	svg       string
	out       string
}

var allTests = slices.Concat([]string{"lat", "bw", "bibw", "mr", "idle"}, collTests)

func parseArgs(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("mdbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	sizes := fs.String("sizes", "8,64,512,4K,16K,64K,256K,1M", "message sizes, comma-separated (suffixes K, M)")
	fs.StringVar(&o.sub, "sub", "", "subdevice to measure alone: shm, tcp, ... (default shm unless -plugins or -conntable is given)")
	fs.StringVar(&o.plugins, "plugins", "", "plugins.hcl choosing the subdevices, instead of -sub")
	fs.StringVar(&o.conntable, "conntable", "", "connection table (file, or directory of <host>.json) choosing the routes")
	fs.StringVar(&o.vsTable, "vs-conntable", "", "also run the job routed by this connection table (series \"table\"), interleaved: e.g. a failover table against a plain one given with -conntable")
	fs.StringVar(&o.vsPlugins, "vs-plugins", "", "also run the job with the subdevices of this plugins.hcl (series \"plugin\"), interleaved: e.g. tcp served by cmd/sdi-tcp against the built-in -sub tcp")
	addVariant := func(parse func(string) (variant, error)) func(string) error {
		return func(v string) error {
			e, err := parse(v)
			if err != nil {
				return err
			}
			for _, old := range o.variants {
				if old.name == e.name {
					return fmt.Errorf("series %q given twice", e.name)
				}
			}
			o.variants = append(o.variants, e)
			return nil
		}
	}
	fs.Func("vs-env", "also run our job with extra environment for its ranks, as series NAME, interleaved: NAME:VAR=VALUE[,VAR=VALUE...] (repeatable; e.g. ring:MD_SHM_SINGLE_COPY=0)", addVariant(parseEnvSeries))
	fs.Func("vs-build", "also run our job with the ranks of another mdbench binary, as series NAME, interleaved: NAME:PATH (repeatable; e.g. main:/tmp/main/mdbench, built from the commit to compare with)", addVariant(parseBuildSeries))
	fs.BoolVar(&o.direct, "direct", false, "also drive the subdevice through the SDI alone, without the multidevice (series \"direct\"; lat, bw, bibw)")
	fs.BoolVar(&o.bind, "bind", true, "bind rank r to the r-th core when there are no more ranks than cores (and tell the MPIs to bind to cores), as OSU runs usually are")
	fs.BoolVar(&o.baseline, "baseline", false, "also build baseline/osu.c with each MPI of -mpi found here and run it, interleaved")
	mpiList := fs.String("mpi", "mpich,openmpi", "MPI implementations for -baseline")
	fs.IntVar(&o.reps, "reps", 10, "repetitions")
	fs.IntVar(&o.window, "window", 64, "messages in flight per iteration of bw, bibw and mr")
	fs.IntVar(&o.pairs, "pairs", 0, "pairs of ranks for mr; 0: as many as the cores mdbench may use hold, one rank a core (at least 1)")
	fs.IntVar(&o.ranks, "n", 0, "ranks for the collectives (allreduce, bcast, barrier, alltoall); 0: one a core mdbench may use (at least 2)")
	fs.IntVar(&o.ranks, "ranks", 0, "the same as -n")
	fs.IntVar(&o.hosts, "hosts", 1, "place every launch's ranks on this many pretend hosts of this machine, in blocks as mpiexec places them (rank r of n on host mdbench-h<r*hosts/n>): ranks of one host talk over shm, of different hosts over tcp (the default subdevices; -sub shm cannot reach across). The collectives' -n ranks span them; lat, bw, bibw and idle put their two ranks on two hosts (-hosts 2), so they measure the path between hosts, and mr puts each pair's ends on two. A test with fewer ranks than hosts is refused, and so is -baseline: the MPIs cannot pretend hosts")
	fs.Float64Var(&o.scale, "scale", 1, "multiply every iteration count (ours and the baseline's) by this")
	fs.Float64Var(&o.seconds, "seconds", 10, "how long idle blocks")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up on a launch (ours or a baseline's) that runs longer than this")
	fs.StringVar(&o.format, "format", "table", "output: table, csv or json")
	fs.StringVar(&o.svg, "svg", "", "also write a plot of latency and bandwidth against size to this SVG file")
	fs.StringVar(&o.out, "o", "", "write the output to this file instead of stdout")

	// Tests may come before, between or after the flags.
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		a := fs.Arg(0)
		if !slices.Contains(allTests, a) {
			return nil, fmt.Errorf("unknown test %q (tests: %s)", a, strings.Join(allTests, ", "))
		}
		if !slices.Contains(o.tests, a) {
			o.tests = append(o.tests, a)
		}
		rest = fs.Args()[1:]
	}
	if len(o.tests) == 0 {
		o.tests = []string{"lat", "bw", "bibw"}
	}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := parseSize(s)
		if err != nil {
			return nil, fmt.Errorf("-sizes: %w", err)
		}
		if !slices.Contains(o.sizes, n) {
			o.sizes = append(o.sizes, n)
		}
	}
	slices.Sort(o.sizes)
	o.mpis = strings.Split(*mpiList, ",")
	for _, name := range o.mpis {
		if !slices.ContainsFunc(mpis, func(m mpi) bool { return m.name == name }) {
			return nil, fmt.Errorf("-mpi: unknown MPI %q (want mpich, openmpi)", name)
		}
	}
	switch {
	case o.sub == "" && o.plugins == "" && o.conntable == "" && o.hosts <= 1:
		o.sub = "shm"
	case o.sub != "" && o.plugins != "":
		return nil, errors.New("-sub and -plugins both choose the subdevices; give one")
	case o.direct && o.sub == "":
		return nil, errors.New("-direct needs -sub: the subdevice to drive")
	}
	switch {
	case o.reps < 1:
		return nil, fmt.Errorf("-reps %d: want at least 1", o.reps)
	case o.window < 1:
		return nil, fmt.Errorf("-window %d: want at least 1", o.window)
	case o.pairs < 0:
		return nil, fmt.Errorf("-pairs %d: want at least 1, or 0 for as many as the cores hold", o.pairs)
	case o.ranks < 0 || o.ranks == 1:
		return nil, fmt.Errorf("-n (-ranks) %d: want at least 2, or 0 for one a core", o.ranks)
	case o.hosts < 1:
		return nil, fmt.Errorf("-hosts %d: want at least 1", o.hosts)
	case !(o.scale > 0) || o.scale*50000 > math.MaxInt32:
		return nil, fmt.Errorf("-scale %g: want more than 0 and at most %g", o.scale, math.MaxInt32/50000.0)
	case o.timeout <= 0:
		return nil, fmt.Errorf("-timeout %v: want more than 0", o.timeout)
	case !(o.seconds > 0) || o.seconds > 1e6:
		return nil, fmt.Errorf("-seconds %g: want more than 0", o.seconds)
	case o.format != "table" && o.format != "csv" && o.format != "json":
		return nil, fmt.Errorf("-format %q: want table, csv or json", o.format)
	}
	if o.pairs == 0 {
		o.pairs = max(1, usableCores()/2)
	}
	if o.ranks == 0 {
		o.ranks = max(2, usableCores())
	}
	if err := o.checkHosts(); err != nil {
		return nil, err
	}
	// What the ranks allocate, the window capped so that the product
	// cannot wrap around. Sizes stop at 256 MiB: only a window can take
	// it past the bound.
	if send, recv := bufLens(o.tests, o.sizes, min(o.window, maxRankBytes)); send+recv > maxRankBytes {
		return nil, fmt.Errorf("-window %d at -sizes %s: each rank needs a receive buffer of %d x %s, more than %s; give a smaller window or sizes",
			o.window, formatSize(send), o.window, formatSize(send), formatSize(maxRankBytes))
	}
	if slices.Contains(o.tests, "alltoall") {
		if size := o.sizes[len(o.sizes)-1]; 2*size*o.ranks > maxRankBytes {
			return nil, fmt.Errorf("alltoall at -sizes %s on %d ranks: each rank needs two buffers of %d x %s, more than %s; give smaller sizes or fewer ranks",
				formatSize(size), o.ranks, o.ranks, formatSize(size), formatSize(maxRankBytes))
		}
	}
	return o, nil
}

// checkHosts refuses -hosts where it cannot hold: more hosts than a
// test has ranks, shm alone (it reaches only ranks on its own host), and
// -baseline (the MPIs run on the one real host, so their figures would
// be of another placement than ours).
func (o *options) checkHosts() error {
	if o.hosts <= 1 {
		return nil
	}
	for _, t := range o.tests {
		if n := o.testRanks(t); o.hosts > n {
			how := "its two ranks"
			switch {
			case isCollective(t):
				how = "-n"
			case t == "mr":
				how = "twice -pairs"
			}
			return fmt.Errorf("-hosts %d: %s runs on %d ranks (%s), too few for %d hosts; give at most -hosts %d with it, or more ranks", o.hosts, t, n, how, o.hosts, n)
		}
	}
	if o.sub == "shm" {
		return fmt.Errorf("-hosts %d with -sub shm: shm reaches only ranks on its own host; leave -sub out for shm within hosts and tcp between them, or give -sub tcp", o.hosts)
	}
	if o.baseline {
		return fmt.Errorf("-hosts %d with -baseline: the MPIs cannot pretend hosts, so they would run on one host against our %d; compare with them without -hosts", o.hosts, o.hosts)
	}
	return nil
}

// testRanks is how many ranks test runs on.
func (o *options) testRanks(test string) int {
	switch {
	case isCollective(test):
		return o.ranks
	case test == "mr":
		return 2 * o.pairs
	}
	return 2 // lat, bw, bibw, idle
}

// usableCores counts the cores mdbench may run on (1 if unknown).
// Ranks that outnumber them share cores and are not bound: the MPIs' waiters
// then spin against each other, and their message rate fell to 8 000
// messages/s in some launches of 2 pairs on 2 cores here, against
// millions with one.
func usableCores() int {
	cores, err := allowedCores()
	if err != nil {
		return 1
	}
	return max(1, len(cores))
}

// route describes what is measured, for the report.
func (o *options) route() string {
	var parts []string
	if o.sub != "" {
		parts = append(parts, "subdevice "+o.sub)
	}
	if o.plugins != "" {
		parts = append(parts, "plugins "+o.plugins)
	}
	if o.conntable != "" {
		parts = append(parts, "conntable "+o.conntable)
	}
	if len(parts) == 0 {
		parts = append(parts, "default subdevices shm and tcp")
	}
	if o.hosts > 1 {
		parts = append(parts, fmt.Sprintf("ranks in blocks on %d pretend hosts %s0..%d", o.hosts, hostPrefix, o.hosts-1))
	}
	return strings.Join(parts, ", ")
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "mdbench: %v\n", err)
		return 2
	}
	// The files are opened before anything is measured: a path that
	// cannot be written fails the run at once, not after hours of
	// launches whose figures it would lose.
	files, err := o.openOutputs()
	if err != nil {
		fmt.Fprintf(stderr, "mdbench: %v\n", err)
		return 1
	}
	rep, err := measure(ctx, o, stderr)
	if rep == nil {
		files.discard()
		fmt.Fprintf(stderr, "mdbench: %v\n", err)
		return 1
	}
	rep.Command = "mdbench " + strings.Join(args, " ")
	if errors.Is(err, errEndedEarly) && (files.out != nil || files.svg != nil) {
		// A partial report must not replace a complete one from an
		// earlier run, and CSV and SVG have no room for the note
		// saying it is partial: it goes to standard output instead.
		files.discard()
		files = outputs{}
		fmt.Fprintln(stderr, "mdbench: the run ended early: its partial report follows on standard output; -o and -svg are left as they were")
	}
	if werr := o.write(rep, stdout, files); werr != nil {
		fmt.Fprintf(stderr, "mdbench: %v\n", werr)
		return 1
	}
	if err != nil { // the figures are of the launches that did not fail
		fmt.Fprintf(stderr, "mdbench: %v\n", err)
		return 1
	}
	return 0
}

// outputs are the -o and -svg files of a run; nil where not given.
type outputs struct {
	out, svg *outFile
}

// outFile is a file a report is written to.
type outFile struct {
	f       *os.File
	created bool // by this run, so removed if the run writes nothing
}

// openOutputs opens the -o and -svg files.
func (o *options) openOutputs() (files outputs, err error) {
	if o.out != "" {
		if files.out, err = openOutFile(o.out); err != nil {
			return outputs{}, fmt.Errorf("-o: %w", err)
		}
	}
	if o.svg != "" {
		if files.svg, err = openOutFile(o.svg); err != nil {
			files.discard()
			return outputs{}, fmt.Errorf("-svg: %w", err)
		}
	}
	return files, nil
}

// discard closes the files, removing those the run created.
func (files outputs) discard() {
	for _, of := range []*outFile{files.out, files.svg} {
		if of == nil {
			continue
		}
		_ = of.f.Close() // nothing was written
		if of.created {
			_ = os.Remove(of.f.Name()) // empty, and the run failed anyway
		}
	}
}

// openOutFile opens path for writing, creating it if need be. A file
// that exists keeps what it holds until replace writes the report: a
// run that fails leaves an earlier report where it was.
func openOutFile(path string) (*outFile, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
	if err == nil {
		return &outFile{f: f, created: true}, nil
	}
	if !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	if f, err = os.OpenFile(path, os.O_WRONLY, 0); err != nil {
		return nil, err
	}
	return &outFile{f: f}, nil
}

// replace writes what write writes in place of what the file held, and
// closes it.
func (of *outFile) replace(write func(io.Writer) error) error {
	// Only a regular file can be truncated (-o /dev/stdout is a device
	// or a pipe), and only a regular file holds an earlier report.
	if fi, err := of.f.Stat(); err == nil && fi.Mode().IsRegular() {
		if err := of.f.Truncate(0); err != nil {
			_ = of.f.Close() // the truncation's error says what went wrong
			return err
		}
	}
	if err := write(of.f); err != nil {
		_ = of.f.Close() // the write's error says what went wrong
		return fmt.Errorf("%s: %w", of.f.Name(), err)
	}
	return of.f.Close()
}

// write writes rep in o's format to stdout or the -o file, and the plot
// to the -svg file.
func (o *options) write(rep *report, stdout io.Writer, files outputs) error {
	text := rep.writeTable
	switch o.format {
	case "csv":
		text = rep.writeCSV
	case "json":
		text = rep.writeJSON
	}
	var err error
	if files.out != nil {
		err = files.out.replace(text)
	} else {
		err = text(stdout)
	}
	if files.svg != nil {
		err = errors.Join(err, files.svg.replace(rep.writeSVG))
	}
	return err
}

// measure runs every repetition, interleaving the series.
func measure(ctx context.Context, o *options, stderr io.Writer) (*report, error) {
	logger := hclog.New(&hclog.LoggerOptions{Name: "mdbench", Level: loglevel.FromEnv("MD_LOG_LEVEL", hclog.Warn, stderr), Output: stderr})
	if cores := usableCores(); slices.Contains(o.tests, "mr") && 2*o.pairs > cores {
		fmt.Fprintf(stderr, "mdbench: mr: %d ranks on %d cores share them unbound; its figures, the MPIs' above all, say little\n", 2*o.pairs, cores)
	}
	rep := &report{Route: o.route(), Reps: o.reps, CPUs: runtime.NumCPU(), LoadBefore: loadAvg(), Hosts: o.hosts, Ranks: map[string]int{}}
	for _, t := range o.tests {
		rep.Ranks[t] = o.testRanks(t)
	}
	if cores := usableCores(); slices.ContainsFunc(o.tests, isCollective) && o.ranks > cores {
		// The note goes into the report too: a table read later must say
		// that its collectives ran oversubscribed.
		note := fmt.Sprintf("collectives: %d ranks on %d cores share them unbound, and waiters that spin (the MPIs' above all) take the cores from the ranks they wait for; these figures say little", o.ranks, cores)
		fmt.Fprintf(stderr, "mdbench: %s\n", note)
		rep.Notes = append(rep.Notes, note)
	}
	cpu0, ok0 := readCPUTimes()
	col := newCollector()

	var mpis []mpi
	if o.baseline {
		dir, err := os.MkdirTemp("", "mdbench-baseline-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		var notes []string
		mpis, notes = buildBaselines(ctx, o.mpis, dir)
		rep.Notes = append(rep.Notes, notes...)
		if o.plugins != "" || o.conntable != "" || (o.sub != "shm" && o.sub != "tcp") {
			rep.Notes = append(rep.Notes, "the MPI baselines use their default intra-host transport (shared memory)")
		}
	}

	job := childJob{Sizes: o.sizes, Window: o.window, Scale: o.scale, Sub: o.sub, Plugins: o.plugins, ConnTable: o.conntable, IdleSeconds: o.seconds, Hosts: o.hosts}
	var two, rate, coll []string // tests run on two ranks, message rate, collectives
	for _, t := range o.tests {
		switch {
		case t == "mr":
			rate = append(rate, t)
		case isCollective(t):
			coll = append(coll, t)
		case t == "idle":
		default:
			two = append(two, t)
		}
	}
	// Each kind of test runs on its own number of ranks.
	groups := []struct {
		tests []string
		ranks int
	}{{two, 2}, {rate, 2 * o.pairs}, {coll, o.ranks}}
	if o.direct && (len(rate) > 0 || len(coll) > 0) {
		rep.Notes = append(rep.Notes, "direct mode measures lat, bw and bibw only")
	}

	// steps are the launches of one repetition; their order alternates.
	// jobOf runs the two-rank tests, then message rate on its pairs, then
	// the collectives, as one job described by base.
	jobOf := func(base childJob) func(ctx context.Context) ([]sample, []traffic, error) {
		return func(ctx context.Context) ([]sample, []traffic, error) {
			var all []sample
			var tr []traffic
			for _, run := range groups {
				if len(run.tests) == 0 {
					continue
				}
				j := base
				j.Tests = run.tests
				var l launched
				err := o.perLaunch(ctx, false, func(ctx context.Context) (err error) {
					l, err = launch(ctx, run.ranks, j, o.bind, o.hosts, logger)
					return err
				})
				if err != nil {
					return nil, nil, err
				}
				all = append(all, l.samples...)
				if l.flows != nil {
					tr = append(tr, traffic{Tests: run.tests, Ranks: run.ranks, Launches: 1, Flows: l.flows})
				}
			}
			return all, tr, nil
		}
	}
	steps := []step{{ours, jobOf(job)}}
	if o.vsPlugins != "" {
		j := job
		j.Sub, j.Plugins = "", o.vsPlugins
		steps = append(steps, step{"plugin", jobOf(j)})
	}
	if o.vsTable != "" {
		j := job
		j.ConnTable = o.vsTable
		steps = append(steps, step{"table", jobOf(j)})
	}
	for _, e := range o.variants {
		j := job
		j.Env, j.Exe = e.env, e.exe
		steps = append(steps, step{e.name, jobOf(j)})
	}
	if o.direct {
		if d := slices.DeleteFunc(slices.Clone(two), func(t string) bool { return t == "mr" }); len(d) > 0 {
			steps = append(steps, step{"direct", func(ctx context.Context) ([]sample, []traffic, error) {
				j := job
				j.Tests, j.Direct = d, true
				var l launched
				err := o.perLaunch(ctx, false, func(ctx context.Context) (err error) {
					l, err = launch(ctx, 2, j, o.bind, o.hosts, logger)
					return err
				})
				return l.samples, nil, err
			}})
		}
	}
	for _, m := range mpis {
		steps = append(steps, step{m.name, func(ctx context.Context) ([]sample, []traffic, error) {
			var all []sample
			for _, g := range groups {
				for _, t := range g.tests {
					args := []string{t}
					if t != "lat" && !isCollective(t) {
						args = append(args, strconv.Itoa(o.window))
					}
					for _, s := range collSizes(t, o.sizes) {
						args = append(args, strconv.Itoa(s))
					}
					var s []sample
					err := o.perLaunch(ctx, false, func(ctx context.Context) (err error) {
						s, err = m.runBaseline(ctx, g.ranks, o.sub, o.bind, o.scale, args...)
						return err
					})
					if err != nil {
						return nil, nil, err
					}
					all = append(all, s...)
				}
			}
			return all, nil, nil
		}})
	}
	idle := func() error {
		fmt.Fprintf(stderr, "mdbench: idle: a rank blocks in Recv for %gs\n", o.seconds)
		j := job
		j.Tests = []string{"idle"}
		var l launched
		err := o.perLaunch(ctx, true, func(ctx context.Context) (err error) {
			l, err = launch(ctx, 2, j, o.bind, o.hosts, logger)
			return err
		})
		if err != nil {
			return fmt.Errorf("idle: %w", err)
		}
		col.add(ours, 0, l.samples)
		for _, m := range mpis {
			var s []sample
			err := o.perLaunch(ctx, true, func(ctx context.Context) (err error) {
				s, err = m.runBaseline(ctx, 2, o.sub, o.bind, 1, "idle", strconv.FormatFloat(o.seconds, 'g', -1, 64))
				return err
			})
			if err != nil {
				return fmt.Errorf("idle: %w", err)
			}
			for i := range s {
				s[i].Size = 8
			}
			col.add(m.name, 0, s)
		}
		return nil
	}
	var failed []error
	var stop error // what ended the run early
	if len(two)+len(rate)+len(coll) > 0 {
		failed, stop = repeat(ctx, o.reps, steps, col, rep, stderr)
	}
	if stop == nil && slices.Contains(o.tests, "idle") {
		stop = idle()
	}
	col.summarize(rep)
	rep.LoadAfter = loadAvg()
	rep.Steal = -1
	if cpu1, ok1 := readCPUTimes(); ok0 && ok1 {
		rep.Steal = cpu1.stealShare(cpu0)
	}
	if stop != nil && len(rep.Stats) == 0 { // nothing to report
		return nil, errors.Join(append(failed, stop)...)
	}
	// A run that ended early still reports what it measured before, as
	// one that left failed repetitions out reports the others: hours of
	// figures are not thrown away for the last launch.
	var errs []error
	if len(failed) > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("%d of %d repetitions failed and are left out of the figures; the first: %v", len(failed), o.reps, failed[0]))
		errs = append(errs, fmt.Errorf("%d of %d repetitions failed (left out of the figures above): %w", len(failed), o.reps, errors.Join(failed...)))
	}
	if stop != nil {
		rep.Notes = append(rep.Notes, fmt.Sprintf("the run ended early, and the figures are of what it measured before: %v", stop))
		errs = append(errs, fmt.Errorf("%w (the figures above are of what it measured before): %w", errEndedEarly, stop))
	}
	return rep, errors.Join(errs...)
}

// errEndedEarly marks a report of a run that stopped before its last
// repetition: its figures are of what it measured before.
var errEndedEarly = errors.New("the run ended early")

// perLaunch runs fn, one launch, under a deadline of its own: -timeout,
// plus -seconds for an idle launch, which blocks that long on purpose.
// -timeout bounds every launch and not a step, which may launch many (a
// baseline launches once per test), so that a step may take as long as
// its tests need and an error blames the launch that hung.
func (o *options) perLaunch(ctx context.Context, idle bool, fn func(ctx context.Context) error) error {
	limit, what := o.timeout, fmt.Sprintf("-timeout %v", o.timeout)
	if idle {
		limit += time.Duration(o.seconds * float64(time.Second))
		what += " plus -seconds"
	}
	lctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	err := fn(lctx)
	if err != nil && ctx.Err() == nil && lctx.Err() == context.DeadlineExceeded {
		return fmt.Errorf("gave up after %s: %w", what, err)
	}
	return err
}

// step is one launch of a repetition: a series' ranks running the tests.
type step struct {
	name string
	fn   func(ctx context.Context) ([]sample, []traffic, error)
}

// repeat runs reps repetitions of steps, alternating their order, and
// adds what they measured to col and rep.
// A repetition in which a launch fails is left out whole, so that the
// series stay paired within every repetition kept, and the run goes on:
// one launch that failed (a port taken, a rank killed by the host)
// does not cost the others. Two failing in a row, or all, end the run:
// repeat returns the failures, and an error that says why it ended early
// (or ctx's error) when it did.
func repeat(ctx context.Context, reps int, steps []step, col *collector, rep *report, stderr io.Writer) ([]error, error) {
	type result struct {
		name    string
		samples []sample
		traffic []traffic
	}
	var failed []error
	streak := 0
	for i := range reps {
		order := slices.Clone(steps)
		if i%2 == 1 {
			slices.Reverse(order)
		}
		var names []string
		for _, st := range order {
			names = append(names, st.name)
		}
		fmt.Fprintf(stderr, "mdbench: repetition %d/%d: %s\n", i+1, reps, strings.Join(names, ", "))
		var got []result
		var repErr error
		for _, st := range order {
			s, tr, err := st.fn(ctx)
			if err != nil {
				repErr = fmt.Errorf("repetition %d, %s: %w", i+1, st.name, err)
				break
			}
			got = append(got, result{st.name, s, tr})
		}
		if err := ctx.Err(); err != nil {
			return failed, err
		}
		if repErr != nil {
			failed = append(failed, repErr)
			streak++
			switch {
			case len(failed) == reps:
				return failed, errors.New("every repetition failed")
			case streak == 2:
				return failed, errors.New("two repetitions in a row failed")
			}
			fmt.Fprintf(stderr, "mdbench: %v; the repetition is left out\n", repErr)
			continue
		}
		streak = 0
		for _, g := range got {
			col.add(g.name, i, g.samples)
			for _, t := range g.traffic {
				t.Series = g.name
				rep.addTraffic(t)
			}
		}
	}
	return failed, nil
}

// cpuTimes are the all-CPU totals of /proc/stat's first line, in ticks.
type cpuTimes struct{ total, steal uint64 }

// readCPUTimes reads them; ok is false where /proc/stat is missing or has
// no steal column (kernels before 2.6.11).
func readCPUTimes() (t cpuTimes, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return t, false
	}
	return parseCPUTimes(string(b))
}

// parseCPUTimes reads the "cpu" line: user nice system idle iowait irq
// softirq steal ...; guest time is already inside user and nice.
func parseCPUTimes(stat string) (t cpuTimes, ok bool) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return t, false
	}
	for i, s := range f[1:min(len(f), 9)] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil || t.total+v < t.total {
			return cpuTimes{}, false
		}
		t.total += v
		if i == 7 {
			t.steal = v
		}
	}
	return t, true
}

// stealShare is the percentage of the time between before and t that
// was stolen.
func (t cpuTimes) stealShare(before cpuTimes) float64 {
	if t.total <= before.total {
		return 0
	}
	return 100 * float64(t.steal-before.steal) / float64(t.total-before.total)
}

// loadAvg returns the 1-minute load average, or "?".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

// variant is a -vs-env or -vs-build series: our job with extra
// environment, or run by another build of mdbench.
type variant struct {
	name string
	env  []string // VAR=VALUE
	exe  string   // absolute path of the other build; "" for this one
}

// reservedSeries are the series names mdbench gives itself.
var reservedSeries = []string{ours, "md", "direct", "plugin", "table", "mpich", "openmpi"}

// checkSeriesName refuses a series name that is empty, mdbench's own, or
// would not read as one word in the report; v is the flag's value.
func checkSeriesName(v, name string) error {
	if name == "" || strings.IndexFunc(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.')
	}) >= 0 {
		return fmt.Errorf("%q: series name %q: want letters, digits, '-', '_' or '.'", v, name)
	}
	if slices.Contains(reservedSeries, name) {
		return fmt.Errorf("%q: series name %q is mdbench's own", v, name)
	}
	return nil
}

// cutSeries splits a series flag's value v, of the given form, at its
// first colon into a valid series name and a non-empty rest.
func cutSeries(v, form string) (name, rest string, err error) {
	name, rest, ok := strings.Cut(v, ":")
	if !ok || rest == "" {
		return "", "", fmt.Errorf("%q: want %s", v, form)
	}
	if err := checkSeriesName(v, name); err != nil {
		return "", "", err
	}
	return name, rest, nil
}

// parseEnvSeries parses NAME:VAR=VALUE[,VAR=VALUE...].
func parseEnvSeries(v string) (variant, error) {
	name, list, err := cutSeries(v, "NAME:VAR=VALUE[,VAR=VALUE...]")
	if err != nil {
		return variant{}, err
	}
	e := variant{name: name}
	for _, kv := range strings.Split(list, ",") {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t\x00") || strings.Contains(kv, "\x00") {
			return variant{}, fmt.Errorf("%q: %q is not VAR=VALUE", v, kv)
		}
		e.env = append(e.env, kv)
	}
	return e, nil
}

// parseBuildSeries parses NAME:PATH, PATH an executable file: an mdbench
// built from other source, whose ranks speak this one's child protocol
// (the job description in MDBENCH_CHILD, results on stdout).
func parseBuildSeries(v string) (variant, error) {
	name, path, err := cutSeries(v, "NAME:PATH")
	if err != nil {
		return variant{}, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return variant{}, fmt.Errorf("%q: %w", v, err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return variant{}, fmt.Errorf("%q: %w", v, err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return variant{}, fmt.Errorf("%q: %s is not an executable file", v, abs)
	}
	return variant{name: name, exe: abs}, nil
}
