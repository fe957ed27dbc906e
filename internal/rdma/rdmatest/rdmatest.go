// Package rdmatest holds what the tests of the RDMA subdevices
// (subdevices/verbs, subdevices/udapl) share to drive the engine over their
// providers: a [Recorder] handler that keeps what each rank is told, and a
// [Rank] that opens, connects and sends through nothing but the
// [sdi.SubDevice] it wraps. What reaches into a provider's C handles stays
// in the subdevice's own tests.
package rdmatest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// Recorder is the [sdi.Handler] of one test rank: it keeps the payloads
// delivered and the first reason each peer was reported down.
type Recorder struct {
	mu      sync.Mutex
	down    map[sdi.Rank]error
	got     map[sdi.Rank][]string // payloads delivered, by sender
	changed chan struct{}         // signalled on every call
}

// NewRecorder returns a Recorder that has been told nothing.
func NewRecorder() *Recorder {
	return &Recorder{down: make(map[sdi.Rank]error), got: make(map[sdi.Rank][]string), changed: make(chan struct{}, 1)}
}

func (r *Recorder) signal() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// Deliver keeps the payload, by sender.
func (r *Recorder) Deliver(from sdi.Rank, _, payload []byte) {
	r.mu.Lock()
	r.got[from] = append(r.got[from], string(payload))
	r.mu.Unlock()
	r.signal()
}

// SendDone ignores the completion.
func (r *Recorder) SendDone(uint64, error) {}

// PeerDown keeps err if it is the first report of peer down.
func (r *Recorder) PeerDown(peer sdi.Rank, err error) {
	r.mu.Lock()
	if _, ok := r.down[peer]; !ok {
		r.down[peer] = err
	}
	r.mu.Unlock()
	r.signal()
}

// Await waits until cond holds, checking it again after every call the
// recorder takes, and fails the test if ctx ends first. cond runs without
// the recorder locked, so it may call [Recorder.Has] and [Recorder.IsDown].
func (r *Recorder) Await(ctx context.Context, t testing.TB, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-r.changed:
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		}
	}
}

// DownErr waits for rank self, whose recorder r is, to report peer down,
// and returns the reason it gave.
func (r *Recorder) DownErr(ctx context.Context, t testing.TB, self, peer sdi.Rank) error {
	t.Helper()
	var err error
	r.Await(ctx, t, fmt.Sprintf("rank %d to report rank %d down", self, peer), func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		var ok bool
		err, ok = r.down[peer]
		return ok
	})
	return err
}

// IsDown reports whether peer has been reported down.
func (r *Recorder) IsDown(peer sdi.Rank) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.down[peer]
	return ok
}

// Has reports whether payload has been delivered from rank from.
func (r *Recorder) Has(from sdi.Rank, payload string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.got[from] {
		if p == payload {
			return true
		}
	}
	return false
}

// Rank is one rank of a job in the test's process: the subdevice, the
// Recorder it reports to, and the card others connect to it by.
type Rank struct {
	ID   sdi.Rank
	SD   sdi.SubDevice
	Rec  *Recorder
	Card []byte
}

// Open opens rank id of a job of size ranks named after the test: the
// engine named name over the provider open returns, logging to log and
// reporting to a new Recorder. Unless it fails, the rank is closed when the
// test ends, within a bound, if the test has not closed it.
func Open(ctx context.Context, t testing.TB, name string, id sdi.Rank, size int, open rdma.OpenFunc, log hclog.Logger) (*Rank, error) {
	t.Helper()
	r := &Rank{ID: id, Rec: NewRecorder()}
	r.SD = rdma.New(sdi.Info{Name: name, Version: "test", APIVersions: []string{sdi.APIVersion}}, open, log)
	loc, err := r.SD.Open(ctx, sdi.OpenParams{
		Rank: id, Size: size, JobID: t.Name(), Secret: []byte("async test secret"),
		APIVersion: sdi.APIVersion, Handler: r.Rec, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	r.Card = loc.Addr
	t.Cleanup(func() {
		// Bounded, so that a test that failed because something
		// stalls does not stall the ones after it.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r.SD.Close(ctx)
	})
	return r, nil
}

// Connect connects r to rank to, failing the test if it cannot.
func (r *Rank) Connect(ctx context.Context, t testing.TB, to *Rank) {
	t.Helper()
	if err := r.SD.Connect(ctx, to.ID, to.Card); err != nil {
		t.Fatalf("rank %d connect to rank %d: %v", r.ID, to.ID, err)
	}
}

// Send sends one eager frame, waiting out backpressure.
func (r *Rank) Send(ctx context.Context, to sdi.Rank, payload string) error {
	for {
		_, err := r.SD.Send(&sdi.Frame{Peer: to, Header: []byte("h"), Payload: []byte(payload)})
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

// Ping sends a frame from r to rank to and waits for it to arrive. It
// connects first: on the accepting side that waits for the connection to
// be up, which its first frames may arrive before.
func (r *Rank) Ping(ctx context.Context, t testing.TB, to *Rank, payload string) {
	t.Helper()
	r.Connect(ctx, t, to)
	if err := r.Send(ctx, to.ID, payload); err != nil {
		t.Fatalf("rank %d send to rank %d: %v", r.ID, to.ID, err)
	}
	to.Rec.Await(ctx, t, fmt.Sprintf("rank %d to receive %q from rank %d", to.ID, payload, r.ID), func() bool {
		return to.Rec.Has(r.ID, payload)
	})
}

// WantMentions fails the test unless err says every one of words.
func WantMentions(t testing.TB, what string, err error, words ...string) {
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
