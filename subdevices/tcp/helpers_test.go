package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hpc-multidevice/multidevice/internal/leakcheck"
	"github.com/hpc-multidevice/multidevice/internal/testlog"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// watchdog bounds every wait in these tests. It is a hang detector, not a
// performance assertion: on a healthy run every wait ends far sooner.
const watchdog = 30 * time.Second

// patientTimeout is a connect_timeout that load cannot trip. It is longer
// than the watchdog, so a handshake that never finishes is reported by the
// watchdog as a hang, not as a timeout. Tests whose handshakes must
// succeed, or must fail because of what they send, use it. A test that
// wants a handshake to time out gives an instance of its own a short
// connect_timeout, and nothing on that instance has to beat the clock.
const patientTimeout = 2 * watchdog

const testSecret = "test-secret"

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaked := leakedGoroutines(); leaked != "" {
			fmt.Fprintf(os.Stderr, "goroutines leaked by the tcp subdevice:\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

// leakedGoroutines returns the stacks of goroutines the package started
// that are still running.
func leakedGoroutines() string {
	return leakcheck.Goroutines("tcp.(*subDevice).acceptLoop", "tcp.(*subDevice).serveInbound", "tcp.(*lane).writeLoop", "tcp.(*lane).watch", "tcp.(*standby).watch", "tcp.(*idleWaiter).run")
}

// testLogger logs at Debug into a buffer the test can search, and shows it
// with t.Log when the test fails or MP_TEST_LOG_LEVEL is set.
func testLogger(t testing.TB, name string) (hclog.Logger, *testlog.Buffer) {
	buf := &testlog.Buffer{}
	level := hclog.Debug
	if l := os.Getenv("MP_TEST_LOG_LEVEL"); l != "" {
		level = hclog.LevelFromString(l)
	}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("MP_TEST_LOG_LEVEL") != "" {
			t.Logf("log of %s:\n%s", name, buf.String())
		}
	})
	return hclog.New(&hclog.LoggerOptions{Name: name, Level: level, Output: buf}), buf
}

type delivery struct {
	header, payload []byte
}

// recorder is a Handler that keeps copies of everything it is told.
type recorder struct {
	mu        sync.Mutex
	delivered map[sdi.Rank][]delivery
	done      map[uint64][]error // every SendDone per token, to spot duplicates
	downs     map[sdi.Rank]error
	downCount map[sdi.Rank]int
	busy      map[sdi.Rank]bool // a Deliver from that rank is running
	hold      time.Duration     // each Deliver lasts at least this long, to expose overlaps
	overlaps  int               // Deliver calls for one rank that overlapped
	late      int               // Handler calls after closedAt was set
	closed    bool              // set once the owning instance's Close returned
	changed   chan struct{}     // closed and replaced on every event
	// gate, when non-nil, makes Deliver wait until it is closed: it plays a
	// peer that stops reading.
	gate chan struct{}
}

func newRecorder() *recorder {
	return &recorder{
		delivered: make(map[sdi.Rank][]delivery),
		done:      make(map[uint64][]error),
		downs:     make(map[sdi.Rank]error),
		downCount: make(map[sdi.Rank]int),
		busy:      make(map[sdi.Rank]bool),
		changed:   make(chan struct{}),
	}
}

func (r *recorder) event() {
	if r.closed {
		r.late++
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *recorder) Deliver(from sdi.Rank, header, payload []byte) {
	r.mu.Lock()
	gate := r.gate
	if r.busy[from] {
		r.overlaps++
	}
	r.busy[from] = true
	hold := r.hold
	r.mu.Unlock()
	if gate != nil {
		<-gate
	}
	time.Sleep(hold)
	d := delivery{header: bytes.Clone(header), payload: bytes.Clone(payload)}
	r.mu.Lock()
	r.busy[from] = false
	r.delivered[from] = append(r.delivered[from], d)
	r.event()
	r.mu.Unlock()
}

func (r *recorder) SendDone(token uint64, err error) {
	r.mu.Lock()
	r.done[token] = append(r.done[token], err)
	r.event()
	r.mu.Unlock()
}

// completedInline records a frame Send completed at once (done=true) as if
// SendDone had reported it, so checks for exactly one completion per token
// cover both ways and catch a SendDone that follows done=true.
func (r *recorder) completedInline(token uint64) {
	r.mu.Lock()
	r.done[token] = append(r.done[token], nil)
	r.event()
	r.mu.Unlock()
}

func (r *recorder) PeerDown(peer sdi.Rank, err error) {
	r.mu.Lock()
	r.downs[peer] = err
	r.downCount[peer]++
	r.event()
	r.mu.Unlock()
}

// waitFor blocks until cond, evaluated under the recorder's lock, holds.
func (r *recorder) waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	timer := time.NewTimer(watchdog)
	defer timer.Stop()
	for {
		r.mu.Lock()
		ok := cond()
		ch := r.changed
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-timer.C:
			t.Fatalf("watchdog: still waiting for %s", what)
		}
	}
}

func (r *recorder) count(from sdi.Rank) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.delivered[from])
}

// node is one opened instance in a test job.
type node struct {
	sd    sdi.SubDevice
	rec   *recorder
	local sdi.Local
	log   *testlog.Buffer
	rank  sdi.Rank
}

type jobOpts struct {
	size   int // ranks in the job; defaults to the number of nodes
	config string
	secret string
	host   string
	// twoLoopbacks gives every rank a card with two interfaces, 127.0.0.1
	// and 127.0.0.2, so ranks connect to each other twice; config must
	// then listen on 0.0.0.0.
	twoLoopbacks bool
	// nap, when set, replaces both of the stand-by's naps: an hour means
	// stand-by ends only through Idle.
	nap time.Duration
	// handler, when set, makes the Handler Open gets from the node's
	// recorder (to add sdi.Placer, say).
	handler func(*recorder) sdi.Handler
}

// openNode opens rank r of a job named after the test.
func openNode(t testing.TB, r sdi.Rank, o jobOpts) *node {
	t.Helper()
	logger, buf := testLogger(t, fmt.Sprintf("tcp.%d", r))
	n := &node{sd: New(logger), rec: newRecorder(), log: buf, rank: r}
	if o.twoLoopbacks {
		n.sd.(*subDevice).ifaces = newTwoLoopbacks().(*subDevice).ifaces
	}
	if o.nap > 0 {
		st := n.sd.(*subDevice).standby
		st.nap, st.hintNap = o.nap, o.nap
	}
	secret := o.secret
	if secret == "" {
		secret = testSecret
	}
	host := o.host
	if host == "" {
		host = "testhost"
	}
	var h sdi.Handler = n.rec
	if o.handler != nil {
		h = o.handler(n.rec)
	}
	local, err := n.sd.Open(context.Background(), sdi.OpenParams{
		Rank: r, Size: o.size, Host: host, JobID: "job-" + t.Name(), Secret: []byte(secret),
		APIVersion: sdi.APIVersion, Config: []byte(o.config), Handler: h, Logger: logger,
	})
	if err != nil {
		t.Fatalf("open rank %d: %v", r, err)
	}
	if err := local.Caps.Validate(); err != nil {
		t.Fatalf("caps: %v", err)
	}
	n.local = local
	t.Cleanup(func() { n.close(t) })
	return n
}

func (n *node) close(t testing.TB) {
	if err := n.sd.Close(context.Background()); err != nil {
		t.Errorf("close rank %d: %v", n.rank, err)
	}
	n.rec.mu.Lock()
	n.rec.closed = true
	n.rec.mu.Unlock()
}

// newJob opens count instances and connects every pair in both directions.
func newJob(t testing.TB, count int, o jobOpts) []*node {
	t.Helper()
	if o.size == 0 {
		o.size = count
	}
	if o.config == "" {
		o.config = `{"listen": "127.0.0.1:0"}`
	}
	nodes := make([]*node, count)
	for i := range nodes {
		nodes[i] = openNode(t, sdi.Rank(i), o)
	}
	for _, a := range nodes {
		for _, b := range nodes {
			if a == b {
				continue
			}
			if err := a.sd.Connect(context.Background(), b.rank, b.local.Addr); err != nil {
				t.Fatalf("connect %d -> %d: %v", a.rank, b.rank, err)
			}
		}
	}
	return nodes
}

// send retries ErrWouldBlock until the frame is accepted, waiting for a
// SendDone in between as the contract suggests.
func send(t testing.TB, n *node, f *sdi.Frame) {
	t.Helper()
	timer := time.NewTimer(watchdog)
	defer timer.Stop()
	for {
		n.rec.mu.Lock()
		ch := n.rec.changed
		n.rec.mu.Unlock()
		done, err := n.sd.Send(f)
		switch {
		case err == nil:
			if done {
				n.rec.completedInline(f.Token)
			}
			return
		case errors.Is(err, sdi.ErrWouldBlock):
		default:
			t.Fatalf("send to %d: %v", f.Peer, err)
		}
		select {
		case <-ch:
		case <-timer.C:
			t.Fatalf("watchdog: send to %d blocked", f.Peer)
		}
	}
}

// frames returns the frames delivered from a rank so far.
func (r *recorder) frames(from sdi.Rank) []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.delivered[from]...)
}

// doneErrs returns the errors of every SendDone for token.
func (r *recorder) doneErrs(token uint64) []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.done[token]...)
}

// down returns the PeerDown error for a rank, or nil.
func (r *recorder) down(rank sdi.Rank) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.downs[rank]
}

// loopbackConfig is a config that listens on loopback and sets key to the
// string value, or leaves it out when value is empty.
func loopbackConfig(key, value string) string {
	if value == "" {
		return `{"listen": "127.0.0.1:0"}`
	}
	return `{"listen": "127.0.0.1:0", "` + key + `": "` + value + `"}`
}
