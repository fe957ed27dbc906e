package sditest

import (
	"context"
	"errors"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/sdi"
)

func TestLoopbackConformance(t *testing.T) {
	fabric := NewFabric(LoopbackOptions{})
	Run(t, Harness{New: func(testing.TB) sdi.SubDevice { return fabric.New(hclog.NewNullLogger()) }})
}

// Tiny caps and queues put every frame near a limit and make Send return
// ErrWouldBlock all the time; three peers exercise fan-in and fan-out.
func TestLoopbackConformanceTiny(t *testing.T) {
	fabric := NewFabric(LoopbackOptions{
		Caps: sdi.Caps{
			MaxHeader: headerSize + 4,
			MaxEager:  64,
			MaxFrame:  200,
			Reach:     sdi.ReachHost,
			Flags:     sdi.FlagReliable | sdi.FlagOrdered,
		},
		QueueLimit: 2,
	})
	Run(t, Harness{New: func(testing.TB) sdi.SubDevice { return fabric.New(hclog.NewNullLogger()) }, Peers: 3})
}

func TestFabricKill(t *testing.T) {
	fabric := NewFabric(LoopbackOptions{})
	e := newEnv(t, Harness{New: func(testing.TB) sdi.SubDevice { return fabric.New(nil) }, Peers: 3}, "Kill", defaultTiming)
	e.open(t)
	e.connectAll(t)
	e.mustSend(t, 0, e.frame(msg{from: 0, to: 1, stream: 1, size: 8}))
	e.awaitStream(t, 1, 0, 1, 1)

	fabric.Kill(1)
	e.recs[1].markClosed() // a dead rank's Handler hears nothing more
	e.await(t, func() (bool, string) {
		return len(e.recs[0].peerDowns) > 0 && len(e.recs[2].peerDowns) > 0, "PeerDown on ranks 0 and 2"
	})
	for _, r := range []int{0, 2} {
		pd := e.recs[r].peerDowns[0]
		if pd.peer != 1 || !errors.Is(pd.err, sdi.ErrPeerUnreachable) {
			t.Errorf("rank %d: PeerDown(%d, %v), want rank 1 and sdi.ErrPeerUnreachable", r, pd.peer, pd.err)
		}
	}
	if _, err := e.sendOnce(0, e.sds[0], e.frame(msg{from: 0, to: 1, size: 1})); !errors.Is(err, sdi.ErrPeerUnreachable) {
		t.Errorf("Send to a killed rank: %v, want sdi.ErrPeerUnreachable", err)
	}
	if _, err := e.sendOnce(1, e.sds[1], e.frame(msg{from: 1, to: 0, size: 1})); !errors.Is(err, sdi.ErrClosed) {
		t.Errorf("Send from a killed rank: %v, want sdi.ErrClosed", err)
	}
	// The survivors still talk.
	e.mustSend(t, 0, e.frame(msg{from: 0, to: 2, stream: 2, size: 8}))
	e.awaitStream(t, 2, 0, 2, 1)
	if err := e.sds[1].Close(e.ctx); err != nil {
		t.Errorf("Close of a killed rank: %v", err)
	}
	e.mu.Lock()
	e.recs[0].peerDowns, e.recs[2].peerDowns = nil, nil // expected, not a violation
	e.mu.Unlock()
	e.finish(t)
}

// Cards name their fabric: another fabric's instance with the same id is a
// stranger, not a peer.
func TestLoopbackRefusesOtherFabric(t *testing.T) {
	a, b := NewFabric(LoopbackOptions{}), NewFabric(LoopbackOptions{})
	p := func(rank sdi.Rank) sdi.OpenParams {
		return sdi.OpenParams{Rank: rank, Size: 2, Host: Host, JobID: "j", APIVersion: sdi.APIVersion, Handler: handlerFuncs{}}
	}
	ctx := context.Background()
	sa, sb := a.New(nil), b.New(nil)
	if _, err := sa.Open(ctx, p(0)); err != nil {
		t.Fatal(err)
	}
	defer sa.Close(ctx)
	lb, err := sb.Open(ctx, p(1))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(ctx)
	if err := sa.Connect(ctx, 1, lb.Addr); !errors.Is(err, sdi.ErrPeerUnreachable) {
		t.Errorf("Connect with another fabric's card: %v, want sdi.ErrPeerUnreachable", err)
	}
	if _, err := sa.Open(ctx, p(0)); err == nil {
		t.Error("second Open succeeded")
	}
}
