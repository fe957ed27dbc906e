package rdma

import (
	"context"
	"fmt"
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
