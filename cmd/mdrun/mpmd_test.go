package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// showApps writes a parse's programs as "n prog [args] x=[exports] wdir".
func showApps(cfg config) string {
	var out []string
	for _, a := range cfg.apps {
		wdir := a.wdir
		if !a.wdirSet {
			wdir = "(mdrun's)"
		}
		out = append(out, fmt.Sprintf("%d %s %q x=%q %s", a.n, filepath.Base(a.prog), a.args, a.exports, wdir))
	}
	return strings.Join(out, " | ")
}

func TestParseMPMD(t *testing.T) {
	dir := t.TempDir()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		n       int
		apps    string
		exports []string // the job's
	}{
		{
			name: "one program", args: []string{"-n", "3", helper, "a", "b"}, n: 3,
			apps: `3 mdrun-test-rank ["a" "b"] x=[] (mdrun's)`,
		},
		{
			name: "two programs", args: []string{"-n", "2", helper, "a", ":", "-n", "3", helper2, "b", "c"}, n: 5,
			apps: `2 mdrun-test-rank ["a"] x=[] (mdrun's) | 3 mdrun-test-other ["b" "c"] x=[] (mdrun's)`,
		},
		{
			name: "three programs, one twice", args: []string{"-n", "1", helper, ":", "-n", "1", helper2, ":", "-n", "4", helper}, n: 6,
			apps: `1 mdrun-test-rank [] x=[] (mdrun's) | 1 mdrun-test-other [] x=[] (mdrun's) | 4 mdrun-test-rank [] x=[] (mdrun's)`,
		},
		{
			// After the program, flags are its own, up to the next ':'.
			name: "flags of the program", args: []string{"-n", "1", helper, "-n", "5", "-hosts", "x", ":", "-n", "1", helper2, "-v", "-wdir", "/"}, n: 2,
			apps: `1 mdrun-test-rank ["-n" "5" "-hosts" "x"] x=[] (mdrun's) | 1 mdrun-test-other ["-v" "-wdir" "/"] x=[] (mdrun's)`,
		},
		{
			// Only a word that is exactly ":" separates.
			name: "colons inside words", args: []string{"-n", "1", helper, "a:b", "::", ": ", "-:"}, n: 1,
			apps: `1 mdrun-test-rank ["a:b" "::" ": " "-:"] x=[] (mdrun's)`,
		},
		{
			// The job's -wdir and -x hold for every program; a section's
			// -wdir replaces the directory for its own ranks (relative to
			// mdrun's), its -x adds to the names.
			name: "per-program -x and -wdir",
			args: []string{"-x", "G", "-wdir", dir, "-n", "1", helper, ":", "-n", "2", "-x", "A", "-wdir", ".", "-x", "B", helper2, ":", "-n", "1", helper}, n: 4,
			apps:    fmt.Sprintf(`1 mdrun-test-rank [] x=[] %s | 2 mdrun-test-other [] x=["A" "B"] %s | 1 mdrun-test-rank [] x=[] %s`, dir, wd, dir),
			exports: []string{"G"},
		},
		{
			// A value may hold '=' and spaces; a name alone stays a name.
			name: "-x with values",
			args: []string{"-x", "G=a b", "-x", "H", "-n", "1", helper, ":", "-n", "1", "-x", "A=x=y z", "-x", "B=", helper2}, n: 2,
			apps:    `1 mdrun-test-rank [] x=[] (mdrun's) | 1 mdrun-test-other [] x=["A=x=y z" "B="] (mdrun's)`,
			exports: []string{"G=a b", "H"},
		},
		{
			name: "-- before the program", args: []string{"-n", "1", "--", helper, ":", "-n", "1", "--", helper2, "--"}, n: 2,
			apps: `1 mdrun-test-rank [] x=[] (mdrun's) | 1 mdrun-test-other ["--"] x=[] (mdrun's)`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := parseArgs(tt.args, io.Discard)
			if err != nil {
				t.Fatalf("parseArgs(%q): %v", tt.args, err)
			}
			if got := showApps(cfg); got != tt.apps {
				t.Errorf("programs\n %s\nwant\n %s", got, tt.apps)
			}
			if cfg.n != tt.n {
				t.Errorf("%d ranks, want %d", cfg.n, tt.n)
			}
			if !slices.Equal(cfg.exports, tt.exports) {
				t.Errorf("the job's -x %q, want %q", cfg.exports, tt.exports)
			}
		})
	}
}

// TestMPMDUsageErrors checks the command lines of several programs that
// mdrun refuses, and what it says, as TestUsageErrors does for one.
func TestMPMDUsageErrors(t *testing.T) {
	ok := []string{"-n", "1", helper}
	then := func(more ...string) []string { return append(append([]string{}, ok...), more...) }
	checkUsageErrors(t, []usageCase{
		{"nothing after", then(":"), `mdrun: nothing after the 1st ":"`},
		{"nothing before", []string{":", "-n", "1", helper}, `mdrun: nothing before the 1st ":"`},
		{"nothing between", then(":", ":", "-n", "1", helper), `mdrun: nothing between the 1st and the 2nd ":"`},
		{"nothing after the 3rd", then(":", "-n", "1", helper, ":", "-n", "1", helper, ":"), `mdrun: nothing after the 3rd ":"`},
		{"n missing in the first", []string{helper, ":", "-n", "1", helper2}, "mdrun: -n is missing"},
		{"n missing", then(":", helper2), `mdrun: after the 1st ":": -n is missing: give each program its number of ranks`},
		{"n missing after a flag", then(":", "-x", "A", helper2), `after the 1st ":": -n is missing`},
		{"n zero", then(":", "-n", "0", helper2), `mdrun: after the 1st ":": -n 0: need at least 1 rank`},
		{"n negative in the 2nd", then(":", "-n", "1", helper, ":", "-n", "-2", helper2), `mdrun: after the 2nd ":": -n -2: need at least 1 rank`},
		{"n not a number", then(":", "-n", "two", helper2), `mdrun: after the 1st ":": invalid value "two" for flag -n`},
		{"too many ranks", []string{"-n", "4194304", helper, ":", "-n", "1", helper2}, `after the 1st ":": -n 1: a job has at most 4194304 ranks, and the programs before have 4194304`},
		// Refused before anything is allocated for them: mdrun once took
		// gigabytes for 10^8 ranks, and ran out of memory.
		{"too many in one", []string{"-n", "100000000", helper}, "mdrun: -n 100000000: a job has at most 4194304 ranks"},
		{"too many with the relays", []string{"-relay", "a:65536,a:2", "-n", "4128767", helper}, "mdrun: -relay: 65538 relays: a job has at most 4194304 ranks, and the programs have 4128767"},
		{"no program", then(":", "-n", "2"), `mdrun: after the 1st ":": no program to run`},
		{"no program after --", then(":", "-n", "2", "--"), `after the 1st ":": no program to run`},
		{"program not found", then(":", "-n", "1", helper2, ":", "-n", "1", "/nonexistent/prog", "x"), `mdrun: after the 2nd ":": program "/nonexistent/prog" not found`},
		{"program not in PATH", then(":", "-n", "1", "no-such-mdrun-program"), `after the 1st ":": program "no-such-mdrun-program" not found`},
		{"unknown flag", then(":", "-bogus", "-n", "1", helper2), `mdrun: after the 1st ":": flag provided but not defined: -bogus`},
		{"global flag", then(":", "-n", "1", "-hosts", "a", helper2), `mdrun: after the 1st ":": -hosts applies to the whole job: give it before the first program`},
		{"global flag first", then(":", "-plugins", "p.hcl", "-n", "1", helper2), `after the 1st ":": -plugins applies to the whole job`},
		// A boolean does not take the next word, so the section reads on.
		{"global bool", then(":", "-v", "-n", "1", helper2), `after the 1st ":": -v applies to the whole job`},
		{"global bool last", then(":", "-n", "1", "-v"), `after the 1st ":": -v applies to the whole job`},
		{"global bool with value", then(":", "-n", "1", "-prefix=false", helper2), `after the 1st ":": -prefix applies to the whole job`},
		{"global flag, then a bad one", then(":", "-timeout", "1s", "-bogus", helper2), `after the 1st ":": -timeout applies to the whole job`},
		{"global flag in the 2nd", then(":", "-n", "1", helper2, ":", "-n", "1", "--bind=core", helper), `after the 2nd ":": -bind applies to the whole job`},
		{"relay after", then(":", "-relay", "h", "-n", "1", helper2), `after the 1st ":": -relay applies to the whole job`},
		{"bad export", then(":", "-n", "1", "-x", "=1", helper2), `mdrun: after the 1st ":": -x "=1": want NAME or NAME=VALUE, with a variable name`},
		{"empty export", then(":", "-n", "1", "-x", "", helper2), `after the 1st ":": -x "": want NAME or NAME=VALUE`},
		{"export of mdrun's own", then(":", "-n", "1", "-x", "MDRUN_HOST=h", helper2), `after the 1st ":": -x "MDRUN_HOST=h": mdrun sets MDRUN_HOST itself`},
		{"map-by after", then(":", "-n", "1", "-map-by", "node", helper2), `after the 1st ":": -map-by applies to the whole job`},
		{"ppn after", then(":", "-ppn", "2", "-n", "1", helper2), `after the 1st ":": -ppn applies to the whole job`},
		{"wdir missing", then(":", "-n", "1", "-wdir", "/nonexistent/wdir", helper2), `mdrun: after the 1st ":": -wdir /nonexistent/wdir: no such file or directory`},
		{"wdir a file", then(":", "-n", "1", "-wdir", "/etc/hostname", helper2), `after the 1st ":": -wdir /etc/hostname: not a directory`},
	})
}

// TestHelp checks -h before the first program and after a ':': both
// print the usage, MPMD included, and succeed.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{
		{"-h"},
		{"-n", "1", helper, ":", "-h"},
		{"-n", "1", helper, ":", "-n", "1", "-help", helper2},
	} {
		status, stdout, stderr := runMdrun(t, args, nil, nil)
		if status != 0 || stdout != "" || !strings.Contains(stderr, "usage: "+usageLine) || !strings.Contains(stderr, "MD_APPNUM") {
			t.Errorf("mdrun %q: status %d, stdout %q, stderr %q; want 0 and the usage on stderr", args, status, stdout, stderr)
		}
	}
}

// TestRankEnvForward checks what each rank sees of MD_PLUGINS,
// MD_CONNTABLE, MD_APPNUM and -x variables, here and through the
// launcher: a flag's value where the flag is given, else mdrun's own
// (which a remote rank sees only through its command line); its program's
// index and never mdrun's MD_APPNUM; a program's -x only for its ranks.
func TestRankEnvForward(t *testing.T) {
	self, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if self == "far" {
		t.Skipf("this machine is called %s, a remote host of this test", self)
	}
	// Ranks 0 and 3 here, 1 and 2 on far; relays 4 on far, 5 here.
	hosts, err := parseHosts("localhost:1,far:2")
	if err != nil {
		t.Fatal(err)
	}
	const none = "(none)"
	tests := []struct {
		name               string
		plugins, conntable string // the flags
		exports            []string
		plugWant, ctWant   string // what every rank sees
	}{
		{name: "no flags", plugWant: "/env/plugins.hcl", ctWant: "/env/ct"},
		{name: "no flags, -x too", exports: []string{"MD_PLUGINS", "MD_CONNTABLE"}, plugWant: "/env/plugins.hcl", ctWant: "/env/ct"},
		{name: "flags", plugins: "/flag/plugins.hcl", conntable: "/flag/ct", plugWant: "/flag/plugins.hcl", ctWant: "/flag/ct"},
		{name: "flags win over -x", plugins: "/flag/plugins.hcl", conntable: "/flag/ct", exports: []string{"MD_PLUGINS", "MD_CONNTABLE"},
			plugWant: "/flag/plugins.hcl", ctWant: "/flag/ct"},
		{name: "one flag", conntable: "/flag/ct", plugWant: "/env/plugins.hcl", ctWant: "/flag/ct"},
	}
	appNum := []string{"0", "0", "1", "1", none, none}
	onlyX := []string{none, none, "second", "second", none, none} // app 1's -x, remote rank 2 only; local ranks see all
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("MD_PLUGINS", "/env/plugins.hcl")
			t.Setenv("MD_CONNTABLE", "/env/ct")
			t.Setenv("MD_APPNUM", "9") // mdrun's own, say of an outer job
			t.Setenv("MDRUN_TEST_ONLY", "second")
			j := &job{
				cfg: config{
					n: 4, apps: []app{{n: 2}, {n: 2, exports: []string{"MDRUN_TEST_ONLY", "MDRUN_SECRET"}}},
					hosts: hosts, relays: []string{"far", "localhost"},
					plugins: tt.plugins, conntable: tt.conntable,
					launcher: []string{"ssh"}, listen: "127.0.0.1:0", exports: tt.exports,
				},
				logger: hclog.NewNullLogger(),
			}
			srv := serve(t, j)
			for r := range j.size() {
				remote := !isLocal(j.hostOf[r], j.self)
				env := j.rankEnv(r, srv, remote)
				seen := env
				if !remote {
					seen = localEnv(env)
				}
				where := fmt.Sprintf("rank %d on %s (remote %v)", r, j.hostOf[r], remote)
				for _, c := range []struct{ name, want string }{
					{"MD_PLUGINS", tt.plugWant},
					{"MD_CONNTABLE", tt.ctWant},
					{"MD_APPNUM", appNum[r]},
				} {
					got, ok := lastValue(seen, c.name)
					if !ok {
						got = none
					}
					if got != c.want {
						t.Errorf("%s: %s=%s, want %s; its variables: %q", where, c.name, got, c.want, env)
					}
					if n := count(env, c.name); remote && n > 1 {
						t.Errorf("%s: %s %d times on the command line: %q", where, c.name, n, env)
					}
				}
				if !remote {
					continue
				}
				got, ok := lastValue(env, "MDRUN_TEST_ONLY")
				if !ok {
					got = none
				}
				if got != onlyX[r] {
					t.Errorf("%s: MDRUN_TEST_ONLY=%s, want %s (the second program's -x)", where, got, onlyX[r])
				}
				// -x cannot put the secret on a command line.
				if got, _ := lastValue(env, "MDRUN_SECRET"); got != "-" || count(env, "MDRUN_SECRET") != 1 {
					t.Errorf("%s: MDRUN_SECRET=%s %d times, want - once", where, got, count(env, "MDRUN_SECRET"))
				}
			}
		})
	}
}

// TestMPMDJobs runs jobs of two programs, here and through a launcher
// that, as ssh, passes on none of mdrun's environment.
func TestMPMDJobs(t *testing.T) {
	self, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if self == "far" {
		t.Skipf("this machine is called %s, a remote host of this test", self)
	}
	// mdrun's own: no rank may see this MD_APPNUM, and a rank on another
	// host sees MD_PLUGINS only because mdrun passes it on.
	dir := t.TempDir()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	plugins := filepath.Join(dir, "plugins.hcl")
	if err := os.WriteFile(plugins, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MD_APPNUM", "9")
	t.Setenv("MD_PLUGINS", plugins)
	t.Setenv("MDRUN_TEST_X", "exported")
	p := regexp.QuoteMeta(plugins)
	line := func(r, size int, prog string, app int, args, plugins, x, wd string) *regexp.Regexp {
		return regexp.MustCompile(fmt.Sprintf(`(?m)^\[%d\] rank %d of %d: %s appnum %d args %s plugins %s x %s wd %s$`,
			r, r, size, prog, app, regexp.QuoteMeta(args), plugins, regexp.QuoteMeta(x), regexp.QuoteMeta(wd)))
	}
	const (
		one   = helperName
		other = helperName2
	)
	remote := []string{"-hosts", "localhost:1,far:4", "-launcher", cleanSSH, "-listen", "127.0.0.1:0"}
	// What a remote shell would change, had mdrun not quoted it.
	const tricky = `sp  ace 'q' "d" $HOME \ a=b`
	tests := []struct {
		name      string
		args      []string
		signal    syscall.Signal // sent once every rank printed "ready"
		status    int
		stdout    []*regexp.Regexp
		stderr    []*regexp.Regexp
		pidsPrint int
	}{
		{
			name: "two programs", args: []string{"-n", "2", helper, "appnum", "a:b", ":", "-n", "3", "-wdir", dir, helper2, "appnum", "c", "-n"}, status: 0,
			stdout: []*regexp.Regexp{
				line(0, 5, one, 0, `["a:b"]`, p, "exported", wd),
				line(1, 5, one, 0, `["a:b"]`, p, "exported", wd),
				line(2, 5, other, 1, `["c" "-n"]`, p, "exported", dir),
				line(3, 5, other, 1, `["c" "-n"]`, p, "exported", dir),
				line(4, 5, other, 1, `["c" "-n"]`, p, "exported", dir),
			},
			pidsPrint: 5,
		},
		{
			// Relays (ranks 2 and 3 here) are in no program.
			name: "relays", args: []string{"-relay", "localhost:2", "-relay-cmd", helper2 + " appnum r", "-n", "1", helper, "appnum", ":", "-n", "1", helper2, "appnum"}, status: 0,
			stdout: []*regexp.Regexp{
				line(0, 4, one, 0, `[]`, p, "exported", wd),
				line(1, 4, other, 1, `[]`, p, "exported", wd),
				regexp.MustCompile(`(?m)^\[2\] rank 2 of 4: ` + other + ` appnum \(unset\) args \["r"\]`),
				regexp.MustCompile(`(?m)^\[3\] rank 3 of 4: ` + other + ` appnum \(unset\) args \["r"\]`),
			},
			pidsPrint: 4,
		},
		{
			// Rank 0 here, 1-4 on far: ranks there see mdrun's MD_PLUGINS
			// and their program's -x, and the second program's -wdir.
			name: "remote", args: append(remote, "-n", "2", helper, "appnum", ":", "-n", "3", "-x", "MDRUN_TEST_X", "-wdir", dir, helper2, "appnum"), status: 0,
			stdout: []*regexp.Regexp{
				line(0, 5, one, 0, `[]`, p, "exported", wd),
				line(1, 5, one, 0, `[]`, p, "(unset)", wd),
				line(2, 5, other, 1, `[]`, p, "exported", dir),
				line(3, 5, other, 1, `[]`, p, "exported", dir),
				line(4, 5, other, 1, `[]`, p, "exported", dir),
			},
			pidsPrint: 5,
		},
		{
			// Placed round-robin: 0 and 2 here, 1 and 3 on far. The
			// second program's -x value reaches its ranks on both hosts
			// and no one else's; rank 0 sees mdrun's own.
			name: "per-program -x values by node",
			args: []string{"-hosts", "localhost:2,far:2", "-map-by", "node", "-launcher", cleanSSH, "-listen", "127.0.0.1:0",
				"-n", "1", helper, "appnum", ":", "-n", "3", "-x", "MDRUN_TEST_X=" + tricky, helper2, "appnum"}, status: 0,
			stdout: []*regexp.Regexp{
				line(0, 4, one, 0, `[]`, p, "exported", wd),
				line(1, 4, other, 1, `[]`, p, tricky, wd),
				line(2, 4, other, 1, `[]`, p, tricky, wd),
				line(3, 4, other, 1, `[]`, p, tricky, wd),
			},
			pidsPrint: 4,
		},
		{
			name: "second program fails", args: []string{"-n", "1", helper, "block", ":", "-n", "2", helper2, "exit3"}, status: 3,
			stderr:    []*regexp.Regexp{regexp.MustCompile(`(?m)^mdrun: rank 1 \(` + other + `, pid \d+\) exited with status 3; terminating the job$`)},
			pidsPrint: 3,
		},
		{
			name: "remote second program fails", args: append(remote, "-n", "1", helper, "block", ":", "-n", "2", helper2, "exit3"), status: 3,
			stderr:    []*regexp.Regexp{regexp.MustCompile(`(?m)^mdrun: rank 1 on far \(` + other + `, launcher pid \d+\) exited with status 3; terminating the job$`)},
			pidsPrint: 3,
		},
		{
			name: "first program panics", args: []string{"-n", "3", helper, "panic", ":", "-n", "1", helper2, "block"}, status: 2,
			stderr: []*regexp.Regexp{
				regexp.MustCompile(`(?m)^\[2\] panic: boom$`),
				regexp.MustCompile(`(?m)^mdrun: rank 2 \(` + one + `, pid \d+\) panicked and exited with status 2; terminating the job$`),
			},
			pidsPrint: 4,
		},
		{
			name: "timeout", args: []string{"-timeout", "2s", "-n", "1", helper, "block", ":", "-n", "1", helper2, "block"}, status: exitTimeout,
			stderr:    []*regexp.Regexp{regexp.MustCompile(`(?m)^mdrun: the job ran longer than -timeout 2s; terminating the job$`)},
			pidsPrint: 2,
		},
		{
			name: "signal", args: []string{"-n", "1", helper, "block", ":", "-n", "2", helper2, "block"}, signal: syscall.SIGINT, status: 128 + int(syscall.SIGINT),
			stderr:    []*regexp.Regexp{regexp.MustCompile(`(?m)^mdrun: received interrupt; passing it on to the ranks$`)},
			pidsPrint: 3,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout *lockedBuffer
			var sigs chan os.Signal
			if tt.signal != 0 {
				stdout = &lockedBuffer{watch: "ready", want: tt.pidsPrint, seen: make(chan struct{})}
				sigs = make(chan os.Signal, 1)
				go func() {
					<-stdout.seen
					sigs <- tt.signal
				}()
			}
			status, out, stderr := runMdrun(t, tt.args, stdout, sigs)
			if status != tt.status {
				t.Errorf("exit status %d, want %d", status, tt.status)
			}
			matchOutput(t, out, stderr, tt.stdout, tt.stderr)
			if got := pids(t, out); len(got) != tt.pidsPrint {
				t.Errorf("%d ranks printed their pid, want %d", len(got), tt.pidsPrint)
			} else {
				checkGone(t, got)
			}
		})
	}
}

// FuzzSections checks the splitting of a command line at ':' words and
// the parse of a section after one: splitting never loses or invents a
// word, and a section that parses reads back the same when written out.
// The input is the words, separated by NUL bytes.
func FuzzSections(f *testing.F) {
	for _, s := range []string{
		"-n\x002\x00prog\x00:\x00-n\x003\x00prog2\x00a",
		":\x00:", "-n\x001\x00p\x00:", ":\x00-n\x001\x00-x\x00A\x00-wdir\x00d\x00p\x00:\x00x",
		":\x00-v\x00-n\x001\x00p", ":\x00-n\x001\x00--\x00-p\x00:\x00", ":\x00-n=2\x00-x=B\x00p\x00a:b",
		":\x00-hosts\x00h\x00-n\x001\x00p", ":\x00-n\x00-1\x00p", ":\x00-h",
		":\x00-n\x001\x00-x\x00A=B C\x00-x\x00D==\x00p", ":\x00-n\x001\x00-x\x00=V\x00p", ":\x00-n\x001\x00-x\x00MDRUN_RANK=1\x00p",
		":\x00-n\x001\x00-map-by\x00node\x00p",
	} {
		f.Add(s)
	}
	var cfg config
	var raw rawFlags
	global := jobFlags(&cfg, &raw, io.Discard)
	f.Fuzz(func(t *testing.T, s string) {
		args := strings.Split(s, "\x00")
		sections := splitSections(args)
		var joined []string
		for k, sec := range sections {
			if k > 0 {
				joined = append(joined, sectionSep)
			}
			if slices.Contains(sec, sectionSep) {
				t.Fatalf("section %d of %q holds a separator: %q", k, args, sec)
			}
			joined = append(joined, sec...)
		}
		if !slices.Equal(joined, args) {
			t.Fatalf("%q split as %q, which joined reads %q", args, sections, joined)
		}
		for _, words := range sections[1:] {
			sec, err := parseSection(words, global)
			if err != nil {
				continue
			}
			if sec.n < 1 || sec.n > maxRanks || len(sec.argv) == 0 || checkExports(sec.exports) != nil {
				t.Fatalf("%q parsed as %+v", words, sec)
			}
			again, err := parseSection(sec.words(), global)
			if err != nil || !reflect.DeepEqual(again, sec) {
				t.Fatalf("%q parsed as %+v, which written out as %q reads back as %+v, %v", words, sec, sec.words(), again, err)
			}
		}
	})
}

// TestOrdinalSections pins the words the section messages use.
func TestOrdinalSections(t *testing.T) {
	for _, tt := range []struct {
		k, count int
		want     string
	}{
		{0, 2, `nothing before the 1st ":"`},
		{1, 2, `nothing after the 1st ":"`},
		{1, 3, `nothing between the 1st and the 2nd ":"`},
		{11, 13, `nothing between the 11th and the 12th ":"`},
		{22, 23, `nothing after the 22nd ":"`},
	} {
		if got := emptySection(tt.k, tt.count); got != tt.want {
			t.Errorf("emptySection(%d, %d) = %q, want %q", tt.k, tt.count, got, tt.want)
		}
	}
	if got, want := sectionPrefix(3), `after the 3rd ":": `; got != want {
		t.Errorf("sectionPrefix(3) = %q, want %q", got, want)
	}
}
