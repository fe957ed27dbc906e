package main

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hpc-multidevice/multidevice/bootstrap"
)

// lastValue is what a process whose environment is env sees for name: the
// last value given, as exec.Cmd and env(1) keep it, or absent.
func lastValue(env []string, name string) (string, bool) {
	v, ok := "", false
	for _, kv := range env {
		if k, val, _ := strings.Cut(kv, "="); k == name {
			v, ok = val, true
		}
	}
	return v, ok
}

// count is how often env gives name.
func count(env []string, name string) int {
	n := 0
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == name {
			n++
		}
	}
	return n
}

// TestRankEnvSite checks MD_SITE per rank: the site of the rank's host
// where it has one (relays included, here and through the launcher, in
// place of mdrun's own MD_SITE), and otherwise whatever mdrun's
// environment holds, as for any MD_* variable.
func TestRankEnvSite(t *testing.T) {
	self, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if self == "far" || self == "near" || self == "gw" {
		t.Skipf("this machine is called %s, a remote host of this test", self)
	}
	// Ranks 0 (localhost) and 4 (self) start here, 1 to 3 remotely;
	// relays 5 (far) and 6 (gw) remotely. This machine's two names are
	// one host, in one site: it is the site of rank 4 too.
	hosts, err := parseHosts("localhost:1@A,far:2@B,near:1," + self + ":1@A")
	if err != nil {
		t.Fatal(err)
	}
	const none = "(none)"
	tests := []struct {
		name string
		mine string // mdrun's own MD_SITE; none: unset
		want []string
	}{
		{"mdrun has none", none, []string{"A", "B", "B", none, "A", "B", none}},
		{"mdrun has one", "mine", []string{"A", "B", "B", "mine", "A", "B", "mine"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("MD_SITE", tt.mine) // restored afterwards
			if tt.mine == none {
				os.Unsetenv("MD_SITE")
			}
			t.Setenv("MD_OTHER", "passes")
			j := &job{
				cfg: config{
					n: 5, hosts: hosts, relays: []string{"far", "gw"},
					launcher: []string{"ssh"}, listen: "127.0.0.1:0", exports: []string{"MD_SITE"},
				},
				logger: hclog.NewNullLogger(),
			}
			srv := serve(t, j)
			for r, want := range tt.want {
				env, seen, remote := rankSees(j, srv, r)
				if n := count(env, "MD_SITE"); remote && n > 1 && j.siteOf[j.hostOf[r]] != "" {
					// mdrun's own (even with -x MD_SITE) must not be there too.
					t.Errorf("rank %d on %s: MD_SITE %d times on the command line: %q", r, j.hostOf[r], n, env)
				}
				got, ok := lastValue(seen, "MD_SITE")
				if !ok {
					got = none
				}
				if got != want {
					t.Errorf("rank %d on %s (remote %v): MD_SITE %s, want %s; its variables: %q", r, j.hostOf[r], remote, got, want, env)
				}
				if v, _ := lastValue(seen, "MD_OTHER"); v != "passes" {
					t.Errorf("rank %d on %s: MD_OTHER=%q, want it passed on", r, j.hostOf[r], v)
				}
			}
		})
	}
}

// TestRankEnvExports checks what -x gives each rank, here and through
// the launcher: NAME=VALUE sets VALUE on every rank (over mdrun's own),
// NAME passes mdrun's value to remote ranks, a program's -x holds for its
// ranks only and comes after the job's, the last -x of a name counts,
// and what mdrun sets from a flag wins.
func TestRankEnvExports(t *testing.T) {
	self, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if self == "far" {
		t.Skipf("this machine is called %s, a remote host of this test", self)
	}
	// Program 0: ranks 0 (here) and 1 (far); program 1: 2 (here) and 3
	// (far); relays 4 (far) and 5 (here).
	hosts, err := parseHosts("localhost:1,far:1")
	if err != nil {
		t.Fatal(err)
	}
	const none = "(none)"
	tests := []struct {
		name     string
		job, app []string // -x before the first program, and after the ':'
		variable string
		want     []string // per rank
	}{
		{"value", []string{"XV=a b=c 'q' $HOME"}, nil, "XV", []string{"a b=c 'q' $HOME", "a b=c 'q' $HOME", "a b=c 'q' $HOME", "a b=c 'q' $HOME", "a b=c 'q' $HOME", "a b=c 'q' $HOME"}},
		{"empty value", []string{"XV="}, nil, "XV", []string{"", "", "", "", "", ""}},
		{"value over mdrun's own", []string{"XA=new"}, nil, "XA", []string{"new", "new", "new", "new", "new", "new"}},
		{"name", []string{"XA"}, nil, "XA", []string{"mine", "mine", "mine", "mine", "mine", "mine"}},
		{"name not in mdrun's", []string{"XU"}, nil, "XU", []string{none, none, none, none, none, none}},
		{"no -x", nil, nil, "XA", []string{"mine", none, "mine", none, none, "mine"}},
		{"program's value", nil, []string{"XV=p"}, "XV", []string{none, none, "p", "p", none, none}},
		{"program's value over the job's", []string{"XV=j"}, []string{"XV=p"}, "XV", []string{"j", "j", "p", "p", "j", "j"}},
		{"program's name after the job's value", []string{"XA=j"}, []string{"XA"}, "XA", []string{"j", "j", "mine", "mine", "j", "j"}},
		{"the last of a name", []string{"XV=1", "XV=2"}, nil, "XV", []string{"2", "2", "2", "2", "2", "2"}},
		{"name, then value", []string{"XA", "XA=v"}, nil, "XA", []string{"v", "v", "v", "v", "v", "v"}},
		{"MD_* value over mdrun's", []string{"MD_X=new"}, nil, "MD_X", []string{"new", "new", "new", "new", "new", "new"}},
		{"a flag wins", []string{"MD_PLUGINS=/x"}, []string{"MD_PLUGINS=/y"}, "MD_PLUGINS", []string{"/flag/p", "/flag/p", "/flag/p", "/flag/p", "/flag/p", "/flag/p"}},
		// MD_CONNTABLE is mdrun's own here, not a flag's: -x replaces it.
		{"mdrun's MD_CONNTABLE", nil, nil, "MD_CONNTABLE", []string{"/env/ct", "/env/ct", "/env/ct", "/env/ct", "/env/ct", "/env/ct"}},
		{"a value over mdrun's MD_CONNTABLE", nil, []string{"MD_CONNTABLE=/x"}, "MD_CONNTABLE", []string{"/env/ct", "/env/ct", "/x", "/x", "/env/ct", "/env/ct"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("XA", "mine")
			t.Setenv("MD_X", "md-mine")
			t.Setenv("XU", "")
			os.Unsetenv("XU")
			t.Setenv("XV", "")
			os.Unsetenv("XV")
			if err := checkExports(append(slices.Clone(tt.job), tt.app...)); err != nil {
				t.Fatal(err)
			}
			j := &job{
				cfg: config{
					n: 4, apps: []app{{n: 2}, {n: 2, exports: tt.app}}, hosts: hosts, relays: []string{"far", "localhost"},
					plugins: "/flag/p", conntable: "/env/ct", inherited: map[string]bool{"MD_CONNTABLE": true}, launcher: []string{"ssh"}, listen: "127.0.0.1:0", exports: tt.job,
				},
				logger: hclog.NewNullLogger(),
			}
			srv := serve(t, j)
			for r, want := range tt.want {
				env, seen, remote := rankSees(j, srv, r)
				got, ok := lastValue(seen, tt.variable)
				if !ok {
					got = none
				}
				if got != want {
					t.Errorf("rank %d on %s (remote %v): %s=%q, want %q; its variables: %q", r, j.hostOf[r], remote, tt.variable, got, want, env)
				}
				if n := count(env, tt.variable); n > 1 {
					t.Errorf("rank %d on %s: %s given %d times: %q", r, j.hostOf[r], tt.variable, n, env)
				}
			}
		})
	}
}

// rankSees returns what mdrun gives rank r of j on top of the launcher's
// variables (env), the environment the rank then sees, and whether it is
// remote: a local rank starts with mdrun's environment, env after it.
func rankSees(j *job, srv *bootstrap.Server, r int) (env, seen []string, remote bool) {
	remote = !isLocal(j.hostOf[r], j.self)
	env = j.rankEnv(r, srv, remote)
	seen = env
	if !remote {
		seen = localEnv(env)
	}
	return env, seen, remote
}

// serve starts j's rendezvous service for a test, closed at its end.
func serve(t *testing.T, j *job) *bootstrap.Server {
	t.Helper()
	srv, err := j.newServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

// TestRelaySites checks the site of each relay's host, which its rank
// gets as MD_SITE: -relay names it as -hosts does ("gw@A"), since relays
// sit on the private networks of the clusters they join and tcp tells
// colliding ones apart only by site (mdrun once refused "gw@A" as no host
// name). A host of -hosts keeps the site -hosts gives it, which an entry
// of -relay may repeat or leave out, and a host is in one site or none:
// anything else is a usage error naming both entries.
func TestRelaySites(t *testing.T) {
	self, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a1", "b1", "ga", "gb", "gw"} {
		if self == name {
			t.Skipf("this machine is called %s, a remote host of this test", self)
		}
	}
	tests := []struct {
		name          string
		hosts, relays string // -hosts ("" none) and -relay
		want          []string
		err           string
	}{
		{"each cluster's relay in its site", "a1@A,b1@B", "ga@A,gb:2@B", []string{"A", "B", "B"}, ""},
		{"a relay host of -hosts", "a1@A,ga@A", "ga@A,ga:2@A", []string{"A", "A", "A"}, ""},
		{"a relay taking the site of -hosts", "a1@A,gw@B", "gw", []string{"B"}, ""},
		{"relays in no site", "a1@A", "ga,gb", []string{"", ""}, ""},
		{"without -hosts", "", "[fd00::1]:2@A,gw@B", []string{"A", "A", "B"}, ""},
		{"here, in the site of -hosts", "a1@A," + self + "@A", "localhost@A", []string{"A"}, ""},
		{"another site than -hosts'", "a1@A,gw@A", "gw@B",
			nil, "-relay: gw is in site B, and -hosts has gw in site A: a host is in one site or in none"},
		{"a site where -hosts has none", "a1@A,gw", "gw@A",
			nil, "-relay: gw is in site A, and -hosts has gw in no site: a host is in one site or in none"},
		{"here, in another site than -hosts'", self + "@A", "localhost@B",
			nil, "-relay: localhost is in site B, and -hosts has " + self + " in site A"},
		{"here without -hosts", "", "localhost@A",
			nil, "-relay: localhost is in site A, and without -hosts the programs' ranks run there, in no site"},
		{"here in two sites", "a1", "localhost@A," + self + "@B",
			nil, "-relay: localhost and " + self + " are both this machine, in site A and in site B: a host is in one site or in none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			relays, err := parseRelays(tt.relays)
			if err != nil {
				t.Fatal(err)
			}
			count := 0
			for _, h := range relays {
				count += h.slots
			}
			cfg := config{n: 1, relays: placeRanks(count, relays), relayHosts: relays, launcher: []string{"ssh"}, listen: "127.0.0.1:0"}
			if tt.hosts != "" {
				if cfg.hosts, err = parseHosts(tt.hosts); err != nil {
					t.Fatal(err)
				}
			}
			j := &job{cfg: cfg, logger: hclog.NewNullLogger()}
			srv, err := j.newServer()
			if tt.err != "" {
				var ue *usageError
				if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want a usage error saying %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Close() })
			for i, want := range tt.want {
				r := j.cfg.n + i
				if got := j.siteOf[j.hostOf[r]]; got != want {
					t.Errorf("relay %d on %s: site %q, want %q", i, j.hostOf[r], got, want)
				}
			}
		})
	}
}
