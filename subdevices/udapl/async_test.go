//go:build udapl && cgo

package udapl

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/internal/testlog"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/subdevices/udapl/internal/fakectl"
)

// These tests make the fakedat stand-in report what DAT reports
// asynchronously (an endpoint that broke or timed out, an EVD that
// overflowed, an IA that died, a connection that broke) or make an EVD
// fail for good, and check that the engine over this provider sees the
// connections concerned fail, and only those, instead of waiting.

// recorder is the sdi.Handler of one test rank.
type recorder struct {
	mu      sync.Mutex
	down    map[sdi.Rank]error
	got     map[sdi.Rank][]string // payloads delivered, by sender
	changed chan struct{}         // signalled on every call
}

func newRecorder() *recorder {
	return &recorder{down: make(map[sdi.Rank]error), got: make(map[sdi.Rank][]string), changed: make(chan struct{}, 1)}
}

func (r *recorder) signal() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *recorder) Deliver(from sdi.Rank, _, payload []byte) {
	r.mu.Lock()
	r.got[from] = append(r.got[from], string(payload))
	r.mu.Unlock()
	r.signal()
}

func (r *recorder) SendDone(uint64, error) {}

func (r *recorder) PeerDown(peer sdi.Rank, err error) {
	r.mu.Lock()
	if _, ok := r.down[peer]; !ok {
		r.down[peer] = err
	}
	r.mu.Unlock()
	r.signal()
}

// await waits until cond, checked under r.mu, holds.
func (r *recorder) await(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-r.changed:
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		}
	}
}

// downErr waits for the rank to report peer down, and returns the error.
func (r *recorder) downErr(ctx context.Context, t *testing.T, self, peer sdi.Rank) error {
	t.Helper()
	var err error
	r.await(ctx, t, fmt.Sprintf("rank %d to report rank %d down", self, peer), func() bool {
		var ok bool
		err, ok = r.down[peer]
		return ok
	})
	return err
}

func (r *recorder) isDown(peer sdi.Rank) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.down[peer]
	return ok
}

// testRank is one rank of a job in this process: the engine over a udapl
// provider, whose DAT handles the tests reach through prov.
type testRank struct {
	rank sdi.Rank
	sd   sdi.SubDevice
	prov *provider
	rec  *recorder
	card []byte
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
		r := &testRank{rank: sdi.Rank(i), rec: newRecorder()}
		log := hclog.New(&hclog.LoggerOptions{Name: fmt.Sprintf("udapl.rank%d", i), Level: hclog.Debug, Output: logs})
		openRank := func(ctx context.Context, p sdi.OpenParams) (rdma.Provider, rdma.Settings, error) {
			prov, set, err := open(ctx, p)
			if err == nil {
				r.prov = prov.(*provider)
			}
			return prov, set, err
		}
		r.sd = rdma.New(sdi.Info{Name: "udapl", Version: "test", APIVersions: []string{sdi.APIVersion}}, openRank, log)
		loc, err := r.sd.Open(ctx, sdi.OpenParams{
			Rank: r.rank, Size: n, JobID: t.Name(), Secret: []byte("async test secret"),
			APIVersion: sdi.APIVersion, Handler: r.rec, Logger: log,
		})
		if errors.Is(err, rdma.ErrNoDevice) {
			t.Skipf("no uDAPL interface adapter opens here: %v", err)
		}
		if err != nil {
			t.Fatalf("open rank %d: %v", i, err)
		}
		r.card = loc.Addr
		t.Cleanup(func() {
			// Bounded, so that a test that failed because something
			// stalls does not stall the ones after it.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r.sd.Close(ctx)
		})
		ranks[i] = r
	}
	return ranks
}

func (r *testRank) connect(ctx context.Context, t *testing.T, to *testRank) {
	t.Helper()
	if err := r.sd.Connect(ctx, to.rank, to.card); err != nil {
		t.Fatalf("rank %d connect to rank %d: %v", r.rank, to.rank, err)
	}
}

// send sends one eager frame, waiting out backpressure.
func (r *testRank) send(ctx context.Context, to sdi.Rank, payload string) error {
	for {
		_, err := r.sd.Send(&sdi.Frame{Peer: to, Header: []byte("h"), Payload: []byte(payload)})
		if !errors.Is(err, sdi.ErrWouldBlock) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// ping sends a frame from r to peer and waits for it to arrive. It
// connects first: on the accepting side that waits for the connection to
// be up, which its first frames may arrive before.
func (r *testRank) ping(ctx context.Context, t *testing.T, to *testRank, payload string) {
	t.Helper()
	r.connect(ctx, t, to)
	if err := r.send(ctx, to.rank, payload); err != nil {
		t.Fatalf("rank %d send to rank %d: %v", r.rank, to.rank, err)
	}
	to.rec.await(ctx, t, fmt.Sprintf("rank %d to receive %q from rank %d", to.rank, payload, r.rank), func() bool {
		for _, p := range to.rec.got[r.rank] {
			if p == payload {
				return true
			}
		}
		return false
	})
}

// onlyEndpoint returns the handle of the rank's one endpoint.
func (r *testRank) onlyEndpoint(t *testing.T) unsafe.Pointer {
	t.Helper()
	eps := r.prov.endpoints()
	if len(eps) != 1 {
		t.Fatalf("rank %d has %d endpoints, want 1", r.rank, len(eps))
	}
	return unsafe.Pointer(eps[0].h)
}

func (r *testRank) ia() unsafe.Pointer { return unsafe.Pointer(r.prov.ia) }

// wantMentions fails unless err says every one of words.
func wantMentions(t *testing.T, what string, err error, words ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want one saying %q", what, words)
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("%s: %v\nwant it to say %q", what, err, w)
		}
	}
}

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
			t.Fatalf("rank %d's async EVD still holds %d events: %v", r.rank, n, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// closeAll closes the ranks, which must work whatever failed, and checks
// that no goroutine of the provider is left.
func closeAll(ctx context.Context, t *testing.T, ranks []*testRank) {
	t.Helper()
	for _, r := range ranks {
		if err := r.sd.Close(ctx); err != nil {
			t.Errorf("close rank %d: %v", r.rank, err)
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
			r0.connect(ctx, t, r1)
			r0.connect(ctx, t, r2)
			r0.ping(ctx, t, r1, "before 0>1")
			r1.ping(ctx, t, r0, "before 1>0")
			r0.ping(ctx, t, r2, "before 0>2")

			if err := fakectl.BreakEP(r1.onlyEndpoint(t), tc.event, tc.nameEP); err != nil {
				t.Fatal(err)
			}
			err := r1.rec.downErr(ctx, t, 1, 0)
			wantMentions(t, "rank 1's report of rank 0 down", err, tc.want, r1.prov.iaName)
			if !errors.Is(err, sdi.ErrPeerUnreachable) {
				t.Fatalf("rank 1's report of rank 0 down: %v, want sdi.ErrPeerUnreachable", err)
			}
			r0.rec.downErr(ctx, t, 0, 1) // told when rank 1 frees the endpoint
			wantMentions(t, "rank 1's send to rank 0", r1.send(ctx, 0, "after"), tc.want)

			r0.ping(ctx, t, r2, "after 0>2")
			r2.ping(ctx, t, r0, "after 2>0")
			if r0.rec.isDown(2) || r2.rec.isDown(0) {
				t.Fatal("the connection between ranks 0 and 2 failed too")
			}
			// The rank itself still works: it connects again.
			r1.ping(ctx, t, r2, "after 1>2")
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
			r0.connect(ctx, t, r1)
			r0.connect(ctx, t, r2)
			r1.connect(ctx, t, r2)
			r1.ping(ctx, t, r0, "1>0")
			r2.ping(ctx, t, r0, "2>0")
			r1.ping(ctx, t, r2, "1>2")

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
				err := r0.rec.downErr(ctx, t, 0, peer.rank)
				wantMentions(t, fmt.Sprintf("rank 0's report of rank %d down", peer.rank), lower(err), want...)
				if !errors.Is(err, sdi.ErrPeerUnreachable) {
					t.Fatalf("rank 0's report of rank %d down: %v, want sdi.ErrPeerUnreachable", peer.rank, err)
				}
				peer.rec.downErr(ctx, t, peer.rank, 0)
			}
			wantMentions(t, "rank 0's send to rank 2", lower(r0.send(ctx, 2, "after")), want...)
			err := r0.sd.Connect(ctx, 1, r1.card)
			wantMentions(t, "rank 0's connect to rank 1", lower(err), want...)
			if !errors.Is(err, sdi.ErrPeerUnreachable) || !errors.Is(err, errIAFailed) {
				t.Fatalf("rank 0's connect to rank 1: %v, want sdi.ErrPeerUnreachable and errIAFailed", err)
			}
			r1.ping(ctx, t, r2, "after 1>2")
			r2.ping(ctx, t, r1, "after 2>1")
			if r1.rec.isDown(2) || r2.rec.isDown(1) {
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
			r0.connect(ctx, t, r1)
			r0.connect(ctx, t, r2)
			r0.ping(ctx, t, r1, "before 0>1")
			r1.ping(ctx, t, r0, "before 1>0")
			r0.ping(ctx, t, r2, "before 0>2")

			if err := fakectl.ConnEvent(r1.onlyEndpoint(t), tc.event); err != nil {
				t.Fatal(err)
			}
			if err := r1.rec.downErr(ctx, t, 1, 0); !errors.Is(err, sdi.ErrPeerUnreachable) {
				t.Fatalf("rank 1's report of rank 0 down: %v, want sdi.ErrPeerUnreachable", err)
			}
			r0.rec.downErr(ctx, t, 0, 1)
			r0.ping(ctx, t, r2, "after 0>2")
			r2.ping(ctx, t, r0, "after 2>0")
			if r0.rec.isDown(2) || r2.rec.isDown(0) {
				t.Fatal("the connection between ranks 0 and 2 failed too")
			}
			closeAll(ctx, t, rs)
		})
	}
}
