package shm

import (
	"bytes"
	"encoding/json"
	"fmt"
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
	// SingleCopy lets this rank read large payloads straight out of a
	// sender's memory with process_vm_readv where the kernel allows it
	// (default true). The environment variable MD_SHM_SINGLE_COPY=0
	// turns it off too. Ranks may differ: each decides for its own
	// receiving side, and senders follow.
	SingleCopy *bool `json:"single_copy"`
	// SingleCopyMin is the smallest payload this rank sends by
	// descriptor to a peer that reads single-copy; smaller ones go
	// through the ring. Default 16 KiB (see defaultSingleCopyMin); at least 1.
	SingleCopyMin int `json:"single_copy_min"`
}

// defaultSingleCopyMin was chosen by measurement (mdbench, 2 CPUs, single
// copy against the ring with a threshold of 16 KiB, 32 KiB and above the
// eager limit, interleaved): from 16 KiB up a descriptor wins on latency
// (16 KiB 4.4-4.9 against 5.7-6.0 us, 64 KiB 11-15 against 16 us) and on
// bidirectional bandwidth (64 KiB 9.4-11.9 against 6.6-7.5 GB/s) even for
// eager messages, which land in a buffer of the receiver's and are copied
// again from there: the receiver reads the sender's clean buffer instead
// of ring lines the sender's core just dirtied, and the sender never waits
// for ring space. Below it the system call costs more than the copy it
// saves.
const defaultSingleCopyMin = 16 << 10

// envSingleCopy names the environment variable that, set to 0, off or
// false, turns the single-copy path off whatever the config says.
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
		if dec.More() {
			return config{}, fmt.Errorf("shm: config: trailing data after the JSON object")
		}
	}
	if c.RingBytes == 0 {
		c.RingBytes = defaultRingBytes
	}
	if c.SingleCopy == nil {
		on := true
		c.SingleCopy = &on
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
