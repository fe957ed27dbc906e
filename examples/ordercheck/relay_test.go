package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/hpc-multidevice/multidevice/internal/netns"
)

// TestMdrunRelay: two clusters that number their private network alike
// (10.9.0.0/24 on both sides, each with its own IPv6 ULA subnet and no route
// between them) and a front-end host with a NIC in each. mdrun starts one
// rank in each cluster and a relay (cmd/mdrelay, built next to mdrun) on the
// front end; the ranks find no direct link, route through the relay, and see
// a world of two. The launcher and the rendezvous service use a separate
// management network, which the tcp subdevice is told to leave alone.
func TestMdrunRelay(t *testing.T) {
	if testing.Short() {
		t.Skip("builds mdrun and mdrelay and starts a job on namespace hosts")
	}
	bed := netns.New(t)
	head, a, b, g := bed.Host("head"), bed.Host("a"), bed.Host("b"), bed.Host("g")
	mgmt, swA, swB := bed.Switch("mgmt"), bed.Switch("swa"), bed.Switch("swb")
	bed.Attach(head, "mgmt", mgmt, "10.78.0.10/24")
	for i, h := range []*netns.Host{a, b, g} {
		bed.Attach(h, "mgmt", mgmt, fmt.Sprintf("10.78.0.%d/24", i+1))
	}
	bed.Attach(a, "eth0", swA, "10.9.0.1/24", "fd00:a::1/64")
	bed.Attach(b, "eth0", swB, "10.9.0.1/24", "fd00:b::1/64")
	bed.Attach(g, "etha", swA, "10.9.0.2/24", "fd00:a::2/64")
	bed.Attach(g, "ethb", swB, "10.9.0.3/24", "fd00:b::3/64")

	script, plugins := mgmtLauncher(t, []*netns.Host{a, b, g})
	mdrun := buildMdrunAndRelay(t)
	cmd := head.Command(context.Background(), mdrun, "-hosts", "10.78.0.1,10.78.0.2", "-relay", "10.78.0.3",
		"-launcher", script, "-plugins", plugins, "-n", "2", helper, "-messages", "40", "-max-size", "300000")
	cmd.Env = cleanEnv()
	status, out := runJob(t, cmd)
	if status != 0 {
		t.Fatalf("mdrun exited %d", status)
	}
	if got := okLine.FindAllStringSubmatch(out, -1); len(got) != 2 || got[0][2] != "2" || got[1][2] != "2" {
		t.Fatalf("want two ranks reporting a world of 2 (the relay is not one), got %q", got)
	}
}

// TestMdrunRelaySites: the topology of examples/networks/relays.hcl. Two
// clusters number their only LAN alike, IPv4 only (10.9.0.0/24, the same
// addresses on both), and each has a relay host on its LAN and on a WAN
// between the relays (192.0.2.0/24, TEST-NET-1: public scope, so no
// private collision rule applies to it). Nothing but named sites tells
// tcp which 10.9.0.x is on which cluster, so the relays need theirs too:
// mdrun -relay ga@A,gb@B (it once refused "host@SITE" in -relay). With
// the sites, the hosts of a cluster talk directly over their LAN and the
// clusters through ga and gb; without them, or without the relays' alone,
// tcp uses the LAN between no two hosts and the job cannot start, which
// shows that the sites, not some other path, make it work.
func TestMdrunRelaySites(t *testing.T) {
	if testing.Short() {
		t.Skip("builds mdrun and mdrelay and starts jobs on namespace hosts")
	}
	bed := netns.New(t)
	head := bed.Host("head")
	mgmt, swA, swB, wan := bed.Switch("mgmt"), bed.Switch("swa"), bed.Switch("swb"), bed.Switch("wan")
	bed.Attach(head, "mgmt", mgmt, "10.78.0.10/24")
	// Ranks 0-3 are a1, a2, b1, b2; the relays 4 and 5 are ga and gb.
	// Each host is reached by its management address, 10.78.0.1 to .6.
	hosts := []struct {
		name, site string
		lan        *netns.Switch
		addr, wan  string
	}{
		{"a1", "A", swA, "10.9.0.1/24", ""},
		{"a2", "A", swA, "10.9.0.2/24", ""},
		{"b1", "B", swB, "10.9.0.1/24", ""},
		{"b2", "B", swB, "10.9.0.2/24", ""},
		{"ga", "A", swA, "10.9.0.254/24", "192.0.2.1/24"},
		{"gb", "B", swB, "10.9.0.254/24", "192.0.2.2/24"},
	}
	var nss []*netns.Host
	site := map[string]string{} // rank -> site
	for i, h := range hosts {
		ns := bed.Host(h.name)
		bed.Attach(ns, "mgmt", mgmt, fmt.Sprintf("10.78.0.%d/24", i+1))
		bed.Attach(ns, "eth0", h.lan, h.addr)
		if h.wan != "" {
			bed.Attach(ns, "wan", wan, h.wan)
		}
		nss = append(nss, ns)
		site[fmt.Sprint(i)] = h.site
	}
	script, plugins := mgmtLauncher(t, nss)
	mdrun := buildMdrunAndRelay(t)
	job := func(hostList, relays string) (int, string) {
		cmd := head.Command(context.Background(), mdrun, "-hosts", hostList, "-relay", relays,
			"-launcher", script, "-plugins", plugins, "-n", "4", helper, "-messages", "20", "-max-size", "200000")
		// At debug level each rank logs the peers it reaches only through
		// gateways, and which.
		cmd.Env = cleanEnv("MD_LOG_LEVEL=debug")
		return runJob(t, cmd)
	}

	t.Run("with sites", func(t *testing.T) {
		status, out := job("10.78.0.1@A,10.78.0.2@A,10.78.0.3@B,10.78.0.4@B", "10.78.0.5@A,10.78.0.6@B")
		if status != 0 {
			t.Fatalf("mdrun exited %d", status)
		}
		got := okLine.FindAllStringSubmatch(out, -1)
		if len(got) != 4 {
			t.Fatalf("%d ranks reported success, want 4 (the relays are not in the world): %q", len(got), got)
		}
		for _, m := range got {
			if m[2] != "4" {
				t.Errorf("rank %s reports a world of %s, want 4", m[1], m[2])
			}
		}
		said := map[string]string{}
		for _, m := range siteLine.FindAllStringSubmatch(out, -1) {
			said[m[1]] = m[2]
		}
		for r := range 4 {
			if rank := fmt.Sprint(r); said[rank] != site[rank] {
				t.Errorf("rank %s says it is in site %q, want %q", rank, said[rank], site[rank])
			}
		}
		// Within a site the ranks talk directly; across, through their
		// own site's relay (a1 -> ga -> gb -> b1).
		relayOf := map[string]string{"A": "4", "B": "5"} // site -> its relay's rank
		via := map[[2]string]string{}
		for _, m := range gatewayLine.FindAllStringSubmatch(out, -1) {
			via[[2]string{m[1], m[2]}] = m[3]
		}
		for r := range 4 {
			for p := range 4 {
				from, to := fmt.Sprint(r), fmt.Sprint(p)
				gw, indirect := via[[2]string{from, to}]
				switch {
				case r == p:
				case site[from] == site[to] && indirect:
					t.Errorf("rank %s reaches rank %s of its own site %s through gateways %s, want a direct link", from, to, site[from], gw)
				case site[from] != site[to] && !indirect:
					t.Errorf("rank %s (site %s) reaches rank %s (site %s) without a gateway", from, site[from], to, site[to])
				case site[from] != site[to] && gw != relayOf[site[from]]:
					t.Errorf("rank %s (site %s) reaches rank %s through gateways [%s], want its own site's relay only", from, site[from], to, gw)
				}
			}
		}
	})

	// Without sites no two hosts use the LAN. With the hosts' sites but
	// not the relays', the hosts of a site do, but none reaches a relay
	// over it: tcp can only guess a relay's site (ga and gb share the
	// WAN, so they look like one). Either way no chain joins the clusters.
	for _, tt := range []struct{ name, hosts, relays string }{
		{"without sites", "10.78.0.1,10.78.0.2,10.78.0.3,10.78.0.4", "10.78.0.5,10.78.0.6"},
		{"without the relays' sites", "10.78.0.1@A,10.78.0.2@A,10.78.0.3@B,10.78.0.4@B", "10.78.0.5,10.78.0.6"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			status, out := job(tt.hosts, tt.relays)
			if status == 0 {
				t.Fatal("the job ran: the test no longer shows that the sites make it work")
			}
			if !strings.Contains(out, "no chain of ranks reaches it") {
				t.Errorf("the job's output does not say %q", "no chain of ranks reaches it")
			}
			// Which rank fails first decides the pair its error explains:
			// one of a site whose LAN collides, or two hosts with one address.
			if !strings.Contains(out, "private network 10.9.0.0/24 collides across the job") && !strings.Contains(out, "both hosts have 10.9.0.") {
				t.Errorf("the job's output says neither that 10.9.0.0/24 collides nor that two hosts have one of its addresses")
			}
		})
	}
}

// gatewayLine is a rank's debug log of a peer it reaches only through
// gateways (multidevice's autoRoute): rank, peer, the gateways' ranks.
var gatewayLine = regexp.MustCompile(`no direct link, routing through gateways: rank=(\d+) peer=(\d+) gateways=\[([\d ]+)\]`)

// siteLine is ordercheck's line of success with the rank's site (its
// MD_SITE): rank, site.
var siteLine = regexp.MustCompile(`(?m)rank (\d+) of \d+ on \S+: ring ok, .*\) in site (\S+)$`)

// mgmtLauncher writes a launch script that runs a command in hosts[i],
// reached as 10.78.0.(i+1), the management network, as ssh would, and a
// plugins.hcl whose tcp leaves that network (interface "mgmt") alone.
func mgmtLauncher(t *testing.T, hosts []*netns.Host) (script, plugins string) {
	t.Helper()
	var cases strings.Builder
	for i, h := range hosts {
		fmt.Fprintf(&cases, "  10.78.0.%d) ns=%s ;;\n", i+1, h.Name())
	}
	dir := t.TempDir()
	script = filepath.Join(dir, "launch")
	body := fmt.Sprintf(`#!/bin/sh
# launch [options] HOST COMMAND...: like ssh, inside the host's namespace.
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
case "$host" in
%s  *) echo "launch: unknown host $host" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" setsid -w sh -c "$*"
`, cases.String())
	plugins = filepath.Join(dir, "plugins.hcl")
	for path, content := range map[string]string{script: body, plugins: "subdevice \"tcp\" {\n  config {\n    exclude = [\"mgmt\"]\n  }\n}\n"} {
		if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return script, plugins
}

// buildMdrunAndRelay builds mdrun, and mdrelay next to it where mdrun
// looks for it; it returns mdrun's path.
func buildMdrunAndRelay(t *testing.T) string {
	t.Helper()
	mdrun := buildMdrun(t)
	relay := filepath.Join(filepath.Dir(mdrun), "mdrelay")
	if out, err := exec.Command("go", "build", "-o", relay, "github.com/hpc-multidevice/multidevice/cmd/mdrelay").CombinedOutput(); err != nil {
		t.Fatalf("build mdrelay: %v\n%s", err, out)
	}
	return mdrun
}
