package tcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"path"
	"strings"
	"time"
)

// Defaults for the config keys; doc.go lists them for users.
const (
	defaultConnectTimeout = 10 * time.Second
	defaultLinkTimeout    = 30 * time.Second
	defaultQueueBytes     = 4 << 20
	// maxQueueBytes keeps a typo ("queue_bytes": 40000000000) from turning
	// the per-peer bound into no bound at all.
	maxQueueBytes = 1 << 30
	// maxConnections bounds max_connections; a card has at most this many
	// interfaces anyway.
	maxConnections = maxCardIfaces
)

// config is the decoded and validated plugins.hcl block.
type config struct {
	// listen is empty when the user left the default: dual-stack, with a
	// fallback to IPv4 only when the host has no IPv6.
	listen         string
	connectTimeout time.Duration
	queueBytes     int
	filter         ifaceFilter
	// maxConns caps the connections to one peer; 0 means one per matched
	// interface pair.
	maxConns int
	// congestion is congestion_control: congestionAuto (also ""),
	// congestionSystem or an algorithm (congestion.go).
	congestion string
	// linkTimeout is link_timeout: how long a connection may go without
	// its peer acknowledging data or keepalive probes; 0 leaves the
	// system's limits (linktimeout.go).
	linkTimeout time.Duration
}

// ordered reports whether frames to a peer always travel on one connection,
// which keeps them in send order.
func (c config) ordered() bool { return c.maxConns == 1 }

// rawConfig mirrors the JSON keys exactly, so unknown keys are rejected by
// the decoder and every value can be checked with its key name.
type rawConfig struct {
	Listen         *string  `json:"listen"`
	ConnectTimeout *string  `json:"connect_timeout"`
	QueueBytes     *int64   `json:"queue_bytes"`
	Include        []string `json:"include"`
	Exclude        []string `json:"exclude"`
	MaxConnections *int64   `json:"max_connections"`
	Congestion     *string  `json:"congestion_control"`
	LinkTimeout    *string  `json:"link_timeout"`
}

// parseConfig decodes the subdevice's config block. An empty block means all
// defaults. Errors name the key and say what is accepted.
func parseConfig(b []byte) (config, error) {
	c := config{connectTimeout: defaultConnectTimeout, queueBytes: defaultQueueBytes, linkTimeout: defaultLinkTimeout}
	if len(bytes.TrimSpace(b)) == 0 {
		return c, nil
	}
	var raw rawConfig
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return config{}, fmt.Errorf("tcp: config: %w (known keys: listen, connect_timeout, queue_bytes, include, exclude, max_connections, congestion_control, link_timeout)", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return config{}, errors.New("tcp: config: trailing data after the JSON object")
	}
	if raw.Listen != nil {
		if _, _, err := net.SplitHostPort(*raw.Listen); err != nil {
			return config{}, fmt.Errorf("tcp: config: listen %q: want host:port, e.g. \"[::]:0\" or \"127.0.0.1:7000\": %w", *raw.Listen, err)
		}
		c.listen = *raw.Listen
	}
	if raw.ConnectTimeout != nil {
		d, err := time.ParseDuration(*raw.ConnectTimeout)
		if err != nil {
			return config{}, fmt.Errorf("tcp: config: connect_timeout %q: want a duration such as \"10s\": %w", *raw.ConnectTimeout, err)
		}
		if d <= 0 {
			return config{}, fmt.Errorf("tcp: config: connect_timeout %q must be positive", *raw.ConnectTimeout)
		}
		c.connectTimeout = d
	}
	if raw.QueueBytes != nil {
		q := *raw.QueueBytes
		if q <= 0 || q > maxQueueBytes {
			return config{}, fmt.Errorf("tcp: config: queue_bytes %d must be in [1, %d]", q, maxQueueBytes)
		}
		c.queueBytes = int(q)
	}
	var err error
	if c.filter.include, err = parseMatchers("include", raw.Include); err != nil {
		return config{}, err
	}
	if c.filter.exclude, err = parseMatchers("exclude", raw.Exclude); err != nil {
		return config{}, err
	}
	if raw.MaxConnections != nil {
		m := *raw.MaxConnections
		if m < 0 || m > maxConnections {
			return config{}, fmt.Errorf("tcp: config: max_connections %d must be in [0, %d] (0: one per matched interface pair)", m, maxConnections)
		}
		c.maxConns = int(m)
	}
	if raw.Congestion != nil {
		v := *raw.Congestion
		if v != congestionAuto && v != congestionSystem {
			if err := checkCongestionName(v); err != nil {
				return config{}, err
			}
		}
		c.congestion = v
	}
	if raw.LinkTimeout != nil {
		d, err := time.ParseDuration(*raw.LinkTimeout)
		if err != nil {
			return config{}, fmt.Errorf("tcp: config: link_timeout %q: want a duration such as \"30s\" (\"0s\": the system's): %w", *raw.LinkTimeout, err)
		}
		if d < 0 || (d > 0 && d < time.Millisecond) || d > maxLinkTimeout {
			return config{}, fmt.Errorf("tcp: config: link_timeout %q must be 0 (the system's) or from 1ms to %v", *raw.LinkTimeout, maxLinkTimeout)
		}
		c.linkTimeout = d
	}
	return c, nil
}

// ifaceFilter decides which interfaces and addresses go on the card.
type ifaceFilter struct {
	include, exclude []matcher
}

// matcher is one include or exclude entry: an interface name pattern or a
// CIDR.
type matcher struct {
	pattern string       // shell pattern on the interface name, when net is invalid
	net     netip.Prefix // addresses inside it
}

func (m matcher) match(ifname string, a netip.Addr) bool {
	if m.net.IsValid() {
		return m.net.Contains(a.WithZone(""))
	}
	ok, _ := path.Match(m.pattern, ifname) // the pattern was checked at parse
	return ok
}

// keep reports whether address a of interface ifname goes on the card.
// Loopback only serves ranks on one host, so include lists do not have to
// name it; an exclude entry still removes it.
func (f ifaceFilter) keep(ifname string, a netip.Addr) bool {
	for _, m := range f.exclude {
		if m.match(ifname, a) {
			return false
		}
	}
	if len(f.include) == 0 || a.IsLoopback() {
		return true
	}
	for _, m := range f.include {
		if m.match(ifname, a) {
			return true
		}
	}
	return false
}

// parseMatchers reads an include or exclude list: entries with a "/" are
// CIDRs, the rest interface names, which may be shell patterns ("eth*").
func parseMatchers(key string, entries []string) ([]matcher, error) {
	var ms []matcher
	for i, e := range entries {
		if strings.Contains(e, "/") {
			p, err := netip.ParsePrefix(e)
			if err != nil {
				return nil, fmt.Errorf("tcp: config: %s[%d] %q: want an interface name or a CIDR such as \"10.1.0.0/16\": %w", key, i, e, err)
			}
			ms = append(ms, matcher{net: p.Masked()})
			continue
		}
		if e == "" {
			return nil, fmt.Errorf("tcp: config: %s[%d] is empty: want an interface name or a CIDR", key, i)
		}
		if _, err := path.Match(e, ""); err != nil {
			return nil, fmt.Errorf("tcp: config: %s[%d] %q: bad interface name pattern: %w", key, i, e, err)
		}
		ms = append(ms, matcher{pattern: e})
	}
	return ms, nil
}
