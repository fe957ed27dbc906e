package multidevice

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// Loss modes of lossySub.
const (
	lossNone  = iota
	lossNow   // Send fails at once
	lossLater // Send keeps the frame, SendDone fails it
	// Send keeps the frame; PeerDown comes, then SendDone fails the
	// frame (lossDownFirst) or completes it (lossDownFirstSent), the
	// order a link that dies under a frame may report it in.
	lossDownFirst
	lossDownFirstSent
)

// lossySub is a subdevice that, while mode says so, fails every frame as
// a subdevice that lost its peer does, with sdi.ErrPeerUnreachable, and
// never calls PeerDown: the report the device gets first when a link dies
// under a frame.
type lossySub struct {
	sdi.SubDevice
	mode *atomic.Int32
	h    sdi.Handler
}

func (l *lossySub) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	l.h = p.Handler
	return l.SubDevice.Open(ctx, p)
}

func (l *lossySub) Send(f *sdi.Frame) (bool, error) {
	err := fmt.Errorf("lossy: rank %d down: %w", f.Peer, sdi.ErrPeerUnreachable)
	switch l.mode.Load() {
	case lossNow:
		return false, err
	case lossLater:
		go l.h.SendDone(f.Token, err)
		return false, nil
	case lossDownFirst, lossDownFirstSent:
		sent := l.mode.Load() == lossDownFirstSent
		go func() {
			l.h.PeerDown(f.Peer, err)
			if sent {
				err = nil
			}
			l.h.SendDone(f.Token, err)
		}()
		return false, nil
	}
	return l.SubDevice.Send(f)
}

// TestSendToLostPeerIsPeerDown: a send whose frame the subdevice fails
// because it lost the peer reports ErrPeerDown, as one after the loss
// was marked does, whether the failure comes from Send or from SendDone
// and whichever path the message takes.
func TestSendToLostPeerIsPeerDown(t *testing.T) {
	mode := new(atomic.Int32)
	fab := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: smallCaps})
	factory := func(log hclog.Logger) sdi.SubDevice { return &lossySub{SubDevice: fab.New(log), mode: mode} }
	devs := openJob(t, jobSpec{n: 2, subs: []string{"loop"}, factories: map[string]sdi.Factory{"loop": factory}})
	d := devs[0]
	small, large := make([]byte, 16), make([]byte, 4*smallCaps.MaxEager)

	sends := []struct {
		name string
		send func() error
	}{
		{"Send", func() error { return d.Send(t.Context(), small, 1, 1, 0, false) }},
		{"sync Send", func() error { return d.Send(t.Context(), small, 1, 1, 0, true) }},
		{"Isend", func() error { _, err := wait(t, must(t)(d.Isend(small, 1, 1, 0, false))); return err }},
		{"Isend rendezvous", func() error { _, err := wait(t, must(t)(d.Isend(large, 1, 1, 0, false))); return err }},
	}
	for _, m := range []struct {
		name string
		mode int32
	}{{"at Send", lossNow}, {"at SendDone", lossLater}} {
		for _, s := range sends {
			t.Run(m.name+"/"+s.name, func(t *testing.T) {
				mode.Store(m.mode)
				defer mode.Store(lossNone)
				err := s.send()
				if !errors.Is(err, ErrPeerDown) || !errors.Is(err, sdi.ErrPeerUnreachable) {
					t.Fatalf("got %v, want ErrPeerDown wrapping the subdevice's sdi.ErrPeerUnreachable", err)
				}
			})
		}
		// A synchronous send whose frame failed waits for no
		// acknowledgement: its request completed whole and is reusable.
		// (Only for another failing send: the failed messages took
		// sequence numbers the peer waits for, as after any loss.)
		t.Run(m.name+"/reuse after a failed synchronous send", func(t *testing.T) {
			mode.Store(m.mode)
			defer mode.Store(lossNone)
			var r Request
			for i := range 2 {
				if err := d.IsendRequest(&r, small, 1, 2, 0, true); err != nil {
					t.Fatalf("send %d: %v", i, err)
				}
				if _, err := wait(t, &r); !errors.Is(err, ErrPeerDown) {
					t.Fatalf("send %d: got %v, want ErrPeerDown", i, err)
				}
			}
		})
	}
}

// TestSyncSendPeerDownFirst: a synchronous send whose peer is reported
// lost before its frame's completion fails with ErrPeerDown and, once
// the frame is done (failed or sent), is reusable: the loss took the
// acknowledgement it waited for off its count.
func TestSyncSendPeerDownFirst(t *testing.T) {
	for _, m := range []struct {
		name string
		mode int32
	}{{"frame failed", lossDownFirst}, {"frame sent", lossDownFirstSent}} {
		t.Run(m.name, func(t *testing.T) {
			mode := new(atomic.Int32)
			fab := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: smallCaps})
			factory := func(log hclog.Logger) sdi.SubDevice { return &lossySub{SubDevice: fab.New(log), mode: mode} }
			d := openJob(t, jobSpec{n: 2, subs: []string{"loop"}, factories: map[string]sdi.Factory{"loop": factory}})[0]
			mode.Store(m.mode)
			var r Request
			if err := d.IsendRequest(&r, make([]byte, 16), 1, 2, 0, true); err != nil {
				t.Fatal(err)
			}
			if _, err := wait(t, &r); !errors.Is(err, ErrPeerDown) {
				t.Fatalf("got %v, want ErrPeerDown", err)
			}
			for deadline := time.Now().Add(10 * time.Second); !r.reusable(); time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the failed synchronous send never became reusable (%d pending)", r.pending.Load())
				}
			}
		})
	}
}
