package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// hostSpec is one entry of -hosts or a hostfile.
type hostSpec struct {
	name  string
	slots int
}

// maxSlots bounds one host's slots, so a typo cannot ask for billions.
const maxSlots = 1 << 16

var hostName = regexp.MustCompile(`^[A-Za-z0-9_.:%-]+$`)

// parseHostEntry reads "name" or "name:slots".
// An IPv6 address with slots is written "[addr]:slots".
func parseHostEntry(s string) (hostSpec, error) {
	h, _, err := parseHostSlots(s)
	return h, err
}

// parseHostSlots is parseHostEntry, and reports whether s gave the slots.
func parseHostSlots(s string) (hostSpec, bool, error) {
	h := hostSpec{name: s, slots: 1}
	slots := ""
	switch {
	case strings.HasPrefix(s, "["):
		name, rest, ok := strings.Cut(s[1:], "]")
		if !ok || (rest != "" && !strings.HasPrefix(rest, ":")) {
			return h, false, fmt.Errorf("host %q: want [address] or [address]:slots", s)
		}
		h.name, slots = name, strings.TrimPrefix(rest, ":")
		if rest == ":" {
			slots = "?"
		}
	case strings.Count(s, ":") == 1:
		h.name, slots, _ = strings.Cut(s, ":")
	}
	if slots != "" {
		n, err := strconv.Atoi(slots)
		if err != nil || n < 1 || n > maxSlots {
			return h, false, fmt.Errorf("host %q: slots %q is not a number from 1 to %d", s, slots, maxSlots)
		}
		h.slots = n
	}
	// A leading '-' is no host name (RFC 1123), and the launcher would
	// take it for an option: "ssh -Efile" writes its log to file.
	if h.name == "" || h.name[0] == '-' || !hostName.MatchString(h.name) {
		return h, false, fmt.Errorf("host %q is not a host name", s)
	}
	return h, slots != "", nil
}

// parseHosts reads -hosts: "h1,h2:2,...".
func parseHosts(s string) ([]hostSpec, error) {
	var hosts []hostSpec
	for _, e := range strings.Split(s, ",") {
		h, err := parseHostEntry(strings.TrimSpace(e))
		if err != nil {
			return nil, fmt.Errorf("-hosts: %w", err)
		}
		hosts = append(hosts, h)
	}
	return hosts, nil
}

// parseHostfile reads a hostfile: one host per line, as "name",
// "name:slots" or "name slots=N"; '#' starts a comment.
func parseHostfile(path string) ([]hostSpec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("-hostfile: %w", err)
	}
	defer f.Close()
	return readHostfile(f, path)
}

// readHostfile parses a hostfile's text from r; errors name the file as
// path, and the line.
func readHostfile(r io.Reader, path string) ([]hostSpec, error) {
	var hosts []hostSpec
	sc := bufio.NewScanner(r)
	line := 1
	for ; sc.Scan(); line++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		h, given, err := parseHostSlots(fields[0])
		if err == nil && len(fields) > 1 {
			v, ok := strings.CutPrefix(fields[1], "slots=")
			n, aerr := strconv.Atoi(v)
			switch {
			case len(fields) > 2 || !ok:
				err = fmt.Errorf("want \"host\", \"host:slots\" or \"host slots=N\", got %q", strings.TrimSpace(text))
			case given:
				err = fmt.Errorf("%q gives the slots twice", strings.TrimSpace(text))
			case aerr != nil || n < 1 || n > maxSlots:
				err = fmt.Errorf("slots=%q is not a number from 1 to %d", v, maxSlots)
			default:
				h.slots = n
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		hosts = append(hosts, h)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s:%d: %w", path, line, err)
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("%s: no hosts", path)
	}
	return hosts, nil
}

// placeRanks gives each rank a host: every host in turn takes as many
// consecutive ranks as it has slots, and the list starts over until all n
// ranks are placed (Hydra's rule).
func placeRanks(n int, hosts []hostSpec) []string {
	out := make([]string, 0, n)
	for len(out) < n {
		for _, h := range hosts {
			for s := 0; s < h.slots && len(out) < n; s++ {
				out = append(out, h.name)
			}
		}
	}
	return out
}

// isLocal reports whether host names this machine, where ranks start
// without the launcher.
func isLocal(host, self string) bool {
	return host == "localhost" || host == self
}

// safeWord matches arguments a POSIX shell takes as they are.
var safeWord = regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./-]+$`)

// shellQuote quotes s for the remote shell that ssh hands the command line
// to; words that need no quoting stay as they are.
func shellQuote(s string) string {
	if safeWord.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// remoteCommand is the argv that starts prog on host through the
// launcher: launcher host cd DIR; env K=V... prog args..., each word
// quoted for the remote shell. The rank starts in wdir, as mpiexec's
// ranks do: with must set (-wdir given), a host without it fails the rank;
// otherwise (mdrun's own directory) such a host starts it where the
// launcher does. The shell words bind (see remoteBind) come before the
// rank's command, to bind it before it starts.
func remoteCommand(launcher []string, host, wdir string, must bool, bind []string, env []string, prog string, args []string) []string {
	argv := append(append([]string{}, launcher...), host, "cd", "--", shellQuote(wdir))
	if must {
		argv = append(argv, "&&")
	} else {
		argv = append(argv, "2>/dev/null;")
	}
	// No exec: the remote shell stays the rank's parent and reaps it at
	// once, whatever happens to the launcher above it.
	argv = append(argv, bind...)
	argv = append(argv, "env")
	for _, kv := range env {
		argv = append(argv, shellQuote(kv))
	}
	argv = append(argv, shellQuote(prog))
	for _, a := range args {
		argv = append(argv, shellQuote(a))
	}
	return argv
}

// listenAddr picks where the rendezvous service listens for ranks on other
// hosts: the -listen flag, or this machine's address on the route to the
// first remote host (a UDP "connection" only consults the routing table).
func listenAddr(flagValue string, remote string) (string, error) {
	if flagValue != "" {
		host, _, err := net.SplitHostPort(flagValue)
		if err != nil {
			return "", fmt.Errorf("-listen %q: %w", flagValue, err)
		}
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			return "", fmt.Errorf("-listen %q: give an address the remote ranks can dial, not a wildcard", flagValue)
		}
		return flagValue, nil
	}
	c, err := net.DialTimeout("udp", net.JoinHostPort(strings.Trim(remote, "[]"), "9"), 5*time.Second)
	if err != nil {
		return "", fmt.Errorf("finding this machine's address towards %s (set -listen): %w", remote, err)
	}
	defer c.Close()
	ua, ok := c.LocalAddr().(*net.UDPAddr)
	if !ok || ua.IP.IsLoopback() {
		return "", errors.New("no address towards " + remote + " other than loopback (set -listen)")
	}
	return net.JoinHostPort(ua.IP.String(), "0"), nil
}
