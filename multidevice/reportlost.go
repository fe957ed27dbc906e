package multidevice

import (
	"fmt"

	"github.com/hpc-multidevice/multidevice/bootstrap"
)

// reportLost tells the launcher that subdevice sub lost peer, if the
// bootstrap takes such reports (mdrun's does; see
// bootstrap.LostReporter), so that when ranks fail together it names the
// one whose loss the others' failures follow. Its callers run it where
// the device takes the loss of a peer it carries (PeerDown, frameLost) or
// of the last route of its failover line (trunkDown), before any request
// fails for it, so the report is out before the application can exit
// because of it; not while finalizing, when peers close their links as
// they finish, nor for a subdevice that carries none of the peer's routes
// (a standby link), which is no loss.
func (d *Device) reportLost(sub, peer int, err error) {
	if r, ok := d.boot.(bootstrap.LostReporter); ok {
		r.ReportLost(peer, fmt.Sprintf("over %q: %v", d.subs[sub].name, err))
	}
}
