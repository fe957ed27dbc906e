//go:build udapl && cgo

package udapl

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/internal/rdma/rdmatest"
	"github.com/hpc-multidevice/multidevice/internal/testlog"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/subdevices/udapl/internal/fakectl"
)

// These tests make the fakedat stand-in report what DAT reports
// asynchronously (an endpoint that broke or timed out, an EVD that
// overflowed, an IA that died, a connection that broke) or make an EVD
// fail for good, and check that the engine over this provider sees the
// connections concerned fail, and only those, instead of waiting.

// testRank is one rank of a job in this process: the engine over a udapl
// provider, whose DAT handles the tests reach through prov.
type testRank struct {
	*rdmatest.Rank
	prov *provider
}

// asyncRanks opens n ranks of one job on the fake, which every test here
// needs: only the fake takes injected events. The ranks are closed at the
// end of the test, if the test has not closed them.
func asyncRanks(ctx context.Context, t *testing.T, n int) []*testRank {
	t.Helper()
	if !fakectl.Loaded() {
		t.Skip("injects asynchronous DAT events: needs the fakedat stand-in (testdata/fakedat/fakedat.c)")
	}
	// The ranks log into a buffer, not t.Log: their goroutines may still
	// log as the test ends. It is shown with -v or on failure.
	logs := &testlog.Buffer{}
	t.Cleanup(func() {
		if s := logs.String(); s != "" && (t.Failed() || testing.Verbose()) {
			t.Logf("logged by the ranks:\n%s", s)
		}
	})
	ranks := make([]*testRank, n)
	for i := range ranks {
		r := &testRank{}
		log := hclog.New(&hclog.LoggerOptions{Name: fmt.Sprintf("udapl.rank%d", i), Level: hclog.Debug, Output: logs})
		openRank := func(ctx context.Context, p sdi.OpenParams) (rdma.Provider, rdma.Settings, error) {
			prov, set, err := open(ctx, p)
			if err == nil {
				r.prov = prov.(*provider)
			}
			return prov, set, err
		}
		var err error
		r.Rank, err = rdmatest.Open(ctx, t, "udapl", sdi.Rank(i), n, openRank, log)
		if errors.Is(err, rdma.ErrNoDevice) {
			t.Skipf("no uDAPL interface adapter opens here: %v", err)
		}
		if err != nil {
			t.Fatalf("open rank %d: %v", i, err)
		}
		ranks[i] = r
	}
	return ranks
}

// onlyEndpoint returns the handle of the rank's one endpoint.
func (r *testRank) onlyEndpoint(t *testing.T) unsafe.Pointer {
	t.Helper()
	eps := r.prov.endpoints()
	if len(eps) != 1 {
		t.Fatalf("rank %d has %d endpoints, want 1", r.ID, len(eps))
	}
	return unsafe.Pointer(eps[0].h)
}

func (r *testRank) ia() unsafe.Pointer { return unsafe.Pointer(r.prov.ia) }

// asyncDrained checks that the rank's async EVD holds no event: every one
// was dequeued, which is all DAT has of an acknowledgement.
func asyncDrained(ctx context.Context, t *testing.T, r *testRank) {
	t.Helper()
	for {
		n, err := fakectl.Queued(unsafe.Pointer(r.prov.asyncEVD))
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("rank %d's async EVD still holds %d events: %v", r.ID, n, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// closeAll closes the ranks, which must work whatever failed, and checks
// that no goroutine of the provider is left.
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

// TestAsyncEndpointBroken breaks the queue pair of one connection the way
// DAT reports it, on the IA's async EVD and with no failed completion:
// naming the IA, as dapl does (the endpoint is found by its
// DAT_EP_STATE_ERROR), or the endpoint, as the spec reads. Both ends must
// report each other down, the broken end with the event as the reason,
// while the connection between the other two ranks carries on.
func TestAsyncEndpointBroken(t *testing.T) {
	for _, tc := range []struct {
		name   string
		event  int
		nameEP bool
		want   string
	}{
		{"EPBroken/NamesIA", fakectl.AsyncEPBroken, false, "DAT_ASYNC_ERROR_EP_BROKEN"},
		{"EPBroken/NamesEP", fakectl.AsyncEPBroken, true, "DAT_ASYNC_ERROR_EP_BROKEN"},
		{"TimedOut/NamesEP", fakectl.AsyncTimedOut, true, "DAT_ASYNC_ERROR_TIMED_OUT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), watchdog)
			defer cancel()
			rs := asyncRanks(ctx, t, 3)
			r0, r1, r2 := rs[0], rs[1], rs[2]
			r0.Connect(ctx, t, r1.Rank)
			r0.Connect(ctx, t, r2.Rank)
			r0.Ping(ctx, t, r1.Rank, "before 0>1")
			r1.Ping(ctx, t, r0.Rank, "before 1>0")
			r0.Ping(ctx, t, r2.Rank, "before 0>2")

			if err := fakectl.BreakEP(r1.onlyEndpoint(t), tc.event, tc.nameEP); err != nil {
				t.Fatal(err)
			}
			err := r1.Rec.DownErr(ctx, t, 1, 0)
			rdmatest.WantMentions(t, "rank 1's report of rank 0 down", err, tc.want, r1.prov.iaName)
			if !errors.Is(err, sdi.ErrPeerUnreachable) {
				t.Fatalf("rank 1's report of rank 0 down: %v, want sdi.ErrPeerUnreachable", err)
			}
			r0.Rec.DownErr(ctx, t, 0, 1) // told when rank 1 frees the endpoint
			rdmatest.WantMentions(t, "rank 1's send to rank 0", r1.Send(ctx, 0, "after"), tc.want)

			r0.Ping(ctx, t, r2.Rank, "after 0>2")
			r2.Ping(ctx, t, r0.Rank, "after 2>0")
			if r0.Rec.IsDown(2) || r2.Rec.IsDown(0) {
				t.Fatal("the connection between ranks 0 and 2 failed too")
			}
			// The rank itself still works: it connects again.
			r1.Ping(ctx, t, r2.Rank, "after 1>2")
			asyncDrained(ctx, t, r1)
			closeAll(ctx, t, rs)
		})
	}
}

// TestAsyncIAFails fails one rank's IA as a whole, by each way DAT has of
// saying so and by an EVD the provider can no longer read: the rank must
// report every peer down with an error naming the IA and what happened,
// its peers must see it go, its later connects and sends must fail with
// that error, the two other ranks carry on between themselves, and Close
// still closes.
func TestAsyncIAFails(t *testing.T) {
	for _, tc := range []struct {
		name   string
		inject func(r *testRank) error
		want   []string
	}{
		{"IACatastrophic", func(r *testRank) error {
			return fakectl.InjectAsync(r.ia(), fakectl.AsyncIACatastrophic, r.ia())
		}, []string{"DAT_ASYNC_ERROR_IA_CATASTROPHIC"}},
		{"ProviderInternalError", func(r *testRank) error {
			return fakectl.InjectAsync(r.ia(), fakectl.AsyncProviderFailure, r.ia())
		}, []string{"DAT_ASYNC_ERROR_PROVIDER_INTERNAL_ERROR"}},
		// dapl names the IA: either the event or the failing dequeue
		// comes first, and both say the EVD overflowed.
		{"CompletionEVDOverflow/NamesIA", func(r *testRank) error {
			return fakectl.OverflowEVD(r.ia(), unsafe.Pointer(r.prov.dtoEVD), false)
		}, []string{"overflow"}},
		{"CompletionEVDOverflow/NamesEVD", func(r *testRank) error {
			return fakectl.OverflowEVD(r.ia(), unsafe.Pointer(r.prov.dtoEVD), true)
		}, []string{"completion EVD"}},
		{"ConnectionEVDOverflow", func(r *testRank) error {
			return fakectl.OverflowEVD(r.ia(), unsafe.Pointer(r.prov.connEVD), true)
		}, []string{"DAT_ASYNC_ERROR_EVD_OVERFLOW", "connection EVD"}},
		{"ConnectionEVDDies", func(r *testRank) error {
			return fakectl.FailEVD(unsafe.Pointer(r.prov.connEVD), fakectl.InternalError)
		}, []string{"waiting for connection events failed", "DAT_INTERNAL_ERROR"}},
		{"RequestEVDDies", func(r *testRank) error {
			return fakectl.FailEVD(unsafe.Pointer(r.prov.crEVD), fakectl.InternalError)
		}, []string{"waiting for connection requests failed", "DAT_INTERNAL_ERROR"}},
		{"AsyncEVDDies", func(r *testRank) error {
			return fakectl.FailEVD(unsafe.Pointer(r.prov.asyncEVD), fakectl.InternalError)
		}, []string{"reading its asynchronous errors failed", "DAT_INTERNAL_ERROR"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), watchdog)
			defer cancel()
			rs := asyncRanks(ctx, t, 3)
			r0, r1, r2 := rs[0], rs[1], rs[2]
			r0.Connect(ctx, t, r1.Rank)
			r0.Connect(ctx, t, r2.Rank)
			r1.Connect(ctx, t, r2.Rank)
			r1.Ping(ctx, t, r0.Rank, "1>0")
			r2.Ping(ctx, t, r0.Rank, "2>0")
			r1.Ping(ctx, t, r2.Rank, "1>2")

			if err := tc.inject(r0); err != nil {
				t.Fatal(err)
			}
			want := append([]string{"udapl: interface adapter", r0.prov.iaName}, tc.want...)
			lower := func(err error) error {
				if err == nil {
					return nil
				}
				return errors.New(strings.ToLower(err.Error()) + " " + err.Error())
			}
			for _, peer := range []*testRank{r1, r2} {
				err := r0.Rec.DownErr(ctx, t, 0, peer.ID)
				rdmatest.WantMentions(t, fmt.Sprintf("rank 0's report of rank %d down", peer.ID), lower(err), want...)
				if !errors.Is(err, sdi.ErrPeerUnreachable) {
					t.Fatalf("rank 0's report of rank %d down: %v, want sdi.ErrPeerUnreachable", peer.ID, err)
				}
				peer.Rec.DownErr(ctx, t, peer.ID, 0)
			}
			rdmatest.WantMentions(t, "rank 0's send to rank 2", lower(r0.Send(ctx, 2, "after")), want...)
			err := r0.SD.Connect(ctx, 1, r1.Card)
			rdmatest.WantMentions(t, "rank 0's connect to rank 1", lower(err), want...)
			if !errors.Is(err, sdi.ErrPeerUnreachable) || !errors.Is(err, errIAFailed) {
				t.Fatalf("rank 0's connect to rank 1: %v, want sdi.ErrPeerUnreachable and errIAFailed", err)
			}
			r1.Ping(ctx, t, r2.Rank, "after 1>2")
			r2.Ping(ctx, t, r1.Rank, "after 2>1")
			if r1.Rec.IsDown(2) || r2.Rec.IsDown(1) {
				t.Fatal("the connection between ranks 1 and 2 failed too")
			}
			if tc.name != "AsyncEVDDies" {
				asyncDrained(ctx, t, r0)
			}
			closeAll(ctx, t, rs)
		})
	}
}

// TestConnectionBroken reports a connection broken or timed out on the
// connection EVD (DAT_CONNECTION_EVENT_BROKEN, _TIMED_OUT), as a CM does
// for a connection that failed under an established endpoint: both ends
// report each other down, and the other connections carry on.
func TestConnectionBroken(t *testing.T) {
	for _, tc := range []struct {
		name  string
		event int
	}{
		{"Broken", fakectl.ConnBroken},
		{"TimedOut", fakectl.ConnTimedOut},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), watchdog)
			defer cancel()
			rs := asyncRanks(ctx, t, 3)
			r0, r1, r2 := rs[0], rs[1], rs[2]
			r0.Connect(ctx, t, r1.Rank)
			r0.Connect(ctx, t, r2.Rank)
			r0.Ping(ctx, t, r1.Rank, "before 0>1")
			r1.Ping(ctx, t, r0.Rank, "before 1>0")
			r0.Ping(ctx, t, r2.Rank, "before 0>2")

			if err := fakectl.ConnEvent(r1.onlyEndpoint(t), tc.event); err != nil {
				t.Fatal(err)
			}
			if err := r1.Rec.DownErr(ctx, t, 1, 0); !errors.Is(err, sdi.ErrPeerUnreachable) {
				t.Fatalf("rank 1's report of rank 0 down: %v, want sdi.ErrPeerUnreachable", err)
			}
			r0.Rec.DownErr(ctx, t, 0, 1)
			r0.Ping(ctx, t, r2.Rank, "after 0>2")
			r2.Ping(ctx, t, r0.Rank, "after 2>0")
			if r0.Rec.IsDown(2) || r2.Rec.IsDown(0) {
				t.Fatal("the connection between ranks 0 and 2 failed too")
			}
			closeAll(ctx, t, rs)
		})
	}
}
