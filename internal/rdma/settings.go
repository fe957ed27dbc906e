package rdma

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Settings are the engine's knobs, the same for every provider. A subdevice
// decodes them from its plugins.hcl block beside its own keys.
type Settings struct {
	// EagerBytes is the payload one receive slot holds; frames up to it
	// travel by send into a posted slot, larger ones by the peer's read.
	// 0 means DefaultEagerBytes.
	EagerBytes int
	// RecvSlots is how many data receives each connection keeps posted
	// (the sender's credits). 0 means DefaultRecvSlots.
	RecvSlots int
	// Exclusivity, Latency and Bandwidth are published in the Caps for
	// routing; zero values mean the defaults of an RDMA network.
	Exclusivity uint32
	Latency     time.Duration
	Bandwidth   uint64
}

// Defaults and bounds of Settings.
const (
	DefaultEagerBytes = 8 << 10
	DefaultRecvSlots  = 32
	MinEagerBytes     = 256
	MaxEagerBytes     = 1 << 20
	MinRecvSlots      = 4
	MaxRecvSlots      = 1024
)

// Validate reports settings out of bounds, naming the plugins.hcl key.
func (s Settings) Validate() error {
	if s.EagerBytes != 0 && (s.EagerBytes < MinEagerBytes || s.EagerBytes > MaxEagerBytes) {
		return fmt.Errorf("eager_bytes %d: must be in [%d, %d]", s.EagerBytes, MinEagerBytes, MaxEagerBytes)
	}
	if s.RecvSlots != 0 && (s.RecvSlots < MinRecvSlots || s.RecvSlots > MaxRecvSlots) {
		return fmt.Errorf("recv_slots %d: must be in [%d, %d]", s.RecvSlots, MinRecvSlots, MaxRecvSlots)
	}
	return nil
}

// OpenFunc opens a provider for the rank p describes, decoding p.Config.
// Errors say what and where ("verbs: config: device \"mlx5_9\": not
// found"); a machine without the hardware gives an error wrapping
// ErrNoDevice.
type OpenFunc func(ctx context.Context, p sdi.OpenParams) (Provider, Settings, error)

// Keys are the engine's plugins.hcl keys, for a subdevice to embed in the
// struct it decodes its config block into, beside its own keys.
type Keys struct {
	EagerBytes  *int64 `json:"eager_bytes"`
	RecvSlots   *int64 `json:"recv_slots"`
	Exclusivity *int64 `json:"exclusivity"`
}

// KeyNames lists the keys of [Keys], for a subdevice's error messages.
const KeyNames = "eager_bytes, recv_slots, exclusivity"

// Settings checks the keys given and returns them as Settings, with
// exclusivity def where the key is left out. Errors name the key.
func (k Keys) Settings(def uint32) (Settings, error) {
	s := Settings{Exclusivity: def}
	// 0 means the default, as in Settings; Validate checks the rest, once
	// they are known to fit an int.
	if k.EagerBytes != nil {
		if *k.EagerBytes < 0 || *k.EagerBytes > MaxEagerBytes {
			return s, fmt.Errorf("eager_bytes %d: must be in [%d, %d], or 0 for the default", *k.EagerBytes, MinEagerBytes, MaxEagerBytes)
		}
		s.EagerBytes = int(*k.EagerBytes)
	}
	if k.RecvSlots != nil {
		if *k.RecvSlots < 0 || *k.RecvSlots > MaxRecvSlots {
			return s, fmt.Errorf("recv_slots %d: must be in [%d, %d], or 0 for the default", *k.RecvSlots, MinRecvSlots, MaxRecvSlots)
		}
		s.RecvSlots = int(*k.RecvSlots)
	}
	if k.Exclusivity != nil {
		// 0 is refused rather than passed on: in Settings it means the
		// engine's default, which is not what "exclusivity": 0 says.
		if *k.Exclusivity < 1 || *k.Exclusivity > math.MaxUint32 {
			return s, fmt.Errorf("exclusivity %d must be in [1, %d] (default %d)", *k.Exclusivity, uint32(math.MaxUint32), def)
		}
		s.Exclusivity = uint32(*k.Exclusivity)
	}
	return s, s.Validate()
}

// DecodeConfig decodes a subdevice's config block (JSON, one object) into
// v, refusing unknown keys and trailing data. An empty block leaves v as
// it is.
func DecodeConfig(b []byte, v any) error {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

// Depths are the queue depths one connection needs with these settings:
// sends and reads posted at once, and receives posted at once. A provider
// sizes its queue pairs by them rather than by the device's largest, which
// costs pinned memory per connection.
func (s Settings) Depths() (send, recv int) {
	slots := cmp0(s.RecvSlots, DefaultRecvSlots) + ctlSlots
	return slots + maxReads, slots
}
