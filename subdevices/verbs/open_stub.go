//go:build !(verbs && cgo)

package verbs

import (
	"context"
	"fmt"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/sdi"
)

var errNotBuilt = fmt.Errorf("verbs: this binary was built without verbs support; rebuild with `-tags verbs` (needs libibverbs-dev and librdmacm-dev): %w", rdma.ErrNoDevice)

// open stands in for the cgo provider. It still checks the config, so a
// typo is reported on every machine and not only on those built with verbs.
func (host) open(_ context.Context, p sdi.OpenParams) (rdma.Provider, rdma.Settings, error) {
	if _, err := parseConfig(p.Config); err != nil {
		return nil, rdma.Settings{}, err
	}
	return nil, rdma.Settings{}, errNotBuilt
}
