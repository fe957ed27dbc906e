package main

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// ours is the series every ratio is taken of.
const ours = "multidevice"

// units and titles of the tests.
var testInfo = map[string]struct {
	unit, title string
	lowerBetter bool
}{
	"lat":       {"us", "latency, half round trip", true},
	"bw":        {"MB/s", "bandwidth, one way", false},
	"bibw":      {"MB/s", "bandwidth, both ways", false},
	"mr":        {"msg/s", "message rate, all pairs", false},
	"idle":      {"% core", "CPU of a rank blocked in Recv", true},
	"allreduce": {"us", "Allreduce of size/8 float64 sums, per call, slowest rank's mean", true},
	"bcast":     {"us", "Bcast of size bytes from rank 0, per call, slowest rank's mean", true},
	"barrier":   {"us", "Barrier, per call, slowest rank's mean (no message: size 0)", true},
	"alltoall":  {"us", "Alltoall of size bytes to every rank, per call, slowest rank's mean", true},
}

// stat summarizes the repetitions of one figure.
type stat struct {
	Test   string    `json:"test"`
	Unit   string    `json:"unit"`
	Size   int       `json:"size"`
	Series string    `json:"series"`
	Median float64   `json:"median"`
	Min    float64   `json:"min"`
	Max    float64   `json:"max"`
	Values []float64 `json:"values"`
}

// ratio compares ours with another series: Ratio is the median, over the
// repetitions both ran in, of our figure divided by theirs in the same
// repetition (Values, in repetition order). Pairing launches that ran
// seconds apart cancels what drifts over minutes: this machine has phases
// in which every series runs 2-3 times slower, and a ratio of the two
// medians moved with how many of each series' launches fell into one.
type ratio struct {
	Test   string    `json:"test"`
	Size   int       `json:"size"`
	Of     string    `json:"of"`
	To     string    `json:"to"`
	Ratio  float64   `json:"ratio"`
	Values []float64 `json:"values"`
}

// report is everything one mdbench run found.
type report struct {
	Command    string `json:"command"`
	Route      string `json:"route"`
	Reps       int    `json:"reps"`
	CPUs       int    `json:"cpus"`
	LoadBefore string `json:"load_before"`
	// Steal is the share of the CPUs' time the hypervisor gave to other
	// guests while this run went on (the steal column of /proc/stat), in
	// percent, or -1 where that is not known. A run with much steal
	// measured the host more than the library.
	Steal     float64  `json:"steal_percent"`
	LoadAfter string   `json:"load_after"`
	Series    []string `json:"series"`
	// Hosts is the number of hosts the ranks of every launch were placed
	// on: 1, the real one, or that many pretend ones (-hosts).
	Hosts int `json:"hosts"`
	// Ranks is how many ranks each test ran on.
	Ranks  map[string]int `json:"ranks"`
	Stats  []stat         `json:"results"`
	Ratios []ratio        `json:"ratios"`
	// Traffic is what the subdevices carried within pretend hosts and
	// between them; only with -hosts.
	Traffic []traffic `json:"traffic,omitempty"`
	Notes   []string  `json:"notes,omitempty"`
}

// traffic is what the subdevices carried in the launches of one series
// that ran one group of tests (those that share a number of ranks) on
// pretend hosts.
type traffic struct {
	Series   string   `json:"series"`
	Tests    []string `json:"tests"`
	Ranks    int      `json:"ranks"`
	Launches int      `json:"launches"`
	Flows    []flow   `json:"flows"` // summed over the launches
}

// addTraffic adds t's launches to those of the same series and tests.
func (r *report) addTraffic(t traffic) {
	for i := range r.Traffic {
		old := &r.Traffic[i]
		if old.Series != t.Series || !slices.Equal(old.Tests, t.Tests) || old.Ranks != t.Ranks {
			continue
		}
		old.Launches += t.Launches
		for _, f := range t.Flows {
			j := slices.IndexFunc(old.Flows, func(o flow) bool { return o.SubDevice == f.SubDevice && o.Between == f.Between })
			if j < 0 {
				old.Flows = append(old.Flows, f)
				continue
			}
			old.Flows[j].Frames += f.Frames
			old.Flows[j].Bytes += f.Bytes
		}
		return
	}
	t.Flows = slices.Clone(t.Flows)
	r.Traffic = append(r.Traffic, t)
}

// placement returns how test's ranks were placed, and false where the
// report does not say (one written before -hosts).
func (r *report) placement(test string) (placement, bool) {
	n, ok := r.Ranks[test]
	if !ok || n < 1 {
		return placement{}, false
	}
	return placement{ranks: n, hosts: max(1, r.Hosts)}, true
}

// writeTraffic prints, per series and group of tests, what the subdevices
// carried in a launch (the mean over its launches), within pretend hosts
// and between them.
func (r *report) writeTraffic(w io.Writer) {
	for _, t := range r.Traffic {
		var within, between []string
		for _, f := range t.Flows {
			n := uint64(max(1, t.Launches))
			s := fmt.Sprintf("%s %s in %d frames", f.SubDevice, formatBytes(f.Bytes/n), f.Frames/n)
			if f.Between {
				between = append(between, s)
			} else {
				within = append(within, s)
			}
		}
		none := func(l []string) string {
			if len(l) == 0 {
				return "nothing"
			}
			return strings.Join(l, ", ")
		}
		fmt.Fprintf(w, "traffic: %s, %s on %s, a launch: within hosts %s; between hosts %s\n",
			t.Series, strings.Join(t.Tests, " "), placement{ranks: t.Ranks, hosts: max(1, r.Hosts)}, none(within), none(between))
	}
}

// collector gathers samples by (test, size, series), and the repetition
// each came from.
type collector struct {
	tests, series []string
	sizes         []int
	values        map[string][]float64
	reps          map[string][]int
}

func newCollector() *collector {
	return &collector{values: map[string][]float64{}, reps: map[string][]int{}}
}

func ckey(test string, size int, series string) string {
	return test + "/" + strconv.Itoa(size) + "/" + series
}

// add records the samples one launch of series gave in repetition rep.
func (c *collector) add(series string, rep int, samples []sample) {
	if !slices.Contains(c.series, series) {
		c.series = append(c.series, series)
	}
	for _, s := range samples {
		if !slices.Contains(c.tests, s.Test) {
			c.tests = append(c.tests, s.Test)
		}
		if !slices.Contains(c.sizes, s.Size) {
			c.sizes = append(c.sizes, s.Size)
			slices.Sort(c.sizes)
		}
		k := ckey(s.Test, s.Size, series)
		c.values[k] = append(c.values[k], s.Value)
		c.reps[k] = append(c.reps[k], rep)
	}
}

// paired returns, for every repetition in which both series have figures
// for (test, size), the median of series a's figures in it divided by the
// median of b's, in repetition order.
func (c *collector) paired(test string, size int, a, b string) []float64 {
	byRep := func(series string) map[int][]float64 {
		k := ckey(test, size, series)
		m := map[int][]float64{}
		for i, v := range c.values[k] {
			m[c.reps[k][i]] = append(m[c.reps[k][i]], v)
		}
		return m
	}
	as, bs := byRep(a), byRep(b)
	var reps []int
	for rep := range as {
		if _, ok := bs[rep]; ok {
			reps = append(reps, rep)
		}
	}
	slices.Sort(reps)
	var out []float64
	for _, rep := range reps {
		if d := median(bs[rep]); d != 0 {
			out = append(out, median(as[rep])/d)
		}
	}
	return out
}

// summarize fills r's stats and ratios.
func (c *collector) summarize(r *report) {
	r.Series = c.series
	for _, test := range c.tests {
		for _, size := range c.sizes {
			has := map[string]bool{}
			for _, se := range c.series {
				vs := c.values[ckey(test, size, se)]
				if len(vs) == 0 {
					continue
				}
				st := summarize(vs)
				st.Test, st.Unit, st.Size, st.Series = test, testInfo[test].unit, size, se
				r.Stats = append(r.Stats, st)
				has[se] = true
			}
			if !has[ours] {
				continue
			}
			for _, se := range c.series {
				if se == ours || !has[se] {
					continue
				}
				if vs := c.paired(test, size, ours, se); len(vs) > 0 {
					r.Ratios = append(r.Ratios, ratio{Test: test, Size: size, Of: ours, To: se, Ratio: median(vs), Values: vs})
				}
			}
		}
	}
}

// summarize returns the median, minimum and maximum of vs.
func summarize(vs []float64) stat {
	return stat{Median: median(vs), Min: slices.Min(vs), Max: slices.Max(vs), Values: vs}
}

// median returns the median of vs, which is not empty.
func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

func (r *report) stat(test string, size int, series string) (stat, bool) {
	for _, s := range r.Stats {
		if s.Test == test && s.Size == size && s.Series == series {
			return s, true
		}
	}
	return stat{}, false
}

func (r *report) ratio(test string, size int, to string) (float64, bool) {
	for _, x := range r.Ratios {
		if x.Test == test && x.Size == size && x.To == to {
			return x.Ratio, true
		}
	}
	return 0, false
}

// writeTable prints one table per test: medians with [min, max], then the
// paired ratios of ours to each other series (see ratio).
func (r *report) writeTable(w io.Writer) error {
	steal := "steal unknown"
	if r.Steal >= 0 {
		steal = fmt.Sprintf("%.0f%% of CPU time stolen by the hypervisor", r.Steal)
	}
	fmt.Fprintf(w, "mdbench: %s; %d repetitions, medians [min, max], md/x the median of ratios within a repetition; %d CPUs, load %s -> %s, %s\n",
		r.Route, r.Reps, r.CPUs, r.LoadBefore, r.LoadAfter, steal)
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	r.writeTraffic(w)
	var tests []string
	var sizes []int
	for _, s := range r.Stats {
		if !slices.Contains(tests, s.Test) {
			tests = append(tests, s.Test)
		}
		if !slices.Contains(sizes, s.Size) {
			sizes = append(sizes, s.Size)
		}
	}
	slices.Sort(sizes)
	for _, test := range tests {
		info := testInfo[test]
		better := "higher is better"
		if info.lowerBetter {
			better = "lower is better"
		}
		where := ""
		if p, ok := r.placement(test); ok {
			where = "; " + p.String()
		}
		fmt.Fprintf(w, "\n%s: %s (%s, %s%s)\n", test, info.title, info.unit, better, where)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		head := []string{"size"}
		head = append(head, r.Series...)
		var others []string
		for _, se := range r.Series {
			if se != ours {
				others = append(others, se)
				head = append(head, shortName(ours)+"/"+shortName(se))
			}
		}
		fmt.Fprintln(tw, strings.Join(head, "\t"))
		for _, size := range sizes {
			row := []string{formatSize(size)}
			any := false
			for _, se := range r.Series {
				s, ok := r.stat(test, size, se)
				if !ok {
					row = append(row, "-")
					continue
				}
				any = true
				row = append(row, fmt.Sprintf("%s [%s, %s]", num(s.Median), num(s.Min), num(s.Max)))
			}
			if !any {
				continue
			}
			for _, se := range others {
				if x, ok := r.ratio(test, size, se); ok {
					row = append(row, ratioText(x))
				} else {
					row = append(row, "-")
				}
			}
			fmt.Fprintln(tw, strings.Join(row, "\t"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

func shortName(series string) string {
	if series == ours {
		return "md"
	}
	return series
}

func (r *report) writeCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"test", "unit", "size", "series", "median", "min", "max", "reps", "ratio_md_to_series", "ranks", "hosts"})
	for _, s := range r.Stats {
		x := ""
		if v, ok := r.ratio(s.Test, s.Size, s.Series); ok {
			x = strconv.FormatFloat(v, 'f', 4, 64)
		}
		ranks, hosts := "", ""
		if p, ok := r.placement(s.Test); ok {
			ranks, hosts = strconv.Itoa(p.ranks), strconv.Itoa(p.hosts)
		}
		_ = cw.Write([]string{s.Test, s.Unit, strconv.Itoa(s.Size), s.Series,
			strconv.FormatFloat(s.Median, 'g', 6, 64), strconv.FormatFloat(s.Min, 'g', 6, 64),
			strconv.FormatFloat(s.Max, 'g', 6, 64), strconv.Itoa(len(s.Values)), x, ranks, hosts})
	}
	cw.Flush()
	return cw.Error()
}

func (r *report) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// num prints a figure with about three significant digits.
func num(v float64) string {
	switch {
	case v >= 1000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 2, 64)
	case v >= 0.01 || v == 0:
		return strconv.FormatFloat(v, 'f', 3, 64)
	default: // three digits, not 0.000: an idle rank's share of a core
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

// ratioText prints a ratio with two decimals, or three significant
// digits below 0.1, where two decimals would print 0.00 for 0.004.
func ratioText(x float64) string {
	if x >= 0.1 || x == 0 {
		return strconv.FormatFloat(x, 'f', 2, 64)
	}
	return strconv.FormatFloat(x, 'g', 3, 64)
}

// formatSize prints bytes as B, KiB or MiB when exact.
func formatSize(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.Itoa(n>>20) + " MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.Itoa(n>>10) + " KiB"
	}
	return strconv.Itoa(n) + " B"
}

// formatBytes prints a byte count with a binary prefix and three
// significant digits or so.
func formatBytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return num(float64(n)/(1<<30)) + " GiB"
	case n >= 1<<20:
		return num(float64(n)/(1<<20)) + " MiB"
	case n >= 1<<10:
		return num(float64(n)/(1<<10)) + " KiB"
	}
	return strconv.FormatUint(n, 10) + " B"
}

// parseSize reads "8", "4K", "64KiB", "1M", "1MiB".
func parseSize(s string) (int, error) {
	t := strings.TrimSpace(s)
	mult := 1
	lower := strings.ToLower(t)
	for _, suf := range []struct {
		s string
		m int
	}{{"kib", 1 << 10}, {"mib", 1 << 20}, {"k", 1 << 10}, {"m", 1 << 20}, {"b", 1}} {
		if strings.HasSuffix(lower, suf.s) {
			mult = suf.m
			t = t[:len(t)-len(suf.s)]
			break
		}
	}
	n, err := strconv.Atoi(strings.TrimSpace(t))
	if err != nil || n < 1 || n > (256<<20)/mult {
		return 0, fmt.Errorf("size %q: want a count of bytes from 1 to 256 MiB, like 8, 4K or 1MiB", s)
	}
	return n * mult, nil
}
