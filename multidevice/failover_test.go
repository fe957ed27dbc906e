package multidevice

import (
	"errors"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/conntable"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// failoverJob opens n ranks over two loopback networks, "a" and "b",
// routed by a table that asks for failover over both (a first) when
// failover is set, and over a alone with b as a plain alternative
// otherwise.
func failoverJob(t *testing.T, n int, failover bool) ([]*Device, map[string]*sditest.Fabric) {
	fabs := map[string]*sditest.Fabric{}
	factories := map[string]sdi.Factory{}
	for _, name := range []string{"a", "b"} {
		fabs[name] = sditest.NewFabric(sditest.LoopbackOptions{Name: name, Caps: fwdCaps})
		factories[name] = fabs[name].New
	}
	table := &conntable.Table{Version: conntable.Version, Peers: []conntable.Entry{{
		To: conntable.SelectAll, Failover: failover,
		Routes: map[string][]conntable.Route{conntable.AllClasses: {{SubDevice: "a"}, {SubDevice: "b"}}},
	}}}
	devs := openJob(t, jobSpec{n: n, subs: []string{"a", "b"}, factories: factories, table: table,
		forward: ForwardOptions{BlockSize: 2000, Window: 32 << 10}})
	return devs, fabs
}

// TestFailover: ranks stream eager, rendezvous and multi-block messages
// to each other over two networks with failover; rank 1's link to the
// first dies in the middle. What it held is sent again over the other,
// and every message arrives once, intact and in order.
func TestFailover(t *testing.T) {
	devs, fabs := failoverJob(t, 4, true)
	if sub, gws, _ := devs[0].Path(1, 100); sub != "a" || len(gws) != 0 {
		t.Fatalf("rank 0 reaches rank 1 over %q through %v before the failure, want a, directly", sub, gws)
	}
	sizes := []int{100, 3000, 30000} // eager, rendezvous, many blocks
	streamThroughFailure(t, devs, [][2]int{{0, 1}, {1, 2}, {3, 1}, {2, 0}}, 40, func(i int) int { return sizes[i%3] },
		func(i int) bool { return i%4 == 0 }, func() { fabs["a"].Kill(1) })
	var resent, dropped uint64
	for r, d := range devs {
		st := d.ForwardStats()
		resent, dropped = resent+st.Resent, dropped+st.Dropped
		for _, peer := range []int{0, 1, 2, 3} {
			if peer == r || (r != 1 && peer != 1) {
				continue
			}
			if sub, gws, _ := d.Path(peer, 100); sub != "b" || len(gws) != 0 {
				t.Errorf("rank %d reaches rank %d over %q through %v after the failure, want b, directly", r, peer, sub, gws)
			}
		}
	}
	if sub, _, _ := devs[0].Path(2, 100); sub != "a" {
		t.Errorf("rank 0 reaches rank 2 over %q; its link on a did not fail", sub)
	}
	if resent == 0 {
		t.Fatal("no block was sent again: the link died carrying nothing, the test proves nothing")
	}
	t.Logf("%d blocks sent again, %d copies dropped", resent, dropped)
}

// TestFailoverLastRoute: when every route to a rank is gone, what waits
// for it fails with ErrPeerDown instead of hanging, and so do new sends.
func TestFailoverLastRoute(t *testing.T) {
	devs, fabs := failoverJob(t, 2, true)
	buf := make([]byte, 100)
	// One message across first, so the line has been used.
	rr := must(t)(devs[1].Irecv(buf, 0, 1, 0))
	must(t)(devs[0].Isend(numbered(100, 0, 0), 1, 1, 0, false))
	if _, err := wait(t, rr); err != nil {
		t.Fatal(err)
	}
	pending := must(t)(devs[0].Irecv(buf, 1, 2, 0))
	fabs["a"].Kill(1)
	fabs["b"].Kill(1)
	done := make(chan error, 1)
	go func() { _, err := pending.Wait(t.Context()); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrPeerDown) {
			t.Fatalf("receive from the lost rank: %v, want ErrPeerDown", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a receive from a rank with no route left still waits")
	}
	r, err := devs[0].Isend(numbered(100, 0, 1), 1, 1, 0, false)
	if err == nil {
		_, err = wait(t, r)
	}
	if !errors.Is(err, ErrPeerDown) {
		t.Fatalf("send to the lost rank: %v, want ErrPeerDown", err)
	}
}

// Without failover the second route is only a fallback for Connect: the
// traffic goes directly over the first, and losing it loses the peer.
func TestNoFailover(t *testing.T) {
	devs, fabs := failoverJob(t, 2, false)
	if sub, gws, _ := devs[0].Path(1, 100); sub != "a" || len(gws) != 0 {
		t.Fatalf("rank 0 reaches rank 1 over %q through %v, want a, directly", sub, gws)
	}
	buf := make([]byte, 100)
	pending := must(t)(devs[0].Irecv(buf, 1, 2, 0))
	fabs["a"].Kill(1)
	if _, err := wait(t, pending); !errors.Is(err, ErrPeerDown) {
		t.Fatalf("receive from the lost rank: %v, want ErrPeerDown", err)
	}
	if st := devs[0].ForwardStats(); st.Resent != 0 {
		t.Errorf("%d blocks resent without failover", st.Resent)
	}
}
