//go:build verbs && cgo

package verbs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/internal/rdma/rdmatest"
	"github.com/hpc-multidevice/multidevice/internal/testlog"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/subdevices/verbs/internal/fakectl"
)

// These tests make the fakeverbs stand-in report what a device reports
// asynchronously (a broken queue pair or completion queue, a dead or
// removed device, a port going down) or break the connection manager's
// event channel, and check that the engine over this provider sees the
// connections concerned fail, and only those, instead of waiting.

// testRank is one rank of a job in this process: the engine over a verbs
// provider, whose C handles the tests reach through prov.
type testRank struct {
	*rdmatest.Rank
	prov *provider
}

// asyncRanks opens n ranks of one job on the fake, which every test here
// needs: only the fake takes injected events. The ranks are closed at the
// end of the test, if the test has not closed them.
func asyncRanks(ctx context.Context, t *testing.T, n int) ([]*testRank, *testlog.Buffer) {
	t.Helper()
	if !fakeverbsLoaded() || !fakectl.Loaded() {
		t.Skip("injects device events: needs the fakeverbs stand-in (testdata/fakeverbs/fakeverbs.c)")
	}
	h := testHost(t)
	// The ranks log into a buffer, not t.Log: their goroutines may still
	// log as the test ends. It is shown with -v or on failure.
	logs := &testlog.Buffer{}
	t.Cleanup(func() {
		if s := logs.String(); s != "" {
			t.Logf("logged by the ranks:\n%s", s)
		}
	})
	ranks := make([]*testRank, n)
	for i := range ranks {
		r := &testRank{}
		log := hclog.New(&hclog.LoggerOptions{Name: fmt.Sprintf("verbs.rank%d", i), Level: hclog.Debug, Output: logs})
		open := func(ctx context.Context, p sdi.OpenParams) (rdma.Provider, rdma.Settings, error) {
			prov, set, err := h.open(ctx, p)
			if err == nil {
				r.prov = prov.(*provider)
			}
			return prov, set, err
		}
		var err error
		if r.Rank, err = rdmatest.Open(ctx, t, "verbs", sdi.Rank(i), n, open, log); err != nil {
			t.Fatalf("open rank %d: %v", i, err)
		}
		ranks[i] = r
	}
	return ranks, logs
}

// onlyEndpoint returns the QP of the rank's one endpoint.
func (r *testRank) onlyEndpoint(t *testing.T) unsafe.Pointer {
	t.Helper()
	eps := r.prov.endpoints()
	if len(eps) != 1 {
		t.Fatalf("rank %d has %d endpoints, want 1", r.ID, len(eps))
	}
	e := eps[0]
	e.mu.Lock()
	defer e.mu.Unlock()
	return unsafe.Pointer(e.qp)
}

func (r *testRank) ctx() unsafe.Pointer { return unsafe.Pointer(r.prov.ctx) }

// eventsAcked checks that the device has no asynchronous event queued or
// read and not acked.
func eventsAcked(t *testing.T, r *testRank) {
	t.Helper()
	q, u, err := fakectl.AsyncCounts(r.ctx())
	if err != nil {
		t.Fatal(err)
	}
	if q != 0 || u != 0 {
		t.Fatalf("%d asynchronous events queued and %d not acked, want none", q, u)
	}
}

// closeAll closes the ranks, which must not hang on an event left unacked
// (the fake's ibv_destroy_qp and ibv_destroy_cq wait for the acks, as
// libibverbs does), and checks that no goroutine of the provider is left.
func closeAll(ctx context.Context, t *testing.T, ranks []*testRank) {
	t.Helper()
	for _, r := range ranks {
		if err := r.SD.Close(ctx); err != nil {
			t.Errorf("close rank %d: %v", r.ID, err)
		}
	}
	if s := leakedGoroutines(); s != "" {
		t.Fatalf("goroutines left after every rank closed:\n%s", s)
	}
}

// TestAsyncQPFatal breaks the queue pair of one connection the way a
// device reports it, with IBV_EVENT_QP_FATAL and no failed completion: both
// ends must report each other down, with the event as the reason, while
// the connection between the other two ranks carries on.
func TestAsyncQPFatal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rs, _ := asyncRanks(ctx, t, 3)
	r0, r1, r2 := rs[0], rs[1], rs[2]
	r0.Connect(ctx, t, r1.Rank)
	r0.Connect(ctx, t, r2.Rank)
	r0.Ping(ctx, t, r1.Rank, "before 0>1")
	r1.Ping(ctx, t, r0.Rank, "before 1>0")
	r0.Ping(ctx, t, r2.Rank, "before 0>2")

	if err := fakectl.InjectAsync(r1.ctx(), fakectl.EventQPFatal, r1.onlyEndpoint(t), 0); err != nil {
		t.Fatal(err)
	}
	err := r1.Rec.DownErr(ctx, t, 1, 0)
	rdmatest.WantMentions(t, "rank 1's report of rank 0 down", err, "IBV_EVENT_QP_FATAL")
	if !errors.Is(err, sdi.ErrPeerUnreachable) {
		t.Fatalf("rank 1's report of rank 0 down: %v, want sdi.ErrPeerUnreachable", err)
	}
	r0.Rec.DownErr(ctx, t, 0, 1) // told by the disconnect
	rdmatest.WantMentions(t, "rank 1's send to rank 0", r1.Send(ctx, 0, "after"), "IBV_EVENT_QP_FATAL")

	r0.Ping(ctx, t, r2.Rank, "after 0>2")
	r2.Ping(ctx, t, r0.Rank, "after 2>0")
	if r0.Rec.IsDown(2) || r2.Rec.IsDown(0) {
		t.Fatal("the connection between ranks 0 and 2 failed too")
	}
	eventsAcked(t, r1)
	closeAll(ctx, t, rs)
}

// TestAsyncDeviceFatal kills the device (IBV_EVENT_DEVICE_FATAL), which
// every rank in the process shares: every connection fails, every rank
// reports its peers down, later connects fail with an error that names the
// device and the event, and Close still closes.
//
// Which reason a rank's report gives depends on who learned first: a rank
// may see its peer's disconnect before its own copy of the event, as it
// may on a real fabric, and then reports the disconnect. So the reports
// are checked for the event only where the rank reporting learned first
// for certain: rank 0 and rank 2 are connected to nobody but rank 1, and
// every rank's later connect names the event.
func TestAsyncDeviceFatal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rs, _ := asyncRanks(ctx, t, 3)
	r0, r1, r2 := rs[0], rs[1], rs[2]
	r0.Connect(ctx, t, r1.Rank)
	r1.Connect(ctx, t, r2.Rank)
	r0.Ping(ctx, t, r1.Rank, "0>1")
	r2.Ping(ctx, t, r1.Rank, "2>1")

	if err := fakectl.InjectAsync(r0.ctx(), fakectl.EventDeviceFatal, nil, 1); err != nil {
		t.Fatal(err)
	}
	named := 0
	for _, d := range []struct{ self, peer *testRank }{{r0, r1}, {r1, r0}, {r1, r2}, {r2, r1}} {
		err := d.self.Rec.DownErr(ctx, t, d.self.ID, d.peer.ID)
		if !errors.Is(err, sdi.ErrPeerUnreachable) {
			t.Fatalf("rank %d's report of rank %d down: %v, want sdi.ErrPeerUnreachable", d.self.ID, d.peer.ID, err)
		}
		if strings.Contains(err.Error(), fakeDevice) && strings.Contains(err.Error(), "IBV_EVENT_DEVICE_FATAL") {
			named++
		}
	}
	if named == 0 {
		t.Fatal("no report of a peer down names the device and the event")
	}
	if err := r0.Send(ctx, 1, "after"); err == nil {
		t.Fatal("rank 0's send to rank 1 after the device died succeeded")
	}
	for _, d := range []struct{ self, peer *testRank }{{r0, r2}, {r2, r0}, {r1, r0}} {
		err := d.self.SD.Connect(ctx, d.peer.ID, d.peer.Card)
		what := fmt.Sprintf("rank %d's connect to rank %d", d.self.ID, d.peer.ID)
		rdmatest.WantMentions(t, what, err, fakeDevice, "IBV_EVENT_DEVICE_FATAL")
		if !errors.Is(err, sdi.ErrPeerUnreachable) || !errors.Is(err, errDeviceFailed) {
			t.Fatalf("%s: %v, want sdi.ErrPeerUnreachable and errDeviceFailed", what, err)
		}
	}
	eventsAcked(t, r0)
	closeAll(ctx, t, rs)
	eventsAcked(t, r0)
}

// TestAsyncCQErr breaks one rank's completion queue (IBV_EVENT_CQ_ERR:
// it overran, and takes no completion any more, so nothing would ever
// report the flushed work): that rank fails as a whole and its peers see
// it go, while the two others carry on between themselves.
func TestAsyncCQErr(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rs, _ := asyncRanks(ctx, t, 3)
	r0, r1, r2 := rs[0], rs[1], rs[2]
	r0.Connect(ctx, t, r1.Rank)
	r0.Connect(ctx, t, r2.Rank)
	r1.Connect(ctx, t, r2.Rank)
	r1.Ping(ctx, t, r0.Rank, "1>0")
	r2.Ping(ctx, t, r0.Rank, "2>0")
	r1.Ping(ctx, t, r2.Rank, "1>2")

	if err := fakectl.InjectAsync(r0.ctx(), fakectl.EventCQErr, unsafe.Pointer(r0.prov.cq), 0); err != nil {
		t.Fatal(err)
	}
	for _, peer := range []*testRank{r1, r2} {
		err := r0.Rec.DownErr(ctx, t, 0, peer.ID)
		rdmatest.WantMentions(t, fmt.Sprintf("rank 0's report of rank %d down", peer.ID), err, fakeDevice, "IBV_EVENT_CQ_ERR")
		peer.Rec.DownErr(ctx, t, peer.ID, 0)
	}
	rdmatest.WantMentions(t, "rank 0's send to rank 2", r0.Send(ctx, 2, "after"), fakeDevice, "IBV_EVENT_CQ_ERR")
	r1.Ping(ctx, t, r2.Rank, "after 1>2")
	r2.Ping(ctx, t, r1.Rank, "after 2>1")
	if r1.Rec.IsDown(2) || r2.Rec.IsDown(1) {
		t.Fatal("the connection between ranks 1 and 2 failed too")
	}
	eventsAcked(t, r0)
	closeAll(ctx, t, rs)
}

// TestCMDeviceRemoval removes the device under the connection manager
// (RDMA_CM_EVENT_DEVICE_REMOVAL on the listener): the rank fails as a
// whole, and says why.
func TestCMDeviceRemoval(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rs, _ := asyncRanks(ctx, t, 3)
	r0, r1, r2 := rs[0], rs[1], rs[2]
	r0.Connect(ctx, t, r1.Rank)
	r0.Ping(ctx, t, r1.Rank, "0>1")

	if err := fakectl.InjectCMEvent(unsafe.Pointer(r0.prov.listen), fakectl.CMEventDeviceRemoval); err != nil {
		t.Fatal(err)
	}
	rdmatest.WantMentions(t, "rank 0's report of rank 1 down", r0.Rec.DownErr(ctx, t, 0, 1), fakeDevice, "RDMA_CM_EVENT_DEVICE_REMOVAL")
	r1.Rec.DownErr(ctx, t, 1, 0)
	rdmatest.WantMentions(t, "rank 0's connect to rank 2", r0.SD.Connect(ctx, 2, r2.Card), fakeDevice, "RDMA_CM_EVENT_DEVICE_REMOVAL")
	closeAll(ctx, t, rs)
}

// TestCMLoopFails makes reading the connection manager's events fail for
// good: the rank can neither make connections nor notice them end, so it
// fails as a whole instead of leaving dials to wait out their contexts.
func TestCMLoopFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rs, _ := asyncRanks(ctx, t, 3)
	r0, r1, r2 := rs[0], rs[1], rs[2]
	r0.Connect(ctx, t, r1.Rank)
	r0.Ping(ctx, t, r1.Rank, "0>1")

	if err := fakectl.FailCMChannel(unsafe.Pointer(r0.prov.ch), syscall.EIO); err != nil {
		t.Fatal(err)
	}
	rdmatest.WantMentions(t, "rank 0's report of rank 1 down", r0.Rec.DownErr(ctx, t, 0, 1), fakeDevice, "connection manager", syscall.EIO.Error())
	r1.Rec.DownErr(ctx, t, 1, 0)
	rdmatest.WantMentions(t, "rank 0's connect to rank 2", r0.SD.Connect(ctx, 2, r2.Card), fakeDevice, "connection manager")
	// Rank 2 never hears from rank 0, and must not need to.
	r1.Connect(ctx, t, r2.Rank)
	r1.Ping(ctx, t, r2.Rank, "1>2")
	closeAll(ctx, t, rs)
}

// TestAsyncBenign injects the events that fail nothing: a port going down
// and coming back (logged, as a warning and as news), a LID change and a
// COMM_EST on an established QP (passed on to librdmacm). The connection
// stays up, and every event is acked.
func TestAsyncBenign(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rs, logs := asyncRanks(ctx, t, 2)
	r0, r1 := rs[0], rs[1]
	r0.Connect(ctx, t, r1.Rank)
	r0.Ping(ctx, t, r1.Rank, "before")

	for _, ev := range []struct {
		typ  int
		elem unsafe.Pointer
	}{
		{fakectl.EventPortErr, nil},
		{fakectl.EventPortActive, nil},
		{fakectl.EventLIDChange, nil},
		{fakectl.EventCommEst, r1.onlyEndpoint(t)},
	} {
		if err := fakectl.InjectAsync(r0.ctx(), ev.typ, ev.elem, 1); err != nil {
			t.Fatal(err)
		}
	}
	// Both ranks share the device, so both log the port's events.
	for _, line := range []string{"[WARN]  verbs.rank0: the device port went down", "[INFO]  verbs.rank1: the device port is active", "IBV_EVENT_LID_CHANGE"} {
		for !strings.Contains(logs.String(), line) {
			select {
			case <-ctx.Done():
				t.Fatalf("waiting for the log to say %q: %v\n%s", line, ctx.Err(), logs.String())
			case <-time.After(time.Millisecond):
			}
		}
	}
	for {
		q, u, err := fakectl.AsyncCounts(r0.ctx())
		if err != nil {
			t.Fatal(err)
		}
		if q == 0 && u == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d asynchronous events still queued and %d not acked: %v", q, u, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
	r0.Ping(ctx, t, r1.Rank, "after 0>1")
	r1.Ping(ctx, t, r0.Rank, "after 1>0")
	if r0.Rec.IsDown(1) || r1.Rec.IsDown(0) {
		t.Fatal("a benign event failed the connection")
	}
	if bytes.Contains([]byte(logs.String()), []byte("[ERROR]")) {
		t.Fatalf("a benign event was logged as an error:\n%s", logs.String())
	}
	closeAll(ctx, t, rs)
}
