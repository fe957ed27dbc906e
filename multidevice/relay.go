package multidevice

import (
	"context"
	"fmt"
	"sync/atomic"
)

// Dedicated relays (GridMPI's relay on a cluster's front end). A relay is a
// rank of the bootstrap job that opens its device with Options.Relay: it
// loads subdevices, connects and publishes like any rank, so the automatic
// routing (reach.go) and connection tables can send through it, but it
// takes no application rank. Relays are the last ranks of the job: a job
// of N application ranks and K relays is a bootstrap job of N+K ranks in
// which ranks N..N+K-1 are relays. Every rank publishes its role under the
// bootstrap key "relay" in the first fence, so the application's world is
// N ranks (Device.Size, and adi's World) on every rank without further
// configuration; a rank-numbered table entry ("rank:N+1") or a host name
// reaches a relay for "via".
//
// A relay's life is one call: Open with Options.Relay, then Close, which
// forwards until every rank of the job has reached Close and then returns
// (cmd/mdrelay does this).

// publishRole tells the other ranks whether this one is a relay.
func (d *Device) publishRole() error {
	role := []byte{0}
	if d.isRelay {
		role[0] = 1
	}
	if err := d.boot.Put("relay", role); err != nil {
		return fmt.Errorf("multidevice: publish role: %w", err)
	}
	return nil
}

// learnRoles counts the application ranks and checks that relays come last.
func (d *Device) learnRoles(ctx context.Context) error {
	app := -1
	for r := range d.size {
		b, err := d.boot.Get(ctx, r, "relay")
		if err != nil {
			return fmt.Errorf("multidevice: role of rank %d: %w", r, err)
		}
		if len(b) != 1 || b[0] > 1 {
			return fmt.Errorf("multidevice: role of rank %d: %q is neither 0 (application) nor 1 (relay)", r, b)
		}
		switch {
		case b[0] == 1 && app < 0:
			app = r
		case b[0] == 0 && app >= 0:
			return fmt.Errorf("multidevice: rank %d is a relay but rank %d after it is not; relays must be the last ranks of the job", app, r)
		}
	}
	if app < 0 {
		app = d.size
	}
	if app == 0 {
		return fmt.Errorf("multidevice: all %d ranks of the job are relays; a job needs an application rank", d.size)
	}
	d.appSize = app
	return nil
}

// relayState lets a relay outlive a failed final fence: when a rank of the
// job dies, the fence fails at once for everybody, but the application's
// other ranks may still be forwarding through this relay. It then serves
// until every application rank it links directly has closed its links.
type relayState struct {
	gone []atomic.Bool // [rank] a subdevice reported it down
	kick chan struct{} // capacity 1: a rank went
}

// relayPeerGone records, on a relay, that peer's link went down.
func (d *Device) relayPeerGone(peer int) {
	d.relayst.gone[peer].Store(true)
	select {
	case d.relayst.kick <- struct{}{}:
	default:
	}
}

// relayLinger waits until every application rank this relay reaches
// directly is gone, or ctx ends.
func (d *Device) relayLinger(ctx context.Context) error {
	for {
		left := 0
		for r := range d.appSize {
			if d.fwd.paths[r][0] == nil && !d.relayst.gone[r].Load() {
				left++
			}
		}
		if left == 0 {
			return nil
		}
		d.log.Debug("final fence failed, forwarding until the application's ranks leave", "left", left)
		select {
		case <-d.relayst.kick:
		case <-ctx.Done():
			return fmt.Errorf("multidevice: relay: %d application ranks still linked: %w", left, ctx.Err())
		}
	}
}

// IsRelay reports whether this device is a dedicated relay.
func (d *Device) IsRelay() bool { return d.isRelay }
