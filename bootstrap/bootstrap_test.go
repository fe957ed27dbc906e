package bootstrap

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/internal/testlog"
)

func testLogger(t testing.TB) hclog.Logger { return testlog.New(t, t.Name(), hclog.Off) }

// startServer runs a server for n ranks until the test ends.
func startServer(t *testing.T, n int, ln net.Listener) *Server {
	t.Helper()
	var srv *Server
	var err error
	if ln == nil {
		srv, err = NewServer(n, testLogger(t).Named("server"))
	} else {
		srv, err = NewServerListener(ln, n, testLogger(t).Named("server"))
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return srv
}

func openRank(t *testing.T, srv *Server, rank int) Bootstrap {
	t.Helper()
	bs, err := open(context.Background(), testLogger(t).Named(fmt.Sprint("rank", rank)), envSnapshot(srv.Env(rank)), nil)
	if err != nil {
		t.Fatalf("open rank %d: %v", rank, err)
	}
	t.Cleanup(func() { bs.Close() })
	return bs
}

// waitArrivals waits until n ranks have reached the server's fence.
func waitArrivals(srv *Server, n int) {
	for {
		srv.mu.Lock()
		got := srv.narrived
		srv.mu.Unlock()
		if got >= n {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func TestAllToAll(t *testing.T) {
	tests := []struct {
		name   string
		listen func(t *testing.T) net.Listener
	}{
		{"unix", func(*testing.T) net.Listener { return nil }},
		{"tcp", func(t *testing.T) net.Listener {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			return ln
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const n = 4
			srv := startServer(t, n, tt.listen(t))
			ranks := make([]Bootstrap, n)
			for r := range n {
				ranks[r] = openRank(t, srv, r)
			}
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for r, bs := range ranks {
				wg.Go(func() { errs <- exchange(bs, r, n) })
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
			for r, bs := range ranks {
				if bs.Rank() != r || bs.Size() != n || bs.JobID() != srv.JobID() || len(bs.Secret()) == 0 || bs.Host() == "" {
					t.Errorf("rank %d: identity rank=%d size=%d job=%q host=%q", r, bs.Rank(), bs.Size(), bs.JobID(), bs.Host())
				}
				if err := bs.Close(); err != nil {
					t.Errorf("rank %d: close: %v", r, err)
				}
			}
		})
	}
}

// exchange runs two rounds of put, fence and get-from-everyone; the second
// round overwrites the first.
func exchange(bs Bootstrap, rank, n int) error {
	ctx := context.Background()
	for round := range 2 {
		card := fmt.Sprintf("card of %d round %d", rank, round)
		if err := bs.Put("card", []byte(card)); err != nil {
			return err
		}
		if round == 0 {
			if err := bs.Put("first", []byte{byte(rank)}); err != nil {
				return err
			}
		}
		if err := bs.Fence(ctx); err != nil {
			return fmt.Errorf("rank %d round %d: %w", rank, round, err)
		}
		for peer := range n {
			got, err := bs.Get(ctx, peer, "card")
			if err != nil {
				return fmt.Errorf("rank %d round %d: %w", rank, round, err)
			}
			if want := fmt.Sprintf("card of %d round %d", peer, round); string(got) != want {
				return fmt.Errorf("rank %d round %d: card of %d = %q, want %q", rank, round, peer, got, want)
			}
			first, err := bs.Get(ctx, peer, "first")
			if err != nil || len(first) != 1 || int(first[0]) != peer {
				return fmt.Errorf("rank %d round %d: first of %d = %v, %v", rank, round, peer, first, err)
			}
		}
	}
	return nil
}

func TestGetErrors(t *testing.T) {
	srv := startServer(t, 2, nil)
	a, b := openRank(t, srv, 0), openRank(t, srv, 1)
	ctx := context.Background()
	if err := a.Put("early", []byte("x")); err != nil {
		t.Fatal(err)
	}
	// Before the fence, a put is not visible even to its own rank.
	if _, err := a.Get(ctx, 0, "early"); !errors.Is(err, ErrNotFound) {
		t.Errorf("get before fence: %v, want ErrNotFound", err)
	}
	var wg sync.WaitGroup
	for _, bs := range []Bootstrap{a, b} {
		wg.Go(func() {
			if err := bs.Fence(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	tests := []struct {
		name     string
		rank     int
		key      string
		notFound bool // want ErrNotFound; otherwise some other error
	}{
		{"missing key", 1, "nope", true},
		{"other rank's key", 1, "early", true},
		{"rank too big", 2, "early", false},
		{"negative rank", -1, "early", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := b.Get(ctx, tt.rank, tt.key)
			if err == nil || errors.Is(err, ErrNotFound) != tt.notFound {
				t.Errorf("Get(%d, %q) = %v, want notFound=%v", tt.rank, tt.key, err, tt.notFound)
			}
		})
	}
	if got, err := b.Get(ctx, 0, "early"); err != nil || string(got) != "x" {
		t.Errorf("Get(0, early) = %q, %v", got, err)
	}
}

func TestFenceCancelAndResume(t *testing.T) {
	srv := startServer(t, 2, nil)
	a := openRank(t, srv, 0)
	if err := a.Put("k", []byte("from 0")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Fence(ctx) }()
	waitArrivals(srv, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled fence: %v, want context.Canceled", err)
	}

	// The arrival stays counted: once rank 1 comes, a retry completes the
	// same barrier and rank 0's put is published.
	b := openRank(t, srv, 1)
	var wg sync.WaitGroup
	for _, bs := range []Bootstrap{a, b} {
		wg.Go(func() {
			if err := bs.Fence(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got, err := b.Get(context.Background(), 0, "k"); err != nil || string(got) != "from 0" {
		t.Errorf("Get after resumed fence = %q, %v", got, err)
	}
}

func TestServerGone(t *testing.T) {
	srv := startServer(t, 2, nil)
	a := openRank(t, srv, 0)
	done := make(chan error, 1)
	go func() { done <- a.Fence(context.Background()) }()
	waitArrivals(srv, 1)
	srv.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Errorf("fence when server closes: %v, want ErrClosed", err)
	}
	ctx := context.Background()
	if _, err := a.Get(ctx, 0, "k"); !errors.Is(err, ErrClosed) {
		t.Errorf("get after server closed: %v, want ErrClosed", err)
	}
	if err := a.Fence(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("fence after server closed: %v, want ErrClosed", err)
	}
	if err := a.Put("k", nil); !errors.Is(err, ErrClosed) {
		t.Errorf("put after server closed: %v, want ErrClosed", err)
	}
	if err := a.Abort(1, "late"); !errors.Is(err, ErrClosed) {
		t.Errorf("abort after server closed: %v, want ErrClosed", err)
	}
	if err := a.Close(); err != nil {
		t.Errorf("close after abort: %v, want nil", err)
	}
}

// TestAbortAfterClose: an Abort after Close fails, as the service was
// not told.
func TestAbortAfterClose(t *testing.T) {
	srv := startServer(t, 1, nil)
	a := openRank(t, srv, 0)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Abort(1, "late"); !errors.Is(err, ErrClosed) {
		t.Errorf("abort after close: %v, want ErrClosed", err)
	}
}

// TestSecondAbortSeesFirstsError: an Abort that waited for another
// returns that one's failure (the service went away before acknowledging
// it), not nil, even though the connection's end came first.
func TestSecondAbortSeesFirstsError(t *testing.T) {
	for i := range 300 {
		cc, sc := net.Pipe()
		c := newClient(hclog.NewNullLogger(), mdrunEnv{addr: "unix:/x", size: 1}, cc)
		got := make(chan struct{})
		go func() { readMessage(sc, maxMessage); close(got) }()
		first, second := make(chan error, 1), make(chan error, 1)
		go func() { first <- c.Abort(1, "first") }()
		<-got
		go func() { second <- c.Abort(2, "second") }()
		time.Sleep(time.Millisecond) // mostly, the second waits by now
		sc.Close()                   // the service ends without an acknowledgement
		if e1, e2 := <-first, <-second; e1 == nil || e2 == nil {
			t.Fatalf("round %d: first Abort %v, second %v; want both to fail", i, e1, e2)
		}
	}
}

// TestCloseWaitsForAbort: a Close made while another goroutine's Abort
// is still going out returns only once that Abort is done. A program
// whose main returns (Close, then exit 0) while the Abort is being
// written otherwise ends before the service has it, and mdrun reports an
// exit without finalizing instead of the abort's code. The PMIx backend
// waits likewise (TestPMIxCloseWaitsForAbort).
func TestCloseWaitsForAbort(t *testing.T) {
	cc, sc := net.Pipe() // synchronous: a write completes only when the service reads it
	defer sc.Close()
	c := newClient(hclog.NewNullLogger(), mdrunEnv{addr: "unix:/x", size: 2}, cc)
	go c.Abort(3, "bad input")
	for closing := false; !closing; runtime.Gosched() {
		c.mu.Lock()
		closing = c.closing
		c.mu.Unlock()
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	// Not a bound on speed: a Close that returns before the service read
	// the abort is wrong whenever it is seen.
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) before the service read the abort: a main that exits now loses it", err)
	case <-time.After(50 * time.Millisecond):
	}
	m, err := readMessage(sc, maxMessage)
	if err != nil || m.Op != opAbort {
		t.Fatalf("service got %+v, %v; want the abort", m, err)
	}
	if err := writeMessage(sc, &message{Op: opOK, ID: m.ID}); err != nil {
		t.Fatal(err)
	}
	if err := <-closed; err != nil {
		t.Errorf("close once the abort was acknowledged: %v, want nil", err)
	}
}

// TestCloseDuringAbortKeepsLeash: a Close made while an Abort waits for
// the service (from another goroutine) leaves the leash on, so a rank
// that mdrun started on another host still ends when the service does;
// only a Close that comes first takes it off. (After an Abort returns,
// its own end of the connection has already pulled the leash.)
func TestCloseDuringAbortKeepsLeash(t *testing.T) {
	for _, tc := range []struct {
		name     string
		abort    bool // Close while an Abort waits, not alone
		leashOff bool
	}{
		{"close", false, true},
		{"close during abort", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc, sc := net.Pipe()
			c := newClient(hclog.NewNullLogger(), mdrunEnv{addr: "unix:/x", size: 1}, cc)
			got := make(chan struct{})
			go func() {
				readMessage(sc, maxMessage)
				if !tc.abort {
					sc.Close() // Close need not wait for its acknowledgement
				}
				close(got)
			}()
			aborted := make(chan struct{})
			if tc.abort {
				go func() { c.Abort(1, "bad input"); close(aborted) }()
				<-got // the Abort is out and waits for its acknowledgement
			} else {
				close(aborted)
			}
			closed := make(chan struct{})
			go func() { c.Close(); close(closed) }()
			if tc.abort {
				// A Close during an Abort waits for it
				// (TestCloseWaitsForAbort): the leash is looked at
				// while it does, as the service may end meanwhile.
				time.Sleep(10 * time.Millisecond)
			} else {
				<-closed
			}
			c.mu.Lock()
			off := c.leashOff
			c.mu.Unlock()
			sc.Close() // the service ends without an acknowledgement
			<-aborted
			<-closed
			// And once both returned, which holds however the pause
			// above fell (had Close not begun yet, the look above saw
			// nothing of it).
			c.mu.Lock()
			end := c.leashOff
			c.mu.Unlock()
			if off != tc.leashOff || end != tc.leashOff {
				t.Errorf("leash off %v while Close waited, %v once it returned; want %v", off, end, tc.leashOff)
			}
		})
	}
}

// TestExitCode: an abort's code becomes the job's exit status, of which
// a launcher keeps the low 8 bits; codes that would end an aborted job
// with status 0, or with one it did not ask for, become 1.
func TestExitCode(t *testing.T) {
	for _, tt := range []struct{ code, want int }{
		{1, 1}, {3, 3}, {255, 255},
		{0, 1}, {256, 1}, {257, 1}, {-1, 1}, {math.MinInt, 1}, {math.MaxInt, 1},
	} {
		if got := exitCode(tt.code); got != tt.want {
			t.Errorf("exitCode(%d) = %d, want %d", tt.code, got, tt.want)
		}
	}
}

// TestAbortCodeReported: the service hears an abort with the code the
// job is to end with, so that Abort(0) or Abort(256) cannot end an
// aborted job as a success, whoever reads the report.
func TestAbortCodeReported(t *testing.T) {
	for _, tt := range []struct{ code, want int }{{3, 3}, {0, 1}, {256, 1}, {-2, 1}} {
		t.Run(strconv.Itoa(tt.code), func(t *testing.T) {
			srv := startServer(t, 1, nil)
			if err := openRank(t, srv, 0).Abort(tt.code, "bad input"); err != nil {
				t.Fatalf("abort: %v", err)
			}
			if got := <-srv.Aborts(); got.Code != tt.want {
				t.Errorf("Abort(%d): the service heard code %d, want %d", tt.code, got.Code, tt.want)
			}
		})
	}
}

func TestAbortReported(t *testing.T) {
	srv := startServer(t, 3, nil)
	a, b := openRank(t, srv, 0), openRank(t, srv, 1)
	openRank(t, srv, 2)
	done := make(chan error, 1)
	go func() { done <- a.Fence(context.Background()) }()
	waitArrivals(srv, 1)
	if err := b.Abort(3, "bad input"); err != nil {
		t.Fatalf("abort: %v", err)
	}
	got := <-srv.Aborts()
	want := AbortError{Rank: 1, Code: 3, Reason: "bad input"}
	if *got != want {
		t.Errorf("abort event %+v, want %+v", *got, want)
	}
	if !strings.Contains(got.Error(), "rank 1 aborted with code 3: bad input") {
		t.Errorf("abort message %q", got)
	}
	// The waiting fence cannot complete any more and must say why.
	if err := <-done; err == nil || !strings.Contains(err.Error(), "rank 1 aborted") {
		t.Errorf("fence after abort: %v", err)
	}
	if err := b.Put("k", nil); !errors.Is(err, ErrClosed) {
		t.Errorf("put after abort: %v, want ErrClosed", err)
	}
}

func TestFinalizedRankFailsLaterFences(t *testing.T) {
	srv := startServer(t, 2, nil)
	a, b := openRank(t, srv, 0), openRank(t, srv, 1)
	if err := a.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	if err := b.Fence(context.Background()); err == nil || !strings.Contains(err.Error(), "rank 0 finalized") {
		t.Errorf("fence without rank 0: %v", err)
	}
}

// TestMdrunGetBadKey: a Get of a key the service would refuse fails alone,
// as under PMI and in-process. Sent, it would make the service drop the
// rank, and every later fence of the job would fail.
func TestMdrunGetBadKey(t *testing.T) {
	srv := startServer(t, 2, nil)
	a, b := openRank(t, srv, 0), openRank(t, srv, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tt := range []struct {
		name, key, want string
	}{
		{"too long", strings.Repeat("k", maxKey+1), "key of 257 bytes, want 1 to 256"},
		{"empty", "", "key of 0 bytes, want 1 to 256"},
	} {
		if _, err := a.Get(ctx, 1, tt.key); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Get of a key %s: %v, want an error with %q", tt.name, err, tt.want)
		}
	}
	var wg sync.WaitGroup
	for _, bs := range []Bootstrap{a, b} {
		wg.Go(func() {
			if err := bs.Fence(ctx); err != nil {
				t.Errorf("rank %d's fence after the bad Gets: %v", bs.Rank(), err)
			}
		})
	}
	wg.Wait()
}

// TestMdrunBinaryKeys: keys are bytes, and distinct keys stay distinct
// under mdrun as under the other backends, also when they are not UTF-8
// (which a JSON string would turn into U+FFFD).
func TestMdrunBinaryKeys(t *testing.T) {
	srv := startServer(t, 1, nil)
	a := openRank(t, srv, 0)
	ctx := context.Background()
	puts := map[string]string{"card\xff": "A", "card\xfe": "B", "\x00\x01": "C"}
	for k, v := range puts {
		if err := a.Put(k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Fence(ctx); err != nil {
		t.Fatal(err)
	}
	for k, want := range puts {
		if got, err := a.Get(ctx, 0, k); err != nil || string(got) != want {
			t.Errorf("Get(%q) = %q, %v; want %q", k, got, err, want)
		}
	}
	if got, err := a.Get(ctx, 0, "card\ufffd"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get of a key never put = %q, %v; want ErrNotFound", got, err)
	}
}

// TestServerPreHelloMemory: before its hello a connection is a stranger's
// (mdrun listens on TCP, on the network for remote hosts), and a stranger
// must not make the service hold megabytes. Here 100 connections each claim
// a message of 2 MiB and fall silent; each used to cost its 2 MiB.
func TestServerPreHelloMemory(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	startServer(t, 1, ln)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 100 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.Write(binary.BigEndian.AppendUint32(nil, 2<<20))
	}
	time.Sleep(500 * time.Millisecond) // for the server to read the claims
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 20<<20 {
		t.Errorf("100 unauthenticated connections grew the heap by %d MiB", grown>>20)
	}
}

// TestLargestHelloFits: the hello limit leaves room for every hello a rank
// of a real job sends, with rank and size at their largest.
func TestLargestHelloFits(t *testing.T) {
	srv := startServer(t, 1, nil)
	e, err := parseMdrunEnv(envSnapshot(srv.Env(0)), nil)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	err = writeMessage(&b, &message{Op: opHello, ID: math.MaxUint64, Version: protocolVersion,
		Rank: math.MaxInt32 - 1, Size: math.MaxInt32, JobID: e.jobID, Secret: hex.EncodeToString(e.secret)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readMessage(&b, maxHello); err != nil {
		t.Errorf("largest hello: %v", err)
	}
}

// frame builds a length-prefixed message from raw bytes.
func frame(body string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	return append(b, body...)
}

func TestBadConnectionsDropped(t *testing.T) {
	srv := startServer(t, 2, nil)
	_, path, _ := strings.Cut(srv.Addr(), ":")
	hello := func(rank int, secret string) string {
		return fmt.Sprintf(`{"op":"hello","id":1,"version":%d,"rank":%d,"size":2,"jobid":%q,"secret":%q}`, protocolVersion, rank, srv.JobID(), secret)
	}
	goodSecret := strings.TrimPrefix(srv.Env(0)[4], EnvSecret+"=")
	tests := []struct {
		name    string
		send    []byte
		refusal bool // the server answers with an error before dropping
	}{
		{"garbage", []byte("GET / HTTP/1.0\r\n\r\n"), false},
		{"oversized", binary.BigEndian.AppendUint32(nil, maxMessage+1), false},
		// Before hello the limit is a hello's: see TestServerPreHelloMemory.
		{"oversized hello", binary.BigEndian.AppendUint32(nil, maxHello+1), false},
		{"zero length", binary.BigEndian.AppendUint32(nil, 0), false},
		{"bad json", frame(`{"op":`), false},
		{"unknown op", frame(`{"op":"launch"}`), false},
		{"fence before hello", frame(`{"op":"fence","id":1}`), true},
		{"wrong secret", frame(hello(0, "00112233")), true},
		{"secret not hex", frame(hello(0, "zz")), true},
		{"rank out of range", frame(hello(5, goodSecret)), true},
		{"wrong version", frame(`{"op":"hello","id":1,"version":9,"secret":"` + goodSecret + `"}`), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := net.Dial("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := conn.Write(tt.send); err != nil {
				t.Fatal(err)
			}
			// A watchdog, not a timing assertion: a connection that is not
			// dropped would block this read forever.
			conn.SetReadDeadline(time.Now().Add(20 * time.Second))
			if tt.refusal {
				m, err := readMessage(conn, maxMessage)
				if err != nil || m.Op != opError || m.ErrCode != errCodeRefused {
					t.Fatalf("reply %+v, %v; want a refusal", m, err)
				}
			}
			// A reset is as good as a close: the server drops garbage
			// without reading all of it.
			if n, err := io.Copy(io.Discard, conn); n != 0 || errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("connection not dropped cleanly: read %d bytes, %v", n, err)
			}
		})
	}
	// The job goes on: the real ranks still connect, and a rank cannot be
	// claimed twice.
	a, b := openRank(t, srv, 0), openRank(t, srv, 1)
	if _, err := open(context.Background(), nil, envSnapshot(srv.Env(1)), nil); err == nil || !strings.Contains(err.Error(), "rank 1 connected before") {
		t.Errorf("second hello for rank 1: %v", err)
	}
	var wg sync.WaitGroup
	for _, bs := range []Bootstrap{a, b} {
		wg.Go(func() {
			if err := bs.Fence(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

func TestOpenEnvErrors(t *testing.T) {
	srv := startServer(t, 2, nil)
	good := envSnapshot(srv.Env(1))
	with := func(key, value string) lookupFunc {
		return func(k string) (string, bool) {
			if k == key {
				return value, value != "<unset>"
			}
			return good(k)
		}
	}
	// A remote rank's environment, without the self-termination that
	// would end this test process with the refused connection.
	remote := envSnapshot(slices.DeleteFunc(srv.RemoteEnv(1, "h2"), func(kv string) bool {
		return strings.HasPrefix(kv, EnvExitWithService+"=")
	}))
	tests := []struct {
		name  string
		env   lookupFunc
		want  []string  // substrings of the error
		stdin io.Reader // for MDRUN_SECRET=-
	}{
		{"rank not a number", with(EnvRank, "one"), []string{EnvRank, `"one"`}, nil},
		{"rank too big", with(EnvRank, "2"), []string{EnvRank, "[0, MDRUN_SIZE=2)"}, nil},
		{"size zero", with(EnvSize, "0"), []string{EnvSize}, nil},
		{"size unset", with(EnvSize, "<unset>"), []string{EnvSize, "not set"}, nil},
		{"addr unset", with(EnvAddr, "<unset>"), []string{EnvAddr, "not set"}, nil},
		{"addr malformed", with(EnvAddr, "carrier-pigeon"), []string{EnvAddr, "carrier-pigeon"}, nil},
		{"addr unreachable", with(EnvAddr, "unix:/nonexistent/mdrun.sock"), []string{EnvAddr, "/nonexistent/mdrun.sock"}, nil},
		{"secret not hex", with(EnvSecret, "xyz"), []string{EnvSecret, "hexadecimal"}, nil},
		{"secret wrong", with(EnvSecret, "abcd"), []string{EnvAddr, "wrong job secret"}, nil},
		{"job id wrong", with(EnvJobID, "other"), []string{EnvJobID, `"other"`}, nil},
		{"size wrong", with(EnvSize, "3"), []string{EnvSize, "2 ranks"}, nil},
		{"host unset", with(EnvHost, ""), []string{EnvHost}, nil},
		{"jobid unset", with(EnvJobID, "<unset>"), []string{EnvJobID}, nil},
		{"secret from no stdin", remote, []string{EnvSecret + "=-", "standard input", "no standard input"}, nil},
		{"secret from empty stdin", remote, []string{EnvSecret + "=-", "empty"}, strings.NewReader("")},
		{"secret from a blank line", remote, []string{EnvSecret + "=-", "first line is empty"}, strings.NewReader("\nabcd\n")},
		{"secret from a long line", remote, []string{EnvSecret + "=-", "longer than"}, strings.NewReader(strings.Repeat("ab", 600))},
		{"wrong secret from stdin", remote, []string{EnvAddr, "wrong job secret"}, strings.NewReader("abcd\n")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bs, err := open(context.Background(), testLogger(t), tt.env, tt.stdin)
			if err == nil {
				bs.Close()
				t.Fatal("open succeeded")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	// None of the failures claimed the rank.
	openRank(t, srv, 1)
}

func TestSingleton(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	ctx := context.Background()
	bs, err := open(ctx, testLogger(t), none, nil)
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	if bs.Rank() != 0 || bs.Size() != 1 || bs.Host() != host || bs.JobID() == "" || len(bs.Secret()) != 32 {
		t.Errorf("identity rank=%d size=%d host=%q job=%q secret=%d bytes", bs.Rank(), bs.Size(), bs.Host(), bs.JobID(), len(bs.Secret()))
	}
	other, err := open(ctx, nil, none, nil)
	if err != nil {
		t.Fatal(err)
	}
	if other.JobID() == bs.JobID() || bytes.Equal(other.Secret(), bs.Secret()) {
		t.Error("two singletons share a job id or secret")
	}
	if err := bs.Put("k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := bs.Get(ctx, 0, "k"); !errors.Is(err, ErrNotFound) {
		t.Errorf("get before fence: %v, want ErrNotFound", err)
	}
	if err := bs.Fence(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := bs.Get(ctx, 0, "k"); err != nil || string(got) != "v" {
		t.Errorf("get after fence = %q, %v", got, err)
	}
	if _, err := bs.Get(ctx, 1, "k"); err == nil || errors.Is(err, ErrNotFound) {
		t.Errorf("get of rank 1: %v, want a range error", err)
	}
	if err := bs.Put("", nil); err == nil {
		t.Error("put of an empty key succeeded")
	}
	if err := bs.Put("big", make([]byte, maxValue+1)); err == nil {
		t.Error("put of an oversized value succeeded")
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := bs.Fence(cancelled); !errors.Is(err, context.Canceled) {
		t.Errorf("fence with cancelled ctx: %v", err)
	}
	if err := bs.Close(); err != nil {
		t.Fatal(err)
	}
	if err := bs.Put("k", nil); !errors.Is(err, ErrClosed) {
		t.Errorf("put after close: %v, want ErrClosed", err)
	}
	if err := bs.Fence(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("fence after close: %v, want ErrClosed", err)
	}
}

// TestPutLimits: Put refuses what would take a fence past maxPuts on the
// wire, and what it accepted goes in one fence, with large values and
// with many small puts, which take three times their bytes in base64
// and JSON: 70,000 puts of 14 bytes, under maxPuts raw, once made a
// fence message of 2.9 MB that closed the rank's connection.
func TestPutLimits(t *testing.T) {
	for _, tc := range []struct {
		name  string
		n     int
		value []byte
	}{
		{"large values", 2 * maxPuts / maxValue, make([]byte, maxValue)},
		{"many small puts", 70000, []byte("12345678")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startServer(t, 1, nil)
			bs := openRank(t, srv, 0)
			last := ""
			var err error
			for i := range tc.n {
				key := fmt.Sprintf("k%05d", i)
				if err = bs.Put(key, tc.value); err != nil {
					break
				}
				last = key
			}
			if err == nil || !strings.Contains(err.Error(), "on the wire") {
				t.Fatalf("%d puts: %v, want a refusal at the limit", tc.n, err)
			}
			// What was accepted still fits one message.
			if err := bs.Fence(context.Background()); err != nil {
				t.Fatalf("fence with puts at the limit: %v", err)
			}
			for _, key := range []string{"k00000", last} {
				if v, err := bs.Get(context.Background(), 0, key); err != nil || !bytes.Equal(v, tc.value) {
					t.Errorf("Get(%s) = %d bytes, %v", key, len(v), err)
				}
			}
		})
	}
}

func FuzzReadMessage(f *testing.F) {
	for _, m := range []*message{
		{Op: opHello, ID: 1, Version: protocolVersion, Rank: 3, Secret: "abcd"},
		{Op: opFence, ID: 2, Puts: []wirePut{{Key: []byte("card"), Value: []byte("tcp://127.0.0.1:1")}, {Key: []byte("card\xff")}}},
		{Op: opGet, ID: 3, Rank: 1, Key: []byte("card")},
		{Op: opOK, ID: 3, Value: []byte{0, 1, 2}},
		{Op: opError, ID: 3, ErrCode: errCodeNotFound, Reason: "no"},
		{Op: opAbort, ID: 4, Code: 7, Reason: "why"},
	} {
		var b bytes.Buffer
		if err := writeMessage(&b, m); err != nil {
			f.Fatal(err)
		}
		f.Add(b.Bytes())
	}
	f.Add(frame(`{"op":"get","rank":-1}`))
	f.Add(frame(`{"op":"fence","puts":[{"key":"YQ==","value":"!!"}]}`))
	f.Add(frame(`{"op":"fence","puts":{"a":"YQ=="}}`)) // version 1's puts
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := readMessage(bytes.NewReader(data), maxMessage)
		if err != nil {
			return
		}
		// Whatever was accepted must survive a round trip unchanged.
		var first bytes.Buffer
		if err := writeMessage(&first, m); err != nil {
			t.Fatalf("re-encode %+v: %v", m, err)
		}
		encoded := bytes.Clone(first.Bytes())
		again, err := readMessage(&first, maxMessage)
		if err != nil {
			t.Fatalf("re-decode %q: %v", encoded, err)
		}
		var second bytes.Buffer
		if err := writeMessage(&second, again); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(encoded, second.Bytes()) {
			t.Fatalf("round trip changed %q to %q", encoded, second.Bytes())
		}
	})
}

// A rank that mdrun starts on another host gets the secret on standard
// input, never in its environment or on the remote-exec command line, and
// joins the job with it; nothing after the secret's line is read.
func TestRemoteSecretOnStdin(t *testing.T) {
	srv := startServer(t, 2, nil)
	secret := strings.TrimSpace(string(srv.SecretLine()))
	env := slices.DeleteFunc(srv.RemoteEnv(1, "h2"), func(kv string) bool {
		return strings.HasPrefix(kv, EnvExitWithService+"=") // see TestOpenEnvErrors
	})
	for _, kv := range env {
		if strings.Contains(kv, secret) {
			t.Fatalf("RemoteEnv carries the secret: %q", kv)
		}
	}
	in := io.MultiReader(bytes.NewReader(srv.SecretLine()), strings.NewReader("the application's input\n"))
	bs, err := open(context.Background(), testLogger(t), envSnapshot(env), in)
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Close()
	a := openRank(t, srv, 0)
	if bs.Rank() != 1 || a.Rank() != 0 {
		t.Errorf("ranks %d and %d", bs.Rank(), a.Rank())
	}
	rest, _ := io.ReadAll(in)
	if string(rest) != "the application's input\n" {
		t.Errorf("stdin after the secret: %q", rest)
	}
}

// nextDeparture is the service's next departure, failing the test if
// none comes within a few seconds.
func nextDeparture(t *testing.T, srv *Server) Departure {
	t.Helper()
	select {
	case d := <-srv.Departures():
		return d
	case <-time.After(5 * time.Second):
		t.Fatal("no departure")
		return Departure{}
	}
}

// noDeparture fails the test if the service has a departure queued.
func noDeparture(t *testing.T, srv *Server, when string) {
	t.Helper()
	select {
	case d := <-srv.Departures():
		t.Errorf("%s: unexpected departure %+v", when, d)
	default:
	}
}

// TestDepartures: the service reports each joined rank's departure once,
// when it has read all the rank sent, with the ranks it lost: those it
// reported lost, in order, each once, and those whose leaving failed a
// fence of it. mdrun names the rank a failing rank lost, not the first
// one it sees exit, which may be that failing rank (the order in which
// dying ranks' connections end is the kernel's). So a rank that exited
// (Exited) and is still connected has no departure until its connection
// ends: a report may still be on its way.
func TestDepartures(t *testing.T) {
	srv := startServer(t, 5, nil)
	ranks := make([]*client, 5)
	for r := range 4 {
		ranks[r] = openRank(t, srv, r).(*client)
	}
	fenceLoss := Loss{Rank: 4, Reason: "rank 4 exited without joining the job (did it call Init?); the fence cannot complete"}

	if srv.Exited(4) {
		t.Error("Exited(4) says a rank that never said hello joined")
	}
	noDeparture(t, srv, "rank 4 exited without joining")

	ranks[2].conn.Close()
	if got, want := nextDeparture(t, srv), (Departure{Rank: 2, Reason: "disconnected"}); !equalDepartures(got, want) {
		t.Errorf("departure %+v, want %+v", got, want)
	}

	ranks[0].ReportLost(3, "links ended")
	if !srv.Exited(0) {
		t.Error("Exited(0) says a connected rank never joined")
	}
	noDeparture(t, srv, "rank 0 exited, its connection open")
	ranks[0].conn.Close()
	if got, want := nextDeparture(t, srv), (Departure{Rank: 0, Reason: "disconnected", Lost: []Loss{{3, "links ended"}}}); !equalDepartures(got, want) {
		t.Errorf("departure %+v, want %+v", got, want)
	}

	ranks[1].ReportLost(3, "links ended")
	ranks[1].ReportLost(2, "timed out")
	ranks[1].ReportLost(3, "again") // once per rank
	ranks[1].ReportLost(1, "itself")
	ranks[1].ReportLost(5, "not in the job")
	if err := ranks[1].Fence(context.Background()); err == nil {
		t.Error("fence after rank 4 exited without joining succeeded")
	}
	if err := ranks[1].Close(); err != nil {
		t.Fatal(err)
	}
	want := Departure{Rank: 1, Reason: "finalized", Finalized: true, Lost: []Loss{{3, "links ended"}, {2, "timed out"}, fenceLoss}}
	if got := nextDeparture(t, srv); !equalDepartures(got, want) {
		t.Errorf("departure %+v, want %+v", got, want)
	}

	if err := ranks[3].Abort(3, "gave up"); err != nil {
		t.Fatal(err)
	}
	if got, want := nextDeparture(t, srv), (Departure{Rank: 3, Reason: "aborted", Aborted: true}); !equalDepartures(got, want) {
		t.Errorf("departure %+v, want %+v", got, want)
	}
	noDeparture(t, srv, "every rank left")
}

// TestFenceFailureIsLoss: a rank waiting in a fence when another leaves
// lost that rank, as a rank whose device saw it go did: its failure
// (Init aborting) follows the other's leaving.
func TestFenceFailureIsLoss(t *testing.T) {
	srv := startServer(t, 3, nil)
	ranks := make([]*client, 3)
	for r := range 3 {
		ranks[r] = openRank(t, srv, r).(*client)
	}
	fenced := make(chan error, 1)
	go func() { fenced <- ranks[0].Fence(context.Background()) }()
	waitArrivals(srv, 1)
	ranks[2].conn.Close()
	if got, want := nextDeparture(t, srv), (Departure{Rank: 2, Reason: "disconnected"}); !equalDepartures(got, want) {
		t.Errorf("departure %+v, want %+v", got, want)
	}
	if err := <-fenced; err == nil {
		t.Fatal("fence succeeded without rank 2")
	}
	ranks[0].Abort(1, "fence failed")
	want := Departure{Rank: 0, Reason: "aborted", Aborted: true, Lost: []Loss{{2, "rank 2 disconnected; the fence cannot complete"}}}
	if got := nextDeparture(t, srv); !equalDepartures(got, want) {
		t.Errorf("departure %+v, want %+v", got, want)
	}
}

// equalDepartures compares departures, Lost included.
func equalDepartures(a, b Departure) bool {
	return a.Rank == b.Rank && a.Reason == b.Reason && a.Finalized == b.Finalized && a.Aborted == b.Aborted && slices.Equal(a.Lost, b.Lost)
}

// TestReportLostToOlderService: a service from before lost reports does
// not list them in its hello reply, and drops a rank that sends a request
// it does not know; a rank sends it none. The service here is such a
// service's wire: it records what the rank sends.
func TestReportLostToOlderService(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Not served: it only makes the rank's environment, for ln.
	srv, err := NewServerListener(ln, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ops := make(chan []string, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			ops <- nil
			return
		}
		defer conn.Close()
		var seen []string
		for {
			m, err := readMessage(conn, maxMessage)
			if err != nil {
				ops <- seen
				return
			}
			seen = append(seen, m.Op)
			if m.Op != opLost {
				writeMessage(conn, &message{Op: opOK, ID: m.ID})
			}
			if m.Op == opFinalize {
				ops <- seen
				return
			}
		}
	}()
	bs, err := open(context.Background(), testLogger(t), envSnapshot(srv.Env(0)), nil)
	if err != nil {
		t.Fatal(err)
	}
	bs.(LostReporter).ReportLost(1, "links ended")
	if err := bs.Close(); err != nil {
		t.Fatal(err)
	}
	if got, want := <-ops, []string{opHello, opFinalize}; !slices.Equal(got, want) {
		t.Errorf("the service got %q, want %q", got, want)
	}
}
