package mdconfig

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"

	"github.com/hpc-multidevice/multidevice/conntable"
)

// base is a valid description the bad-input cases start from.
const base = `
subdevice "shm" {
  reach     = "host"
  latency   = "0.5us"
  bandwidth = "5GB/s"
}
subdevice "tcp" {
  latency   = "50us"
  bandwidth = "1Gbit/s"
}
network "eth" {
  subdevice = "tcp"
  hosts     = ["a[01-04]"]
}
`

func TestParseBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  string
		at   string // file:line:col of the first error
		want []string
	}{
		{
			name: "unknown subdevice",
			src:  base + "network \"ib\" {\n  subdevice = \"verb\"\n  hosts = [\"a[01-02]\"]\n}\n",
			at:   "net.hcl:16:15",
			want: []string{`subdevice "verb", which is not declared`, "declare it", "use one of: shm, tcp"},
		},
		{
			name: "typo gets a suggestion",
			src:  base + "network \"eth2\" {\n  subdevice = \"tpc\"\n  hosts = [\"a[01-02]\"]\n}\n",
			at:   "net.hcl:16:15",
			want: []string{`did you mean "tcp"`},
		},
		{
			name: "host in no network",
			src:  base + "host \"b01\" {\n  penalty = \"5us\"\n}\n",
			at:   "net.hcl:15:6",
			want: []string{`host "b01" is not on any network`, "add it to a network's hosts"},
		},
		{
			name: "local subdevice names a host in no network",
			src:  strings.Replace(base, `reach     = "host"`, "reach = \"host\"\n  hosts = [\"a01\", \"z9\"]", 1),
			at:   "net.hcl:4:19",
			want: []string{`host "z9" is not on any network`},
		},
		{
			name: "zero bandwidth",
			src:  strings.Replace(base, `"1Gbit/s"`, `"0Gbit/s"`, 1),
			at:   "net.hcl:9:15",
			want: []string{"not positive", "greater than zero"},
		},
		{
			name: "negative bandwidth",
			src:  strings.Replace(base, `"1Gbit/s"`, `"-1Gbit/s"`, 1),
			at:   "net.hcl:9:15",
			want: []string{"not a bandwidth", "positive number and a unit"},
		},
		{
			name: "bandwidth without unit",
			src:  strings.Replace(base, `"1Gbit/s"`, `1000`, 1),
			at:   "net.hcl:9:15",
			want: []string{"no known unit"},
		},
		{
			name: "negative latency",
			src:  strings.Replace(base, `"50us"`, `"-50us"`, 1),
			at:   "net.hcl:8:15",
			want: []string{"negative"},
		},
		{
			name: "duplicate subdevice",
			src:  base + "subdevice \"tcp\" {\n  latency = \"1us\"\n  bandwidth = \"1GB/s\"\n}\n",
			at:   "net.hcl:15:11",
			want: []string{`subdevice "tcp" is already declared at net.hcl:7:11`},
		},
		{
			name: "duplicate network",
			src:  base + "network \"eth\" {\n  subdevice = \"tcp\"\n  hosts = [\"b01\"]\n}\n",
			at:   "net.hcl:15:9",
			want: []string{`network "eth" is already declared at net.hcl:11:9`},
		},
		{
			name: "host twice in a network",
			src:  strings.Replace(base, `["a[01-04]"]`, `["a[01-04]", "a03"]`, 1),
			at:   "net.hcl:13:28",
			want: []string{`host "a03" is already in network "eth"`},
		},
		{
			name: "duplicate size class",
			src:  base + "size_class \"s\" {\n  max = \"1KiB\"\n}\nsize_class \"s\" {}\n",
			at:   "net.hcl:18:12",
			want: []string{`size_class "s" is already declared`},
		},
		{
			name: "two host blocks for one host",
			src:  base + "host \"a[01-02]\" {\n  penalty = \"1us\"\n}\nhost \"a02\" {\n  penalty = \"2us\"\n}\n",
			at:   "net.hcl:18:6",
			want: []string{`host "a02" already has a host block`},
		},
		{
			name: "bad host range",
			src:  strings.Replace(base, `["a[01-04]"]`, `["a[04-01]"]`, 1),
			at:   "net.hcl:13:16",
			want: []string{"runs backwards", "smaller number first"},
		},
		{
			name: "unclosed host range",
			src:  strings.Replace(base, `["a[01-04]"]`, `["a[01-04"]`, 1),
			at:   "net.hcl:13:16",
			want: []string{"never closed"},
		},
		{
			name: "unreachable host",
			src: base + `penalty = "off"
network "ib" {
  subdevice = "tcp"
  hosts     = ["a04", "b01"]
}
`,
			at:   "net.hcl:15:11",
			want: []string{`cannot reach host "b01"`, `passes a host whose penalty is "off"`, `(e.g. "a04") a finite penalty`},
		},
		{
			name: "unreachable through a host block",
			src: base + `network "ib" {
  subdevice = "tcp"
  hosts     = ["a04", "b01"]
}
host "a04" {
  penalty = "off"
}
`,
			at:   "net.hcl:20:13",
			want: []string{`cannot reach host "b01"`},
		},
		{
			name: "unknown attribute (HCL's own diagnostic)",
			src:  strings.Replace(base, `latency   = "50us"`, `latncy = "50us"`, 1),
			at:   "net.hcl:8:3",
			want: []string{"Unsupported argument", `Did you mean "latency"?`},
		},
		{
			name: "syntax error",
			src:  base + "network \"x\" {\n",
			at:   "net.hcl:15:13",
			want: []string{"Unclosed configuration block"},
		},
		{
			name: "missing bandwidth",
			src:  base + "subdevice \"verbs\" {\n  latency = \"2us\"\n}\n",
			at:   "net.hcl:15:11",
			want: []string{"no bandwidth", `add bandwidth = "1Gbit/s"`},
		},
		{
			name: "network on a host-local subdevice",
			src:  base + "network \"mem\" {\n  subdevice = \"shm\"\n  hosts = [\"a01\", \"a02\"]\n}\n",
			at:   "net.hcl:16:15",
			want: []string{`reach = "host" and cannot join hosts`},
		},
		{
			name: "override of an unknown class",
			src:  strings.Replace(base, `bandwidth = "1Gbit/s"`, "bandwidth = \"1Gbit/s\"\n  class \"huge\" {\n    latency = \"1us\"\n  }", 1),
			at:   "net.hcl:10:9",
			want: []string{`"huge" is not a size class`, "small, medium, large"},
		},
		{
			name: "size classes out of order",
			src:  base + "size_class \"a\" {\n  max = \"64KiB\"\n}\nsize_class \"b\" {\n  max = \"1KiB\"\n}\nsize_class \"c\" {}\n",
			at:   "net.hcl:19:9",
			want: []string{"must be larger than the previous class's 64KiB"},
		},
		{
			name: "bounded last class",
			src:  base + "size_class \"a\" {\n  max = \"64KiB\"\n}\n",
			at:   "net.hcl:16:9",
			want: []string{"last one", "remove max"},
		},
		{
			name: "bad max_routes",
			src:  base + "max_routes = 0\n",
			at:   "net.hcl:15:14",
			want: []string{"from 1"},
		},
		{
			name: "bad failover",
			src:  base + "failover = \"yes\"\n",
			at:   "net.hcl:15:12",
			want: []string{`failover is "yes"; write true or false`},
		},
		{
			name: "list where a string belongs",
			src:  strings.Replace(base, `"50us"`, `["50us"]`, 1),
			at:   "net.hcl:8:15",
			want: []string{"Expected a string"},
		},
		{
			name: "variables are refused",
			src:  strings.Replace(base, `"50us"`, `var.lat`, 1),
			at:   "net.hcl:8:15",
			want: []string{"Variables not allowed"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, diags := Parse([]byte(tc.src), "net.hcl")
			if !diags.HasErrors() || d != nil {
				t.Fatalf("no error; diagnostics:\n%s", FormatDiagnostics(diags, []byte(tc.src)))
			}
			out := FormatDiagnostics(diags, []byte(tc.src))
			first := firstError(diags)
			if got := posString(*first.Subject); got != tc.at {
				t.Errorf("first error at %s, want %s:\n%s", got, tc.at, out)
			}
			if !strings.HasPrefix(out, tc.at+": error: ") {
				t.Errorf("output does not start with %q:\n%s", tc.at+": error: ", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

func firstError(diags hcl.Diagnostics) *hcl.Diagnostic {
	for _, d := range diags {
		if d.Severity == hcl.DiagError {
			return d
		}
	}
	return nil
}

func TestParseReportsEveryError(t *testing.T) {
	src := strings.Replace(strings.Replace(base, `"1Gbit/s"`, `"0Gbit/s"`, 1), `["a[01-04]"]`, `["a[04-01]"]`, 1)
	_, diags := Parse([]byte(src), "net.hcl")
	if n := len(diags.Errs()); n != 2 {
		t.Errorf("%d errors, want 2 (bandwidth and host range):\n%s", n, FormatDiagnostics(diags, []byte(src)))
	}
}

func TestParseWarnings(t *testing.T) {
	src := base + `network "other" {
  subdevice = "tcp"
  hosts     = ["b[01-02]"]
}
network "lonely" {
  subdevice = "tcp"
  hosts     = ["a01"]
}
`
	d, diags := Parse([]byte(src), "net.hcl")
	if diags.HasErrors() || d == nil {
		t.Fatalf("errors:\n%s", FormatDiagnostics(diags, []byte(src)))
	}
	out := FormatDiagnostics(diags, []byte(src))
	for _, w := range []string{"warning: separate islands", "{a[01-04]} {b[01-02]}", "warning: network with one host"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	tab, err := d.Table("a01")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range tab.Peers {
		if strings.HasPrefix(e.To, "b") {
			t.Errorf("a01's table has an entry for %s in another island", e.To)
		}
	}
	if _, err := d.Route("a01", "b01", 0); err == nil {
		t.Error("Route across islands succeeded")
	}
}

func TestParseDefaults(t *testing.T) {
	d, diags := Parse([]byte(base), "net.hcl")
	if diags.HasErrors() {
		t.Fatal(FormatDiagnostics(diags, nil))
	}
	got := fmt.Sprint(d.Classes())
	if want := "[{small 1024 256} {medium 131072 16384} {large 0 1048576}]"; got != want {
		t.Errorf("default classes %s, want %s", got, want)
	}
	if d.alternatives != defaultAlternatives || d.maxRoutes != defaultMaxRoutes {
		t.Errorf("alternatives %v, max_routes %v", d.alternatives, d.maxRoutes)
	}
	for i, want := range map[int64]int{1: 0, 1024: 0, 1025: 1, 128 << 10: 1, 1 << 30: 2} {
		if got := d.Class(i); got != want {
			t.Errorf("Class(%d) = %d, want %d", i, got, want)
		}
	}
	// The last class is costed at eight times the one before it, also
	// where that would wrap past MaxInt64 (it once came out as 1MiB).
	for _, small := range []string{"1MiB", "2000000TiB", "4000000TiB"} {
		src := base + "size_class \"small\" {\n  max = \"" + small + "\"\n}\nsize_class \"large\" {}\n"
		d, diags := Parse([]byte(src), "net.hcl")
		if diags.HasErrors() {
			t.Fatal(FormatDiagnostics(diags, []byte(src)))
		}
		if cs := d.Classes(); cs[1].Typical <= cs[0].MaxBytes && cs[0].MaxBytes < 1<<62 {
			t.Errorf("small up to %s: large is costed at %d bytes, not above %d", small, cs[1].Typical, cs[0].MaxBytes)
		}
	}
}

// TestPMIHostNames: under PMI a rank's host is "<hostname>#<node>"
// (bootstrap/pmi.go) and a job loads <dir>/<host>.json, so a description
// must be able to name such hosts, and the tables, file names and drawing
// must carry them. '#' was refused as a host name character, so no
// description could make tables for a PMI job.
func TestPMIHostNames(t *testing.T) {
	src := base + "network \"ib\" {\n  subdevice = \"tcp\"\n  hosts     = [\"node[1-2]#[0-1]\"]\n}\n"
	d, diags := Parse([]byte(src), "net.hcl")
	if diags.HasErrors() {
		t.Fatalf("PMI host names refused:\n%s", FormatDiagnostics(diags, []byte(src)))
	}
	dir := filepath.Join(t.TempDir(), "tables")
	if _, err := WriteTables(d, dir); err != nil {
		t.Fatal(err)
	}
	tab, err := conntable.Load(filepath.Join(dir, "node2#1.json"))
	if err != nil {
		t.Fatal(err)
	}
	if tab.Host != "node2#1" || len(routesTo(tab, "node1#0", "small")) == 0 {
		t.Errorf("table of node2#1: host %q, routes to node1#0 %v", tab.Host, routesTo(tab, "node1#0", "small"))
	}
	dot, err := d.Dot(DotOptions{From: "node1#0", To: "node2#1"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(dot), `"host:node1#0"`) {
		t.Errorf("dot output does not name host node1#0:\n%s", dot)
	}
}

// A name with a character outside what tables carry is refused naming
// that character as the user wrote it. The messages once quoted one byte
// of it, 'Ã' for both 'ä' and 'ö', pointing at a character nowhere in the
// file.
func TestParseNamesNonASCIICharacter(t *testing.T) {
	src := "subdevice \"tcp\" {\n latency = \"1us\"\n bandwidth = \"1GB/s\"\n}\nnetwork \"län\" {\n subdevice = \"tcp\"\n hosts = [\"knötchen\", \"b\"]\n}\n"
	_, diags := Parse([]byte(src), "u.hcl")
	msg := FormatDiagnostics(diags, []byte(src))
	for _, want := range []string{`"län" contains 'ä'`, `"knötchen": character 3 ('ö')`} {
		if !strings.Contains(msg, want) {
			t.Errorf("diagnostics lack %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "Ã") {
		t.Errorf("diagnostics quote a byte of a character:\n%s", msg)
	}
}
