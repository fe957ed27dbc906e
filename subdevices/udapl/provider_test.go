//go:build udapl && cgo

package udapl

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/internal/leakcheck"
	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/internal/testlog"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// watchdog bounds every wait in these tests; a healthy run ends far sooner.
const watchdog = 30 * time.Second

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaked := leakedGoroutines(); leaked != "" {
			fmt.Fprintf(os.Stderr, "goroutines leaked by the udapl provider:\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

// leakedGoroutines returns the stacks of goroutines the package started
// that are still running.
func leakedGoroutines() string {
	return leakcheck.Goroutines("udapl.(*provider).listen", "udapl.(*provider).watch")
}

func openParams(t *testing.T, config string) sdi.OpenParams {
	return sdi.OpenParams{Config: []byte(config), Logger: testlog.New(t, "udapl", hclog.Debug)}
}

// TestOpenNoDevice opens the registry's default IA. On a machine without an
// RDMA adapter that fails, and must say so in a way the multidevice can
// act on (rdma.ErrNoDevice) and a user can read.
func TestOpenNoDevice(t *testing.T) {
	p, _, err := open(context.Background(), openParams(t, ""))
	if err == nil {
		card := p.(*provider).cardAddr()
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		t.Skipf("a uDAPL interface adapter opens here (card %s); TestLoopback exercises it", card)
	}
	t.Logf("open: %v", err)
	if !errors.Is(err, rdma.ErrNoDevice) {
		t.Fatalf("open error %v does not wrap rdma.ErrNoDevice", err)
	}
	var st datStatus
	if !errors.As(err, &st) {
		t.Fatalf("open error %v does not carry the DAT return code", err)
	}
	for _, want := range []string{"udapl: dat_ia_open", "/etc/dat.conf", "config key ia"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("open error %q does not mention %q", err, want)
		}
	}
}

// TestOpenUnknownIA names an IA no registry lists: that is a machine
// without the device too, whatever hardware it has.
func TestOpenUnknownIA(t *testing.T) {
	_, _, err := open(context.Background(), openParams(t, `{"ia": "udapl-test-no-such-ia"}`))
	if err == nil {
		t.Fatal("open of an IA the registry does not list succeeded")
	}
	var st datStatus
	if !errors.Is(err, rdma.ErrNoDevice) || !errors.As(err, &st) || st.typ() != datProviderNotFound {
		t.Fatalf("open error %v: want rdma.ErrNoDevice and DAT_PROVIDER_NOT_FOUND", err)
	}
	if !strings.Contains(err.Error(), `"udapl-test-no-such-ia" (config key ia)`) {
		t.Fatalf("open error %q does not name the IA and where it came from", err)
	}
}

func TestOpenBadConfig(t *testing.T) {
	_, _, err := open(context.Background(), openParams(t, `{"port": 0}`))
	if err == nil || errors.Is(err, rdma.ErrNoDevice) || !strings.Contains(err.Error(), "udapl: config: port 0") {
		t.Fatalf("open with port 0: %v, want the config error", err)
	}
}

// TestFirstProvider checks that the default IA is the first entry of
// /etc/dat.conf, as dat_registry_list_providers reads it.
func TestFirstProvider(t *testing.T) {
	if os.Getenv("DAT_OVERRIDE") != "" {
		t.Skip("DAT_OVERRIDE names another registry file")
	}
	f, err := os.Open("/etc/dat.conf")
	if err != nil {
		t.Skipf("no DAT registry: %v", err)
	}
	defer f.Close()
	var first string
	for sc := bufio.NewScanner(f); sc.Scan(); {
		if fields := strings.Fields(sc.Text()); len(fields) > 0 && !strings.HasPrefix(fields[0], "#") {
			first = fields[0]
			break
		}
	}
	got, ok := firstProvider()
	if first == "" {
		if ok {
			t.Fatalf("firstProvider() = %q from a registry without entries", got)
		}
		return
	}
	if !ok || got != first {
		t.Fatalf("firstProvider() = %q, %v; the first entry of /etc/dat.conf is %q", got, ok, first)
	}
}

// openOrSkip opens the provider, or skips the test where no IA opens.
func openOrSkip(t *testing.T) *provider {
	t.Helper()
	p, _, err := open(context.Background(), openParams(t, ""))
	if errors.Is(err, rdma.ErrNoDevice) {
		t.Skipf("no uDAPL interface adapter opens here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p.(*provider)
}

// collect polls p until it has a completion for every (endpoint, WR) in
// want, and returns them by key.
func collect(t *testing.T, p *provider, want ...[2]uint64) map[[2]uint64]rdma.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), watchdog)
	defer cancel()
	got := map[[2]uint64]rdma.Completion{}
	cs := make([]rdma.Completion, 16)
	for {
		n, err := p.Poll(cs)
		if err != nil {
			t.Fatalf("Poll: %v", err)
		}
		for _, c := range cs[:n] {
			got[[2]uint64{uint64(c.Endpoint), c.WR}] = c
		}
		done := true
		for _, k := range want {
			if _, ok := got[k]; !ok {
				done = false
			}
		}
		if done {
			return got
		}
		if err := p.Arm(); err != nil {
			t.Fatalf("Arm: %v", err)
		}
		if n, _ := p.Poll(cs[:0]); n != 0 {
			continue
		}
		if err := p.Wait(ctx); err != nil {
			t.Fatalf("waiting for completions %v, have %v: %v", want, got, err)
		}
	}
}

// TestLoopback connects the provider to itself and moves a message by
// send and another by RDMA read, then closes one end and checks that the
// work posted at both ends completes, flushed.
func TestLoopback(t *testing.T) {
	p := openOrSkip(t)
	bufA, bufB := make([]byte, 8192), make([]byte, 8192)
	ra, err := p.Register(bufA)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := p.Register(bufB)
	if err != nil {
		t.Fatal(err)
	}
	defer ra.Close()
	defer rb.Close()

	type accepted struct {
		ep  rdma.Endpoint
		err error
	}
	acc := make(chan accepted, 1)
	go func() {
		r, ok := <-p.Requests()
		if !ok {
			acc <- accepted{err: errors.New("requests closed")}
			return
		}
		if got := string(r.Private()); got != "hello" {
			r.Reject()
			acc <- accepted{err: fmt.Errorf("private data %q, want %q", got, "hello")}
			return
		}
		ep, err := r.Accept(2, func(ep rdma.Endpoint) error { return ep.PostRecv(20, rb, 0, 64) })
		acc <- accepted{ep, err}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), watchdog)
	defer cancel()
	epA, err := p.Dial(ctx, p.Card(), []byte("hello"), 1, func(ep rdma.Endpoint) error { return ep.PostRecv(10, ra, 0, 64) })
	if err != nil {
		t.Fatalf("Dial own card: %v", err)
	}
	a := <-acc
	if a.err != nil {
		t.Fatalf("Accept: %v", a.err)
	}
	epB := a.ep

	copy(bufA[100:], "ping")
	if err := epA.PostSend(11, ra, 100, 4); err != nil {
		t.Fatal(err)
	}
	got := collect(t, p, [2]uint64{1, 11}, [2]uint64{2, 20})
	if c := got[[2]uint64{2, 20}]; c.Err != nil || c.Op != rdma.OpRecv || c.Len != 4 || string(bufB[:4]) != "ping" {
		t.Fatalf("receive completion %+v, buffer %q", c, bufB[:4])
	}
	if c := got[[2]uint64{1, 11}]; c.Err != nil || c.Op != rdma.OpSend {
		t.Fatalf("send completion %+v", c)
	}

	copy(bufB[1000:], "remote data")
	if err := epA.PostRead(12, ra, 2000, 11, rb.Addr()+1000, rb.RKey()); err != nil {
		t.Fatal(err)
	}
	got = collect(t, p, [2]uint64{1, 12})
	if c := got[[2]uint64{1, 12}]; c.Err != nil || c.Op != rdma.OpRead || !bytes.Equal(bufA[2000:2011], []byte("remote data")) {
		t.Fatalf("read completion %+v, buffer %q", c, bufA[2000:2011])
	}

	if err := epB.PostRecv(21, rb, 64, 64); err != nil {
		t.Fatal(err)
	}
	if err := epA.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	got = collect(t, p, [2]uint64{1, 10}, [2]uint64{2, 21})
	for _, k := range [][2]uint64{{1, 10}, {2, 21}} {
		if c := got[k]; !errors.Is(c.Err, rdma.ErrFlushed) {
			t.Errorf("endpoint %d WR %d after close: %+v, want flushed", k[0], k[1], c)
		}
	}
	if err := epB.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// Work posted on a closed endpoint flushes at once.
	if err := epA.PostRecv(13, ra, 0, 64); err != nil {
		t.Fatal(err)
	}
	if c := collect(t, p, [2]uint64{1, 13})[[2]uint64{1, 13}]; !errors.Is(c.Err, rdma.ErrFlushed) {
		t.Fatalf("receive posted after close: %+v, want flushed", c)
	}
}

// TestDialRejected checks that a refused request fails Dial with
// rdma.ErrRejected and flushes what setup posted.
func TestDialRejected(t *testing.T) {
	p := openOrSkip(t)
	buf := make([]byte, 4096)
	r, err := p.Register(buf)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	go func() {
		if req, ok := <-p.Requests(); ok {
			req.Reject()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), watchdog)
	defer cancel()
	_, err = p.Dial(ctx, p.Card(), nil, 3, func(ep rdma.Endpoint) error { return ep.PostRecv(30, r, 0, 64) })
	if !errors.Is(err, rdma.ErrRejected) {
		t.Fatalf("Dial to a listener that rejects: %v, want rdma.ErrRejected", err)
	}
	if c := collect(t, p, [2]uint64{3, 30})[[2]uint64{3, 30}]; !errors.Is(c.Err, rdma.ErrFlushed) {
		t.Fatalf("receive posted by setup: %+v, want flushed", c)
	}
}

// TestDialSetupFails checks that a setup error fails Dial with it, and that
// what setup posted before failing completes, flushed, although the
// endpoint never connected.
func TestDialSetupFails(t *testing.T) {
	p := openOrSkip(t)
	r, err := p.Register(make([]byte, 4096))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	errSetup := errors.New("setup refused")
	ctx, cancel := context.WithTimeout(context.Background(), watchdog)
	defer cancel()
	_, err = p.Dial(ctx, p.Card(), nil, 4, func(ep rdma.Endpoint) error {
		if err := ep.PostRecv(40, r, 0, 64); err != nil {
			return err
		}
		return errSetup
	})
	if !errors.Is(err, errSetup) {
		t.Fatalf("Dial: %v, want the setup error", err)
	}
	if c := collect(t, p, [2]uint64{4, 40})[[2]uint64{4, 40}]; !errors.Is(c.Err, rdma.ErrFlushed) {
		t.Fatalf("receive posted by setup: %+v, want flushed", c)
	}
}

// TestDialCancelled checks that a Dial nobody answers ends with its
// context and flushes what setup posted, and that Close disposes of the
// request nobody took.
func TestDialCancelled(t *testing.T) {
	p := openOrSkip(t)
	r, err := p.Register(make([]byte, 4096))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = p.Dial(ctx, p.Card(), []byte("x"), 5, func(ep rdma.Endpoint) error { return ep.PostRecv(50, r, 0, 64) })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dial nobody answers: %v, want the context's deadline", err)
	}
	if c := collect(t, p, [2]uint64{5, 50})[[2]uint64{5, 50}]; !errors.Is(c.Err, rdma.ErrFlushed) {
		t.Fatalf("receive posted by setup: %+v, want flushed", c)
	}
}

// TestWaitKeepsEvent checks that the completion Wait takes out of the EVD
// is the first the next Poll returns.
func TestWaitKeepsEvent(t *testing.T) {
	p := openOrSkip(t)
	a, b := connectPair(t, p, p)
	buf := make([]byte, 4096)
	r, err := p.Register(buf)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := b.PostRecv(60, r, 0, 64); err != nil {
		t.Fatal(err)
	}
	if err := a.PostSend(61, r, 100, 8); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), watchdog)
	defer cancel()
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	cs := make([]rdma.Completion, 1)
	if n, err := p.Poll(cs); err != nil || n != 1 {
		t.Fatalf("Poll after Wait = %d, %v; want the completion Wait took", n, err)
	}
	first := cs[0]
	other := [2]uint64{11, 61}
	switch {
	case first.Endpoint == 11 && first.WR == 61:
		other = [2]uint64{12, 60}
	case first.Endpoint != 12 || first.WR != 60:
		t.Fatalf("first completion %+v is neither of the two", first)
	}
	collect(t, p, other)
	if n, err := p.Poll(cs); err != nil || n != 0 {
		t.Fatalf("Poll after both completions = %d (%+v), %v; want none", n, cs[:n], err)
	}
}

// TestTwoProviders opens two providers on one adapter, as two ranks of a
// host do: they take different connection qualifiers, connect, and when
// one closes, the other's posted work completes, flushed.
func TestTwoProviders(t *testing.T) {
	p1 := openOrSkip(t)
	p2 := openOrSkip(t)
	if bytes.Equal(p1.Card(), p2.Card()) {
		t.Fatalf("two providers publish the same card %x", p1.Card())
	}
	a, b := connectPair(t, p1, p2)
	buf1, buf2 := make([]byte, 4096), make([]byte, 4096)
	r1, err := p1.Register(buf1)
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Close()
	r2, err := p2.Register(buf2)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.PostRecv(70, r2, 0, 64); err != nil {
		t.Fatal(err)
	}
	copy(buf1[10:], "across")
	if err := a.PostSend(71, r1, 10, 6); err != nil {
		t.Fatal(err)
	}
	if c := collect(t, p2, [2]uint64{12, 70})[[2]uint64{12, 70}]; c.Err != nil || c.Len != 6 || string(buf2[:6]) != "across" {
		t.Fatalf("receive at the second provider: %+v, %q", c, buf2[:6])
	}
	collect(t, p1, [2]uint64{11, 71})

	if err := a.PostRecv(72, r1, 0, 64); err != nil {
		t.Fatal(err)
	}
	if err := p2.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, ok := <-p2.Requests(); ok {
		t.Fatal("Requests still open after Close")
	}
	if c := collect(t, p1, [2]uint64{11, 72})[[2]uint64{11, 72}]; !errors.Is(c.Err, rdma.ErrFlushed) {
		t.Fatalf("receive at the first provider after the second closed: %+v, want flushed", c)
	}
	if err := r2.Close(); err != nil {
		t.Fatalf("region Close after the provider's: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}

// connectPair dials from p to q and accepts there, as endpoints 11 and 12.
func connectPair(t *testing.T, p, q *provider) (rdma.Endpoint, rdma.Endpoint) {
	t.Helper()
	acc := make(chan rdma.Endpoint, 1)
	go func() {
		if r, ok := <-q.Requests(); ok {
			ep, err := r.Accept(12, func(rdma.Endpoint) error { return nil })
			if err != nil {
				t.Errorf("Accept: %v", err)
			}
			acc <- ep
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), watchdog)
	defer cancel()
	a, err := p.Dial(ctx, q.Card(), nil, 11, func(rdma.Endpoint) error { return nil })
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	b := <-acc
	if b == nil {
		t.FailNow()
	}
	return a, b
}

// TestReadBadKey checks that a read the peer refuses fails with an error
// other than a flush, and that the failure reaches the peer: its posted
// work completes, flushed.
func TestReadBadKey(t *testing.T) {
	p := openOrSkip(t)
	a, b := connectPair(t, p, p)
	buf := make([]byte, 4096)
	r, err := p.Register(buf)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := b.PostRecv(80, r, 0, 64); err != nil {
		t.Fatal(err)
	}
	if err := a.PostRead(81, r, 100, 8, r.Addr(), r.RKey()+12345); err != nil {
		t.Fatal(err)
	}
	got := collect(t, p, [2]uint64{11, 81}, [2]uint64{12, 80})
	if c := got[[2]uint64{11, 81}]; c.Err == nil || errors.Is(c.Err, rdma.ErrFlushed) || c.Op != rdma.OpRead {
		t.Fatalf("read with a bad key: %+v, want a read error that is not a flush", c)
	}
	if c := got[[2]uint64{12, 80}]; !errors.Is(c.Err, rdma.ErrFlushed) {
		t.Fatalf("the peer's receive: %+v, want flushed", c)
	}
	a.Close()
	b.Close()
}
