package netns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperRole selects what TestHelperProcess does when the test binary is
// re-executed inside a namespace.
const helperRole = "NETNS_TEST_ROLE"

// TestHelperProcess is not a test: it is the program the tests run inside
// namespaces. "sink ADDR" accepts one connection and prints how many bytes
// it read; "source ADDR N" connects and writes N bytes.
func TestHelperProcess(t *testing.T) {
	role := os.Getenv(helperRole)
	if role == "" {
		t.Skip("helper process; runs only when re-executed by another test")
	}
	if err := helper(strings.Fields(role)); err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func helper(args []string) error {
	switch {
	case len(args) == 2 && args[0] == "sink":
		ln, err := net.Listen("tcp", args[1])
		if err != nil {
			return err
		}
		fmt.Println("listening")
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		n, err := io.Copy(io.Discard, c)
		fmt.Println(n)
		return err
	case len(args) == 3 && args[0] == "probe":
		timeout, err := time.ParseDuration(args[2])
		if err != nil {
			return err
		}
		// A refused connection proves the host answered as well as an
		// accepted one; no route or no answer is what fails.
		c, err := net.DialTimeout("tcp", args[1], timeout)
		if err == nil {
			return c.Close()
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil
		}
		return err
	case len(args) == 3 && args[0] == "source":
		n, err := strconv.Atoi(args[2])
		if err != nil {
			return err
		}
		c, err := net.DialTimeout("tcp", args[1], 10*time.Second)
		if err != nil {
			return err
		}
		if _, err := c.Write(make([]byte, n)); err != nil {
			return err
		}
		return c.Close()
	}
	return fmt.Errorf("unknown role %q", args)
}

// helperCmd runs the test binary inside h in role.
func helperCmd(ctx context.Context, h *Host, role string) *exec.Cmd {
	c := h.Command(ctx, os.Args[0], "-test.run=^TestHelperProcess$")
	c.Env = append(os.Environ(), helperRole+"="+role)
	return c
}

// reach reports whether h can reach addr within timeout (TCP port 9
// answers, even if only to refuse); this machine's image has no ping.
func reach(h *Host, addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := helperCmd(ctx, h, "probe "+net.JoinHostPort(addr, "9")+" "+timeout.String()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s cannot reach %s: %v: %s", h.Name(), addr, err, out)
	}
	return nil
}

func mustReach(t *testing.T, h *Host, addr string) {
	t.Helper()
	if err := reach(h, addr, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// Two hosts on one switch reach each other over both families.
func TestSwitchReach(t *testing.T) {
	b := New(t)
	a, c := b.Host("a"), b.Host("c")
	sw := b.Switch("lan")
	b.Attach(a, "eth0", sw, "10.9.0.1/24", "fd09::1/64")
	b.Attach(c, "eth0", sw, "10.9.0.2/24", "fd09::2/64")
	// What runs in a host sees its interfaces operational at once (the
	// kernel may take a second to say so; the bed waits for it).
	if out, err := a.Run("ip", "-o", "link", "show", "eth0"); err != nil || !strings.Contains(out, "state UP") {
		t.Fatalf("eth0 not operational when the first command runs: %v\n%s", err, out)
	}
	mustReach(t, a, "10.9.0.2")
	mustReach(t, a, "fd09::2")
	mustReach(t, c, "10.9.0.1")
	// An address nobody has must not answer: the bed is really isolated.
	if err := reach(a, "10.9.0.3", time.Second); err == nil {
		t.Fatal("reached an address nobody has")
	}
}

// Two subnets joined by a router, one wired point to point and one through
// a switch, reach each other only once the routes are in.
func TestRouter(t *testing.T) {
	b := New(t)
	a, c, r := b.Host("a"), b.Host("c"), b.Router("r")
	b.Wire(a, "eth0", r, "a0", []string{"10.1.0.2/24", "fd01::2/64"}, []string{"10.1.0.1/24", "fd01::1/64"})
	sw := b.Switch("s2")
	b.Attach(r, "s0", sw, "10.2.0.1/24", "fd02::1/64")
	b.Attach(c, "eth0", sw, "10.2.0.2/24", "fd02::2/64")
	if err := reach(a, "10.2.0.2", time.Second); err == nil {
		t.Fatal("reached the other subnet without a route")
	}
	a.Route("default", "10.1.0.1")
	a.Route("default", "fd01::1")
	c.Route("10.1.0.0/24", "10.2.0.1")
	c.Route("fd01::/64", "fd02::1")
	mustReach(t, a, "10.2.0.2")
	mustReach(t, a, "fd02::2")
}

// A tbf limit slows a transfer down and the counters of both ends move by at
// least what was sent. The time bound is a lower bound with a wide margin,
// so a slow machine cannot make it fail.
func TestLimitAndCounters(t *testing.T) {
	b := New(t)
	a, c := b.Host("a"), b.Host("c")
	ia, ic := b.Wire(a, "eth0", c, "eth0", []string{"10.3.0.1/24"}, []string{"10.3.0.2/24"})
	if err := ia.Limit("2mbit"); err != nil {
		t.Fatal(err)
	}
	out, err := a.Run("tc", "qdisc", "show", "dev", "eth0")
	if err != nil || !strings.Contains(out, "tbf") || !strings.Contains(out, "2Mbit") {
		t.Fatalf("tbf not installed: %v\n%s", err, out)
	}
	_, tx0, err := ia.Counters()
	if err != nil {
		t.Fatal(err)
	}
	rx0, _, err := ic.Counters()
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 500_000 // 4 Mbit: two seconds at 2 Mbit/s
	sink := helperCmd(ctx, c, "sink 10.3.0.2:7001")
	sinkOut, _ := sink.StdoutPipe()
	sink.Stderr = os.Stderr
	if err := sink.Start(); err != nil {
		t.Fatal(err)
	}
	defer sink.Wait()
	buf := make([]byte, 64)
	if _, err := sinkOut.Read(buf); err != nil { // "listening"
		t.Fatal(err)
	}
	start := time.Now()
	if out, err := helperCmd(ctx, a, fmt.Sprintf("source 10.3.0.2:7001 %d", n)).CombinedOutput(); err != nil {
		t.Fatalf("source: %v\n%s", err, out)
	}
	rest, _ := io.ReadAll(sinkOut)
	if err := sink.Wait(); err != nil {
		t.Fatalf("sink: %v", err)
	}
	elapsed := time.Since(start)
	if got := strings.TrimSpace(string(rest)); got != strconv.Itoa(n) {
		t.Fatalf("sink read %q bytes, want %d", got, n)
	}
	if elapsed < time.Second {
		t.Errorf("%d bytes through a 2 Mbit/s limit took %v; the limit is not applied", n, elapsed)
	}
	_, tx1, err := ia.Counters()
	if err != nil {
		t.Fatal(err)
	}
	rx1, _, err := ic.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if tx1-tx0 < n || rx1-rx0 < n {
		t.Errorf("counters moved by tx %d / rx %d bytes, want at least %d each", tx1-tx0, rx1-rx0, n)
	}
	t.Logf("%d bytes in %v; tx +%d, rx +%d", n, elapsed, tx1-tx0, rx1-rx0)
}

// SetDown cuts a link and SetUp restores it with its addresses.
func TestDownUp(t *testing.T) {
	b := New(t)
	a, c := b.Host("a"), b.Host("c")
	ia, _ := b.Wire(a, "eth0", c, "eth0", []string{"10.4.0.1/24", "fd04::1/64"}, []string{"10.4.0.2/24", "fd04::2/64"})
	mustReach(t, a, "fd04::2")
	if err := ia.SetDown(); err != nil {
		t.Fatal(err)
	}
	if err := reach(a, "10.4.0.2", time.Second); err == nil {
		t.Fatal("reached the peer over a downed link")
	}
	if err := ia.SetUp(); err != nil {
		t.Fatal(err)
	}
	mustReach(t, a, "10.4.0.2")
	mustReach(t, a, "fd04::2")
}

// Blackhole drops what both ends send while the link stays up.
func TestBlackhole(t *testing.T) {
	b := New(t)
	a, c := b.Host("a"), b.Host("c")
	ia, ic := b.Wire(a, "eth0", c, "eth0", []string{"10.5.0.1/24"}, []string{"10.5.0.2/24"})
	mustReach(t, a, "10.5.0.2")
	for _, i := range []*Iface{ia, ic} {
		if err := i.Blackhole(); err != nil {
			t.Fatal(err)
		}
	}
	if err := reach(a, "10.5.0.2", time.Second); err == nil {
		t.Fatal("reached the peer through a blackholed link")
	}
	if out, err := a.Run("ip", "-o", "link", "show", "dev", "eth0"); err != nil || !strings.Contains(out, "state UP") {
		t.Fatalf("the blackholed link is not up: %v %s", err, out)
	}
}

// After a test that used a bed, nothing with its prefix is left: no
// namespace, and no link in the root namespace.
func TestCleanupLeavesNothing(t *testing.T) {
	var prefix string
	t.Run("bed", func(t *testing.T) {
		b := New(t)
		prefix = b.Prefix()
		a, c := b.Host("a"), b.Host("c")
		sw := b.Switch("lan")
		b.Attach(a, "eth0", sw, "10.5.0.1/24")
		b.Attach(c, "eth0", sw, "10.5.0.2/24")
		b.Wire(a, "eth1", c, "eth1", nil, nil)
	})
	if prefix == "" {
		t.Skip("the bed was skipped")
	}
	out, err := run("ip", "netns", "list")
	if err != nil {
		t.Fatalf("ip netns list: %v\n%s", err, out)
	}
	if strings.Contains(out, prefix) {
		t.Errorf("namespaces with prefix %s left:\n%s", prefix, out)
	}
	out, err = run("ip", "-o", "link", "show")
	if err != nil {
		t.Fatalf("ip link show: %v\n%s", err, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, prefix) {
			t.Errorf("link left in the root namespace: %s", line)
		}
	}
}

// A stale namespace of a process that is gone is removed by the next New;
// one of a live process is not.
func TestRemovesStale(t *testing.T) {
	New(t) // skips when not root
	// pid_max is at most 2^22, so this pid cannot be running.
	stale := fmt.Sprintf("%s%dx1-stale", Prefix, 1<<23)
	if out, err := run("ip", "netns", "add", stale); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Cleanup(func() { run("ip", "netns", "del", stale) })
	b := New(t)
	live := b.Prefix() + "live"
	b.Host("live")
	out, _ := run("ip", "netns", "list")
	if strings.Contains(out, stale) {
		t.Errorf("stale namespace %s was not removed", stale)
	}
	if !strings.Contains(out, live) {
		t.Errorf("namespace %s of this live process was removed", live)
	}
}

// Without root, New skips with a message that says why.
func TestUnavailable(t *testing.T) {
	found := func(string) (string, error) { return "/usr/sbin/x", nil }
	missing := func(string) (string, error) { return "", errors.New("not in PATH") }
	tests := []struct {
		name   string
		euid   int
		look   func(string) (string, error)
		reason string // substring; "" means available
	}{
		{"root with tools", 0, found, ""},
		{"not root", 1000, found, "need root"},
		{"no ip", 0, missing, "ip (iproute2) not found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := unavailable(tc.euid, tc.look)
			if (tc.reason == "") != (got == "") || !strings.Contains(got, tc.reason) {
				t.Errorf("unavailable(%d) = %q, want %q", tc.euid, got, tc.reason)
			}
		})
	}
}

func TestParseRate(t *testing.T) {
	tests := []struct {
		in   string
		want uint64
		bad  bool
	}{
		{"100mbit", 100e6, false},
		{"1gbit", 1e9, false},
		{"1.5Mbit", 1.5e6, false},
		{"10mbps", 80e6, false},
		{"500bit", 500, false},
		{"100", 0, true},
		{"-1mbit", 0, true},
		{"fastmbit", 0, true},
	}
	for _, tc := range tests {
		got, err := parseRate(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("parseRate(%q) = %d, %v; want %d, bad=%v", tc.in, got, err, tc.want, tc.bad)
		}
	}
}
