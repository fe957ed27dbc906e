//go:build verbs && cgo

package verbs

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/internal/testlog"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// openTest opens a provider on h, skipping without a usable device; the
// test closes it at the end if it has not.
func openTest(t *testing.T, h host) rdma.Provider {
	t.Helper()
	p, _, err := h.open(context.Background(), sdi.OpenParams{Logger: testlog.New(t, "verbs", hclog.Warn)})
	if errors.Is(err, rdma.ErrNoDevice) {
		t.Skipf("no usable RDMA device: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func register(t *testing.T, p rdma.Provider, n int) (rdma.Region, []byte) {
	t.Helper()
	buf := make([]byte, n)
	r, err := p.Register(buf)
	if err != nil {
		t.Fatal(err)
	}
	return r, buf
}

// pair connects p to itself: the dialer's endpoint and the acceptor's,
// each set up by its own function.
func pair(ctx context.Context, t *testing.T, p rdma.Provider, dialSetup, accSetup func(rdma.Endpoint) error) (de, ae rdma.Endpoint) {
	t.Helper()
	type accepted struct {
		ep  rdma.Endpoint
		err error
	}
	ch := make(chan accepted, 1)
	go func() {
		req, ok := <-p.Requests()
		if !ok {
			ch <- accepted{err: errors.New("Requests closed")}
			return
		}
		ep, err := req.Accept(2, accSetup)
		ch <- accepted{ep, err}
	}()
	de, err := p.Dial(ctx, p.Card(), []byte("pair"), 1, dialSetup)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	a := <-ch
	if a.err != nil {
		t.Fatalf("Accept: %v", a.err)
	}
	return de, a.ep
}

// waitAtLeast polls as waitFor does, appending to got, until it holds at
// least want completions.
func waitAtLeast(ctx context.Context, t *testing.T, p rdma.Provider, got []rdma.Completion, want int) []rdma.Completion {
	t.Helper()
	buf := make([]rdma.Completion, 8)
	for len(got) < want {
		n, err := p.Poll(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
		if n > 0 {
			continue
		}
		if err := p.Arm(); err != nil {
			t.Fatal(err)
		}
		if n, err = p.Poll(buf); err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
		if n > 0 {
			continue
		}
		if err := p.Wait(ctx); err != nil {
			t.Fatalf("Wait with %d of %d completions (%+v): %v", len(got), want, got, err)
		}
	}
	return got
}

// expectFailed finds the completion of (ep, wr) in cs and checks that it
// failed with an error saying want, and not as flushed work.
func expectFailed(t *testing.T, cs []rdma.Completion, ep uint32, wr uint64, op rdma.Op, want string) {
	t.Helper()
	for _, c := range cs {
		if c.Endpoint != ep || c.WR != wr {
			continue
		}
		if c.Op != op || c.Err == nil || errors.Is(c.Err, rdma.ErrFlushed) || !strings.Contains(c.Err.Error(), want) {
			t.Fatalf("completion %+v, want a %v failing with %q", c, op, want)
		}
		return
	}
	t.Fatalf("no completion for endpoint %d wr %d in %+v", ep, wr, cs)
}

// takeViolations checks, on the fakeverbs stand-in, that it saw the rule
// breaches a test commits on purpose, and only those: every line it logged
// says one of want.
func takeViolations(t *testing.T, want ...string) {
	t.Helper()
	if !fakeverbsLoaded() {
		return
	}
	v := strings.TrimSpace(newViolations())
	if v == "" {
		t.Fatalf("the fakeverbs stand-in saw no rule broken, want %q", want)
	}
	for _, line := range strings.Split(v, "\n") {
		ok := false
		for _, w := range want {
			ok = ok || strings.Contains(line, w)
		}
		if !ok {
			t.Errorf("unexpected rule breach: %s", line)
		}
	}
}

// TestRuleBreaches commits the errors a device reports in completions, not
// as flushes: a send that finds no receive, and a read outside the remote
// region. Each fails its endpoint; the rest of the work flushes.
func TestRuleBreaches(t *testing.T) {
	h := testHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := openTest(t, h)
	rd, dbuf := register(t, p, 4096)
	ra, _ := register(t, p, 4096)

	t.Run("SendWithoutReceive", func(t *testing.T) {
		de, ae := pair(ctx, t, p,
			func(ep rdma.Endpoint) error { return ep.PostRecv(100, rd, 0, 64) },
			func(rdma.Endpoint) error { return nil })
		copy(dbuf[1024:], "nobody listens")
		if err := de.PostSend(101, rd, 1024, 14); err != nil {
			t.Fatal(err)
		}
		got := waitFor(ctx, t, p, 2)
		expectFailed(t, got, 1, 101, rdma.OpSend, "RNR retry counter exceeded")
		expect(t, got, 1, 100, rdma.OpRecv, -1, rdma.ErrFlushed)
		takeViolations(t, "no receive posted")
		if err := de.Close(); err != nil {
			t.Fatal(err)
		}
		if err := ae.Close(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("ReadOutOfBounds", func(t *testing.T) {
		de, ae := pair(ctx, t, p,
			func(ep rdma.Endpoint) error { return ep.PostRecv(100, rd, 0, 64) },
			func(ep rdma.Endpoint) error { return ep.PostRecv(200, ra, 0, 64) })
		if err := de.PostRead(101, rd, 1024, 16, ra.Addr()+4096-8, ra.RKey()); err != nil {
			t.Fatal(err)
		}
		got := waitAtLeast(ctx, t, p, nil, 2)
		expectFailed(t, got, 1, 101, rdma.OpRead, "remote access error")
		expect(t, got, 1, 100, rdma.OpRecv, -1, rdma.ErrFlushed)
		if err := de.Close(); err != nil {
			t.Fatal(err)
		}
		if err := ae.Close(); err != nil {
			t.Fatal(err)
		}
		// The responder's QP failed with the read (IB), or its Close
		// flushes it now.
		got = waitAtLeast(ctx, t, p, got, 3)
		if len(got) != 3 {
			t.Fatalf("completions %+v, want 3", got)
		}
		expect(t, got, 2, 200, rdma.OpRecv, -1, rdma.ErrFlushed)
		takeViolations(t, "remote access error")
	})

	for _, r := range []rdma.Region{rd, ra} {
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestDialFails covers the ways a dial ends without a connection: nobody
// listens at the card, nobody has its address, and the dialer gives up
// while the peer still holds the request, which the peer then cannot
// accept.
func TestDialFails(t *testing.T) {
	h := testHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := openTest(t, h)
	noop := func(rdma.Endpoint) error { return nil }

	gone := openTest(t, h)
	card := gone.Card()
	if err := gone.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := p.Dial(ctx, card, nil, 1, noop)
	if err == nil || errors.Is(err, rdma.ErrRejected) || !strings.Contains(err.Error(), "nobody listens") {
		t.Errorf("Dial to a closed provider's card = %v, want an error saying nobody listens, not ErrRejected", err)
	}

	// TEST-NET-1 (RFC 5737): no host has it.
	ap, _ := parseCard(p.Card())
	if ap.Addr().Is4() {
		nowhere, err := formatCard(netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), 4791))
		if err != nil {
			t.Fatal(err)
		}
		sctx, scancel := context.WithTimeout(ctx, 300*time.Millisecond)
		start := time.Now()
		_, err = p.Dial(sctx, nowhere, nil, 2, noop)
		scancel()
		if err == nil || errors.Is(err, rdma.ErrRejected) {
			t.Errorf("Dial to an address nobody has = %v, want an error", err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("Dial to an address nobody has took %v, with a 300ms context", d)
		}
	}

	// The dialer gives up while the request waits at the peer.
	peer := openTest(t, h)
	r, _ := register(t, p, 4096)
	sctx, scancel := context.WithCancel(ctx)
	dialed := make(chan error, 1)
	go func() {
		_, err := p.Dial(sctx, peer.Card(), []byte("late"), 3, func(ep rdma.Endpoint) error { return ep.PostRecv(1, r, 0, 64) })
		dialed <- err
	}()
	var req rdma.Request
	select {
	case req = <-peer.Requests():
	case <-ctx.Done():
		t.Fatal("no request arrived")
	}
	scancel()
	if err := <-dialed; !errors.Is(err, context.Canceled) {
		t.Fatalf("Dial given up = %v, want context.Canceled", err)
	}
	// The dialer's posted receive flushes; polling it frees the endpoint.
	expect(t, waitFor(ctx, t, p, 1), 3, 1, rdma.OpRecv, -1, rdma.ErrFlushed)
	if ep, err := req.Accept(9, noop); err == nil {
		ep.Close()
		t.Fatal("Accept of a request whose dialer gave up succeeded")
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	for _, q := range []rdma.Provider{p, peer} {
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCloseBusy closes providers with everything still in use: connected
// endpoints with work posted and completions not polled, registered
// regions, a connection request nobody answered and a dial waiting for it.
// Close must free it all in an order the libraries accept, and the peer
// must see its connection fail.
func TestCloseBusy(t *testing.T) {
	h := testHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := openTest(t, h)
	b := openTest(t, h)
	ra, abuf := register(t, a, 4096)
	rb, _ := register(t, b, 4096)

	accepted := make(chan rdma.Endpoint, 1)
	go func() {
		req := <-b.Requests()
		ep, err := req.Accept(2, func(ep rdma.Endpoint) error {
			return errors.Join(ep.PostRecv(200, rb, 0, 64), ep.PostRecv(201, rb, 64, 64))
		})
		if err != nil {
			t.Errorf("Accept: %v", err)
		}
		accepted <- ep
	}()
	de, err := a.Dial(ctx, b.Card(), nil, 1, func(ep rdma.Endpoint) error { return ep.PostRecv(100, ra, 0, 64) })
	if err != nil {
		t.Fatal(err)
	}
	if <-accepted == nil {
		t.FailNow()
	}
	copy(abuf[1024:], "unpolled")
	if err := de.PostSend(101, ra, 1024, 8); err != nil {
		t.Fatal(err)
	}

	// A second dial whose request b never answers.
	dialed := make(chan error, 1)
	go func() {
		_, err := a.Dial(ctx, b.Card(), nil, 3, func(rdma.Endpoint) error { return nil })
		dialed <- err
	}()
	time.Sleep(50 * time.Millisecond) // let the request reach b

	if err := b.Close(); err != nil {
		t.Fatalf("Close with work, regions and a request outstanding: %v", err)
	}
	if _, ok := <-b.Requests(); ok {
		t.Fatal("Requests still open after Close")
	}
	select {
	case err := <-dialed:
		if err == nil {
			t.Fatal("a dial to a provider that closed succeeded")
		}
	case <-ctx.Done():
		t.Fatal("a dial to a provider that closed never returned")
	}
	// a's side of the connection fails: its receive flushes, after the
	// send, which completed or failed.
	got := waitFor(ctx, t, a, 2)
	expect(t, got, 1, 100, rdma.OpRecv, -1, rdma.ErrFlushed)
	for _, c := range got {
		if c.Endpoint != 1 || (c.WR != 100 && c.WR != 101) {
			t.Fatalf("unexpected completion %+v", c)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close with an open endpoint and a region: %v", err)
	}
}

// TestZeroLength sends an empty message into an empty receive: the
// provider posts no scatter/gather entry for it, since some adapters read
// an entry of length 0 as 2 GiB.
func TestZeroLength(t *testing.T) {
	h := testHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := openTest(t, h)
	rd, _ := register(t, p, 64)
	ra, _ := register(t, p, 64)
	de, ae := pair(ctx, t, p,
		func(rdma.Endpoint) error { return nil },
		func(ep rdma.Endpoint) error { return ep.PostRecv(200, ra, 64, 0) })
	if err := de.PostSend(101, rd, 0, 0); err != nil {
		t.Fatal(err)
	}
	got := waitFor(ctx, t, p, 2)
	expect(t, got, 1, 101, rdma.OpSend, -1, nil)
	expect(t, got, 2, 200, rdma.OpRecv, 0, nil)
	for _, c := range []interface{ Close() error }{de, ae, rd, ra, p} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
