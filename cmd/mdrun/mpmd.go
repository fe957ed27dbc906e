package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/hpc-multidevice/multidevice/bootstrap"
)

// sectionSep separates the programs of an MPMD command line, as in Hydra's
// and Open MPI's mpiexec: a word that is exactly ":" always separates,
// wherever it is.
const sectionSep = ":"

// maxRanks bounds the ranks of a job, relays included. mdrun starts a
// process here for each (a remote rank's launcher), and Linux has at
// most 2^22 process ids (PID_MAX_LIMIT), so no larger job can start;
// checked first, it keeps a typo from allocating gigabytes for the
// ranks' bookkeeping. A rank is an int32 on the wire and in the library,
// well above it.
const maxRanks = 1 << 22

// app is one program of the job, one section of the command line. Its
// ranks are consecutive, and each gets MD_APPNUM, its section's index.
type app struct {
	n    int
	prog string // resolved, absolute path
	args []string
	// exports are the -x words of a section after ':' (NAME or
	// NAME=VALUE), for its own ranks on top of the job's.
	exports []string
	// wdir is where its ranks start: the section's -wdir, else the job's;
	// wdirSet says a -wdir named it, so a host without it is an error.
	wdir    string
	wdirSet bool
}

// splitSections splits args at every lone ":" word. It returns one more
// section than there are separators; sections may be empty.
func splitSections(args []string) [][]string {
	sections := [][]string{{}}
	for _, a := range args {
		if a == sectionSep {
			sections = append(sections, []string{})
			continue
		}
		last := len(sections) - 1
		sections[last] = append(sections[last], a)
	}
	return sections
}

// emptySection describes where the empty section k of count sections is,
// for messages.
func emptySection(k, count int) string {
	switch {
	case k == 0:
		return `nothing before the 1st ":"`
	case k == count-1:
		return fmt.Sprintf("nothing after the %s %q", ordinal(k), sectionSep)
	}
	return fmt.Sprintf("nothing between the %s and the %s %q", ordinal(k), ordinal(k+1), sectionSep)
}

// sectionPrefix starts the messages about section k >= 1.
func sectionPrefix(k int) string {
	return fmt.Sprintf("after the %s %q: ", ordinal(k), sectionSep)
}

// section is a section after ':' as written: its flags and its program's
// words (not yet looked up).
type section struct {
	n       int
	exports []string
	wdir    string   // "": the job's
	argv    []string // the program and its arguments
}

// globalOnly stands for a flag of the whole job in a section after ':'.
// Set records that it was given, so the section's parse can say where the
// flag belongs rather than that it is unknown.
type globalOnly struct {
	name   string
	isBool bool
	seen   *string // the first global flag given
}

func (f globalOnly) String() string { return "" }

func (f globalOnly) Set(string) error {
	if f.seen != nil && *f.seen == "" {
		*f.seen = f.name
	}
	return nil
}

// IsBoolFlag lets a boolean global flag (-v) stand without a value, as
// it does before the first program, so it does not swallow the next word.
func (f globalOnly) IsBoolFlag() bool { return f.isBool }

// sectionFlags are the flags a section after ':' takes; the others are
// the job's and go before the first program.
var sectionFlags = map[string]bool{"n": true, "x": true, "wdir": true}

// parseSection reads a section after ':' (not the first): -n M (required),
// -x NAME and -wdir DIR, then the program and its arguments. global is the
// job's flag set, whose other flags it rejects by name. -h or -help
// returns flag.ErrHelp. It touches no file.
func parseSection(args []string, global *flag.FlagSet) (section, error) {
	var s section
	fs := flag.NewFlagSet("mdrun", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.IntVar(&s.n, "n", 0, "")
	var exports stringList
	fs.Var(&exports, "x", "")
	fs.StringVar(&s.wdir, "wdir", "", "")
	seen := ""
	global.VisitAll(func(f *flag.Flag) {
		if sectionFlags[f.Name] {
			return
		}
		b, ok := f.Value.(interface{ IsBoolFlag() bool })
		fs.Var(globalOnly{name: f.Name, isBool: ok && b.IsBoolFlag(), seen: &seen}, f.Name, "")
	})
	err := fs.Parse(args)
	if seen != "" {
		return s, fmt.Errorf("-%s applies to the whole job: give it before the first program", seen)
	}
	if err != nil {
		return s, err
	}
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "n" })
	if !given {
		return s, errors.New("-n is missing: give each program its number of ranks")
	}
	if err := checkRanks(s.n); err != nil {
		return s, err
	}
	if err := checkExports(exports); err != nil {
		return s, err
	}
	if fs.NArg() == 0 {
		return s, errors.New("no program to run")
	}
	s.exports, s.argv = exports, fs.Args()
	return s, nil
}

// checkRanks checks a program's -n.
func checkRanks(n int) error {
	switch {
	case n < 1:
		return fmt.Errorf("-n %d: need at least 1 rank", n)
	case n > maxRanks:
		return fmt.Errorf("-n %d: a job has at most %d ranks", n, maxRanks)
	}
	return nil
}

// mdrunSets are the variables mdrun gives every rank (MD_APPNUM: every
// rank of a program) whatever -x says: a value for one would be dropped,
// so -x NAME=VALUE refuses them.
var mdrunSets = map[string]bool{
	bootstrap.EnvAddr: true, bootstrap.EnvRank: true, bootstrap.EnvSize: true,
	bootstrap.EnvJobID: true, bootstrap.EnvSecret: true, bootstrap.EnvHost: true,
	bootstrap.EnvExitWithService: true, "MD_APPNUM": true,
}

// checkExports checks -x's words: NAME or NAME=VALUE, with a name. A
// value may hold anything, '=' and spaces included.
func checkExports(words []string) error {
	for _, w := range words {
		name, _, given := strings.Cut(w, "=")
		switch {
		case name == "":
			return fmt.Errorf("-x %q: want NAME or NAME=VALUE, with a variable name", w)
		case given && mdrunSets[name]:
			return fmt.Errorf("-x %q: mdrun sets %s itself", w, name)
		}
	}
	return nil
}

// words writes s back as a section's words, the way parseSection reads
// them; "--" keeps a program whose name starts with '-' a program.
func (s section) words() []string {
	w := []string{"-n", strconv.Itoa(s.n)}
	for _, x := range s.exports {
		w = append(w, "-x", x)
	}
	if s.wdir != "" {
		w = append(w, "-wdir", s.wdir)
	}
	return append(append(w, "--"), s.argv...)
}

// appOf returns the index of the program rank r runs, and the program;
// -1 and nil for a relay.
func (j *job) appOf(r int) (int, *app) {
	first := 0
	for k := range j.cfg.apps {
		a := &j.cfg.apps[k]
		if r < first+a.n {
			return k, a
		}
		first += a.n
	}
	return -1, nil
}
