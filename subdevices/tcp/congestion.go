package tcp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Values of congestion_control other than an algorithm's name.
const (
	congestionAuto   = "auto"
	congestionSystem = "system"
)

// loopbackCongestion are the algorithms a connection over loopback asks
// for when congestion_control is left at auto, in order of preference.
// Loopback has no bottleneck to estimate and no queue to keep short, so
// BBR (the default on many hosts, this one included) only costs there:
// its pacing spreads a large frame's segments over timers, and 1 MiB
// streams ran at 0.73-0.77x the speed of the same build with cubic or
// reno (mdbench --sub tcp, 12 interleaved repetitions). Reno is the
// fallback because every kernel lets any process choose it; cubic needs
// to be in net.ipv4.tcp_allowed_congestion_control or CAP_NET_ADMIN.
var loopbackCongestion = []string{"cubic", "reno"}

// checkCongestionName refuses what cannot be the name of a congestion
// control algorithm (the kernel's TCP_CA_NAME_MAX is 16 with the NUL).
func checkCongestionName(name string) error {
	if name == "" || len(name) > 15 || strings.IndexFunc(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-')
	}) >= 0 {
		return fmt.Errorf("tcp: config: congestion_control %q: want %q, %q or an algorithm's name such as \"cubic\"", name, congestionAuto, congestionSystem)
	}
	return nil
}

// congestionFor returns the algorithms a connection to peer asks for, in
// order, and whether it must get the first (an explicit setting) rather
// than any of them or the system's default.
func (c config) congestionFor(peer netip.Addr) (names []string, strict bool) {
	switch c.congestion {
	case congestionSystem:
		return nil, false
	case congestionAuto, "":
		if peer.IsLoopback() {
			return loopbackCongestion, false
		}
		return nil, false
	default:
		return []string{c.congestion}, true
	}
}

// setCongestion asks for the first of names the kernel grants on fd. With
// strict set only names[0] will do and its refusal is the error;
// otherwise a refusal of all of them leaves the system's default.
func setCongestion(fd int, names []string, strict bool) error {
	for _, name := range names {
		err := unix.SetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION, name)
		if err == nil {
			return nil
		}
		if strict {
			return congestionError(name, err)
		}
	}
	return nil
}

// congestionError explains why the kernel refused algorithm name.
func congestionError(name string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		avail, _ := os.ReadFile("/proc/sys/net/ipv4/tcp_available_congestion_control")
		return fmt.Errorf("tcp: config: congestion_control %q: not available in this kernel (available: %s)", name, strings.TrimSpace(string(avail)))
	case errors.Is(err, unix.EPERM):
		allowed, _ := os.ReadFile("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
		return fmt.Errorf("tcp: config: congestion_control %q: not allowed for this process (allowed: %s; others need CAP_NET_ADMIN)", name, strings.TrimSpace(string(allowed)))
	}
	return fmt.Errorf("tcp: config: congestion_control %q: %w", name, err)
}

// checkCongestion reports whether this process may use algorithm name, on
// a socket of its own, so that a setting that cannot work fails Open with
// the reason instead of every Connect.
func checkCongestion(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	}
	if err != nil {
		return fmt.Errorf("tcp: config: congestion_control %q: a socket to try it on: %w", name, err)
	}
	defer unix.Close(fd)
	return setCongestion(fd, []string{name}, true)
}

// congestionOf returns the algorithm conn's socket uses, or "" when it has
// no socket underneath or the kernel does not say.
func congestionOf(conn net.Conn) string {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return ""
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return ""
	}
	var name string
	raw.Control(func(fd uintptr) {
		name, _ = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
	})
	return name
}
