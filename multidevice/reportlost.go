package multidevice

import (
	"fmt"

	"github.com/hpc-multidevice/multidevice/bootstrap"
)

// reportLost tells the launcher that subdevice sub lost peer, if the
// bootstrap takes such reports (mdrun's does; see
// bootstrap.LostReporter), so that when ranks fail together it names the
// one whose loss the others' failures follow. It runs before any request
// fails for the loss, so the report is out before the application can
// exit because of it. Not while finalizing: peers then close their links
// as they finish.
func (d *Device) reportLost(sub, peer int, err error) {
	if r, ok := d.boot.(bootstrap.LostReporter); ok && !d.finalizing.Load() {
		r.ReportLost(peer, fmt.Sprintf("over %q: %v", d.subs[sub].name, err))
	}
}
