// Package netns builds small networks of hosts out of Linux network
// namespaces for tests: hosts, switches (bridges), routers, veth links with
// IPv4 and IPv6 addresses, routes, tc tbf rate limits and interface
// counters. It drives `ip` and `tc` from iproute2; it needs root.
//
// # Usage
//
//	bed := netns.New(t) // skips the test when not root or without `ip`
//	a, b := bed.Host("a"), bed.Host("b")
//	sw := bed.Switch("lan")
//	bed.Attach(a, "eth0", sw, "10.0.0.1/24", "fd00::1/64")
//	bed.Attach(b, "eth0", sw, "10.0.0.2/24", "fd00::2/64")
//	out, err := a.Run("ping", "-c1", "10.0.0.2")
//
// Go code runs inside a host by re-executing the test binary through
// [Host.Command] with -test.run selecting a helper test and an environment
// variable selecting its role; entering a namespace on a locked OS thread
// would not move the goroutines a library starts.
//
// # Names and cleanup
//
// Every namespace the bed makes is named "mdt<pid>x<n>-<name>", unique per
// process and bed, so test binaries running at once do not collide. All
// links live inside those namespaces (the root namespace gets none), so
// deleting the namespaces removes every veth and bridge too. [New]
// registers that cleanup with t.Cleanup, which runs even when the test
// fails or panics, and first removes "mdt*" namespaces left by processes
// that are gone (a test binary killed by its timeout runs no cleanup).
//
// A Bed is meant for one test goroutine; tests that run in parallel use
// separate Beds.
package netns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Prefix starts the name of every namespace a bed makes.
const Prefix = "mdt"

// cmdTimeout bounds each ip/tc command, so a wedged command fails the test
// instead of hanging it.
const cmdTimeout = 30 * time.Second

var bedSeq atomic.Uint32

// Bed is a set of hosts, switches and links. It is not safe for concurrent
// use: one test goroutine drives it.
type Bed struct {
	t      testing.TB
	prefix string
	nss    []string // namespaces made, in creation order
	names  map[string]bool
	ports  map[*Switch]int
	// pending are interfaces brought up but maybe not yet operational: the
	// kernel reports a new carrier up to a second late, and until then a
	// program in the host sees the interface as not running.
	pending []*Iface
}

// Host is a network namespace standing for one machine.
type Host struct {
	bed  *Bed
	name string // short name given by the test
	ns   string // namespace name
}

// Switch is a bridge, in a namespace of its own, that hosts attach to.
type Switch struct {
	host *Host
}

// Iface is one end of a veth pair inside a host.
type Iface struct {
	host *Host
	name string
}

// New makes an empty test bed. It skips the test with a clear message when
// not root or when `ip` or network namespaces are unavailable, and registers
// a cleanup that removes everything the bed made.
func New(t testing.TB) *Bed {
	t.Helper()
	if reason := unavailable(os.Geteuid(), exec.LookPath); reason != "" {
		t.Skip(reason)
	}
	removeStale(t)
	b := &Bed{
		t:      t,
		prefix: fmt.Sprintf("%s%dx%d-", Prefix, os.Getpid(), bedSeq.Add(1)),
		names:  map[string]bool{},
		ports:  map[*Switch]int{},
	}
	// Probe once, so a kernel or container without netns support skips
	// rather than fails.
	probe := b.prefix + "probe"
	if out, err := run("ip", "netns", "add", probe); err != nil {
		t.Skipf("netns: skipping: cannot create a network namespace (%v): %s", err, out)
	}
	run("ip", "netns", "del", probe)
	t.Cleanup(b.cleanup)
	return b
}

// unavailable says why a bed cannot be built for a process with effective
// user id euid, or "" when it can.
func unavailable(euid int, lookPath func(string) (string, error)) string {
	if euid != 0 {
		return fmt.Sprintf("netns: skipping: network namespaces need root, and this test runs as uid %d (CI runs it as root)", euid)
	}
	for _, tool := range []string{"ip", "tc"} {
		if _, err := lookPath(tool); err != nil {
			return fmt.Sprintf("netns: skipping: %s (iproute2) not found: %v", tool, err)
		}
	}
	return ""
}

// Prefix is the bed's name prefix ("mdt<pid>x<n>-"); every namespace it
// made starts with it.
func (b *Bed) Prefix() string { return b.prefix }

// cleanup deletes every namespace the bed made, newest first. Deleting a
// namespace destroys the veths and bridges in it and the veth peers
// elsewhere.
func (b *Bed) cleanup() {
	var errs []string
	for i := len(b.nss) - 1; i >= 0; i-- {
		if out, err := run("ip", "netns", "del", b.nss[i]); err != nil {
			errs = append(errs, fmt.Sprintf("ip netns del %s: %v: %s", b.nss[i], err, out))
		}
	}
	b.nss = nil
	if len(errs) > 0 {
		b.t.Errorf("netns: cleanup: %s", strings.Join(errs, "; "))
	}
}

var staleName = regexp.MustCompile(`^` + Prefix + `(\d+)x\d+-`)

// removeStale deletes namespaces of earlier beds whose process is gone.
func removeStale(t testing.TB) {
	out, err := run("ip", "netns", "list")
	if err != nil {
		return // New's probe reports a real problem
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		m := staleName.FindStringSubmatch(f[0])
		if m == nil {
			continue
		}
		pid, err := strconv.Atoi(m[1])
		if err != nil || pid == os.Getpid() || processAlive(pid) {
			continue
		}
		if out, err := run("ip", "netns", "del", f[0]); err != nil {
			t.Logf("netns: removing stale namespace %s: %v: %s", f[0], err, out)
		}
	}
}

func processAlive(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return err == nil
}

// run runs a command and returns its combined output.
func run(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}

// must runs a command and fails the test, naming the command and its
// output, when it fails.
func (b *Bed) must(name string, args ...string) string {
	b.t.Helper()
	out, err := run(name, args...)
	if err != nil {
		b.t.Fatalf("netns: %s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// newNS makes a namespace for name with lo up and quick IPv6: no duplicate
// address detection (addresses usable at once) and addresses kept while an
// interface is down (so SetDown then SetUp restores it).
func (b *Bed) newNS(name string) *Host {
	b.t.Helper()
	if name == "" || strings.ContainsAny(name, "/ \t\n") {
		b.t.Fatalf("netns: bad host name %q", name)
	}
	if b.names[name] {
		b.t.Fatalf("netns: host or switch %q already exists in this bed", name)
	}
	ns := b.prefix + name
	b.must("ip", "netns", "add", ns)
	b.nss = append(b.nss, ns)
	b.names[name] = true
	h := &Host{bed: b, name: name, ns: ns}
	h.sysctl(map[string]string{
		"net.ipv6.conf.all.accept_dad":            "0",
		"net.ipv6.conf.default.accept_dad":        "0",
		"net.ipv6.conf.all.keep_addr_on_down":     "1",
		"net.ipv6.conf.default.keep_addr_on_down": "1",
	})
	b.must("ip", "-n", ns, "link", "set", "lo", "up")
	return h
}

func (h *Host) sysctl(kv map[string]string) {
	h.bed.t.Helper()
	args := []string{"netns", "exec", h.ns, "sysctl", "-q", "-w"}
	for k, v := range kv {
		args = append(args, k+"="+v)
	}
	h.bed.must("ip", args...)
}

// Host makes a host: a namespace with lo up.
func (b *Bed) Host(name string) *Host {
	b.t.Helper()
	return b.newNS(name)
}

// Router makes a host that forwards IPv4 and IPv6.
func (b *Bed) Router(name string) *Host {
	b.t.Helper()
	h := b.newNS(name)
	h.sysctl(map[string]string{
		"net.ipv4.ip_forward":          "1",
		"net.ipv6.conf.all.forwarding": "1",
	})
	return h
}

// Switch makes a bridge, in a namespace of its own, for hosts to attach to.
// It forwards at once (no STP) and floods multicast (no snooping), so
// neighbour discovery works from the first packet.
func (b *Bed) Switch(name string) *Switch {
	b.t.Helper()
	h := b.newNS(name)
	b.must("ip", "-n", h.ns, "link", "add", "br0", "type", "bridge", "stp_state", "0", "mcast_snooping", "0")
	b.must("ip", "-n", h.ns, "link", "set", "br0", "up")
	return &Switch{host: h}
}

// Attach makes a veth pair: ifname inside h, the other end a port of sw. It
// brings both up and assigns addrs (CIDR, IPv4 or IPv6, e.g. "10.0.0.1/24",
// "fd00:1::1/64"; IPv6 without duplicate address detection, usable at once).
func (b *Bed) Attach(h *Host, ifname string, sw *Switch, addrs ...string) *Iface {
	b.t.Helper()
	b.ports[sw]++
	port := "p" + strconv.Itoa(b.ports[sw])
	b.must("ip", "-n", h.ns, "link", "add", ifname, "type", "veth", "peer", "name", port, "netns", sw.host.ns)
	b.must("ip", "-n", sw.host.ns, "link", "set", port, "master", "br0", "up")
	i := &Iface{host: h, name: ifname}
	i.configure(addrs)
	return i
}

// Wire makes a point-to-point veth pair between two hosts, brings both ends
// up and assigns their addresses.
func (b *Bed) Wire(h1 *Host, if1 string, h2 *Host, if2 string, addrs1, addrs2 []string) (*Iface, *Iface) {
	b.t.Helper()
	b.must("ip", "-n", h1.ns, "link", "add", if1, "type", "veth", "peer", "name", if2, "netns", h2.ns)
	i1, i2 := &Iface{host: h1, name: if1}, &Iface{host: h2, name: if2}
	i1.configure(addrs1)
	i2.configure(addrs2)
	return i1, i2
}

func (i *Iface) configure(addrs []string) {
	b := i.host.bed
	b.t.Helper()
	for _, a := range addrs {
		args := []string{"-n", i.host.ns, "addr", "add", a, "dev", i.name}
		if strings.Contains(a, ":") {
			args = append(args, "nodad")
		}
		b.must("ip", args...)
	}
	b.must("ip", "-n", i.host.ns, "link", "set", i.name, "up")
	b.pending = append(b.pending, i)
}

// Settle waits until every interface brought up so far is operationally
// up, so whatever runs in a host next sees the network as built; it fails
// the test if one is not after 10 s. Run and Command call it; call it
// before starting a program through ExecPrefix.
func (b *Bed) Settle() {
	b.t.Helper()
	deadline := time.Now().Add(settleTimeout)
	for len(b.pending) > 0 {
		i := b.pending[0]
		out, err := run("ip", "-n", i.host.ns, "-o", "link", "show", "dev", i.name)
		if err == nil && (strings.Contains(out, " state UP ") || strings.Contains(out, " state UNKNOWN ")) {
			b.pending = b.pending[1:]
			continue
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("netns: %s in %s not up after %v: %v\n%s", i.name, i.host.ns, settleTimeout, err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// settleTimeout bounds the wait for interfaces to come up.
const settleTimeout = 10 * time.Second

// Name returns the namespace name.
func (h *Host) Name() string { return h.ns }

// Route adds a route to dst (a CIDR or "default") through via. The family
// follows dst, or via for "default".
func (h *Host) Route(dst, via string) {
	h.bed.t.Helper()
	fam := "-4"
	if strings.Contains(dst, ":") || (dst == "default" && strings.Contains(via, ":")) {
		fam = "-6"
	}
	h.bed.must("ip", "-n", h.ns, fam, "route", "add", dst, "via", via)
}

// Run runs a command inside the host and returns its combined output. Unlike
// the bed's set-up methods it does not fail the test when the command fails:
// the caller decides what that means. It first waits until every interface
// of the bed is operationally up (the kernel can take up to a second to say
// so), failing the test if one never comes up.
func (h *Host) Run(args ...string) (string, error) {
	h.bed.t.Helper()
	h.bed.Settle()
	if len(args) == 0 {
		return "", errors.New("netns: Run: no command")
	}
	p := h.ExecPrefix()
	out, err := run(p[0], append(p[1:], args...)...)
	if err != nil {
		return out, fmt.Errorf("netns: in %s: %s: %w", h.ns, strings.Join(args, " "), err)
	}
	return out, nil
}

// Command returns a command that runs name inside the namespace (ip netns
// exec <ns> name args...); the caller sets Env, Stdout and so on. ip execs
// name in place, so cancelling ctx kills name itself. Like Run, it first
// waits until every interface of the bed is operationally up.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	h.bed.t.Helper()
	h.bed.Settle()
	p := h.ExecPrefix()
	return exec.CommandContext(ctx, p[0], append(append(p[1:], name), args...)...)
}

// ExecPrefix is the argv prefix that enters the namespace:
// {"ip", "netns", "exec", ns}. Call [Bed.Settle] before using it.
func (h *Host) ExecPrefix() []string { return []string{"ip", "netns", "exec", h.ns} }

// Limit rate-limits the interface's egress with a tc token bucket (rate as
// tc takes it: "100mbit", "1gbit", "500kbit"). The bucket holds 10 ms of
// traffic but at least 64 KiB, so segmentation-offloaded packets pass.
func (i *Iface) Limit(rate string) error {
	bps, err := parseRate(rate)
	if err != nil {
		return fmt.Errorf("netns: limit %s in %s: %w", i.name, i.host.ns, err)
	}
	burst := max(bps/8/100, 64<<10)
	args := []string{"-n", i.host.ns, "qdisc", "replace", "dev", i.name, "root", "tbf",
		"rate", rate, "burst", strconv.FormatUint(burst, 10), "latency", "100ms"}
	if out, err := run("tc", args...); err != nil {
		return fmt.Errorf("netns: tc %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// parseRate reads a tc rate in bits per second ("100mbit", "1gbit", "64kbit",
// "1000000bit", or bytes with "bps": "10mbps").
func parseRate(s string) (uint64, error) {
	units := []struct {
		suffix string
		mult   uint64
	}{
		{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1},
		{"gbps", 8e9}, {"mbps", 8e6}, {"kbps", 8e3}, {"bps", 8},
	}
	l := strings.ToLower(s)
	for _, u := range units {
		if num, ok := strings.CutSuffix(l, u.suffix); ok {
			v, err := strconv.ParseFloat(num, 64)
			if err != nil || v <= 0 {
				return 0, fmt.Errorf("rate %q: want a positive number with a unit such as 100mbit", s)
			}
			return uint64(v * float64(u.mult)), nil
		}
	}
	return 0, fmt.Errorf("rate %q: want a unit: bit, kbit, mbit, gbit, bps, kbps, mbps or gbps", s)
}

// Counters returns the interface's received and transmitted bytes, read from
// /sys/class/net inside its namespace.
func (i *Iface) Counters() (rxBytes, txBytes uint64, err error) {
	dir := "/sys/class/net/" + i.name + "/statistics/"
	out, err := i.host.Run("cat", dir+"rx_bytes", dir+"tx_bytes")
	if err != nil {
		return 0, 0, fmt.Errorf("netns: counters of %s: %w: %s", i.name, err, out)
	}
	f := strings.Fields(out)
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("netns: counters of %s in %s: want two numbers, got %q", i.name, i.host.ns, out)
	}
	rx, err1 := strconv.ParseUint(f[0], 10, 64)
	tx, err2 := strconv.ParseUint(f[1], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, fmt.Errorf("netns: counters of %s in %s: %w", i.name, i.host.ns, err)
	}
	return rx, tx, nil
}

// Blackhole makes the interface drop every packet it sends, as a dead
// switch port or cable would: the link stays up and nothing reports an
// error to the programs using it, so only their own timeouts notice. It
// is a token bucket whose burst is smaller than any packet (tc has no
// drop action here).
func (i *Iface) Blackhole() error {
	args := []string{"-n", i.host.ns, "qdisc", "replace", "dev", i.name, "root", "tbf", "rate", "8bit", "burst", "1", "latency", "1ms"}
	if out, err := run("tc", args...); err != nil {
		return fmt.Errorf("netns: tc %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// SetDown takes the interface down (its addresses are kept).
func (i *Iface) SetDown() error { return i.setLink("down") }

// SetUp brings the interface up again; the next Run or Command waits until
// it is operational.
func (i *Iface) SetUp() error {
	if err := i.setLink("up"); err != nil {
		return err
	}
	i.host.bed.pending = append(i.host.bed.pending, i)
	return nil
}

func (i *Iface) setLink(state string) error {
	if out, err := run("ip", "-n", i.host.ns, "link", "set", i.name, state); err != nil {
		return fmt.Errorf("netns: ip -n %s link set %s %s: %w: %s", i.host.ns, i.name, state, err, out)
	}
	return nil
}

// LAN makes a head node and n hosts, 10.77.0.1 to 10.77.0.n, on one
// switch, and a launch script that runs a command on a host as ssh would:
// `launch [options] HOST COMMAND...`, for mdrun's -launcher or Hydra's
// -launcher-exec. Jobs start from the head node (head.Command).
func LAN(t testing.TB, n int) (head *Host, script string) {
	t.Helper()
	bed := New(t)
	head = bed.Host("head")
	sw := bed.Switch("lan")
	bed.Attach(head, "eth0", sw, "10.77.0.10/24")
	var cases strings.Builder
	for i := 1; i <= n; i++ {
		h := bed.Host(fmt.Sprintf("h%d", i))
		bed.Attach(h, "eth0", sw, fmt.Sprintf("10.77.0.%d/24", i))
		fmt.Fprintf(&cases, "  10.77.0.%d) ns=%s ;;\n", i, h.Name())
	}
	script = filepath.Join(t.TempDir(), "launch")
	body := fmt.Sprintf(`#!/bin/sh
# launch [options] HOST COMMAND...: like ssh, run COMMAND (a shell command
# line) on HOST, here the network namespace that stands for it.
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
case "$host" in
%s  *) echo "launch: unknown host $host" >&2; exit 255 ;;
esac
# A session of its own, as under sshd: a signal to this script does not
# reach the command.
exec ip netns exec "$ns" setsid -w sh -c "$*"
`, cases.String())
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return head, script
}
