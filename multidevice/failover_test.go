package multidevice

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/conntable"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// failoverJob opens n ranks over two loopback networks, "a" and "b",
// routed by a table that asks for failover over both (a first, b on
// standby with standby set) when failover is set, and over a alone with b
// as a plain alternative otherwise. sends counts the frames each
// network's subdevices were given.
func failoverJob(t *testing.T, n int, failover, standby bool) (devs []*Device, fabs map[string]*sditest.Fabric, sends map[string]*atomic.Int64) {
	return failoverJobCaps(t, n, failover, standby, fwdCaps)
}

// failoverJobCaps is failoverJob over subdevices with the given caps.
func failoverJobCaps(t *testing.T, n int, failover, standby bool, caps sdi.Caps) (devs []*Device, fabs map[string]*sditest.Fabric, sends map[string]*atomic.Int64) {
	return failoverJobOpts(t, n, failover, standby, caps, failoverForward)
}

// failoverForward are the forward options of failoverJob.
var failoverForward = ForwardOptions{BlockSize: 2000, Window: 32 << 10}

// failoverJobOpts is failoverJobCaps with the given forward options.
func failoverJobOpts(t *testing.T, n int, failover, standby bool, caps sdi.Caps, fwd ForwardOptions) (devs []*Device, fabs map[string]*sditest.Fabric, sends map[string]*atomic.Int64) {
	js, fabs, sends := failoverSpec(n, failover, standby, caps, fwd)
	return openJob(t, js), fabs, sends
}

// failoverSpec is the job failoverJobOpts opens, for a test that opens it
// its own way.
func failoverSpec(n int, failover, standby bool, caps sdi.Caps, fwd ForwardOptions) (js jobSpec, fabs map[string]*sditest.Fabric, sends map[string]*atomic.Int64) {
	fabs, sends = map[string]*sditest.Fabric{}, map[string]*atomic.Int64{}
	factories := map[string]sdi.Factory{}
	for _, name := range []string{"a", "b"} {
		fab, count := sditest.NewFabric(sditest.LoopbackOptions{Name: name, Caps: caps}), new(atomic.Int64)
		fabs[name], sends[name] = fab, count
		factories[name] = func(log hclog.Logger) sdi.SubDevice { return countingSub{fab.New(log), count} }
	}
	table := &conntable.Table{Version: conntable.Version, Peers: []conntable.Entry{{
		To: conntable.SelectAll, Failover: failover,
		Routes: map[string][]conntable.Route{conntable.AllClasses: {{SubDevice: "a"}, {SubDevice: "b", Standby: standby}}},
	}}}
	js = jobSpec{n: n, subs: []string{"a", "b"}, factories: factories, table: table, forward: fwd}
	return js, fabs, sends
}

// countingSub counts the frames its subdevice is given.
type countingSub struct {
	sdi.SubDevice
	sends *atomic.Int64
}

func (c countingSub) Send(f *sdi.Frame) (bool, error) {
	c.sends.Add(1)
	return c.SubDevice.Send(f)
}

// TestFailover: ranks stream eager, rendezvous and multi-block messages
// to each other over two networks with failover; rank 1's link to the
// first dies in the middle. What it held is sent again over the other,
// and every message arrives once, intact and in order. Blocks travel
// split where the subdevices take 128-byte headers (rendezvous data then
// stays in the application's buffer until acknowledged), else with the
// inner header in the payload, copied.
func TestFailover(t *testing.T) {
	split := fwdCaps
	combined := fwdCaps
	combined.MaxHeader = headerSize
	for _, tt := range []struct {
		name string
		caps sdi.Caps
	}{{"split", split}, {"combined", combined}} {
		t.Run(tt.name, func(t *testing.T) { testFailover(t, tt.caps) })
	}
}

func testFailover(t *testing.T, caps sdi.Caps) {
	devs, fabs, sends := failoverJobCaps(t, 4, true, false, caps)
	if got, want := devs[0].fwd.split[1][0], caps.MaxHeader >= 2*headerSize; got != want {
		t.Fatalf("the line to rank 1 sends blocks split: %v, want %v", got, want)
	}
	if sub, gws, _ := devs[0].Path(1, 100); sub != "a" || len(gws) != 0 {
		t.Fatalf("rank 0 reaches rank 1 over %q through %v before the failure, want a, directly", sub, gws)
	}
	sizes := []int{100, 3000, 30000} // eager, rendezvous, many blocks
	streamThroughFailure(t, devs, [][2]int{{0, 1}, {1, 2}, {3, 1}, {2, 0}}, 40, func(i int) int { return sizes[i%3] },
		func(i int) bool { return i%4 == 0 }, func() { fabs["a"].Sever(1) })
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
	t.Logf("%d blocks sent again, %d copies dropped; frames over a %d, over b %d", resent, dropped, sends["a"].Load(), sends["b"].Load())
}

// TestFailoverStandby: with the second route on standby it carries
// nothing while the first lives, and everything once it died.
func TestFailoverStandby(t *testing.T) {
	devs, fabs, sends := failoverJob(t, 2, true, true)
	var before int64
	streamThroughFailure(t, devs, [][2]int{{0, 1}, {1, 0}}, 30, func(i int) int { return []int{100, 3000, 30000}[i%3] },
		func(i int) bool { return i%4 == 0 }, func() {
			before = sends["b"].Load()
			fabs["a"].Sever(1)
		})
	if before != 0 {
		t.Errorf("the standby route carried %d frames while the first lived", before)
	}
	if sends["b"].Load() == 0 {
		t.Error("the standby route carried nothing after the first died")
	}
	for r := range devs {
		if sub, _, _ := devs[r].Path(1-r, 100); sub != "b" {
			t.Errorf("rank %d reaches rank %d over %q after the failure, want b", r, 1-r, sub)
		}
	}
}

// TestFailoverRevives: a route whose link comes back carries traffic
// again. Rank 1's link to network a dies in the middle of a stream; once
// it is mended, both ranks connect over a again on their own and the next
// stream goes over it, intact and in order, and a spare on standby stands
// by again.
func TestFailoverRevives(t *testing.T) {
	for _, standby := range []bool{false, true} {
		t.Run(fmt.Sprintf("standby=%v", standby), func(t *testing.T) {
			devs, fabs, sends := failoverJobOpts(t, 2, true, standby, fwdCaps,
				ForwardOptions{BlockSize: 2000, Window: 32 << 10, Retry: 20 * time.Millisecond})
			pairs := [][2]int{{0, 1}, {1, 0}}
			size := func(i int) int { return []int{100, 3000, 30000}[i%3] }
			ssend := func(i int) bool { return i%4 == 0 }
			streamThroughFailure(t, devs, pairs, 30, size, ssend, func() { fabs["a"].Sever(1) })
			for r := range devs {
				if sub, _, _ := devs[r].Path(1-r, 100); sub != "b" {
					t.Fatalf("rank %d reaches rank %d over %q while a is cut, want b", r, 1-r, sub)
				}
			}
			fabs["a"].Mend(1)
			deadline := time.Now().Add(10 * time.Second)
			for r := range devs {
				for {
					sub, _, _ := devs[r].Path(1-r, 100)
					if sub == "a" {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("rank %d still reaches rank %d over %q 10 s after the link came back", r, 1-r, sub)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			a, b := sends["a"].Load(), sends["b"].Load()
			streamThroughFailure(t, devs, pairs, 30, size, ssend, func() {})
			if sends["a"].Load() == a {
				t.Error("the route that came back carried nothing")
			}
			if standby && sends["b"].Load() != b {
				t.Errorf("the standby route carried %d frames after the first came back", sends["b"].Load()-b)
			}
		})
	}
}

// A route that never comes back is tried again at growing pauses, and the
// attempts stop when the Device closes: no goroutine is left behind.
func TestFailoverRetryStops(t *testing.T) {
	devs, fabs, _ := failoverJobOpts(t, 2, true, false, fwdCaps,
		ForwardOptions{BlockSize: 2000, Window: 32 << 10, Retry: time.Millisecond})
	streamThroughFailure(t, devs, [][2]int{{0, 1}, {1, 0}}, 9, func(int) int { return 3000 }, func(int) bool { return false },
		func() { fabs["a"].Sever(1) })
	time.Sleep(50 * time.Millisecond) // several attempts, all refused
	for r, d := range devs {
		if sub, _, _ := d.Path(1-r, 100); sub != "b" {
			t.Errorf("rank %d reaches rank %d over %q, whose link is still cut", r, 1-r, sub)
		}
	}
	closeJob(t, devs)
}

// TestFailoverLastRoute: when every route to a rank is gone, what waits
// for it fails with ErrPeerDown instead of hanging, and so do new sends.
func TestFailoverLastRoute(t *testing.T) {
	devs, fabs, _ := failoverJob(t, 2, true, false)
	buf := make([]byte, 100)
	// One message across first, so the line has been used.
	rr := must(t)(devs[1].Irecv(buf, 0, 1, 0))
	must(t)(devs[0].Isend(numbered(100, 0, 0), 1, 1, 0, false))
	if _, err := wait(t, rr); err != nil {
		t.Fatal(err)
	}
	pending := must(t)(devs[0].Irecv(buf, 1, 2, 0))
	fabs["a"].Sever(1)
	fabs["b"].Sever(1)
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

// loseFailoverRank opens two ranks with failover over "a" and "b", rank
// 0's bootstrap taking reports of lost ranks, cuts rank 1 off both
// networks once a message went across, and returns the reports rank 0
// made (a while after) and how its receive from rank 1 ended.
func loseFailoverRank(t *testing.T) (reports []string, err error) {
	t.Helper()
	js, fabs, _ := failoverSpec(2, true, false, fwdCaps, failoverForward)
	devs, rb := reportingOpen(t, js)
	buf := make([]byte, 100)
	rr := must(t)(devs[1].Irecv(buf, 0, 1, 0))
	must(t)(devs[0].Isend(numbered(100, 0, 0), 1, 1, 0, false))
	if _, err := wait(t, rr); err != nil {
		t.Fatal(err)
	}
	pending := must(t)(devs[0].Irecv(buf, 1, 2, 0))
	rb.watch(pending)
	fabs["a"].Sever(1)
	fabs["b"].Sever(1)
	_, err = wait(t, pending)
	time.Sleep(200 * time.Millisecond) // for a second report, if one comes
	return rb.got(), err
}

// TestFailoverLastRouteReportedLost: a rank whose failover line lost its
// last route is reported to the launcher, once, before the receive from
// it fails, as a rank lost over a plain route is (reportLost). Neither
// PeerDown nor a failed frame reports it, since a failover route does not
// carry the rank directly; it went unreported, and mdrun could not name
// the rank whose loss the others' failures followed.
func TestFailoverLastRouteReportedLost(t *testing.T) {
	reports, err := loseFailoverRank(t)
	if !errors.Is(err, ErrPeerDown) {
		t.Fatalf("receive from the lost rank: %v, want ErrPeerDown", err)
	}
	if len(reports) != 1 || !strings.HasPrefix(reports[0], "rank 1: ") || strings.Contains(reports[0], "after") {
		t.Fatalf("reports %q: want exactly one, of rank 1, made before the receive failed", reports)
	}
}

// TestFailoverLastRouteSaysWhy: a request failed because a failover line
// lost its last route says why that route went (the subdevice's reason),
// as one failed by the loss of a plain route does. The line's error kept
// only a gateway's lost notice, which a failover route never sends.
func TestFailoverLastRouteSaysWhy(t *testing.T) {
	_, err := loseFailoverRank(t)
	if !errors.Is(err, ErrPeerDown) || !strings.Contains(err.Error(), "link is down") {
		t.Fatalf("receive from the lost rank: %v; want ErrPeerDown saying why (the loopback's \"link is down\")", err)
	}
}

// Without failover the second route is only a fallback for Connect: the
// traffic goes directly over the first, and losing it loses the peer.
func TestNoFailover(t *testing.T) {
	devs, fabs, _ := failoverJob(t, 2, false, false)
	if sub, gws, _ := devs[0].Path(1, 100); sub != "a" || len(gws) != 0 {
		t.Fatalf("rank 0 reaches rank 1 over %q through %v, want a, directly", sub, gws)
	}
	buf := make([]byte, 100)
	pending := must(t)(devs[0].Irecv(buf, 1, 2, 0))
	fabs["a"].Sever(1)
	if _, err := wait(t, pending); !errors.Is(err, ErrPeerDown) {
		t.Fatalf("receive from the lost rank: %v, want ErrPeerDown", err)
	}
	if st := devs[0].ForwardStats(); st.Resent != 0 {
		t.Errorf("%d blocks resent without failover", st.Resent)
	}
}

// creditEater loses, without a word, the credit messages given to its
// subdevice while eating says so (as a connection that breaks while it is
// being replaced can): Send reports them sent.
type creditEater struct {
	sdi.SubDevice
	eating func() bool
	eaten  *atomic.Int32
}

func (c creditEater) Send(f *sdi.Frame) (bool, error) {
	if h, err := decodeHeader(f.Header, 1<<20); err == nil && h.kind == kindSys && h.tag == sysCredit && c.eating() {
		c.eaten.Add(1)
		return true, nil
	}
	return c.SubDevice.Send(f)
}

// TestFailoverLostCredit: on a failover line, the destination's credits go
// missing for a while although no route fails, so the source's window
// fills and nothing reports a trunk down; once they stop going missing,
// the destination has nothing new to credit. The line's watch sends the
// oldest block again, the destination answers the copy with a credit,
// and the stream goes on; without the watch it would wait until Close.
// Credits go missing until the source's first nudge, not for a set time:
// a stream the race detector slows may not fill its window in any given
// time, and credits that stop going missing before it stalls prove nothing.
func TestFailoverLostCredit(t *testing.T) {
	var source atomic.Pointer[Device] // set after Open: Open's own traffic is not a line's
	eating := func() bool { d := source.Load(); return d != nil && d.ForwardStats().Nudged == 0 }
	eaten := new(atomic.Int32)
	factories := map[string]sdi.Factory{}
	for _, name := range []string{"a", "b"} {
		fab := sditest.NewFabric(sditest.LoopbackOptions{Name: name, Caps: fwdCaps})
		factories[name] = func(log hclog.Logger) sdi.SubDevice { return creditEater{fab.New(log), eating, eaten} }
	}
	table := &conntable.Table{Version: conntable.Version, Peers: []conntable.Entry{{
		To: conntable.SelectAll, Failover: true,
		Routes: map[string][]conntable.Route{conntable.AllClasses: {{SubDevice: "a"}, {SubDevice: "b"}}},
	}}}
	devs := openJob(t, jobSpec{n: 2, subs: []string{"a", "b"}, factories: factories, table: table,
		forward: ForwardOptions{BlockSize: 2000, Window: 8 << 10}})
	source.Store(devs[0])
	start := time.Now()
	streamThroughFailure(t, devs, [][2]int{{0, 1}}, 40, func(int) int { return 1500 }, func(int) bool { return false }, func() {})
	st := devs[0].ForwardStats()
	t.Logf("stream of 40 blocks, %d credits lost: %v, %d nudges", eaten.Load(), time.Since(start).Round(time.Millisecond), st.Nudged)
	if eaten.Load() == 0 {
		t.Fatalf("%d credits lost, %d nudges: the stream never waited for a lost credit, the test proves nothing", eaten.Load(), st.Nudged)
	}
}

// TestLostSource: once a source is reported lost, what it sent before is
// still received, and what waits for more from it fails with ErrPeerDown
// instead of waiting for ever, whenever it was posted.
func TestLostSource(t *testing.T) {
	tests := []struct {
		name    string
		queued  int  // bytes rank 1 sent (tag 5) before it was lost, 0 for nothing
		probe   bool // probe for tag 5 instead of receiving it
		matched bool // receive it through a matched probe
		wantErr bool
	}{
		{name: "receive, nothing queued", wantErr: true},
		{name: "probe, nothing queued", probe: true, wantErr: true},
		{name: "matched probe, nothing queued", matched: true, wantErr: true},
		{name: "receive, ready-to-send queued", queued: 100000, wantErr: true},
		{name: "matched receive, ready-to-send queued", queued: 100000, matched: true, wantErr: true},
		{name: "receive, eager message queued", queued: 100},
		{name: "matched receive, eager message queued", queued: 100, matched: true},
		{name: "probe, ready-to-send queued", queued: 100000, probe: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			devs, fabs, _ := failoverJob(t, 2, false, false)
			if tc.queued > 0 {
				must(t)(devs[1].Isend(pattern(tc.queued, 1), 0, 5, 0, false))
				for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(time.Millisecond) {
					if _, ok, err := devs[0].Iprobe(1, 5, 0); ok || err != nil {
						break
					}
					if time.Now().After(deadline) {
						t.Fatal("rank 1's message never arrived")
					}
				}
			}
			// The loss is processed once a receive waiting for rank 1 fails.
			pending := must(t)(devs[0].Irecv(make([]byte, 1), 1, 2, 0))
			fabs["a"].Sever(1)
			if st, err := wait(t, pending); !errors.Is(err, ErrPeerDown) || st != (Status{Source: 1, Tag: 2}) {
				t.Fatalf("receive pending at the loss: %+v, %v; want ErrPeerDown and its own source and tag", st, err)
			}

			var st Status
			var err error
			waited := false // a receive was posted and completed
			if tc.probe {
				var ok bool
				st, ok, err = devs[0].Iprobe(1, 5, 0)
				if err == nil && !ok {
					t.Fatal("probe found nothing and no error")
				}
			} else {
				buf := make([]byte, max(tc.queued, 1))
				r := new(Request)
				if tc.matched {
					var m *Message
					var ok bool
					if m, _, ok, err = devs[0].Improbe(1, 5, 0); err == nil && !ok {
						t.Fatal("matched probe found nothing and no error")
					}
					if err == nil {
						err = devs[0].MrecvRequest(r, m, buf)
					}
				} else {
					err = devs[0].IrecvRequest(r, buf, 1, 5, 0)
				}
				if err == nil {
					st, err = wait(t, r)
					waited = true
				}
				if err == nil && !bytes.Equal(buf, pattern(tc.queued, 1)) {
					t.Error("message corrupted")
				}
			}
			if tc.wantErr != errors.Is(err, ErrPeerDown) || !tc.wantErr && err != nil {
				t.Fatalf("got %+v, %v; want ErrPeerDown: %v", st, err, tc.wantErr)
			}
			if !tc.wantErr && (st.Source != 1 || st.Count != tc.queued) {
				t.Errorf("status %+v, want %d bytes from rank 1", st, tc.queued)
			}
			// A failed receive reports the source and tag it was posted
			// with or matched, not rank 0's tag 0.
			if tc.wantErr && waited && st != (Status{Source: 1, Tag: 5}) {
				t.Errorf("failed receive's status %+v, want rank 1, tag 5, no bytes", st)
			}
		})
	}
}

// TestFailoverGatewayReportedBeforeFailure: rank 0 reaches rank 2 over a
// failover line (a, b) and rank 1 only through gateway 2 over a. Rank 2
// dies (b first, then a). The loss of rank 2 must be reported before the
// receive from rank 1 fails because of it (as TestGatewayLossReportedBeforeFailure
// demands for a gateway reached directly). trunkDown failed the lines in
// rank order, reporting rank 2 only when it reached rank 2's own line.
func TestFailoverGatewayReportedBeforeFailure(t *testing.T) {
	fabs := map[string]*sditest.Fabric{}
	factories := map[string]sdi.Factory{}
	for _, name := range []string{"a", "b"} {
		fabs[name] = sditest.NewFabric(sditest.LoopbackOptions{Name: name, Caps: fwdCaps})
		factories[name] = fabs[name].New
	}
	tableOf := func(r int) *conntable.Table {
		e := []conntable.Entry{{To: conntable.SelectAll, Routes: map[string][]conntable.Route{conntable.AllClasses: {{SubDevice: "a"}}}}}
		if r == 0 {
			e = append(e,
				conntable.Entry{To: "rank:2", Failover: true, Routes: map[string][]conntable.Route{conntable.AllClasses: {{SubDevice: "a"}, {SubDevice: "b"}}}},
				conntable.Entry{To: "rank:1", Routes: map[string][]conntable.Route{conntable.AllClasses: {hop("a", 2)}}})
		}
		return &conntable.Table{Version: conntable.Version, Peers: e}
	}
	devs, rb := reportingOpen(t, jobSpec{n: 3, subs: []string{"a", "b"}, factories: factories, tableOf: tableOf,
		forward: ForwardOptions{Retry: -1}})
	if !devs[0].indirect(1, 0) || !devs[0].indirect(2, 0) {
		t.Fatal("rank 0 does not reach 1 and 2 through lines; the test proves nothing")
	}
	pending := must(t)(devs[0].Irecv(make([]byte, 8), 1, 9, 0))
	rb.watch(pending)
	fabs["b"].Sever(2)
	time.Sleep(200 * time.Millisecond)
	if pending.isDone() {
		t.Fatal("receive from 1 failed while rank 2 was still reachable over a")
	}
	fabs["a"].Sever(2)
	if _, err := wait(t, pending); !errors.Is(err, ErrPeerDown) {
		t.Fatalf("receive from 1: %v, want ErrPeerDown", err)
	}
	time.Sleep(200 * time.Millisecond)
	reports := rb.got()
	if len(reports) == 0 || !strings.HasPrefix(reports[0], "rank 2: ") || strings.Contains(reports[0], "after") {
		t.Fatalf("reports %q: want rank 2's loss reported before the receive from 1 (through gateway 2) failed", reports)
	}
}

// slowSub delays every frame its rank receives over this subdevice, as a
// route that is healthy but slow does.
type slowSub struct {
	sdi.SubDevice
	pause time.Duration
}

func (s slowSub) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	p.Handler = slowHandler{Handler: p.Handler, pause: s.pause}
	return s.SubDevice.Open(ctx, p)
}

// unevenJob opens n ranks over a failover entry of two live routes, a
// fast "a" and a "b" whose every frame takes slow to arrive. sends counts
// the frames each network's subdevices were given.
func unevenJob(t *testing.T, n int, slow time.Duration, caps sdi.Caps, fwd ForwardOptions) ([]*Device, map[string]*atomic.Int64) {
	sends := map[string]*atomic.Int64{}
	factories := map[string]sdi.Factory{}
	for _, name := range []string{"a", "b"} {
		fab, count := sditest.NewFabric(sditest.LoopbackOptions{Name: name, Caps: caps}), new(atomic.Int64)
		sends[name] = count
		factories[name] = func(log hclog.Logger) sdi.SubDevice {
			var s sdi.SubDevice = countingSub{fab.New(log), count}
			if name == "b" {
				s = slowSub{s, slow}
			}
			return s
		}
	}
	table := &conntable.Table{Version: conntable.Version, Peers: []conntable.Entry{{
		To: conntable.SelectAll, Failover: true,
		Routes: map[string][]conntable.Route{conntable.AllClasses: {{SubDevice: "a"}, {SubDevice: "b"}}},
	}}}
	return openJob(t, jobSpec{n: n, subs: []string{"a", "b"}, factories: factories, table: table, forward: fwd}), sends
}

// TestUnevenRoutes: rank 0 streams to rank 1 over a fast route and a
// healthy one that takes slow a frame. Striping must follow measured
// delivery: with small blocks (stripe) the slow route carries under a
// quarter of the fast one's frames. Trunks were picked by
// unacknowledged bytes, but credit is cumulative: while an early block
// crawled over the slow route, the blocks the fast one had delivered
// stayed unacknowledged too, and the slow route got half the blocks.
// And nothing failed, so nothing may go twice: a route that needs longer
// than the watch's first pause to deliver a block (slow, 256 KiB blocks)
// was taken for a lost frame, and its blocks were sent again.
func TestUnevenRoutes(t *testing.T) {
	bigCaps := sdi.Caps{MaxHeader: 128, MaxEager: 4096, MaxFrame: 1 << 20, Reach: sdi.ReachNetwork, Flags: sdi.FlagReliable | sdi.FlagOrdered, Exclusivity: 1}
	for _, tc := range []struct {
		name        string
		slow        time.Duration
		caps        sdi.Caps
		fwd         ForwardOptions
		size, count int
		stripe      bool // the slow route must carry under a quarter of the fast one's frames
	}{
		{name: "stripe", slow: 2 * time.Millisecond, caps: fwdCaps, fwd: ForwardOptions{BlockSize: 2000, Window: 64 << 10}, size: 2 << 20, count: 1, stripe: true},
		{name: "slow-blocks", slow: 100 * time.Millisecond, caps: bigCaps, size: 256 << 10, count: 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			devs, sends := unevenJob(t, 2, tc.slow, tc.caps, tc.fwd)
			var reqs []*Request
			for i := range tc.count {
				reqs = append(reqs, must(t)(devs[1].Irecv(make([]byte, tc.size), 0, 1, 0)), must(t)(devs[0].Isend(numbered(tc.size, 0, i), 1, 1, 0, false)))
			}
			waitAll(t, reqs)
			s0, s1 := devs[0].ForwardStats(), devs[1].ForwardStats()
			a, b := sends["a"].Load(), sends["b"].Load()
			t.Logf("frames a %d b %d; sender %+v receiver %+v", a, b, s0, s1)
			if s0.Nudged+s1.Nudged > 0 || s0.Dropped+s1.Dropped > 0 {
				t.Errorf("no route failed, yet %d blocks were sent again and %d copies dropped", s0.Nudged+s1.Nudged, s0.Dropped+s1.Dropped)
			}
			if tc.stripe && 4*b > a {
				t.Errorf("the slow route (%v a frame) carried %d frames, the fast one %d: striping ignores delivery times", tc.slow, b, a)
			}
		})
	}
}
