package udapl

import (
	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/sdi"
)

func init() { sdi.Register("udapl", New) }

// New returns an unopened uDAPL subdevice. In a build without the udapl tag
// its Open fails with an error wrapping [rdma.ErrNoDevice] that says how to
// rebuild.
func New(logger hclog.Logger) sdi.SubDevice {
	return rdma.New(sdi.Info{Name: "udapl", Version: "0.1.0", APIVersions: []string{sdi.APIVersion}}, open, logger)
}
