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
	// slotsGiven says the entry gave the slots; otherwise slots is 1,
	// or -ppn's.
	slotsGiven bool
	// site names the cluster of hosts the host is in, passed to its ranks
	// as MD_SITE; "" is none.
	site string
}

// maxSlots bounds one host's slots, so a typo cannot ask for billions.
const maxSlots = 1 << 16

var hostName = regexp.MustCompile(`^[A-Za-z0-9_.:%-]+$`)

// maxSiteLen is the longest site name the library takes (MD_SITE).
const maxSiteLen = 255

// siteName is the characters a site name may use: fewer than MD_SITE
// allows (any bytes but NUL), so that a name needs no quoting on the
// launcher's command line and means the same in every locale.
var siteName = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// checkSite reports what is wrong with site as a site name.
func checkSite(site string) error {
	switch {
	case site == "":
		return errors.New("the site is empty")
	case len(site) > maxSiteLen:
		return fmt.Errorf("the site is %d bytes long, at most %d may be", len(site), maxSiteLen)
	case !siteName.MatchString(site):
		return fmt.Errorf("site %q: use only letters, digits, '_', '.' and '-'", site)
	}
	return nil
}

// sameSite checks that h names the site its host had in the entries
// before it (seen, by host name; it adds h's): all the ranks of a host
// are in one site, or in none.
func sameSite(seen map[string]string, h hostSpec) error {
	before, ok := seen[h.name]
	if !ok {
		seen[h.name] = h.site
		return nil
	}
	if before == h.site {
		return nil
	}
	return fmt.Errorf("host %s is %s here and %s before: a host is in one site or in none", h.name, inSite(h.site), inSite(before))
}

// inSite says which site a host is in, for messages.
func inSite(site string) string {
	if site == "" {
		return "in no site"
	}
	return "in site " + site
}

// parseHostEntry reads "name" or "name:slots".
// An IPv6 address with slots is written "[addr]:slots".
func parseHostEntry(s string) (hostSpec, error) {
	h, _, err := parseHostSlots(s)
	return h, err
}

// parseHostSlots is parseHostEntry, and reports whether s gave the slots.
func parseHostSlots(s string) (hostSpec, bool, error) {
	h := hostSpec{name: s, slots: 1}
	slots, given := "", false // "a:" gives slots, and no number
	switch {
	case strings.HasPrefix(s, "["):
		name, rest, ok := strings.Cut(s[1:], "]")
		if !ok || (rest != "" && !strings.HasPrefix(rest, ":")) {
			return h, false, fmt.Errorf("host %q: want [address] or [address]:slots", s)
		}
		h.name, slots, given = name, strings.TrimPrefix(rest, ":"), rest != ""
	case strings.Count(s, ":") == 1:
		h.name, slots, given = strings.Cut(s, ":")
	}
	if given {
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
	h.slotsGiven = given
	return h, given, nil
}

// parseHosts reads -hosts: "h1,h2:2,...", each entry optionally with
// "@site" after it ("h1:2@A", "[fd00::1]:2@A").
func parseHosts(s string) ([]hostSpec, error) {
	return parseHostList("-hosts", s)
}

// parseRelays reads -relay, in -hosts' form: a relay sits on a cluster's
// private network as its hosts do, so it needs their site as much.
func parseRelays(s string) ([]hostSpec, error) {
	return parseHostList("-relay", s)
}

// parseHostList reads the list of hosts flag gives; errors name the flag.
func parseHostList(flag, s string) ([]hostSpec, error) {
	var hosts []hostSpec
	seen := map[string]string{}
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		entry, site, withSite := strings.Cut(e, "@")
		h, err := parseHostEntry(entry)
		if err == nil && withSite {
			if err = checkSite(site); err != nil {
				err = fmt.Errorf("host %q: %w", e, err)
			}
			h.site = site
		}
		if err == nil {
			err = sameSite(seen, h)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		hosts = append(hosts, h)
	}
	return hosts, nil
}

// parseHostfile reads a hostfile: one host per line, as "name",
// "name:slots" or "name slots=N", optionally with "site=NAME";
// '#' starts a comment.
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
	seen := map[string]string{}
	sc := bufio.NewScanner(r)
	line := 1
	for ; sc.Scan(); line++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		h, err := hostLine(fields, strings.TrimSpace(text))
		if err == nil {
			err = sameSite(seen, h)
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

// hostLine reads the fields of one hostfile line, text: the host, then
// slots=N and site=NAME in any order, each at most once.
func hostLine(fields []string, text string) (hostSpec, error) {
	if strings.Contains(fields[0], "@") {
		return hostSpec{}, fmt.Errorf("%q: a hostfile names the site with site=NAME, not with @", fields[0])
	}
	h, slotsGiven, err := parseHostSlots(fields[0])
	if err != nil {
		return h, err
	}
	siteGiven := false
	for _, f := range fields[1:] {
		key, v, ok := strings.Cut(f, "=")
		if !ok {
			key = "" // "slots" alone is no field
		}
		switch key {
		case "slots":
			n, err := strconv.Atoi(v)
			switch {
			case slotsGiven:
				return h, fmt.Errorf("%q gives the slots twice", text)
			case err != nil || n < 1 || n > maxSlots:
				return h, fmt.Errorf("slots=%q is not a number from 1 to %d", v, maxSlots)
			}
			h.slots, slotsGiven, h.slotsGiven = n, true, true
		case "site":
			if siteGiven {
				return h, fmt.Errorf("%q gives the site twice", text)
			}
			if err := checkSite(v); err != nil {
				return h, err
			}
			h.site, siteGiven = v, true
		default:
			return h, fmt.Errorf("want \"host\", \"host:slots\" or \"host slots=N\", each optionally with site=NAME, got %q", text)
		}
	}
	return h, nil
}

// placeRanks gives each rank a host: every host in turn takes as many
// consecutive ranks as it has slots, and the list starts over until all n
// ranks are placed (Hydra's rule; -map-by slot). hosts must not be empty.
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
