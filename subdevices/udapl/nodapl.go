//go:build !(udapl && cgo)

package udapl

import (
	"context"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// notBuiltError is what open returns in a build without uDAPL: the
// multidevice treats it as a machine without the device (it wraps
// rdma.ErrNoDevice), and the message says how to get one with it.
type notBuiltError struct{}

func (notBuiltError) Error() string {
	return "udapl: this binary was built without uDAPL support; rebuild with `-tags udapl` (needs libdapl-dev)"
}

func (notBuiltError) Unwrap() error { return rdma.ErrNoDevice }

// open checks the config, so that a bad plugins.hcl block is reported the
// same with or without uDAPL, and then refuses.
func open(_ context.Context, p sdi.OpenParams) (rdma.Provider, rdma.Settings, error) {
	if _, err := parseConfig(p.Config); err != nil {
		return nil, rdma.Settings{}, err
	}
	return nil, rdma.Settings{}, notBuiltError{}
}
