package udapl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
)

// Defaults and bounds of the config keys; doc.go lists them for users.
const (
	// defaultExclusivity puts uDAPL above tcp (10) and below verbs (20):
	// where both RDMA subdevices reach a peer, the direct verbs path wins.
	defaultExclusivity = 15
	// maxIANameLen is DAT_NAME_MAX_LENGTH less the terminating NUL.
	maxIANameLen = 255
	// defaultPortBase and portScan bound the connection qualifiers tried
	// when port is left out: each rank of a host takes the next free one.
	// Qualifiers stay below 65536 because the cma and scm providers use
	// them as TCP or RDMA CM port numbers, and the card keeps 16 bits.
	defaultPortBase = 47000
	portScan        = 1024
)

// config is the decoded and validated plugins.hcl block.
type config struct {
	// ia is the interface adapter's name in the DAT registry
	// (/etc/dat.conf); empty means the registry's first entry.
	ia string
	// port is the connection qualifier the listener takes; 0 means the
	// first free one from defaultPortBase up.
	port     uint16
	settings rdma.Settings
}

// rawConfig mirrors the JSON keys exactly, so unknown keys are rejected by
// the decoder and every value can be checked with its key name.
type rawConfig struct {
	IA          *string `json:"ia"`
	Port        *int64  `json:"port"`
	EagerBytes  *int64  `json:"eager_bytes"`
	RecvSlots   *int64  `json:"recv_slots"`
	Exclusivity *int64  `json:"exclusivity"`
}

// parseConfig decodes the subdevice's config block. An empty block means all
// defaults. Errors name the key and say what is accepted.
func parseConfig(b []byte) (config, error) {
	c := config{settings: rdma.Settings{Exclusivity: defaultExclusivity}}
	if len(bytes.TrimSpace(b)) == 0 {
		return c, nil
	}
	var raw rawConfig
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return config{}, fmt.Errorf("udapl: config: %w (known keys: ia, port, eager_bytes, recv_slots, exclusivity)", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return config{}, errors.New("udapl: config: trailing data after the JSON object")
	}
	if raw.IA != nil {
		name := *raw.IA
		if name == "" || len(name) > maxIANameLen || strings.ContainsRune(name, 0) {
			return config{}, fmt.Errorf("udapl: config: ia %q: want the name of an /etc/dat.conf entry (1 to %d bytes), e.g. \"ofa-v2-ib0\"", name, maxIANameLen)
		}
		c.ia = name
	}
	if raw.Port != nil {
		p := *raw.Port
		if p < 1 || p > math.MaxUint16 {
			return config{}, fmt.Errorf("udapl: config: port %d must be in [1, %d] (leave it out to take the first free one from %d)", p, math.MaxUint16, defaultPortBase)
		}
		c.port = uint16(p)
	}
	// The engine's own keys are checked by rdma.Settings.Validate, which
	// names them; only values an int cannot hold are refused here.
	if raw.EagerBytes != nil {
		if *raw.EagerBytes < 0 || *raw.EagerBytes > math.MaxInt32 {
			return config{}, fmt.Errorf("udapl: config: eager_bytes %d: must be in [%d, %d]", *raw.EagerBytes, rdma.MinEagerBytes, rdma.MaxEagerBytes)
		}
		c.settings.EagerBytes = int(*raw.EagerBytes)
	}
	if raw.RecvSlots != nil {
		if *raw.RecvSlots < 0 || *raw.RecvSlots > math.MaxInt32 {
			return config{}, fmt.Errorf("udapl: config: recv_slots %d: must be in [%d, %d]", *raw.RecvSlots, rdma.MinRecvSlots, rdma.MaxRecvSlots)
		}
		c.settings.RecvSlots = int(*raw.RecvSlots)
	}
	if err := c.settings.Validate(); err != nil {
		return config{}, fmt.Errorf("udapl: config: %w", err)
	}
	if raw.Exclusivity != nil {
		x := *raw.Exclusivity
		if x < 1 || x > math.MaxUint32 {
			return config{}, fmt.Errorf("udapl: config: exclusivity %d must be in [1, %d] (default %d: above tcp, below verbs)", x, uint32(math.MaxUint32), defaultExclusivity)
		}
		c.settings.Exclusivity = uint32(x)
	}
	return c, nil
}
