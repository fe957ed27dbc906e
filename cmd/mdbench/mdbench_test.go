package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/conntable"
	"github.com/hpc-multidevice/multidevice/multidevice"
)

// TestMain lets the test binary act as a rank: launch starts
// os.Executable(), which under go test is this binary.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	os.Exit(m.Run())
}

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		bad  bool
	}{
		{"8", 8, false},
		{"4K", 4096, false},
		{"64KiB", 64 << 10, false},
		{"1M", 1 << 20, false},
		{"1mib", 1 << 20, false},
		{" 512 ", 512, false},
		{"0", 0, true},
		{"-3", 0, true},
		{"1G", 0, true},
		{"300M", 0, true},
		{"", 0, true},
		{"K", 0, true},
	} {
		got, err := parseSize(tc.in)
		if tc.bad != (err != nil) || got != tc.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

func TestParseArgs(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args  []string
		tests string
		err   string
	}{
		{nil, "lat bw bibw", ""},
		{[]string{"idle", "-seconds", "2"}, "idle", ""},
		{[]string{"-sub", "tcp", "lat", "mr", "lat"}, "lat mr", ""},
		{[]string{"-reps", "0"}, "", "-reps"},
		{[]string{"-format", "xml"}, "", "-format"},
		{[]string{"-sizes", "8,zz"}, "", "-sizes"},
		{[]string{"-sub", "shm", "-plugins", "p.hcl"}, "", "-sub and -plugins"},
		{[]string{"-plugins", "p.hcl", "-direct"}, "", "-direct needs -sub"},
		{[]string{"latency"}, "", "unknown test"},
		{[]string{"-timeout", "0s"}, "", "-timeout"},
		{[]string{"-vs-env", "ring:MD_SHM_SINGLE_COPY=0", "-vs-env", "copy:MD_SHM_SINGLE_COPY=1,GOGC=off", "lat"}, "lat", ""},
		{[]string{"-vs-env", "ring:A=1", "-vs-env", "ring:A=2"}, "", `series "ring" given twice`},
		{[]string{"-vs-env", "mpich:A=1"}, "", "mdbench's own"},
		{[]string{"-vs-env", "A=1"}, "", "want NAME:VAR=VALUE"},
		{[]string{"-vs-env", "x y:A=1"}, "", "series name"},
		{[]string{"-vs-env", "x:A"}, "", `"A" is not VAR=VALUE`},
		{[]string{"-vs-env", "x:=1"}, "", `"=1" is not VAR=VALUE`},
		{[]string{"-vs-build", "old:" + exe, "-vs-env", "ring:A=1", "lat"}, "lat", ""},
		{[]string{"-vs-build", "ring:" + exe, "-vs-env", "ring:A=1"}, "", `series "ring" given twice`},
		{[]string{"-vs-build", "direct:" + exe}, "", "mdbench's own"},
		{[]string{"-vs-build", exe}, "", "want NAME:PATH"},
		{[]string{"-vs-build", "a/b:" + exe}, "", "series name"},
		{[]string{"-vs-build", "old:"}, "", "want NAME:PATH"},
		{[]string{"-vs-build", "old:" + filepath.Join(dir, "missing")}, "", "no such file"},
		{[]string{"-vs-build", "old:" + dir}, "", "not an executable file"},
		{[]string{"-vs-build", "old:" + plain}, "", "not an executable file"},
		{[]string{"-pairs", "-1", "mr"}, "", "-pairs -1"},
		{[]string{"allreduce", "-ranks", "3"}, "allreduce", ""},
		{[]string{"-ranks", "1", "allreduce"}, "", "-ranks) 1"},
		{[]string{"bcast", "-n", "3", "barrier", "alltoall", "allreduce"}, "bcast barrier alltoall allreduce", ""},
		{[]string{"-n", "1", "bcast"}, "", "-n (-ranks) 1: want at least 2"},
		{[]string{"-n", "-2", "barrier"}, "", "-n (-ranks) -2"},
		{[]string{"-n", "3", "-sizes", "8,256M", "alltoall"}, "", "alltoall at -sizes 256 MiB on 3 ranks"},
		{[]string{"-n", "3", "-sizes", "8,256M", "bcast"}, "bcast", ""},
		// Refused here rather than failing later, misleadingly or not at all.
		{[]string{"-baseline", "-mpi", "foo", "lat"}, "", `-mpi: unknown MPI "foo"`}, // compared with nothing
		{[]string{"-scale", "NaN", "lat"}, "", "-scale NaN"},                         // the ranks' JSON failed
		{[]string{"-seconds", "NaN", "idle"}, "", "-seconds NaN"},
		{[]string{"-scale", "1e300", "lat"}, "", "-scale 1e+300"},                                   // one iteration each, silently
		{[]string{"-window", "1000", "-sizes", "256M", "bw"}, "", "-window 1000 at -sizes 256 MiB"}, // out of memory
		{[]string{"-window", "1000", "-sizes", "256M", "lat"}, "lat", ""},
		// A flag's value that is a test's name is the flag's.
		{[]string{"-o", "lat", "bw"}, "bw", ""},
		{[]string{"-o", "lat", "-reps", "1"}, "lat bw bibw", ""},
	} {
		o, ok := parseCase(t, tc.args, tc.err)
		if !ok {
			continue
		}
		if got := strings.Join(o.tests, " "); got != tc.tests {
			t.Errorf("parseArgs(%q) tests %q, want %q", tc.args, got, tc.tests)
		}
	}
}

// checkOutputs writes r as a table, which must contain each of wants, and
// as CSV, whose rows it returns.
func checkOutputs(t *testing.T, r *report, wants ...string) [][]string {
	t.Helper()
	var table bytes.Buffer
	if err := r.writeTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range wants {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	var out bytes.Buffer
	if err := r.writeCSV(&out); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&out).ReadAll()
	if err != nil {
		t.Fatalf("CSV does not parse: %v", err)
	}
	return rows
}

// parseCase parses args and checks the error: one containing wantErr,
// or none when wantErr is empty. It returns the options when parsing
// succeeded as it should, ok false otherwise (the case is then over).
func parseCase(t *testing.T, args []string, wantErr string) (o *options, ok bool) {
	t.Helper()
	o, err := parseArgs(args, &bytes.Buffer{})
	switch {
	case wantErr != "":
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("parseArgs(%q) error %v, want one containing %q", args, err, wantErr)
		}
		return nil, false
	case err != nil:
		t.Errorf("parseArgs(%q): %v", args, err)
		return nil, false
	}
	return o, true
}

// TestPairsDefault: mr's pairs default to a rank per core mdbench may
// use, at least one pair; given, they stand.
func TestPairsDefault(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"mr"}, max(1, usableCores()/2)},
		{[]string{"-pairs", "3", "mr"}, 3},
	} {
		o, err := parseArgs(tc.args, &bytes.Buffer{})
		if err != nil {
			t.Fatalf("parseArgs(%q): %v", tc.args, err)
		}
		if o.pairs != tc.want {
			t.Errorf("parseArgs(%q) pairs %d, want %d", tc.args, o.pairs, tc.want)
		}
	}
}

// TestRanksDefault: the collectives' ranks default to one a core mdbench
// may use, at least two; -n and -ranks set them.
func TestRanksDefault(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"bcast"}, max(2, usableCores())},
		{[]string{"-n", "3", "bcast"}, 3},
		{[]string{"-ranks", "4", "alltoall"}, 4},
	} {
		o, err := parseArgs(tc.args, &bytes.Buffer{})
		if err != nil {
			t.Fatalf("parseArgs(%q): %v", tc.args, err)
		}
		if o.ranks != tc.want {
			t.Errorf("parseArgs(%q) ranks %d, want %d", tc.args, o.ranks, tc.want)
		}
	}
}

// TestTestInfo: every test has a unit and a title for the reports.
func TestTestInfo(t *testing.T) {
	for _, test := range allTests {
		if i, ok := testInfo[test]; !ok || i.unit == "" || i.title == "" {
			t.Errorf("test %q has no unit or title in testInfo", test)
		}
	}
}

func TestSummarizeAndRatios(t *testing.T) {
	c := newCollector()
	// Repetition 1 caught mpich in a slow phase of the machine: the
	// ratio of the medians would be 1/8, the paired ratios say 1/2.
	c.add(ours, 0, []sample{{"lat", 8, 1}, {"bw", 8, 10}})
	c.add("mpich", 0, []sample{{"lat", 8, 2}, {"bw", 8, 40}})
	c.add(ours, 1, []sample{{"lat", 8, 1}})
	c.add("mpich", 1, []sample{{"lat", 8, 8}, {"bw", 8, 20}})
	c.add("mpich", 2, []sample{{"lat", 8, 8}})
	c.add(ours, 2, []sample{{"lat", 8, 4}})
	c.add(ours, 3, []sample{{"lat", 8, 3}}) // mpich has none to pair with
	var r report
	c.summarize(&r)
	s, ok := r.stat("lat", 8, ours)
	if !ok || s.Median != 2 || s.Min != 1 || s.Max != 4 {
		t.Fatalf("lat stat %+v", s)
	}
	if s, _ := r.stat("bw", 8, "mpich"); s.Median != 30 {
		t.Fatalf("even count median %v, want 30", s.Median)
	}
	if x, ok := r.ratio("lat", 8, "mpich"); !ok || x != 0.5 {
		t.Fatalf("lat ratio %v, want the paired 0.5", x)
	}
	if x, _ := r.ratio("bw", 8, "mpich"); x != 0.25 {
		t.Fatalf("bw ratio %v, want 0.25 (repetition 0 alone pairs)", x)
	}
	if vs := c.paired("lat", 8, ours, "mpich"); !slices.Equal(vs, []float64{0.5, 0.125, 0.5}) {
		t.Fatalf("paired lat ratios %v, want [0.5 0.125 0.5] in repetition order", vs)
	}
	var out bytes.Buffer
	if err := r.writeTable(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"md/mpich", "2.000 [1.000, 4.000]", "0.50"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := r.writeSVG(&out); err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(out.Bytes(), new(struct{})); err != nil {
		t.Fatalf("plot is not well-formed XML: %v", err)
	}
	if n := strings.Count(out.String(), "<polyline"); n != 4 {
		t.Fatalf("plot has %d series lines, want 4 (2 series in 2 panels)", n)
	}
}

// runJSON runs mdbench with args (which ask for JSON) and returns its
// report, failing the test if it exits non-zero or prints anything else.
func runJSON(ctx context.Context, t *testing.T, args []string) report {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := run(ctx, args, &out, &errOut); code != 0 {
		t.Fatalf("mdbench exited %d: %s", code, errOut.String())
	}
	var r report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out.String())
	}
	return r
}

// TestRunShm runs mdbench itself, briefly, over shm with and without the
// multidevice, and checks the JSON it prints. It checks that figures
// exist and are positive, not how fast they are.
func TestRunShm(t *testing.T) {
	if testing.Short() {
		t.Skip("launches ranks")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	svg := t.TempDir() + "/plot.svg"
	args := []string{"-reps", "2", "-scale", "0.02", "-sizes", "8,20K,300K", "-window", "4", "-direct", "-ranks", "3", "-format", "json", "-svg", svg, "lat", "bw", "bibw", "mr", "allreduce"}
	r := runJSON(ctx, t, args)
	for _, test := range []string{"lat", "bw", "bibw", "mr", "allreduce"} {
		for _, size := range []int{8, 20 << 10, 300 << 10} {
			series := []string{ours, "direct"}
			if test == "mr" || test == "allreduce" {
				series = series[:1]
			}
			for _, se := range series {
				s, ok := r.stat(test, size, se)
				if !ok || len(s.Values) != 2 || s.Min <= 0 {
					t.Errorf("%s %d %s: %+v (found %v)", test, size, se, s, ok)
				}
			}
		}
	}
	if _, ok := r.ratio("lat", 8, "direct"); !ok {
		t.Error("no multidevice/direct ratio")
	}
	if b, err := os.ReadFile(svg); err != nil || !bytes.Contains(b, []byte("<svg")) {
		t.Errorf("plot: %v", err)
	}
}

// checkCollectives checks that r has a figure for every collective of
// tests at every size it runs at (barrier at size 0 alone) in each of
// series, from every one of reps repetitions, all positive, and a ratio
// of ours to every other series.
func checkCollectives(t *testing.T, r report, tests []string, sizes []int, series []string, reps int) {
	t.Helper()
	for _, test := range tests {
		for _, size := range collSizes(test, sizes) {
			for _, se := range series {
				s, ok := r.stat(test, size, se)
				if !ok || len(s.Values) != reps || s.Min <= 0 || s.Unit != "us" {
					t.Errorf("%s %d %s: %+v (found %v)", test, size, se, s, ok)
				}
				if _, ok := r.ratio(test, size, se); se != ours && !ok {
					t.Errorf("%s %d: no ratio of %s to %s", test, size, ours, se)
				}
			}
		}
	}
	if _, ok := r.stat("barrier", sizes[0], ours); ok {
		t.Errorf("barrier reported at size %d; it runs once, at size 0", sizes[0])
	}
}

// TestRunCollectives runs every collective, briefly, on three ranks and
// checks the report: figures for every size, and the table and CSV made
// from it. It checks that figures exist and are positive, not how fast
// they are; the ranks check one call of each collective for its result
// before timing it, and fail the run if it is wrong. 70 KiB takes
// Allreduce's reduce-scatter from 64 KiB.
func TestRunCollectives(t *testing.T) {
	if testing.Short() {
		t.Skip("launches ranks")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sizes := []int{8, 20 << 10, 70 << 10}
	r := runJSON(ctx, t, []string{"-n", "3", "-reps", "2", "-scale", "0.01", "-sizes", "8,20K,70K", "-format", "json", "allreduce", "bcast", "barrier", "alltoall"})
	checkCollectives(t, r, collTests, sizes, []string{ours}, 2)
	if oversubscribed := 3 > usableCores(); oversubscribed != slices.ContainsFunc(r.Notes, func(n string) bool {
		return strings.Contains(n, "3 ranks on") && strings.Contains(n, "say little")
	}) {
		t.Errorf("notes %q: want one about oversubscribed cores exactly when 3 ranks outnumber the %d cores", r.Notes, usableCores())
	}

	rows := checkOutputs(t, &r, "\nallreduce: ", "\nbcast: ", "\nbarrier: ", "\nalltoall: ", "\n0 B ", "\n70 KiB ")
	if want := 1 + 3*len(sizes) + 1; len(rows) != want {
		t.Errorf("CSV has %d rows, want %d (a header, 3 tests at %d sizes, barrier once):\n%v", len(rows), want, len(sizes), rows)
	}
	for _, row := range rows[1:] {
		if v, err := strconv.ParseFloat(row[4], 64); !isCollective(row[0]) || row[1] != "us" || err != nil || v <= 0 {
			t.Errorf("CSV row %q: want a collective in us with a positive median", row)
		}
	}
}

// TestRunBaselineCollectives runs the collectives against every MPI
// installed here, interleaved, and checks both series and their ratios.
func TestRunBaselineCollectives(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the baseline and launches ranks")
	}
	var series []string
	for _, m := range mpis {
		if m.missing() == "" {
			series = append(series, m.name)
		}
	}
	if len(series) == 0 {
		t.Skip("no MPI to compare with: neither mpicc.mpich and mpiexec.mpich nor mpicc.openmpi and mpirun.openmpi are on PATH (Debian: apt-get install mpich libmpich-dev)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sizes := []int{8, 20 << 10}
	r := runJSON(ctx, t, []string{"-baseline", "-mpi", strings.Join(series, ","), "-n", "2", "-reps", "2", "-scale", "0.01", "-sizes", "8,20K", "-format", "json", "allreduce", "bcast", "barrier", "alltoall"})
	for _, n := range r.Notes {
		if strings.Contains(n, "baseline") {
			t.Errorf("note %q: every MPI found here should build", n)
		}
	}
	checkCollectives(t, r, collTests, sizes, append([]string{ours}, series...), 2)
}

// TestRunIdle runs `mdbench idle` and checks the figure it reports: a rank
// process blocked in Recv for two seconds uses under 2 % of a core.
func TestRunIdle(t *testing.T) {
	if testing.Short() {
		t.Skip("takes two seconds")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := runJSON(ctx, t, []string{"idle", "-seconds", "2", "-format", "json"})
	s, ok := r.stat("idle", 8, ours)
	if !ok {
		t.Fatalf("no idle figure in %+v", r.Stats)
	}
	t.Logf("rank blocked in Recv: %.3f %% of a core", s.Median)
	if s.Median >= 2 {
		t.Fatalf("rank blocked in Recv used %.2f %% of a core, want < 2 %%", s.Median)
	}
}

// TestRunVsPlugins measures tcp built in against tcp served by its plugin
// binary in one run and checks that both series and their ratio are there.
func TestRunVsPlugins(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a plugin and launches ranks")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	build := exec.CommandContext(ctx, "go", "build", "-o", dir, "github.com/hpc-multidevice/multidevice/cmd/sdi-tcp")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build sdi-tcp: %v\n%s", err, out)
	}
	hcl := filepath.Join(dir, "plugins.hcl")
	if err := os.WriteFile(hcl, []byte("subdevice \"tcp\" {\n  command = \"sdi-tcp\"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"-sub", "tcp", "-vs-plugins", hcl, "-reps", "2", "-scale", "0.02", "-sizes", "8,300K", "-window", "4", "-format", "json", "lat", "bw"}
	r := runJSON(ctx, t, args)
	for _, test := range []string{"lat", "bw"} {
		for _, size := range []int{8, 300 << 10} {
			for _, se := range []string{ours, "plugin"} {
				if s, ok := r.stat(test, size, se); !ok || len(s.Values) != 2 || s.Min <= 0 {
					t.Errorf("%s %d %s: %+v (found %v)", test, size, se, s, ok)
				}
			}
		}
	}
	if _, ok := r.ratio("lat", 8, "plugin"); !ok {
		t.Error("no multidevice/plugin ratio")
	}
}

// TestRunVariants runs our job plainly and as one -vs-env or -vs-build
// series whose ranks each leave a file in a directory: every rank of the
// env series writes a CPU profile there, and the build series' binary is
// a script that leaves a mark there and runs this test binary as the rank.
// Both series and their ratio must be there, and only that series' ranks
// may have left files, two per repetition.
func TestRunVariants(t *testing.T) {
	if testing.Short() {
		t.Skip("launches ranks")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		flag func(t *testing.T, dir string) []string // the series x, whose ranks write into dir
	}{
		{"env", func(t *testing.T, dir string) []string {
			return []string{"-vs-env", "x:" + profileEnv + "=" + dir}
		}},
		{"build", func(t *testing.T, dir string) []string {
			script := filepath.Join(t.TempDir(), "other-build")
			body := fmt.Sprintf("#!/bin/sh\n: > '%s/rank.'$$\nexec '%s' \"$@\"\n", dir, self)
			if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
				t.Fatal(err)
			}
			return []string{"-vs-build", "x:" + script}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			dir := t.TempDir()
			args := append(tt.flag(t, dir), "-reps", "2", "-scale", "0.02", "-sizes", "8", "-format", "json", "lat")
			r := runJSON(ctx, t, args)
			for _, se := range []string{ours, "x"} {
				if s, ok := r.stat("lat", 8, se); !ok || len(s.Values) != 2 {
					t.Errorf("lat 8 %s: %+v (found %v)", se, s, ok)
				}
			}
			if _, ok := r.ratio("lat", 8, "x"); !ok {
				t.Error("no md/x ratio")
			}
			files, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(files) != 4 {
				t.Errorf("the series' ranks left %d files, want 4 (2 ranks, 2 repetitions of that series only)", len(files))
			}
		})
	}
}

// TestRunTimeout: a launch that outlives -timeout is given up promptly,
// with an error that says so.
func TestRunTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("launches ranks")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	start := time.Now()
	code := run(ctx, []string{"-reps", "1", "-timeout", "50ms", "-sizes", "1M", "bw"}, &out, &errOut)
	if code == 0 || !strings.Contains(errOut.String(), "gave up after -timeout 50ms") {
		t.Fatalf("exit %d, stderr %q: want a failure naming the timeout", code, errOut.String())
	}
	if el := time.Since(start); el > 30*time.Second {
		t.Errorf("the run took %v to give up", el)
	}
}

func TestParseCPUTimes(t *testing.T) {
	tests := []struct {
		name  string
		stat  string
		want  cpuTimes
		valid bool
	}{
		{"steal column", "cpu  10 1 5 100 2 0 3 40 0 0\ncpu0 5 0 2 50 1 0 1 20 0 0\n", cpuTimes{total: 161, steal: 40}, true},
		{"no steal column", "cpu  10 1 5 100 2 0 3\n", cpuTimes{}, false},
		{"not the cpu line", "intr 1 2 3 4 5 6 7 8 9\n", cpuTimes{}, false},
		{"not a number", "cpu  10 1 5 x 2 0 3 40\n", cpuTimes{}, false},
		{"empty", "", cpuTimes{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parseCPUTimes(tt.stat)
			if ok != tt.valid || (ok && got != tt.want) {
				t.Fatalf("parseCPUTimes = %+v, %v; want %+v, %v", got, ok, tt.want, tt.valid)
			}
		})
	}
	before, after := cpuTimes{total: 1000, steal: 100}, cpuTimes{total: 1400, steal: 300}
	if s := after.stealShare(before); s != 50 {
		t.Fatalf("stealShare = %v, want 50", s)
	}
}

// TestBwIters pins the streaming tests' iteration counts, which
// baseline/osu.c's bw_iters must give too.
func TestBwIters(t *testing.T) {
	tests := []struct {
		size, window int
		scale        float64
		want         int
	}{
		{8, 64, 1, 2048},      // 2^17 messages
		{512, 64, 1, 2048},    // still the messages
		{4096, 64, 1, 1024},   // 256 MiB first
		{16384, 64, 1, 256},   // 256 MiB
		{65536, 64, 1, 100},   // OSU's count is more
		{1 << 20, 64, 1, 20},  // OSU's count above 64 KiB
		{8, 4, 0.02, 655},     // mdbench's own tests: scaled
		{8, 1, 1, 1 << 17},    // a window of one
		{1 << 20, 1, 0.01, 2}, // scaled, 256 windows of 1 MiB
	}
	for _, tt := range tests {
		if got := bwIters(tt.size, tt.window, tt.scale); got != tt.want {
			t.Errorf("bwIters(%d, %d, %g) = %d, want %d", tt.size, tt.window, tt.scale, got, tt.want)
		}
	}
}

// TestRunVsConntable measures tcp routed plainly against tcp and a second
// tcp with failover in one run, and checks both series and their ratio.
func TestRunVsConntable(t *testing.T) {
	if testing.Short() {
		t.Skip("launches ranks")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	files := map[string]string{
		"plugins.hcl":   "subdevice \"tcp\" {}\nsubdevice \"tcp2\" {\n  builtin = \"tcp\"\n}\n",
		"plain.json":    `{"version": 1, "peers": [{"to": "*", "routes": {"*": [{"subdevice": "tcp"}]}}]}`,
		"failover.json": `{"version": 1, "peers": [{"to": "*", "failover": true, "routes": {"*": [{"subdevice": "tcp"}, {"subdevice": "tcp2"}]}}]}`,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"-plugins", filepath.Join(dir, "plugins.hcl"), "-conntable", filepath.Join(dir, "plain.json"),
		"-vs-conntable", filepath.Join(dir, "failover.json"), "-reps", "2", "-scale", "0.02", "-sizes", "8,300K", "-window", "4", "-format", "json", "lat", "bw"}
	r := runJSON(ctx, t, args)
	for _, test := range []string{"lat", "bw"} {
		for _, size := range []int{8, 300 << 10} {
			for _, se := range []string{ours, "table"} {
				if s, ok := r.stat(test, size, se); !ok || len(s.Values) != 2 || s.Min <= 0 {
					t.Errorf("%s %d %s: %+v (found %v)", test, size, se, s, ok)
				}
			}
		}
	}
	if _, ok := r.ratio("bw", 300<<10, "table"); !ok {
		t.Error("no multidevice/table ratio")
	}
}

// The plugins files and tables of examples/routes, which the README's
// measurements name, parse, and each table routes over subdevices its
// plugins file declares.
func TestExampleRoutes(t *testing.T) {
	const dir = "../../examples/routes"
	for _, tc := range []struct{ plugins, table string }{
		{"shm-tcp.hcl", "shm.json"},
		{"shm-tcp.hcl", "tcp.json"},
		{"shm-tcp.hcl", "shm-small-tcp-large.json"},
		{"two-tcp.hcl", "tcp.json"},
		{"two-tcp.hcl", "tcp-failover.json"},
		{"two-shm.hcl", "shm.json"},
		{"two-shm.hcl", "shm-failover.json"},
	} {
		t.Run(tc.plugins+"/"+tc.table, func(t *testing.T) {
			p, err := multidevice.LoadPlugins(filepath.Join(dir, tc.plugins))
			if err != nil {
				t.Fatal(err)
			}
			tab, err := conntable.Load(filepath.Join(dir, tc.table))
			if err != nil {
				t.Fatal(err)
			}
			declared := map[string]bool{}
			for _, s := range p.SubDevices {
				declared[s.Name] = true
			}
			for _, e := range tab.Peers {
				for class, routes := range e.Routes {
					for _, r := range routes {
						if !declared[r.SubDevice] {
							t.Errorf("peers %q, class %q: subdevice %q is not in %s", e.To, class, r.SubDevice, tc.plugins)
						}
					}
				}
			}
		})
	}
}

// fakeMPICH puts a fake mpicc.mpich (it creates the -o file) and a fake
// mpiexec.mpich running script first on PATH, and returns the directory.
func fakeMPICH(t *testing.T, script string) string {
	t.Helper()
	dir := t.TempDir()
	cc := "#!/bin/sh\nwhile [ $# -gt 0 ]; do if [ \"$1\" = -o ]; then printf '#!/bin/sh\\n' > \"$2\"; chmod +x \"$2\"; fi; shift; done\n"
	if err := os.WriteFile(filepath.Join(dir, "mpicc.mpich"), []byte(cc), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "mpiexec.mpich"), []byte("#!/bin/sh\n"+script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	return dir
}

// TestIdleBaselineSeconds: -seconds 0.4 is accepted and our rank
// blocks 0.4 s, and so is the baseline's: it was told "0" (osu.c atoi'd
// it and slept 0 s), and its CPU share was measured over no time.
func TestIdleBaselineSeconds(t *testing.T) {
	if testing.Short() {
		t.Skip("launches ranks")
	}
	dir := fakeMPICH(t, "echo \"$@\" > \"$(dirname \"$0\")/args\"\necho 'idle 0 50.000'\n")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	if code := run(ctx, []string{"-baseline", "-mpi", "mpich", "-seconds", "0.4", "-format", "json", "idle"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	args, err := os.ReadFile(filepath.Join(dir, "args"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`idle (\S+)`).FindSubmatch(args)
	if m == nil || string(m[1]) != "0.4" {
		t.Errorf("baseline idle ran as %q; ours blocked 0.4 s, the MPI was told %q", strings.TrimSpace(string(args)), m[1])
	}
}

// TestIdleTimeout: -timeout is documented as giving up on any
// launch, ours or a baseline's, that runs longer; the idle launches once
// ignored it.
func TestIdleTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("launches ranks")
	}
	fakeMPICH(t, "exec sleep 15\n")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	var out, errOut bytes.Buffer
	code := run(ctx, []string{"-baseline", "-mpi", "mpich", "-seconds", "1", "-timeout", "2s", "idle"}, &out, &errOut)
	if d := time.Since(start); d > 8*time.Second || code == 0 {
		t.Errorf("a baseline idle launch hanging 15 s with -timeout 2s: exit %d after %v, want a -timeout error after about 3 s\n%s", code, d.Round(time.Second), out.String())
	}
}

// TestSVGColours: every series beyond ours, direct, mpich and openmpi
// (plugin, table, -vs-env, -vs-build) has a colour of its own: they were
// all grey, and the plot could not tell them apart.
func TestSVGColours(t *testing.T) {
	c := newCollector()
	for i, se := range []string{ours, "plugin", "old"} {
		c.add(se, 0, []sample{{"lat", 8, float64(i + 1)}, {"lat", 64, float64(i + 2)}})
	}
	var r report
	c.summarize(&r)
	var b bytes.Buffer
	if err := r.writeSVG(&b); err != nil {
		t.Fatal(err)
	}
	colours := map[string]bool{}
	for _, m := range regexp.MustCompile(`<polyline fill="none" stroke="([^"]+)"`).FindAllStringSubmatch(b.String(), -1) {
		colours[m[1]] = true
	}
	if len(colours) != 3 {
		t.Errorf("3 series drawn in %d colours: %v", len(colours), colours)
	}
}

// TestSmallFigures: figures and ratios below a hundredth keep three
// significant digits in the table, where fixed decimals printed an idle
// rank's 0.0004 of a core as 0.000 and a ratio of 0.004 as 0.00.
func TestSmallFigures(t *testing.T) {
	for _, tc := range []struct {
		v        float64
		num, rat string
	}{
		{0, "0.000", "0.00"},
		{0.0004, "0.0004", "0.0004"},
		{0.00456, "0.00456", "0.00456"},
		{0.05, "0.050", "0.05"},
		{0.5, "0.500", "0.50"},
		{1.234, "1.234", "1.23"},
		{12.345, "12.35", "12.35"},
	} {
		if got := num(tc.v); got != tc.num {
			t.Errorf("num(%v) = %q, want %q", tc.v, got, tc.num)
		}
		if got := ratioText(tc.v); got != tc.rat {
			t.Errorf("ratioText(%v) = %q, want %q", tc.v, got, tc.rat)
		}
	}
}

// TestRepeatLeavesFailedRepetitionsOut: a repetition in which one launch
// fails is left out whole (so the series stay paired), the run goes on,
// and the failures come back; two failing in a row end the run.
func TestRepeatLeavesFailedRepetitionsOut(t *testing.T) {
	fake := func(name string, failAt ...int) step {
		rep := 0
		return step{name, func(context.Context) ([]sample, []traffic, error) {
			rep++
			if slices.Contains(failAt, rep) {
				return nil, nil, fmt.Errorf("launch %d of %s failed", rep, name)
			}
			return []sample{{"lat", 8, float64(rep)}}, nil, nil
		}}
	}
	t.Run("one fails", func(t *testing.T) {
		col, rep := newCollector(), &report{}
		var log bytes.Buffer
		failed, err := repeat(context.Background(), 4, []step{fake(ours), fake("direct", 2)}, col, rep, &log)
		if err != nil || len(failed) != 1 || !strings.Contains(failed[0].Error(), "repetition 2, direct: launch 2 of direct failed") {
			t.Fatalf("failed %v, err %v", failed, err)
		}
		col.summarize(rep)
		// Repetition 2 is gone from both series: it ran direct first
		// (the order alternates), which failed, so ours launched three
		// times, in repetitions 1, 3 and 4.
		if s, ok := rep.stat("lat", 8, ours); !ok || !slices.Equal(s.Values, []float64{1, 2, 3}) {
			t.Fatalf("ours: %+v", s)
		}
		if vs := col.paired("lat", 8, ours, "direct"); len(vs) != 3 {
			t.Fatalf("paired ratios %v, want 3 (repetitions 1, 3, 4)", vs)
		}
		if !strings.Contains(log.String(), "the repetition is left out") {
			t.Fatalf("log does not say the repetition was left out:\n%s", log.String())
		}
	})
	t.Run("two in a row", func(t *testing.T) {
		failed, err := repeat(context.Background(), 5, []step{fake(ours, 2, 3), fake("direct")}, newCollector(), &report{}, io.Discard)
		if all := errors.Join(failed...); err == nil || all == nil || !strings.Contains(all.Error(), "launch 2 of") || !strings.Contains(all.Error(), "launch 3 of") {
			t.Fatalf("failed %v, err %v, want both failures and an error", failed, err)
		}
	})
	t.Run("the only one", func(t *testing.T) {
		_, err := repeat(context.Background(), 1, []step{fake(ours, 1)}, newCollector(), &report{}, io.Discard)
		if err == nil {
			t.Fatal("a run whose every repetition failed succeeded")
		}
	})
}

// TestRankBuffers: a rank's buffers are sized from the tests its launch
// runs. Only bw, bibw and mr keep a window of receives posted; lat once
// got a window of the largest messages too (direct mode faulted every
// page of it in), and at -sizes 256M -window 128 every rank died of
// OOM after parseArgs, which checks the window only for those three, had
// let it through.
func TestRankBuffers(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		args       []string
		send, recv int
	}{
		{[]string{"-sizes", "8,256M", "-window", "128", "lat"}, 256 * mib, 256 * mib},
		{[]string{"-direct", "-sub", "shm", "-sizes", "4M", "lat"}, 4 * mib, 4 * mib},
		{[]string{"-sizes", "8,4M", "-window", "8", "bw"}, 4 * mib, 32 * mib},
		{[]string{"-sizes", "4M", "-window", "8", "lat", "bibw"}, 4 * mib, 32 * mib},
		{[]string{"-sizes", "4M", "-window", "8", "mr"}, 4 * mib, 32 * mib},
		// idle sends and receives 8 bytes; the collectives allocate
		// buffers of their own.
		{[]string{"-sizes", "4M", "idle"}, 8, 8},
		{[]string{"-sizes", "8,1M", "-n", "2", "allreduce", "bcast", "barrier", "alltoall"}, 8, 8},
	} {
		o, ok := parseCase(t, tc.args, "")
		if !ok {
			continue
		}
		if send, recv := bufLens(o.tests, o.sizes, o.window); send != tc.send || recv != tc.recv {
			t.Errorf("%q: a rank allocates %d bytes to send and %d to receive, want %d and %d", tc.args, send, recv, tc.send, tc.recv)
		}
	}
}

// TestRankBuffersGuard: parseArgs refuses a run whose ranks would
// allocate more than maxRankBytes, counting what they really allocate
// (a window to receive into and one message to send), and a window so
// large that the product wrapped around and slipped through.
func TestRankBuffersGuard(t *testing.T) {
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"-window", "3", "-sizes", "256M", "bw"}, ""}, // 1 GiB exactly
		{[]string{"-window", "4", "-sizes", "256M", "bibw"}, "-window 4 at -sizes 256 MiB"},
		{[]string{"-window", "4", "-sizes", "256M", "lat", "idle"}, ""},
		{[]string{"-window", "9223372036854775807", "-sizes", "8", "mr"}, "-window 9223372036854775807"},
	} {
		parseCase(t, tc.args, tc.err)
	}
}

// lastLine is the last line of s, where a failed run says why.
func lastLine(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return l[len(l)-1]
}

// TestRunTimeoutPerLaunch: -timeout bounds each launch, as its help and
// the README say; it once bounded a whole step, so that a baseline,
// which launches mpiexec once per test, failed a long list of tests
// whose every launch was well within the limit, and the error blamed
// whichever launch happened to be running.
func TestRunTimeoutPerLaunch(t *testing.T) {
	if testing.Short() {
		t.Skip("launches ranks")
	}
	// Each launch takes 0.7 s, the three of a repetition 2.1 s.
	fakeMPICH(t, `sleep 0.7
while [ $# -gt 0 ]; do case "$1" in */osu_mpich) shift; break;; esac; shift; done
test=$1; shift; [ "$test" = lat ] || shift
for s in "$@"; do echo "$test $s 1.0"; done
`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	start := time.Now()
	code := run(ctx, []string{"-baseline", "-mpi", "mpich", "-reps", "1", "-scale", "0.01", "-sizes", "8", "-timeout", "1500ms", "lat", "bw", "bibw"}, &out, &errOut)
	if code != 0 {
		t.Errorf("every baseline launch took 0.7 s, under -timeout 1.5s, yet exit %d after %v: %s", code, time.Since(start).Round(100*time.Millisecond), lastLine(errOut.String()))
	}
}

// TestRunKeepsFiguresOnLateFailure: a failure that ends the run after
// some figures were measured (a failed idle launch, or a second failed
// repetition in a row) prints those figures, with the error; they were
// thrown away and nothing was printed, though a run that goes on after a
// failed repetition prints "the figures of the others". They go to
// standard output even with -o, whose earlier, complete report stays: a
// partial CSV, which has no room for the note, replaced it.
func TestRunKeepsFiguresOnLateFailure(t *testing.T) {
	if testing.Short() {
		t.Skip("launches ranks")
	}
	// The fake mpiexec fails an idle launch, and every launch from the
	// failfrom-th on; the others report a latency.
	dir := fakeMPICH(t, `d=$(dirname "$0"); n=$(cat "$d/n" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$d/n"
case " $* " in *" idle "*) exit 1;; esac
[ $n -ge $(cat "$d/failfrom") ] && exit 1
echo "lat 8 1.0"
`)
	for _, tc := range []struct {
		name     string
		failFrom string
		args     []string
	}{
		{"idle fails", "99", []string{"-reps", "2", "-seconds", "0.2", "lat", "idle"}},
		{"repetitions 2 and 3 fail", "2", []string{"-reps", "3", "lat"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.Remove(filepath.Join(dir, "n")); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "failfrom"), []byte(tc.failFrom), 0o644); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			earlier := filepath.Join(t.TempDir(), "r.csv")
			const complete = "an earlier run's complete report\n"
			if err := os.WriteFile(earlier, []byte(complete), 0o644); err != nil {
				t.Fatal(err)
			}
			var out, errOut bytes.Buffer
			args := append([]string{"-baseline", "-mpi", "mpich", "-scale", "0.01", "-sizes", "8", "-format", "csv", "-o", earlier}, tc.args...)
			code := run(ctx, args, &out, &errOut)
			if code == 0 || !strings.Contains(out.String(), "lat,us,8,"+ours) {
				t.Errorf("exit %d, output %q: want a failure, with the latency of repetition 1; stderr ends: %s", code, out.String(), lastLine(errOut.String()))
			}
			if b, err := os.ReadFile(earlier); err != nil || string(b) != complete {
				t.Errorf("-o after a run that ended early: %q, %v; want the earlier report untouched", b, err)
			}
		})
	}
}

// TestRunOutputFilesFirst: the -o and -svg files are opened before
// anything is measured, so that a path that cannot be written fails the
// run at once; it was found only after every launch had run, and the
// figures were lost. A run that measured nothing leaves no file behind
// and does not touch one that was there.
func TestRunOutputFilesFirst(t *testing.T) {
	if testing.Short() {
		t.Skip("launches ranks")
	}
	dir := t.TempDir()
	bad := filepath.Join(dir, "missing", "r.json")
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"-o", []string{"-o", bad}},
		{"-svg", []string{"-svg", bad}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var out, errOut bytes.Buffer
			args := append(tc.args, "-reps", "2", "-scale", "0.01", "-sizes", "8", "lat")
			code := run(ctx, args, &out, &errOut)
			if code == 0 || !strings.Contains(errOut.String(), bad) || strings.Contains(errOut.String(), "repetition") {
				t.Errorf("exit %d: want a failure naming %s before any repetition; stderr:\n%s", code, bad, errOut.String())
			}
		})
	}
	t.Run("nothing measured", func(t *testing.T) {
		created, kept := filepath.Join(dir, "new.csv"), filepath.Join(dir, "old.svg")
		if err := os.WriteFile(kept, []byte("old"), 0o644); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var out, errOut bytes.Buffer
		// Every launch gives up at once.
		code := run(ctx, []string{"-o", created, "-svg", kept, "-reps", "1", "-timeout", "1ns", "-sizes", "8", "lat"}, &out, &errOut)
		if code == 0 {
			t.Fatalf("a run whose launches all gave up succeeded: %s", errOut.String())
		}
		if _, err := os.Stat(created); !os.IsNotExist(err) {
			t.Errorf("the -o file the failed run created is left behind (stat: %v)", err)
		}
		if b, err := os.ReadFile(kept); err != nil || string(b) != "old" {
			t.Errorf("the -svg file that was there holds %q (%v), want it untouched", b, err)
		}
	})
	t.Run("earlier report replaced", func(t *testing.T) {
		path := filepath.Join(dir, "r.csv")
		if err := os.WriteFile(path, bytes.Repeat([]byte("an earlier, longer report\n"), 1000), 0o644); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var out, errOut bytes.Buffer
		if code := run(ctx, []string{"-o", path, "-format", "csv", "-reps", "1", "-scale", "0.01", "-sizes", "8", "lat"}, &out, &errOut); code != 0 {
			t.Fatalf("exit %d: %s", code, errOut.String())
		}
		if b, err := os.ReadFile(path); err != nil || !strings.Contains(string(b), "lat,us,8,"+ours) || strings.Contains(string(b), "earlier") {
			t.Errorf("-o file after the run (%v):\n%s", err, b)
		}
	})
}
