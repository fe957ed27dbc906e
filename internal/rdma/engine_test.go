package rdma_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/bootstrap"
	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/internal/softrdma"
	"github.com/hpc-multidevice/multidevice/multidevice"
	"github.com/hpc-multidevice/multidevice/sdi"
)

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestJobOverSoft runs a job whose ranks sit on hosts of their own and
// reach each other only through the engine: every pair exchanges messages
// from empty to above MaxFrame both ways at once, then the ranks reduce a
// vector large enough for the multidevice's rendezvous.
func TestJobOverSoft(t *testing.T) {
	for _, deferred := range []bool{false, true} {
		t.Run(fmt.Sprintf("deferred=%v", deferred), func(t *testing.T) { jobOverSoft(t, deferred) })
	}
}

func jobOverSoft(t *testing.T, deferred bool) {
	const n = 3
	fab := softrdma.New(rdma.Limits{})
	fab.Deferred = deferred
	boots, err := bootstrap.InProcess(n, func(r int) string { return fmt.Sprint("host", r) })
	if err != nil {
		t.Fatal(err)
	}
	plugins := &multidevice.PluginsConfig{SubDevices: []multidevice.SubDeviceSpec{{Name: "soft", Enabled: true}}}
	factory := func(log hclog.Logger) sdi.SubDevice { return newSoft(fab, rdma.Settings{}) }
	ws := make([]*adi.World, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			ws[r], errs[r] = adi.Init(ctxT(t), adi.WithBootstrap(boots[r]), adi.WithPlugins(plugins), adi.WithSubDevice("soft", factory))
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, w := range ws {
			wg.Go(func() { w.Finalize(context.Background()) })
		}
		wg.Wait()
		if v := fab.Violations.Load(); v != 0 {
			t.Errorf("the engine broke the fabric's rules %d times: %q", v, fab.Errs())
		}
	}()
	if route, err := ws[0].Route(1, 1<<20); err != nil || route != "soft" {
		t.Fatalf("route from 0 to 1 for 1 MiB: %q, %v; want soft", route, err)
	}

	sizes := []int{0, 1, rdma.DefaultEagerBytes, rdma.DefaultEagerBytes + 1, 100_000, rdma.MaxFrame + 12345}
	msg := func(src, dst, size int) []byte {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(src*31 + dst*7 + i*13 + size)
		}
		return b
	}
	for r := range n {
		wg.Go(func() {
			c := ws[r].Comm()
			ctx := ctxT(t)
			var reqs []*adi.Request
			bufs := map[[2]int][]byte{}
			for peer := range n {
				if peer == r {
					continue
				}
				for i, size := range sizes {
					q, err := c.Isend(msg(r, peer, size), peer, i)
					if err != nil {
						errs[r] = err
						return
					}
					reqs = append(reqs, q)
					buf := make([]byte, size)
					bufs[[2]int{peer, i}] = buf
					if q, err = c.Irecv(buf, peer, i); err != nil {
						errs[r] = err
						return
					}
					reqs = append(reqs, q)
				}
			}
			for _, q := range reqs {
				if _, err := q.Wait(ctx); err != nil {
					errs[r] = fmt.Errorf("rank %d: %w", r, err)
					return
				}
			}
			for k, buf := range bufs {
				if want := msg(k[0], r, sizes[k[1]]); !bytes.Equal(buf, want) {
					errs[r] = fmt.Errorf("rank %d: message of %d bytes from rank %d corrupted", r, len(want), k[0])
					return
				}
			}
			xs := make([]float64, 200_000)
			for i := range xs {
				xs[i] = float64(r*i + 1)
			}
			sum := make([]float64, len(xs))
			if err := adi.Allreduce(ctx, c, xs, sum, adi.Sum); err != nil {
				errs[r] = err
				return
			}
			for i, v := range sum {
				if want := float64(i*(n*(n-1)/2) + n); v != want {
					errs[r] = fmt.Errorf("rank %d: allreduce element %d is %v, want %v", r, i, v, want)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// recorder is a Handler that keeps what arrives.
type recorder struct {
	mu      sync.Mutex
	frames  [][]byte // header then payload, joined
	placed  [][]byte // slices handed out by Place
	same    int      // Delivers whose payload was a placed slice
	done    map[uint64]error
	down    []sdi.Rank
	changed chan struct{}
	place   bool
}

func newRecorder(place bool) *recorder {
	return &recorder{done: map[uint64]error{}, changed: make(chan struct{}, 1), place: place}
}

func (r *recorder) poke() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *recorder) Deliver(from sdi.Rank, h, p []byte) {
	r.mu.Lock()
	for i, b := range r.placed {
		if len(b) > 0 && len(p) == len(b) && &p[0] == &b[0] {
			r.same++
			r.placed = append(r.placed[:i], r.placed[i+1:]...)
			break
		}
	}
	r.frames = append(r.frames, append(append([]byte(nil), h...), p...))
	r.mu.Unlock()
	r.poke()
}

func (r *recorder) Place(from sdi.Rank, h []byte, n int) []byte {
	if !r.place {
		return nil
	}
	b := make([]byte, n)
	r.mu.Lock()
	r.placed = append(r.placed, b)
	r.mu.Unlock()
	return b
}

func (r *recorder) SendDone(token uint64, err error) {
	r.mu.Lock()
	r.done[token] = err
	r.mu.Unlock()
	r.poke()
}

func (r *recorder) PeerDown(peer sdi.Rank, err error) {
	r.mu.Lock()
	r.down = append(r.down, peer)
	r.mu.Unlock()
	r.poke()
}

// await polls until cond holds under r.mu.
func (r *recorder) await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-r.changed:
		case <-time.After(time.Millisecond):
		case <-deadline:
			t.Fatalf("waited 10 s for %s", what)
		}
	}
}

// rankSpec is one rank a test opens.
type rankSpec struct {
	prov   rdma.Provider
	set    rdma.Settings
	h      sdi.Handler
	secret string // "s" when empty
}

// openRanks opens the ranks of one job, each a subdevice on its own
// provider, and closes them when the test ends.
func openRanks(t testing.TB, ranks ...rankSpec) ([]*rdma.SubDevice, [][]byte) {
	t.Helper()
	sds := make([]*rdma.SubDevice, len(ranks))
	cards := make([][]byte, len(ranks))
	t.Cleanup(func() {
		for _, sd := range sds {
			if sd != nil {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				sd.Close(ctx)
				cancel()
			}
		}
	})
	for i, r := range ranks {
		sd := rdma.New(sdi.Info{Name: "soft"}, func(context.Context, sdi.OpenParams) (rdma.Provider, rdma.Settings, error) {
			return r.prov, r.set, nil
		}, nil)
		l, err := sd.Open(ctxT(t), sdi.OpenParams{Rank: sdi.Rank(i), Size: len(ranks), JobID: "j", Secret: []byte(cmp.Or(r.secret, "s")),
			APIVersion: sdi.APIVersion, Handler: r.h, Logger: hclog.NewNullLogger()})
		if err != nil {
			t.Fatal(err)
		}
		sds[i], cards[i] = sd, l.Addr
	}
	return sds, cards
}

// pair opens two ranks on fab with the given secrets and handlers.
func pair(t *testing.T, fab *softrdma.Fabric, secrets [2]string, hs [2]*recorder) ([]*rdma.SubDevice, [][]byte) {
	return openRanks(t, rankSpec{prov: fab.Open(), h: hs[0], secret: secrets[0]}, rankSpec{prov: fab.Open(), h: hs[1], secret: secrets[1]})
}

// TestPlacedAndOrdered: a frame read into the handler's place is delivered
// in that very slice, and an eager frame sent after it is delivered after
// it, though it arrives while the read runs.
func TestPlacedAndOrdered(t *testing.T) {
	fab := softrdma.New(rdma.Limits{})
	hs := [2]*recorder{newRecorder(false), newRecorder(true)}
	sds, cards := pair(t, fab, [2]string{"s", "s"}, hs)
	if err := sds[0].Connect(ctxT(t), 1, cards[1]); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 100_000)
	const rounds = 20
	for i := range rounds {
		for _, f := range []*sdi.Frame{
			{Peer: 1, Header: []byte{byte(i), 'L'}, Payload: big, Token: uint64(i)},
			{Peer: 1, Header: []byte{byte(i), 'S'}, Payload: []byte("small")},
		} {
			for {
				_, err := sds[0].Send(f)
				if !errors.Is(err, sdi.ErrWouldBlock) {
					if err != nil {
						t.Fatal(err)
					}
					break
				}
				time.Sleep(time.Millisecond)
			}
		}
	}
	if err := sds[0].Flush(ctxT(t), 1); err != nil {
		t.Fatal(err)
	}
	hs[1].await(t, "every frame", func() bool { return len(hs[1].frames) == 2*rounds })
	hs[0].await(t, "every SendDone", func() bool { return len(hs[0].done) == rounds })
	for i, f := range hs[1].frames {
		want := append([]byte{byte(i / 2), "LS"[i%2]}, "small"...)
		if i%2 == 0 {
			want = append(want[:2:2], big...)
		}
		if !bytes.Equal(f, want) {
			t.Fatalf("frame %d: %d bytes starting %q, want %d starting %q", i, len(f), f[:min(2, len(f))], len(want), want[:2])
		}
	}
	if hs[1].same != rounds {
		t.Errorf("%d of %d large frames delivered in the place the handler gave", hs[1].same, rounds)
	}
	for tok, err := range hs[0].done {
		if err != nil {
			t.Errorf("SendDone(%d, %v)", tok, err)
		}
	}
	if v := fab.Violations.Load(); v != 0 {
		t.Errorf("fabric rules broken %d times: %q", v, fab.Errs())
	}
}

// TestLinkFailure: when the link fails, both ends report the peer down
// once, sends fail instead of hanging, and a new Connect brings the peer
// back.
func TestLinkFailure(t *testing.T) {
	fab := softrdma.New(rdma.Limits{})
	provs := []*softrdma.Provider{fab.Open(), fab.Open()}
	hs := [2]*recorder{newRecorder(false), newRecorder(false)}
	sds, cards := openRanks(t, rankSpec{prov: provs[0], h: hs[0]}, rankSpec{prov: provs[1], h: hs[1]})
	if err := sds[1].Connect(ctxT(t), 0, cards[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := sds[1].Send(&sdi.Frame{Peer: 0, Header: []byte("h"), Payload: []byte("before")}); err != nil {
		t.Fatal(err)
	}
	hs[0].await(t, "the first frame", func() bool { return len(hs[0].frames) == 1 })

	softrdma.Sever(provs[0], provs[1])
	for i, h := range hs {
		h.await(t, fmt.Sprintf("rank %d to report its peer down", i), func() bool { return len(h.down) == 1 })
	}
	if _, err := sds[1].Send(&sdi.Frame{Peer: 0, Header: []byte("h")}); !errors.Is(err, sdi.ErrPeerUnreachable) {
		t.Fatalf("send after the failure: %v, want ErrPeerUnreachable", err)
	}

	if err := sds[0].Connect(ctxT(t), 1, cards[1]); err != nil {
		t.Fatalf("reconnect: %v", err)
	}
	for {
		_, err := sds[1].Send(&sdi.Frame{Peer: 0, Header: []byte("h"), Payload: []byte("after")})
		if err == nil {
			break
		}
		if !errors.Is(err, sdi.ErrPeerUnreachable) && !errors.Is(err, sdi.ErrWouldBlock) {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond) // rank 1 sees the accepted connection shortly
	}
	hs[0].await(t, "the frame after the reconnect", func() bool { return len(hs[0].frames) == 2 })
	if got := string(hs[0].frames[1]); got != "hafter" {
		t.Errorf("after the reconnect rank 0 got %q", got)
	}
	for i, h := range hs {
		h.mu.Lock()
		if len(h.down) != 1 {
			t.Errorf("rank %d reported the peer down %d times", i, len(h.down))
		}
		h.mu.Unlock()
	}
}

// TestStrangerRefused: the card of a rank of another job (another secret)
// is turned away at once, whichever of the two connects. A request that
// gets past a card (one forged without the secret) is refused by the
// listener's handshake check (TestHandshake).
func TestStrangerRefused(t *testing.T) {
	fab := softrdma.New(rdma.Limits{})
	hs := [2]*recorder{newRecorder(false), newRecorder(false)}
	sds, cards := pair(t, fab, [2]string{"ours", "theirs"}, hs)
	for _, dir := range [][2]int{{1, 0}, {0, 1}} {
		err := sds[dir[0]].Connect(ctxT(t), sdi.Rank(dir[1]), cards[dir[1]])
		if !errors.Is(err, sdi.ErrPeerUnreachable) || !strings.Contains(err.Error(), "another job") {
			t.Fatalf("rank %d's connect to a rank of another job: %v, want it turned away", dir[0], err)
		}
	}
	if _, err := sds[1].Send(&sdi.Frame{Peer: 0, Header: []byte("h")}); err == nil {
		t.Fatal("a refused peer took a frame")
	}
}

// TestCompletionQueueBound: a connection that could overrun the shared
// completion queue is refused with a message that says so.
func TestCompletionQueueBound(t *testing.T) {
	lim := softrdma.DefaultLimits
	lim.CQSize = 30 // one connection of 4+4 slots needs 2*8+8
	fab := softrdma.New(lim)
	var ranks []rankSpec
	for range 3 {
		ranks = append(ranks, rankSpec{prov: fab.Open(), set: rdma.Settings{RecvSlots: 4}, h: newRecorder(false)})
	}
	sds, cards := openRanks(t, ranks...)
	if err := sds[0].Connect(ctxT(t), 1, cards[1]); err != nil {
		t.Fatal(err)
	}
	err := sds[0].Connect(ctxT(t), 2, cards[2])
	if err == nil || !strings.Contains(err.Error(), "completion queue") {
		t.Fatalf("a second connection over a queue with room for one: %v", err)
	}
	if v := fab.Violations.Load(); v != 0 {
		t.Errorf("fabric rules broken: %q", fab.Errs())
	}
}

// slowAccept is a provider whose accepted connections come up late on the
// accepting side: the dialer may fill the new connection's slots before
// the accepting rank has made it the peer's.
type slowAccept struct {
	*softrdma.Provider
	reqs chan rdma.Request
}

func newSlowAccept(p *softrdma.Provider) *slowAccept {
	s := &slowAccept{Provider: p, reqs: make(chan rdma.Request)}
	go func() {
		for r := range p.Requests() {
			s.reqs <- slowRequest{r}
		}
		close(s.reqs)
	}()
	return s
}

func (s *slowAccept) Requests() <-chan rdma.Request { return s.reqs }

type slowRequest struct{ rdma.Request }

func (r slowRequest) Accept(id uint32, setup func(rdma.Endpoint) error) (rdma.Endpoint, error) {
	ep, err := r.Request.Accept(id, setup)
	time.Sleep(100 * time.Millisecond)
	return ep, err
}

// TestEarlyFramesCounted: frames that arrive on a connection before the
// accepting rank has taken it up still give their slots back, so a sender
// that used every credit in that moment is not left waiting for ever.
func TestEarlyFramesCounted(t *testing.T) {
	fab := softrdma.New(rdma.Limits{})
	set := rdma.Settings{RecvSlots: 4}
	hs := [2]*recorder{newRecorder(false), newRecorder(false)}
	sds, cards := openRanks(t, rankSpec{prov: newSlowAccept(fab.Open()), set: set, h: hs[0]},
		rankSpec{prov: newSlowAccept(fab.Open()), set: set, h: hs[1]})
	if err := sds[0].Connect(ctxT(t), 1, cards[1]); err != nil {
		t.Fatal(err)
	}
	const frames = 40
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; i < frames; {
		_, err := sds[0].Send(&sdi.Frame{Peer: 1, Header: []byte{byte(i)}, Payload: []byte("x")})
		switch {
		case err == nil:
			i++
		case errors.Is(err, sdi.ErrWouldBlock):
			if time.Now().After(deadline) {
				t.Fatalf("sent %d of %d frames, then no credit came back for 10 s", i, frames)
			}
			time.Sleep(time.Millisecond)
		default:
			t.Fatal(err)
		}
	}
	hs[1].await(t, "every frame", func() bool { return len(hs[1].frames) == frames })
}

// TestCloseIsQuiet: a rank that closes says goodbye, and its peer drops
// the connection without reporting a failure, even where the device does
// work after it is posted and flushes what a closing connection has not
// yet sent.
func TestCloseIsQuiet(t *testing.T) {
	fab := softrdma.New(rdma.Limits{})
	fab.Deferred = true
	hs := [2]*recorder{newRecorder(false), newRecorder(false)}
	sds, cards := pair(t, fab, [2]string{"s", "s"}, hs)
	if err := sds[0].Connect(ctxT(t), 1, cards[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := sds[0].Send(&sdi.Frame{Peer: 1, Header: []byte("h"), Payload: []byte("hello")}); err != nil {
		t.Fatal(err)
	}
	hs[1].await(t, "the frame", func() bool { return len(hs[1].frames) == 1 })
	if err := sds[0].Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := sds[1].Send(&sdi.Frame{Peer: 0, Header: []byte("h")})
		if errors.Is(err, sdi.ErrPeerUnreachable) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rank 1 still sends to the closed rank 0: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // a report, if one were coming
	hs[1].mu.Lock()
	defer hs[1].mu.Unlock()
	if len(hs[1].down) != 0 {
		t.Fatal("rank 1 reported rank 0 down after rank 0 closed in order")
	}
}

// TestOpenChecksLimits: settings a device cannot carry are refused at
// Open, with a message that names what is short.
func TestOpenChecksLimits(t *testing.T) {
	for _, tc := range []struct {
		name string
		lim  func(*rdma.Limits)
		want string
	}{
		{"slot beyond the largest message", func(l *rdma.Limits) { l.MaxMsg = 4096 }, "eager_bytes"},
		{"too few receives", func(l *rdma.Limits) { l.MaxRecvWR = 8 }, "recv_slots"},
		{"too few sends", func(l *rdma.Limits) { l.MaxSendWR = 8 }, "recv_slots"},
		{"private data too short", func(l *rdma.Limits) { l.MaxPrivate = 16 }, "handshake"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim := softrdma.DefaultLimits
			tc.lim(&lim)
			sd := newSoft(softrdma.New(lim), rdma.Settings{})
			_, err := sd.Open(ctxT(t), sdi.OpenParams{Rank: 0, Size: 2, Handler: newRecorder(false), Logger: hclog.NewNullLogger()})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open: %v, want an error naming %s", err, tc.want)
			}
		})
	}
}
