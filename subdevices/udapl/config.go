package udapl

import (
	"fmt"
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
	IA   *string `json:"ia"`
	Port *int64  `json:"port"`
	rdma.Keys
}

// parseConfig decodes the subdevice's config block. An empty block means all
// defaults. Errors name the key and say what is accepted.
func parseConfig(b []byte) (config, error) {
	var raw rawConfig
	if err := rdma.DecodeConfig(b, &raw); err != nil {
		return config{}, fmt.Errorf("udapl: config: %w (known keys: ia, port, %s)", err, rdma.KeyNames)
	}
	var c config
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
	var err error
	if c.settings, err = raw.Settings(defaultExclusivity); err != nil {
		return config{}, fmt.Errorf("udapl: config: %w", err)
	}
	return c, nil
}
