//go:build verbs && cgo

package verbs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/internal/leakcheck"
	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/internal/testlog"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// fakeLog is the file the fakeverbs stand-in appends the rule breaches it
// sees to (FAKEVERBS_LOG), and fakeLogRead how much of it the tests have
// looked at.
var (
	fakeLog     string
	fakeLogMu   sync.Mutex
	fakeLogRead int64
)

func TestMain(m *testing.M) {
	f, err := os.CreateTemp("", "fakeverbs-*.log")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	f.Close()
	fakeLog = f.Name()
	// Set before any C call, so the fake's getenv never races with it.
	os.Setenv("FAKEVERBS_LOG", fakeLog)
	code := m.Run()
	if code == 0 {
		if leaked := leakedGoroutines(); leaked != "" {
			fmt.Fprintf(os.Stderr, "goroutines leaked by the verbs provider:\n%s\n", leaked)
			code = 1
		}
		if v := newViolations(); v != "" {
			fmt.Fprintf(os.Stderr, "the fakeverbs stand-in saw rules broken after the tests ended:\n%s", v)
			code = 1
		}
	}
	os.Remove(fakeLog)
	os.Exit(code)
}

// newViolations returns what the fake logged since the last call.
func newViolations() string {
	fakeLogMu.Lock()
	defer fakeLogMu.Unlock()
	f, err := os.Open(fakeLog)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, _ := io.ReadAll(io.NewSectionReader(f, fakeLogRead, 1<<30))
	fakeLogRead += int64(len(b))
	return string(b)
}

// leakedGoroutines returns the stacks of goroutines the package started
// that are still running.
func leakedGoroutines() string {
	return leakcheck.Goroutines("verbs.(*provider).cmLoop", "verbs.(*provider).deliver", "verbs.(*asyncReader).run")
}

// fakeverbsLoaded reports whether libibverbs and librdmacm are the
// fakeverbs stand-in (see testdata/fakeverbs/fakeverbs.c).
func fakeverbsLoaded() bool {
	b, err := os.ReadFile("/proc/self/maps")
	return err == nil && bytes.Contains(b, []byte("/libfakeverbs.so"))
}

// testHost is the machine the device tests run on: the fake's, when the
// fakeverbs stand-in is loaded (and then the test fails if the fake saw a
// rule broken), else this machine if it has an RDMA device; without either
// the test is skipped.
func testHost(t *testing.T) host {
	t.Helper()
	if fakeverbsLoaded() {
		newViolations()
		t.Cleanup(func() {
			if v := newViolations(); v != "" {
				t.Errorf("the fakeverbs stand-in saw rules broken:\n%s", v)
			}
		})
		return fakeHost(t)
	}
	if _, err := realHost.sys.devices(); err != nil {
		t.Skipf("needs an RDMA device, or the fakeverbs stand-in (testdata/fakeverbs/fakeverbs.c): %v", err)
	}
	return realHost
}

// TestOpenNoDevice runs where there is no RDMA device: Open must say so
// with rdma.ErrNoDevice, before touching librdmacm.
func TestOpenNoDevice(t *testing.T) {
	if devs, err := realHost.sys.devices(); err == nil {
		t.Skipf("this machine has RDMA devices %v; TestLoopback exercises them", devs)
	}
	log := testlog.New(t, "verbs", hclog.Warn)
	for _, cfg := range []string{"", `{"device": "mlx5_0"}`, `{"address": "10.1.0.7"}`} {
		prov, _, err := realHost.open(context.Background(), sdi.OpenParams{Config: []byte(cfg), Logger: log})
		if err == nil {
			prov.Close()
			t.Fatalf("open(%s) succeeded on a machine without RDMA devices", cfg)
		}
		if !errors.Is(err, rdma.ErrNoDevice) || !strings.Contains(err.Error(), "/sys/class/infiniband does not exist") {
			t.Fatalf("open(%s) = %v, want ErrNoDevice saying /sys/class/infiniband does not exist", cfg, err)
		}
	}
	// A config error is still a config error.
	if _, _, err := realHost.open(context.Background(), sdi.OpenParams{Config: []byte(`{"port": 0}`), Logger: log}); err == nil || errors.Is(err, rdma.ErrNoDevice) {
		t.Fatalf("open with port 0 = %v, want a config error", err)
	}
}

// TestLoopback connects the provider to itself and moves data both ways:
// send into a posted receive, an RDMA read, flushes on close at both ends,
// and a rejected request. It needs a device with an ACTIVE port and an IP
// address on its interface, or the fakeverbs stand-in.
func TestLoopback(t *testing.T) {
	h := testHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	log := testlog.New(t, "verbs", hclog.Warn)
	prov, _, err := h.open(ctx, sdi.OpenParams{Logger: log})
	if errors.Is(err, rdma.ErrNoDevice) {
		t.Skipf("no usable RDMA device: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	p := prov
	defer p.Close()

	lim := p.Limits()
	if lim.MaxPrivate != maxPrivate || lim.MaxSendWR < 1 || lim.MaxRecvWR < 1 || lim.MaxMsg < rdma.DefaultEagerBytes || lim.CQSize < 1 {
		t.Fatalf("Limits = %+v", lim)
	}
	if _, err := parseCard(p.Card()); err != nil {
		t.Fatalf("own card: %v", err)
	}

	const n = 4096
	dialBuf := make([]byte, 3*n) // receive | send | read source
	accBuf := make([]byte, 3*n)  // receive | read target | unused
	rd, err := p.Register(dialBuf)
	if err != nil {
		t.Fatal(err)
	}
	ra, err := p.Register(accBuf)
	if err != nil {
		t.Fatal(err)
	}

	const dialID, accID = 1, 2
	type accepted struct {
		ep      rdma.Endpoint
		private []byte
		err     error
	}
	accCh := make(chan accepted, 1)
	go func() {
		req, ok := <-p.Requests()
		if !ok {
			accCh <- accepted{err: errors.New("Requests closed")}
			return
		}
		ep, err := req.Accept(accID, func(ep rdma.Endpoint) error { return ep.PostRecv(200, ra, 0, n) })
		accCh <- accepted{ep, req.Private(), err}
	}()
	de, err := p.Dial(ctx, p.Card(), []byte("hello"), dialID, func(ep rdma.Endpoint) error { return ep.PostRecv(100, rd, 0, n) })
	if err != nil {
		t.Fatalf("Dial own card: %v", err)
	}
	a := <-accCh
	if a.err != nil {
		t.Fatalf("Accept: %v", a.err)
	}
	if string(a.private) != "hello" {
		t.Fatalf("Private = %q, want %q", a.private, "hello")
	}

	copy(dialBuf[n:], "ping")
	if err := de.PostSend(101, rd, n, 4); err != nil {
		t.Fatal(err)
	}
	got := waitFor(ctx, t, p, 2)
	expect(t, got, dialID, 101, rdma.OpSend, -1, nil)
	expect(t, got, accID, 200, rdma.OpRecv, 4, nil)
	if string(accBuf[:4]) != "ping" {
		t.Fatalf("received %q, want ping", accBuf[:4])
	}

	msg := []byte("read me, please!")
	copy(dialBuf[2*n:], msg)
	if err := a.ep.PostRead(201, ra, n, len(msg), rd.Addr()+2*n, rd.RKey()); err != nil {
		t.Fatal(err)
	}
	got = waitFor(ctx, t, p, 1)
	expect(t, got, accID, 201, rdma.OpRead, -1, nil)
	if !bytes.Equal(accBuf[n:n+len(msg)], msg) {
		t.Fatalf("read %q, want %q", accBuf[n:n+len(msg)], msg)
	}

	// Closing one end flushes its posted receive and, through the
	// disconnect, the peer's.
	if err := a.ep.PostRecv(202, ra, 0, n); err != nil {
		t.Fatal(err)
	}
	if err := de.Close(); err != nil {
		t.Fatal(err)
	}
	got = waitFor(ctx, t, p, 2)
	expect(t, got, dialID, 100, rdma.OpRecv, -1, rdma.ErrFlushed)
	expect(t, got, accID, 202, rdma.OpRecv, -1, rdma.ErrFlushed)
	if err := de.PostSend(102, rd, n, 4); !errors.Is(err, rdma.ErrFlushed) {
		t.Fatalf("PostSend on a closed endpoint = %v, want ErrFlushed", err)
	}
	if err := a.ep.Close(); err != nil {
		t.Fatal(err)
	}

	go func() {
		if req, ok := <-p.Requests(); ok {
			req.Reject()
		}
	}()
	if _, err := p.Dial(ctx, p.Card(), nil, 3, func(rdma.Endpoint) error { return nil }); !errors.Is(err, rdma.ErrRejected) {
		t.Fatalf("Dial to a rejecting peer = %v, want ErrRejected", err)
	}

	if err := rd.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-p.Requests(); ok {
		t.Fatal("Requests still open after Close")
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// waitFor polls the way the engine does (poll, arm, poll, wait) until want
// completions came.
func waitFor(ctx context.Context, t *testing.T, p rdma.Provider, want int) []rdma.Completion {
	t.Helper()
	got := waitAtLeast(ctx, t, p, nil, want)
	if len(got) != want {
		t.Fatalf("got completions %+v, want %d", got, want)
	}
	return got
}

// expect finds the completion of (ep, wr) in cs; wantLen < 0 skips the
// length check.
func expect(t *testing.T, cs []rdma.Completion, ep uint32, wr uint64, op rdma.Op, wantLen int, wantErr error) {
	t.Helper()
	for _, c := range cs {
		if c.Endpoint != ep || c.WR != wr {
			continue
		}
		if c.Op != op || (wantLen >= 0 && c.Len != wantLen) {
			t.Fatalf("completion %+v, want op %v len %d", c, op, wantLen)
		}
		if wantErr == nil && c.Err != nil || wantErr != nil && !errors.Is(c.Err, wantErr) {
			t.Fatalf("completion %+v, want error %v", c, wantErr)
		}
		return
	}
	t.Fatalf("no completion for endpoint %d wr %d in %+v", ep, wr, cs)
}
