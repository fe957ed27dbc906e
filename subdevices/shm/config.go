package shm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Ring size limits. The lower bound keeps MaxFrame above MaxEager; the upper
// one keeps cursors' in-ring offsets far from overflow and segments sane.
const (
	defaultRingBytes = 1 << 20
	minRingBytes     = 1 << 16
	maxRingBytes     = 1 << 30
)

// Caps this subdevice publishes, besides those derived from the ring size.
const (
	maxHeader = 256
	// maxEager: messages up to 64 KiB cost one trip through the ring
	// rather than a rendezvous handshake (three); like MPICH's shared
	// memory eager limit, it trades a buffered copy at an unready
	// receiver for latency.
	maxEager    = 64 << 10
	exclusivity = 50
)

// config is the subdevice's block from plugins.hcl, as JSON:
//
//	{"ring_bytes": 1048576, "single_copy": true, "single_copy_min": 16384}
type config struct {
	// RingBytes is the data capacity of each inbound ring: a power of two in
	// [64 KiB, 1 GiB]. Every rank of a job must use the same value.
	RingBytes uint64 `json:"ring_bytes"`
	// SingleCopy says whether this rank reads payloads of at least
	// SingleCopyMin bytes straight out of a sender's memory with
	// process_vm_readv where the kernel allows it: true always, false
	// never, and unset (the default) while the ring's copies show lines
	// crossing slowly (choose.go). The environment variable
	// MD_SHM_SINGLE_COPY (1/on/true, 0/off/false or auto) overrides it.
	// Ranks may differ: each decides for its own receiving side, and
	// senders follow.
	SingleCopy *bool `json:"single_copy"`
	// SingleCopyMin is the smallest payload this rank sends by
	// descriptor to a peer that reads single-copy (with SingleCopy unset,
	// payloads longer than a ring fragment may be sent so too); smaller
	// ones go through the ring. Default 16 KiB (see
	// defaultSingleCopyMin); at least 1.
	SingleCopyMin int `json:"single_copy_min"`
}

// defaultSingleCopyMin is the smallest payload sent by descriptor where
// the single copy is on. 16 KiB was where it beat the ring, before the
// ring pipelined its copies; below it the system call costs more than
// the copy it saves on any machine measured.
const defaultSingleCopyMin = 16 << 10

// envSingleCopy names the environment variable that, set to 1, on, true
// or yes (0, off, false or no), turns the single-copy path on (off)
// whatever the config says; auto leaves the choice to the receiver
// (choose.go), as an unset single_copy does.
const envSingleCopy = "MD_SHM_SINGLE_COPY"

// parseConfig decodes and validates raw, filling defaults. Empty input means
// all defaults.
func parseConfig(raw []byte) (config, error) {
	var c config
	if len(bytes.TrimSpace(raw)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			return config{}, fmt.Errorf("shm: config: %w (want {\"ring_bytes\": N, \"single_copy\": bool, \"single_copy_min\": N})", err)
		}
		// Token, not More: More is false before a stray '}' or ']'.
		if _, err := dec.Token(); !errors.Is(err, io.EOF) {
			return config{}, fmt.Errorf("shm: config: trailing data after the JSON object")
		}
	}
	if c.RingBytes == 0 {
		c.RingBytes = defaultRingBytes
	}
	switch {
	case c.SingleCopyMin == 0:
		c.SingleCopyMin = defaultSingleCopyMin
	case c.SingleCopyMin < 0:
		return config{}, fmt.Errorf("shm: config: single_copy_min %d must be positive", c.SingleCopyMin)
	}
	if c.RingBytes < minRingBytes || c.RingBytes > maxRingBytes || c.RingBytes&(c.RingBytes-1) != 0 {
		return config{}, fmt.Errorf("shm: config: ring_bytes %d must be a power of two in [%d, %d]",
			c.RingBytes, minRingBytes, maxRingBytes)
	}
	return c, nil
}

// maxFrame is the largest payload for a ring of ringBytes. A quarter of the
// ring keeps the largest record (plus a padding record at the wrap) below
// half the ring, so an empty ring always accepts any frame and a few large
// frames can be in flight at once.
func maxFrame(ringBytes uint64) int { return int(ringBytes / 4) }

// caps returns the Caps for a configuration.
func (c config) caps() sdi.Caps {
	mf := maxFrame(c.RingBytes)
	return sdi.Caps{
		MaxHeader:   maxHeader,
		MaxEager:    min(maxEager, mf),
		MaxFrame:    mf,
		Exclusivity: exclusivity,
		Latency:     500 * time.Nanosecond, // nominal, for routing
		Bandwidth:   5 << 30,
		Reach:       sdi.ReachHost,
		Flags:       sdi.FlagReliable | sdi.FlagOrdered | sdi.FlagPoll,
	}
}
