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
			MaxHeader: sdi.MinHeader + 4,
			MaxEager:  64,
			MaxFrame:  200,
			Reach:     sdi.ReachHost,
			Flags:     sdi.FlagReliable | sdi.FlagOrdered,
		},
		QueueLimit: 2,
	})
	Run(t, Harness{New: func(testing.TB) sdi.SubDevice { return fabric.New(hclog.NewNullLogger()) }, Peers: 3})
}

// threeRanks opens three connected loopback ranks on fabric, rank 0
// having sent rank 1 one frame.
func threeRanks(t *testing.T, fabric *Fabric, name string) *env {
	t.Helper()
	e := newEnv(t, Harness{New: func(testing.TB) sdi.SubDevice { return fabric.New(nil) }, Peers: 3}, name, defaultTiming)
	e.open(t)
	e.connectAll(t)
	e.mustSend(t, 0, e.frame(msg{from: 0, to: 1, stream: 1, size: 8}))
	e.awaitStream(t, 1, 0, 1, 1)
	return e
}

func TestFabricKill(t *testing.T) {
	fabric := NewFabric(LoopbackOptions{})
	e := threeRanks(t, fabric, "Kill")

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

// TestFabricSever: a severed rank lives on, and both ends of its link hear
// that it is down; frames either way fail with SendDone or at Send.
func TestFabricSever(t *testing.T) {
	fabric := NewFabric(LoopbackOptions{})
	e := threeRanks(t, fabric, "Sever")
	// Frames of rank 1 still on their way when the link dies each get
	// their one SendDone, delivered or failed, never silence.
	var burst []uint64
	for i := range 200 {
		f := e.frame(msg{from: 1, to: 0, stream: 3, seq: uint64(i), size: 100})
		if done := e.mustSend(t, 1, f); !done {
			burst = append(burst, f.Token)
		}
	}

	fabric.Sever(1)
	for _, token := range burst {
		e.awaitToken(t, token)
		e.mu.Lock()
		err := e.tokens[token].err
		e.mu.Unlock()
		if err != nil && !errors.Is(err, sdi.ErrPeerUnreachable) {
			t.Errorf("frame cut off by the severed link completed with %v, want sdi.ErrPeerUnreachable", err)
		}
	}
	e.await(t, func() (bool, string) {
		return len(e.recs[0].peerDowns) > 0 && len(e.recs[2].peerDowns) > 0 && len(e.recs[1].peerDowns) == 2,
			"PeerDown on ranks 0 and 2 for rank 1, and on rank 1 for both"
	})
	e.mu.Lock()
	for _, r := range []int{0, 2} {
		if pd := e.recs[r].peerDowns[0]; pd.peer != 1 || !errors.Is(pd.err, sdi.ErrPeerUnreachable) {
			t.Errorf("rank %d: PeerDown(%d, %v), want rank 1 and sdi.ErrPeerUnreachable", r, pd.peer, pd.err)
		}
	}
	seen := map[sdi.Rank]bool{}
	for _, pd := range e.recs[1].peerDowns {
		seen[pd.peer] = true
		if !errors.Is(pd.err, sdi.ErrPeerUnreachable) {
			t.Errorf("rank 1: PeerDown(%d, %v), want sdi.ErrPeerUnreachable", pd.peer, pd.err)
		}
	}
	e.mu.Unlock()
	if !seen[0] || !seen[2] {
		t.Errorf("rank 1 heard PeerDown for %v, want ranks 0 and 2", seen)
	}
	if _, err := e.sendOnce(1, e.sds[1], e.frame(msg{from: 1, to: 0, size: 1})); !errors.Is(err, sdi.ErrPeerUnreachable) {
		t.Errorf("Send from a severed rank: %v, want sdi.ErrPeerUnreachable", err)
	}
	// A frame to it is refused, through SendDone if Send took it.
	f := e.frame(msg{from: 0, to: 1, size: 100})
	if done, err := e.sendOnce(0, e.sds[0], f); err == nil && !done {
		e.awaitToken(t, f.Token)
		e.mu.Lock()
		err = e.tokens[f.Token].err
		e.mu.Unlock()
		if !errors.Is(err, sdi.ErrPeerUnreachable) {
			t.Errorf("frame to a severed rank completed with %v, want sdi.ErrPeerUnreachable", err)
		}
	} else if !errors.Is(err, sdi.ErrPeerUnreachable) {
		t.Errorf("Send to a severed rank: done=%v, %v", done, err)
	}
	// The others still talk.
	e.mustSend(t, 0, e.frame(msg{from: 0, to: 2, stream: 2, size: 8}))
	e.awaitStream(t, 2, 0, 2, 1)
	// Nobody connects to or from a severed rank; once its link is mended
	// both ends connect again and frames flow.
	for _, c := range [][2]int{{0, 1}, {1, 0}} {
		if err := e.sds[c[0]].Connect(e.ctx, sdi.Rank(c[1]), e.locals[c[1]].Addr); !errors.Is(err, sdi.ErrPeerUnreachable) {
			t.Errorf("Connect from rank %d to rank %d over a severed link: %v, want sdi.ErrPeerUnreachable", c[0], c[1], err)
		}
	}
	fabric.Mend(1)
	for _, c := range [][2]int{{0, 1}, {1, 0}} {
		if err := e.sds[c[0]].Connect(e.ctx, sdi.Rank(c[1]), e.locals[c[1]].Addr); err != nil {
			t.Errorf("Connect from rank %d to rank %d after Mend: %v", c[0], c[1], err)
		}
	}
	e.mustSend(t, 1, e.frame(msg{from: 1, to: 0, stream: 4, size: 8}))
	e.awaitStream(t, 0, 1, 4, 1)
	if err := e.closeRank(1); err != nil {
		t.Errorf("Close of a once severed rank: %v", err)
	}
	e.mu.Lock()
	for _, r := range e.recs {
		r.peerDowns = nil // expected, not violations
	}
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
