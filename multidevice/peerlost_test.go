package multidevice

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
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
	lossFull // Send would block, as a full ring does
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
	case lossFull:
		return false, sdi.ErrWouldBlock
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

// lossyJob opens a job of two ranks over a lossySub whose loss mode is
// the returned word, lossNone at first.
func lossyJob(t *testing.T) ([]*Device, *atomic.Int32) {
	mode := new(atomic.Int32)
	fab := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: smallCaps})
	factory := func(log hclog.Logger) sdi.SubDevice { return &lossySub{SubDevice: fab.New(log), mode: mode} }
	return openJob(t, jobSpec{n: 2, subs: []string{"loop"}, factories: map[string]sdi.Factory{"loop": factory}}), mode
}

// lossModes are the two ways lossySub fails a frame without PeerDown.
var lossModes = []struct {
	name string
	mode int32
}{{"at Send", lossNow}, {"at SendDone", lossLater}}

// TestSendToLostPeerIsPeerDown: a send whose frame the subdevice fails
// because it lost the peer reports ErrPeerDown, as one after the loss
// was marked does, whether the failure comes from Send or from SendDone
// and whichever path the message takes.
func TestSendToLostPeerIsPeerDown(t *testing.T) {
	small, large := make([]byte, 16), make([]byte, 4*smallCaps.MaxEager)
	sends := []struct {
		name string
		send func(d *Device) error
	}{
		{"Send", func(d *Device) error { return d.Send(t.Context(), small, 1, 1, 0, false) }},
		{"sync Send", func(d *Device) error { return d.Send(t.Context(), small, 1, 1, 0, true) }},
		{"Isend", func(d *Device) error { _, err := wait(t, must(t)(d.Isend(small, 1, 1, 0, false))); return err }},
		{"Isend rendezvous", func(d *Device) error { _, err := wait(t, must(t)(d.Isend(large, 1, 1, 0, false))); return err }},
	}
	for _, m := range lossModes {
		for _, s := range sends {
			t.Run(m.name+"/"+s.name, func(t *testing.T) {
				devs, mode := lossyJob(t)
				d := devs[0]
				mode.Store(m.mode)
				err := s.send(d)
				if !errors.Is(err, ErrPeerDown) || !errors.Is(err, sdi.ErrPeerUnreachable) {
					t.Fatalf("got %v, want ErrPeerDown wrapping the subdevice's sdi.ErrPeerUnreachable", err)
				}
			})
		}
		// A synchronous send whose frame failed waits for no
		// acknowledgement: its request completed whole and is reusable,
		// for a send that then fails at once on the lost peer.
		t.Run(m.name+"/reuse after a failed synchronous send", func(t *testing.T) {
			devs, mode := lossyJob(t)
			d := devs[0]
			mode.Store(m.mode)
			var r Request
			if err := d.IsendRequest(&r, small, 1, 2, 0, true); err != nil {
				t.Fatal(err)
			}
			if _, err := wait(t, &r); !errors.Is(err, ErrPeerDown) {
				t.Fatalf("got %v, want ErrPeerDown", err)
			}
			if err := d.IsendRequest(&r, small, 1, 2, 0, true); !errors.Is(err, ErrPeerDown) {
				t.Fatalf("reusing it: got %v, want ErrPeerDown", err)
			}
		})
	}
}

// TestFailedFrameLosesPeer: a subdevice that fails a frame without ever
// calling PeerDown has still lost the peer for the device. The frame
// took a sequence number the peer waits for, so a later message would
// arrive and never be matched while its send reported success: the next
// send fails with ErrPeerDown instead, even once the subdevice would
// carry it, and so does a receive from the peer.
func TestFailedFrameLosesPeer(t *testing.T) {
	for _, m := range lossModes {
		t.Run(m.name, func(t *testing.T) {
			devs, mode := lossyJob(t)
			d := devs[0]
			msg := make([]byte, 16)
			mode.Store(m.mode)
			if err := d.Send(t.Context(), msg, 1, 1, 0, false); !errors.Is(err, ErrPeerDown) {
				t.Fatalf("the failed frame's send: got %v, want ErrPeerDown", err)
			}
			mode.Store(lossNone)
			if err := d.Send(t.Context(), msg, 1, 1, 0, false); !errors.Is(err, ErrPeerDown) {
				t.Fatalf("the next send: got %v, want ErrPeerDown (the peer would never match it)", err)
			}
			if _, err := d.Recv(t.Context(), msg, 1, 1, 0); !errors.Is(err, ErrPeerDown) {
				t.Fatalf("a receive from the peer: got %v, want ErrPeerDown", err)
			}
		})
	}
}

// TestQueuedFrameToLostPeer: a frame that waits in the outbox (its
// subdevice would block) when its peer is lost fails with ErrPeerDown at
// its next try, rather than going out once the subdevice takes frames
// again: its peer would not match it, as it follows what the loss took.
// (The subdevice keeps blocking here: switching it back could let a try
// that began before the loss send the frame, as on any link.)
func TestQueuedFrameToLostPeer(t *testing.T) {
	devs, mode := lossyJob(t)
	d := devs[0]
	mode.Store(lossFull)
	r, err := d.Isend(make([]byte, 16), 1, 1, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	sub := slices.IndexFunc(d.subs, func(s *subdev) bool { return s.name == "loop" })
	(&handler{d: d, sub: sub}).PeerDown(1, fmt.Errorf("lossy: rank 1 down: %w", sdi.ErrPeerUnreachable))
	if _, err := wait(t, r); !errors.Is(err, ErrPeerDown) {
		t.Fatalf("got %v, want ErrPeerDown", err)
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
			devs, mode := lossyJob(t)
			d := devs[0]
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

// TestFailedFrameKeepsPlaces: a loss the device infers from a failed
// frame does not end what the subdevice is placing (sdi.Placer: only its
// own report of the peer down does). The receive being placed does not
// complete, handing back a buffer the subdevice may still write into;
// it completes with its message once the subdevice delivers it.
func TestFailedFrameKeepsPlaces(t *testing.T) {
	devs, mode := lossyJob(t)
	d := devs[0]
	sub := slices.IndexFunc(d.subs, func(s *subdev) bool { return s.name == "loop" })
	h := &handler{d: d, sub: sub}
	buf := make([]byte, 300)
	r := must(t)(d.Irecv(buf, 1, 3, 0))
	hb := make([]byte, shortHeaderSize)
	putShort(hb, 3, 0, 0)
	place := h.Place(1, hb, 200) // the subdevice starts filling it
	if place == nil {
		t.Fatal("no place")
	}
	mode.Store(lossNow)
	if err := d.Send(t.Context(), make([]byte, 16), 1, 1, 0, false); !errors.Is(err, ErrPeerDown) {
		t.Fatalf("send: got %v, want ErrPeerDown", err)
	}
	// Not a bound on speed: a completion seen at any time is wrong.
	time.Sleep(50 * time.Millisecond)
	if r.isDone() {
		_, err := r.Result()
		t.Fatalf("the receive completed (%v) while the subdevice still placed its message", err)
	}
	copy(place, pattern(200, 1))
	h.Deliver(1, hb, place)
	st, err := wait(t, r)
	if err != nil || st.Count != 200 || !bytes.Equal(buf[:200], pattern(200, 1)) {
		t.Fatalf("once delivered: %+v, %v", st, err)
	}
}

// TestAckAfterInferredLoss: once rank 0 took rank 1 for lost from a
// failed frame, its unnumbered frames still go out and fail only if the
// link is dead: rank 1, which lost nothing, has its synchronous message
// received by rank 0, and its Ssend completes on the acknowledgement.
func TestAckAfterInferredLoss(t *testing.T) {
	devs, mode := lossyJob(t)
	d := devs[0]
	mode.Store(lossNow)
	if err := d.Send(t.Context(), make([]byte, 16), 1, 1, 0, false); !errors.Is(err, ErrPeerDown) {
		t.Fatalf("the failed send: %v", err)
	}
	mode.Store(lossNone) // the link carries frames again
	rr := must(t)(d.Irecv(make([]byte, 16), AnySource, 7, 0))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	sent := make(chan error, 1)
	go func() { sent <- devs[1].Send(ctx, make([]byte, 16), 0, 7, 0, true) }()
	if _, err := wait(t, rr); err != nil {
		t.Fatalf("rank 0's receive: %v", err)
	}
	if err := <-sent; err != nil {
		t.Fatalf("rank 1's Ssend, whose message rank 0 received: %v", err)
	}
}

// droppingSub keeps every frame while on, and fails them all with
// sdi.ErrNotConnected once gate is closed: a connection dropped under
// several frames.
type droppingSub struct {
	sdi.SubDevice
	on   *atomic.Bool
	gate chan struct{}
	h    sdi.Handler
}

func (l *droppingSub) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	l.h = p.Handler
	return l.SubDevice.Open(ctx, p)
}

func (l *droppingSub) Send(f *sdi.Frame) (bool, error) {
	if !l.on.Load() {
		return l.SubDevice.Send(f)
	}
	tok, peer := f.Token, f.Peer
	go func() {
		<-l.gate
		l.h.SendDone(tok, fmt.Errorf("dropping: rank %d: connection dropped: %w", peer, sdi.ErrNotConnected))
	}()
	return false, nil
}

// TestFramesFailingTogether: every send whose frame failed in one loss
// reports ErrPeerDown, not only the one whose failure marked the peer.
func TestFramesFailingTogether(t *testing.T) {
	on, gate := new(atomic.Bool), make(chan struct{})
	fab := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: smallCaps})
	factory := func(log hclog.Logger) sdi.SubDevice { return &droppingSub{SubDevice: fab.New(log), on: on, gate: gate} }
	d := openJob(t, jobSpec{n: 2, subs: []string{"loop"}, factories: map[string]sdi.Factory{"loop": factory}})[0]
	on.Store(true)
	defer on.Store(false)
	var rs []*Request
	for i := range 4 {
		rs = append(rs, must(t)(d.Isend(make([]byte, 16), 1, i, 0, false)))
	}
	close(gate)
	for i, r := range rs {
		if _, err := wait(t, r); !errors.Is(err, ErrPeerDown) {
			t.Errorf("send %d: %v, want ErrPeerDown", i, err)
		}
	}
}

// TestMrecvAfterClose: a message taken by Improbe and received with Mrecv
// after Close fails with ErrClosed, as Irecv does then. A large one's
// receive was filed after Close had swept the receives, sent its
// clear-to-send into a stopped outbox, and waited forever.
func TestMrecvAfterClose(t *testing.T) {
	for _, size := range []int{10, 3000} { // eager, rendezvous
		devs := loopJob(t, 2, smallCaps)
		must(t)(devs[0].Isend(pattern(size, 1), 1, 5, 0, false))
		var m *Message
		for deadline := time.Now().Add(10 * time.Second); m == nil && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			var err error
			if m, _, _, err = devs[1].Improbe(0, 5, 0); err != nil {
				t.Fatal(err)
			}
		}
		if m == nil {
			t.Fatal("the message never came")
		}
		closeJob(t, devs)
		done := make(chan error, 1)
		go func() {
			_, err := devs[1].Mrecv(context.Background(), m, make([]byte, size))
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("Mrecv of %d bytes after Close: %v, want ErrClosed", size, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Mrecv of %d bytes after Close still blocked", size)
		}
	}
}
