package tcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// Defaults for the config keys; doc.go lists them for users.
const (
	defaultConnectTimeout = 10 * time.Second
	defaultQueueBytes     = 4 << 20
	// maxQueueBytes keeps a typo ("queue_bytes": 40000000000) from turning
	// the per-peer bound into no bound at all.
	maxQueueBytes = 1 << 30
)

// config is the decoded and validated plugins.hcl block.
type config struct {
	// listen is empty when the user left the default: dual-stack, with a
	// fallback to IPv4 only when the host has no IPv6.
	listen         string
	connectTimeout time.Duration
	queueBytes     int
}

// rawConfig mirrors the JSON keys exactly, so unknown keys are rejected by
// the decoder and every value can be checked with its key name.
type rawConfig struct {
	Listen         *string `json:"listen"`
	ConnectTimeout *string `json:"connect_timeout"`
	QueueBytes     *int64  `json:"queue_bytes"`
}

// parseConfig decodes the subdevice's config block. An empty block means all
// defaults. Errors name the key and say what is accepted.
func parseConfig(b []byte) (config, error) {
	c := config{connectTimeout: defaultConnectTimeout, queueBytes: defaultQueueBytes}
	if len(bytes.TrimSpace(b)) == 0 {
		return c, nil
	}
	var raw rawConfig
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return config{}, fmt.Errorf("tcp: config: %w (known keys: listen, connect_timeout, queue_bytes)", err)
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
	return c, nil
}
