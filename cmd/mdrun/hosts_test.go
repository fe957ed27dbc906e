package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/hpc-multidevice/multidevice/internal/sched"
)

// show writes hosts as "name:slots" or "name:slots@site", space-separated.
func show(hosts []hostSpec) string {
	var es []string
	for _, h := range hosts {
		e := h.name + ":" + strconv.Itoa(h.slots)
		if h.site != "" {
			e += "@" + h.site
		}
		es = append(es, e)
	}
	return strings.Join(es, " ")
}

func TestParseHosts(t *testing.T) {
	long := strings.Repeat("s", maxSiteLen)
	tests := []struct {
		in   string
		want string
		err  string
	}{
		{"a", "a:1", ""},
		{"a,b:2, c:3", "a:1 b:2 c:3", ""},
		{"10.0.0.1:4,fd00::1,[fd00::2]:2,[fd00::3]", "10.0.0.1:4 fd00::1:1 fd00::2:2 fd00::3:1", ""},
		{"a:x", "", `slots "x" is not a number`},
		{"a:70000", "", `slots "70000"`},
		{"[fd00::1", "", "want [address] or [address]:slots"},
		{"[fd00::1]:", "", `slots "" is not a number`},
		{"a:", "", `host "a:": slots "" is not a number`}, // not 1 slot
		{"a:,b:2", "", `host "a:": slots ""`},
		{"a b", "", `host "a b" is not a host name`},
		{"a;rm", "", "is not a host name"},
		{"-Elog", "", `host "-Elog" is not a host name`},
		{"[-v]:2", "", `host "[-v]:2" is not a host name`},
		// Sites.
		{"h1:2@A,h2:2@A,h3:2@B", "h1:2@A h2:2@A h3:2@B", ""},
		{"[fd00::1]:2@A,[fd00::2]@B,fd00::3@C", "fd00::1:2@A fd00::2:1@B fd00::3:1@C", ""},
		{"h1@a.b-c_9, h2", "h1:1@a.b-c_9 h2:1", ""},
		{"h1@A,h2,h1:3@A,h2:2", "h1:1@A h2:1 h1:3@A h2:2", ""},
		{"h1@" + long, "h1:1@" + long, ""},
		{"h1@", "", `-hosts: host "h1@": the site is empty`},
		{"h1:2@", "", `host "h1:2@": the site is empty`},
		{"h1@" + long + "s", "", "the site is 256 bytes long, at most 255 may be"},
		{"h1@A/B", "", `-hosts: host "h1@A/B": site "A/B": use only letters, digits, '_', '.' and '-'`},
		{"h1@A@B", "", `site "A@B": use only`},
		{"h1@A B", "", `site "A B": use only`},
		{"h1@Ä", "", `site "Ä": use only`},
		{"@A", "", `host "" is not a host name`},
		{"h1:x@A", "", `slots "x" is not a number`},
		{"[fd00::1@A]:2", "", "want [address] or [address]:slots"},
		{"h1@A,h1@B", "", "-hosts: host h1 is in site B here and in site A before: a host is in one site or in none"},
		{"h1@A,h2,h1", "", "host h1 is in no site here and in site A before"},
		{"h1,h1@A", "", "host h1 is in site A here and in no site before"},
	}
	for _, tt := range tests {
		got, err := parseHosts(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("parseHosts(%q) = %v, %v; want error %q", tt.in, got, err, tt.err)
			}
			continue
		}
		if err != nil || show(got) != tt.want {
			t.Errorf("parseHosts(%q) = %s, %v; want %s", tt.in, show(got), err, tt.want)
		}
	}
}

func TestParseHostfile(t *testing.T) {
	tests := []struct {
		text string
		want string
		err  string
	}{
		{"# cluster\nn1\nn2:2  # two\n\nn3 slots=4\n", "n1:1 n2:2 n3:4", ""},
		{"n1\nn2 slots=0\n", "", ":2: slots=\"0\" is not a number"},
		{"n1:\n", "", `:1: host "n1:": slots "" is not a number`},
		{"n1 cpus=4\n", "", `:1: want "host", "host:slots" or "host slots=N", each optionally with site=NAME, got "n1 cpus=4"`},
		{"n1 slots=1 x\n", "", ":1: want"},
		{"n1 slots\n", "", ":1: want"},
		{"# nothing\n", "", "no hosts"},
		{"bad!host\n", "", `:1: host "bad!host" is not a host name`},
		{"n1\n-v\n", "", `:2: host "-v" is not a host name`},
		{"n1:2 slots=3\n", "", `:1: "n1:2 slots=3" gives the slots twice`},
		{"[fd00::2]:2 slots=3\n", "", "gives the slots twice"},
		{"[fd00::2] slots=3\nfd00::3 slots=2\n", "fd00::2:3 fd00::3:2", ""},
		{"n1\n" + strings.Repeat("x", 70000) + "\n", "", ":2: bufio.Scanner: token too long"},
		// Sites.
		{"h1 slots=4 site=A\nh2 site=A slots=2\nh3:4 site=B # far\nh4\n", "h1:4@A h2:2@A h3:4@B h4:1", ""},
		{"[fd00::2]:2 site=x.y\nfd00::3 site=x.y\n", "fd00::2:2@x.y fd00::3:1@x.y", ""},
		{"h1 site=A\nh1:2 site=A\n", "h1:1@A h1:2@A", ""},
		{"h1 site=A site=B\n", "", `:1: "h1 site=A site=B" gives the site twice`},
		{"h1 site=A site=A\n", "", "gives the site twice"},
		{"h1 slots=2 site=A slots=3\n", "", `:1: "h1 slots=2 site=A slots=3" gives the slots twice`},
		{"h1:2 site=A slots=3\n", "", "gives the slots twice"},
		{"n1\nh1 site=\n", "", ":2: the site is empty"},
		{"h1 site=a/b\n", "", `:1: site "a/b": use only letters, digits, '_', '.' and '-'`},
		{"h1 site=" + strings.Repeat("s", 256) + "\n", "", ":1: the site is 256 bytes long"},
		{"h1 site\n", "", ":1: want"},
		{"h1@A\n", "", `:1: "h1@A": a hostfile names the site with site=NAME, not with @`},
		{"h1 site=A\nh2\nh1 site=B\n", "", ":3: host h1 is in site B here and in site A before"},
		{"h1\nh1 site=B\n", "", ":2: host h1 is in site B here and in no site before"},
	}
	for i, tt := range tests {
		path := filepath.Join(t.TempDir(), fmt.Sprintf("hosts%d", i))
		if err := os.WriteFile(path, []byte(tt.text), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := parseHostfile(path)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) || !strings.Contains(err.Error(), path) {
				t.Errorf("hostfile %q = %v, %v; want error naming the file and %q", tt.text, got, err, tt.err)
			}
			continue
		}
		if err != nil || show(got) != tt.want {
			t.Errorf("hostfile %q = %s, %v; want %s", tt.text, show(got), err, tt.want)
		}
	}
}

func TestPlaceRanks(t *testing.T) {
	tests := []struct {
		n     int
		hosts []hostSpec
		want  string
	}{
		{4, []hostSpec{{name: "a", slots: 1}, {name: "b", slots: 1}}, "[a b a b]"},
		{4, []hostSpec{{name: "a", slots: 2}, {name: "b", slots: 2}}, "[a a b b]"},
		{5, []hostSpec{{name: "a", slots: 2}, {name: "b", slots: 1}}, "[a a b a a]"},
		{1, []hostSpec{{name: "a", slots: 3}, {name: "b", slots: 1}}, "[a]"},
	}
	for _, tt := range tests {
		if got := fmt.Sprint(placeRanks(tt.n, tt.hosts)); got != tt.want {
			t.Errorf("placeRanks(%d, %v) = %s, want %s", tt.n, tt.hosts, got, tt.want)
		}
	}
}

// TestRemoteCommand runs the command line mdrun builds through a shell, as
// ssh does, and checks that every word arrives unchanged.
func TestRemoteCommand(t *testing.T) {
	args := []string{"plain", "two words", "it's", `"quoted"`, "$HOME", "a;b", "*", "", "tab\there", "new\nline"}
	env := []string{"MDRUN_ADDR=tcp:10.0.0.1:4000", "MD_X=with space"}
	script := `for a; do printf '<%s>' "$a"; done; printf '%s|%s|%s' "$MD_X" "$PWD" "$(grep Cpus_allowed_list /proc/self/status | cut -f2)"`
	// Unbound, the rank runs on the CPUs this test may use.
	self, err := sched.Affinity()
	if err != nil {
		t.Fatal(err)
	}
	mine := "|" + self.String()
	dir := filepath.Join(t.TempDir(), "it's a dir")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	want := ""
	for _, a := range args {
		want += "<" + a + ">"
	}
	// The first core of this machine, as the remote shell finds it: all
	// of it, whatever this test may use.
	b, err := os.ReadFile("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list")
	if err != nil {
		t.Skipf("no CPU topology here: %v", err)
	}
	core0, err := sched.ParseCPUList(string(b))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		wdir   string
		must   bool
		bind   []string
		out    string // what the rank prints after its arguments; "" fails
		stderr string // what the failing shell says
	}{
		{"in the directory", dir, false, nil, "with space|" + dir + mine, ""},
		{"in the given directory", dir, true, nil, "with space|" + dir + mine, ""},
		{"directory missing here", dir + "/none", false, nil, "with space|" + "/" + mine, ""},
		{"given directory missing here", dir + "/none", true, nil, "", ""},
		{"bound to a CPU", dir, false, remoteBind(bindHWThread, 0), "with space|" + dir + "|0", ""},
		{"bound to a core", dir, false, remoteBind(bindCore, 0), "with space|" + dir + "|" + core0.String(), ""},
		{"bound to a core not there", dir, false, remoteBind(bindCore, 8191), "", "mdrun: -bind core: this host has no 8192nd core\n"},
		// The failed cd, not the core it never looked for.
		{"given directory missing here, bound to a core", dir + "/none", true, remoteBind(bindCore, 0), "", dir + "/none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := exec.LookPath("taskset"); err != nil && tt.bind != nil {
				t.Skip("taskset not installed (util-linux)")
			}
			if tt.bind != nil && !self.Has(0) {
				t.Skipf("this test may not use CPU 0 (only %v)", self)
			}
			argv := remoteCommand([]string{"ssh", "-o", "BatchMode=yes"}, "h1", tt.wdir, tt.must, tt.bind, env, "/bin/sh", append([]string{"-c", script, "sh"}, args...))
			if strings.Join(argv[:4], " ") != "ssh -o BatchMode=yes h1" {
				t.Fatalf("argv starts %q", argv[:4])
			}
			// What ssh does with the words after the host, starting where
			// ssh starts a command (the home directory; / here).
			cmd := exec.Command("sh", "-c", strings.Join(argv[4:], " "))
			cmd.Dir = "/"
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if tt.out == "" {
				if err == nil {
					t.Errorf("ran where it should not: %q", out)
				}
				if !strings.Contains(stderr.String(), tt.stderr) {
					t.Errorf("the remote shell said %q, want %q", stderr.String(), tt.stderr)
				}
				// One failure, told once: what failed first ends the
				// command line, and nothing after it runs.
				if n := strings.Count(stderr.String(), "\n"); n != 1 {
					t.Errorf("the remote shell said %d lines, want 1: %q", n, stderr.String())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(out) != want+tt.out {
				t.Errorf("the remote shell saw %q, want %q", out, want+tt.out)
			}
		})
	}
}

func TestListenAddr(t *testing.T) {
	for _, tt := range []struct{ flag, remote, want, err string }{
		{"10.1.2.3:5000", "h", "10.1.2.3:5000", ""},
		{":5000", "h", "", "not a wildcard"},
		{"0.0.0.0:0", "h", "", "not a wildcard"},
		{"[::]:0", "h", "", "not a wildcard"},
		{"nonsense", "h", "", `-listen "nonsense"`},
		{"", "127.0.0.1", "", "other than loopback"},
	} {
		got, err := listenAddr(tt.flag, tt.remote)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("listenAddr(%q, %q) = %q, %v; want error %q", tt.flag, tt.remote, got, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("listenAddr(%q, %q) = %q, %v; want %q", tt.flag, tt.remote, got, err, tt.want)
		}
	}
}

// checkParse checks one parse of in by parse, whose errors must start
// with prefix: a successful one must name hosts a launcher can take, with
// slot counts in range and valid sites, one site (or none) per host, and
// read back the same when written out by write as entries joined by sep.
func checkParse(t *testing.T, in string, parse func(string) ([]hostSpec, error), write func(hostSpec) string, prefix, sep string) {
	t.Helper()
	hosts, err := parse(in)
	if err != nil {
		if !strings.HasPrefix(err.Error(), prefix) {
			t.Fatalf("error %q does not start with %q", err, prefix)
		}
		return
	}
	var es []string
	siteOf := map[string]string{}
	for _, h := range hosts {
		if h.name == "" || h.name[0] == '-' || !hostName.MatchString(h.name) || h.slots < 1 || h.slots > maxSlots {
			t.Fatalf("%q: parsed host %+v", in, h)
		}
		if h.site != "" && checkSite(h.site) != nil {
			t.Fatalf("%q: parsed host %+v with a bad site", in, h)
		}
		if site, ok := siteOf[h.name]; ok && site != h.site {
			t.Fatalf("%q: host %s in sites %q and %q", in, h.name, site, h.site)
		}
		siteOf[h.name] = h.site
		es = append(es, write(h))
	}
	again, err := parse(strings.Join(es, sep))
	if err != nil || show(again) != show(hosts) {
		t.Fatalf("%q parsed as %s, which written out reads back as %s, %v", in, show(hosts), show(again), err)
	}
}

// entry writes h as -hosts and hostfile entries read it, without its site.
func entry(h hostSpec) string {
	if strings.Contains(h.name, ":") {
		return fmt.Sprintf("[%s]:%d", h.name, h.slots)
	}
	return fmt.Sprintf("%s:%d", h.name, h.slots)
}

// hostsEntry writes h as -hosts reads it.
func hostsEntry(h hostSpec) string {
	if h.site != "" {
		return entry(h) + "@" + h.site
	}
	return entry(h)
}

// hostfileLine writes h as a hostfile line.
func hostfileLine(h hostSpec) string {
	if h.site != "" {
		return entry(h) + " site=" + h.site
	}
	return entry(h)
}

func FuzzParseHosts(f *testing.F) {
	for _, s := range []string{"a", "a,b:2, c:3", "10.0.0.1:4,fd00::1,[fd00::2]:2", "[fd00::1", "a:70000", "-x", "[a:b]:3",
		"h1:2@A,h2:2@A,h3:2@B", "[fd00::1]:2@x.y", "h1@", "h1@A,h1@B", "h1@A,h1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkParse(t, s, parseHosts, hostsEntry, "-hosts: ", ",") })
}

func FuzzReadHostfile(f *testing.F) {
	for _, s := range []string{"# cluster\nn1\nn2:2  # two\n\nn3 slots=4\n", "n1 slots=0\n", "n1:2 slots=3", "[fd00::2] slots=3\r\n", "\n\n#\n",
		"h1 slots=4 site=A\nh2:2 site=B\n", "h1 site=A site=B", "h1 site=A\nh1\n", "h1@A"} {
		f.Add(s)
	}
	read := func(text string) ([]hostSpec, error) { return readHostfile(strings.NewReader(text), "hf") }
	f.Fuzz(func(t *testing.T, text string) { checkParse(t, text, read, hostfileLine, "hf:", "\n") })
}

// pickCore finds a host's k-th core from its sysfs whether the threads
// of a core are numbered side by side or far apart.
func TestPickCore(t *testing.T) {
	hosts := map[string][]string{ // per CPU, its core's threads
		"side by side": {"0-1", "0-1", "2-3", "2-3"},
		"far apart":    {"0,2", "1,3", "0,2", "1,3"},
		"no threads":   {"0", "1", "2", "3"},
	}
	for cpu := range 24 { // as text, "10-11" would sort before "2-3"
		hosts["24 CPUs"] = append(hosts["24 CPUs"], fmt.Sprintf("%d-%d", cpu&^1, cpu|1))
	}
	tests := []struct {
		host string
		k    int
		want string // "" fails
	}{
		{"side by side", 0, "0-1"},
		{"side by side", 1, "2-3"},
		{"side by side", 2, ""},
		{"far apart", 0, "0,2"},
		{"far apart", 1, "1,3"},
		{"no threads", 3, "3"},
		{"24 CPUs", 1, "2-3"},
		{"24 CPUs", 11, "22-23"},
		{"24 CPUs", 12, ""},
	}
	for _, tt := range tests {
		t.Run(tt.host+" "+strconv.Itoa(tt.k), func(t *testing.T) {
			dir := t.TempDir()
			for cpu, list := range hosts[tt.host] {
				topo := filepath.Join(dir, "cpu"+strconv.Itoa(cpu), "topology")
				if err := os.MkdirAll(topo, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(topo, "thread_siblings_list"), []byte(list+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command("sh", "-c", pickCore(dir, tt.k)+` echo "$c"`)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if tt.want == "" {
				want := "mdrun: -bind core: this host has no " + ordinal(tt.k+1) + " core\n"
				if err == nil || stderr.String() != want {
					t.Errorf("got %q, %v, stderr %q; want a failure saying %q", out, err, stderr.String(), want)
				}
				return
			}
			if err != nil || string(out) != tt.want+"\n" {
				t.Errorf("got %q, %v (stderr %q); want %s", out, err, stderr.String(), tt.want)
			}
		})
	}
}
