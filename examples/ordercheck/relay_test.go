package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

	dir := t.TempDir()
	script := filepath.Join(dir, "launch")
	body := fmt.Sprintf(`#!/bin/sh
# launch [options] HOST COMMAND...: like ssh, inside the host's namespace.
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
case "$host" in
  10.78.0.1) ns=%s ;;
  10.78.0.2) ns=%s ;;
  10.78.0.3) ns=%s ;;
  *) echo "launch: unknown host $host" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" setsid -w sh -c "$*"
`, a.Name(), b.Name(), g.Name())
	plugins := filepath.Join(dir, "plugins.hcl")
	for path, content := range map[string]string{script: body, plugins: "subdevice \"tcp\" {\n  config {\n    exclude = [\"mgmt\"]\n  }\n}\n"} {
		if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mdrun := buildMdrun(t)
	relay := filepath.Join(filepath.Dir(mdrun), "mdrelay")
	if out, err := exec.Command("go", "build", "-o", relay, "github.com/hpc-multidevice/multidevice/cmd/mdrelay").CombinedOutput(); err != nil {
		t.Fatalf("build mdrelay: %v\n%s", err, out)
	}
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
