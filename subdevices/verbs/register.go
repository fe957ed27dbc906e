package verbs

import (
	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/sdi"
)

func init() { sdi.Register("verbs", New) }

// New returns an unopened verbs subdevice. Its Open fails with an error
// wrapping rdma.ErrNoDevice on a machine without a usable RDMA device, or in
// a binary built without the verbs tag.
func New(logger hclog.Logger) sdi.SubDevice { return newOn(realHost, logger) }

// newOn is New on the machine h describes.
func newOn(h host, logger hclog.Logger) sdi.SubDevice {
	return rdma.New(sdi.Info{Name: "verbs", Version: "0.1.0", APIVersions: []string{sdi.APIVersion}}, h.open, logger)
}
