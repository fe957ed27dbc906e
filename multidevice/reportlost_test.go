package multidevice

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/bootstrap"
	"github.com/hpc-multidevice/multidevice/conntable"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// reportingBoot is a bootstrap that takes reports of lost ranks, as
// mdrun's does, and notes whether a request was done before each report.
type reportingBoot struct {
	bootstrap.Bootstrap
	mu      sync.Mutex
	pending *Request // must not be done when a report comes
	reports []string
}

func (b *reportingBoot) ReportLost(rank int, why string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := fmt.Sprintf("rank %d: %s", rank, why)
	if b.pending != nil && b.pending.isDone() {
		r += " (after the receive failed)"
	}
	b.reports = append(b.reports, r)
}

// watch makes r the request that must not be done when a report comes.
func (b *reportingBoot) watch(r *Request) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pending = r
}

// got returns the reports made so far.
func (b *reportingBoot) got() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.reports)
}

// reportingOpen is openJob with rank 0's bootstrap taking reports of lost
// ranks.
func reportingOpen(t *testing.T, js jobSpec) ([]*Device, *reportingBoot) {
	t.Helper()
	var rb *reportingBoot
	js.wrapBoot = func(rank int, b bootstrap.Bootstrap) bootstrap.Bootstrap {
		if rank != 0 {
			return b
		}
		rb = &reportingBoot{Bootstrap: b}
		return rb
	}
	return openJob(t, js), rb
}

// reportingJob opens two ranks over the given loopback fabrics (named by
// their Info names, in this order), rank 0's bootstrap taking reports of
// lost ranks, and returns rank 0's device and bootstrap.
func reportingJob(t *testing.T, fabs ...*sditest.Fabric) (*Device, *reportingBoot) {
	t.Helper()
	js := jobSpec{n: 2, factories: map[string]sdi.Factory{}}
	for _, fab := range fabs {
		info, err := fab.New(hclog.NewNullLogger()).Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		js.factories[info.Name] = fab.New
		js.subs = append(js.subs, info.Name)
	}
	devs, rb := reportingOpen(t, js)
	return devs[0], rb
}

// TestPeerDownReportedLost: a device whose subdevice lost a peer tells a
// bootstrap that takes such reports, before the receives from the peer
// fail: mdrun names the rank that died first from these reports, and a
// rank that exits on the failure must have sent its report already.
// Peers closing links while this rank finalizes are no loss.
func TestPeerDownReportedLost(t *testing.T) {
	for _, tc := range []struct {
		name       string
		finalizing bool
		want       []string
	}{
		{"running", false, []string{`rank 1: over "loop": link gone`}},
		{"finalizing", true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, rb := reportingJob(t, sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: smallCaps}))
			var r *Request
			var err error
			if !tc.finalizing { // a finalizing rank posts no receive
				if r, err = d.Irecv(make([]byte, 8), 1, 1, 0); err != nil {
					t.Fatal(err)
				}
				rb.mu.Lock()
				rb.pending = r
				rb.mu.Unlock()
			}
			d.finalizing.Store(tc.finalizing)
			sub := slices.IndexFunc(d.subs, func(s *subdev) bool { return s.name == "loop" })
			(&handler{d: d, sub: sub}).PeerDown(1, errors.New("link gone"))
			if r != nil {
				if _, err := wait(t, r); !errors.Is(err, ErrPeerDown) {
					t.Fatalf("the receive from the lost peer: got %v, want ErrPeerDown", err)
				}
			}
			rb.mu.Lock()
			defer rb.mu.Unlock()
			if !slices.Equal(rb.reports, tc.want) {
				t.Errorf("reports %q, want %q", rb.reports, tc.want)
			}
		})
	}
}

// TestFrameLostReportedBeforeFailure: a subdevice that fails queued
// frames (SendDone with ErrPeerUnreachable) before its PeerDown makes the
// device fail everything for the peer (frameLost); the loss is reported
// before that, once. It was reported only at the PeerDown, after the
// receive had failed and the application could have exited.
func TestFrameLostReportedBeforeFailure(t *testing.T) {
	fab := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: smallCaps})
	d, rb := reportingJob(t, fab)
	r, err := d.Irecv(make([]byte, 8), 1, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	rb.mu.Lock()
	rb.pending = r
	rb.mu.Unlock()
	for range 200 { // frames rank 1 has not taken yet
		if _, err := d.Isend(make([]byte, 8), 1, 2, 0, false); err != nil {
			break
		}
	}
	fab.Sever(0)
	if _, err := wait(t, r); !errors.Is(err, ErrPeerDown) {
		t.Fatalf("receive: %v", err)
	}
	time.Sleep(100 * time.Millisecond)
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if len(rb.reports) != 1 || strings.Contains(rb.reports[0], "after") {
		t.Fatalf("reports %q: want one report, made before the receive failed", rb.reports)
	}
}

// TestUnusedSubdeviceNotReportedLost: a PeerDown on a subdevice that
// carries none of the peer's routes is no loss for the device, and is not
// reported: reports go once per rank, so the false one would have kept
// the real loss's reason and place from mdrun.
func TestUnusedSubdeviceNotReportedLost(t *testing.T) {
	capsB := smallCaps
	capsB.Exclusivity = 0 // "a" carries everything, "b" stands by
	d, rb := reportingJob(t, sditest.NewFabric(sditest.LoopbackOptions{Name: "a", Caps: smallCaps}),
		sditest.NewFabric(sditest.LoopbackOptions{Name: "b", Caps: capsB}))
	unused := -1
	for i, s := range d.subs {
		if i > 0 && !d.carries(1, s.idx) {
			unused = i
		}
	}
	if unused < 0 {
		t.Skip("both subdevices carry rank 1")
	}
	(&handler{d: d, sub: unused}).PeerDown(1, errors.New("standby link reset"))
	// The peer is not lost: it still talks over the other subdevice.
	r, err := d.Isend([]byte("hi"), 1, 1, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wait(t, r); err != nil {
		t.Fatalf("send after the unused link's PeerDown: %v", err)
	}
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if len(rb.reports) != 0 {
		t.Fatalf("rank 1 reported lost though the device lost nothing: %q", rb.reports)
	}
}

// TestGatewayLossReportedBeforeFailure: rank 0 reaches rank 2 only
// through gateway 1, which it also reaches directly. When rank 0's link
// fails, the blocks to 2 queued toward the gateway fail first; rank 1's
// loss is reported before the receive from 2 fails because of it, as a
// failed direct frame's is (frameLost). The failed blocks dropped the
// trunk and failed the line at once, and the report came only with the
// subdevice's PeerDown, after the application could have exited.
func TestGatewayLossReportedBeforeFailure(t *testing.T) {
	fab := sditest.NewFabric(sditest.LoopbackOptions{Name: "a", Caps: fwdCaps})
	devs, rb := reportingOpen(t, jobSpec{n: 3, subs: []string{"a"}, factories: map[string]sdi.Factory{"a": fab.New},
		tableOf: viaTables("a", 2, map[int][]conntable.Route{0: {hop("a", 1)}}), forward: ForwardOptions{Retry: -1}})
	pending := must(t)(devs[0].Irecv(make([]byte, 8), 2, 9, 0))
	rb.watch(pending)
	for i := range 200 { // blocks gateway 1 has not taken yet
		if _, err := devs[0].Isend(make([]byte, 8), 2, 1+i, 0, false); err != nil {
			break
		}
	}
	fab.Sever(0)
	if _, err := wait(t, pending); !errors.Is(err, ErrPeerDown) {
		t.Fatalf("receive: %v, want ErrPeerDown", err)
	}
	time.Sleep(100 * time.Millisecond)
	if reports := rb.got(); len(reports) == 0 || !strings.HasPrefix(reports[0], "rank 1: ") || strings.Contains(reports[0], "after") {
		t.Fatalf("reports %q: want rank 1's loss reported before the receive from 2 failed", reports)
	}
}
