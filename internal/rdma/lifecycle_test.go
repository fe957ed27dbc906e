package rdma_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/internal/softrdma"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// The tests below stretch windows real hardware has, found in review.

// wprov wraps a softrdma provider to widen windows that real hardware has:
// an accept that returns late, a progress thread that is slow to poll, a
// slow deregistration.
type wprov struct {
	*softrdma.Provider
	reqs         chan rdma.Request
	beforeAccept func()
	afterAccept  func()
	paused       atomic.Bool
	slowRegSize  int
	slowRegDelay time.Duration
	// flushed: a Poll returned a flushed completion (a broken
	// connection); pastFlush: the provider was polled or armed again
	// after that, so the subdevice has handled it.
	flushed, pastFlush atomic.Bool
}

func wrap(p *softrdma.Provider) *wprov {
	w := &wprov{Provider: p, reqs: make(chan rdma.Request, 64)}
	go func() {
		for r := range p.Requests() {
			w.reqs <- &wreq{Request: r, w: w}
		}
		close(w.reqs)
	}()
	return w
}

func (w *wprov) Requests() <-chan rdma.Request { return w.reqs }

func (w *wprov) Poll(cs []rdma.Completion) (int, error) {
	if w.flushed.Load() {
		w.pastFlush.Store(true)
	}
	if w.paused.Load() {
		return 0, nil
	}
	n, err := w.Provider.Poll(cs)
	for _, c := range cs[:n] {
		if errors.Is(c.Err, rdma.ErrFlushed) {
			w.flushed.Store(true)
		}
	}
	return n, err
}

func (w *wprov) Arm() error {
	if w.flushed.Load() {
		w.pastFlush.Store(true)
	}
	return w.Provider.Arm()
}

// awaitFlushHandled polls sd until its provider w has handed it a flushed
// completion and been asked again, so that sd knows the connection broke.
func awaitFlushHandled(t *testing.T, sd *rdma.SubDevice, w *wprov) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !w.pastFlush.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the broken connection's flushed completions were never handled")
		}
		sd.Poll()
	}
}

type slowReg struct {
	rdma.Region
	d time.Duration
}

func (r slowReg) Close() error { time.Sleep(r.d); return r.Region.Close() }

func (w *wprov) Register(b []byte) (rdma.Region, error) {
	r, err := w.Provider.Register(b)
	if err == nil && w.slowRegSize != 0 && len(b) == w.slowRegSize {
		return slowReg{r, w.slowRegDelay}, nil
	}
	return r, err
}

type wreq struct {
	rdma.Request
	w *wprov
}

func (r *wreq) Accept(id uint32, setup func(rdma.Endpoint) error) (rdma.Endpoint, error) {
	if r.w.beforeAccept != nil {
		r.w.beforeAccept()
	}
	ep, err := r.Request.Accept(id, setup)
	if r.w.afterAccept != nil {
		r.w.afterAccept()
	}
	return ep, err
}

// wpair opens two subdevices on wrapped providers; configure the wrappers
// before connecting.
func wpair(t *testing.T, hs [2]sdi.Handler, set rdma.Settings) ([2]*rdma.SubDevice, [2][]byte, [2]*wprov) {
	t.Helper()
	fab := softrdma.New(rdma.Limits{})
	ws := [2]*wprov{wrap(fab.Open()), wrap(fab.Open())}
	sds, cards := openRanks(t, rankSpec{prov: ws[0], set: set, h: hs[0]}, rankSpec{prov: ws[1], set: set, h: hs[1]})
	return [2]*rdma.SubDevice(sds), [2][]byte(cards), ws
}

func sendWithin(sd *rdma.SubDevice, f *sdi.Frame, d time.Duration) (bool, error) {
	deadline := time.Now().Add(d)
	for {
		done, err := sd.Send(f)
		if !errors.Is(err, sdi.ErrWouldBlock) || time.Now().After(deadline) {
			return done, err
		}
		time.Sleep(time.Millisecond)
	}
}

// a connection that fails between Accept and upLocked is finished
// without a report (p.c is not yet it), then made the peer's connection:
// the peer is "up" on a dead endpoint forever, frames are accepted and
// lost, no PeerDown ever comes.
func TestFailsAsItComesUp(t *testing.T) {
	hs := [2]*recorder{newRecorder(false), newRecorder(false)}
	sds, cards, ws := wpair(t, [2]sdi.Handler{hs[0], hs[1]}, rdma.Settings{})
	ws[0].afterAccept = func() { time.Sleep(100 * time.Millisecond) }
	if err := sds[1].Connect(ctxT(t), 0, cards[0]); err != nil {
		t.Fatal(err)
	}
	softrdma.Sever(ws[0].Provider, ws[1].Provider)
	time.Sleep(300 * time.Millisecond)
	accepted := 0
	var err error
	for range 2 * rdma.DefaultRecvSlots {
		var done bool
		done, err = sds[0].Send(&sdi.Frame{Peer: 1, Header: []byte("h"), Payload: []byte("x")})
		if err != nil {
			break
		}
		if done {
			accepted++
		}
	}
	hs[0].mu.Lock()
	down := len(hs[0].down)
	hs[0].mu.Unlock()
	if down == 0 && accepted > 0 {
		t.Fatalf("rank 0: the link failed, no PeerDown, and %d frames accepted as done on a dead connection (then %v)", accepted, err)
	}
}

// Close while an accept is under way: answer passed peerOf before
// closed was set, then makes the peer up after Close's goodbye loop; Close
// spins until its context ends (forever with context.Background()).
func TestCloseDuringAccept(t *testing.T) {
	hs := [2]*recorder{newRecorder(false), newRecorder(false)}
	sds, cards, ws := wpair(t, [2]sdi.Handler{hs[0], hs[1]}, rdma.Settings{})
	in, release := make(chan struct{}), make(chan struct{})
	ws[0].beforeAccept = func() { close(in); <-release }
	go sds[1].Connect(ctxT(t), 0, cards[0])
	<-in
	closed := make(chan error, 1)
	start := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		closed <- sds[0].Close(ctx)
	}()
	time.Sleep(50 * time.Millisecond)
	close(release)
	err := <-closed
	if d := time.Since(start); err != nil || d > time.Second {
		t.Fatalf("Close took %v: %v", d, err)
	}
}

func goid() string {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	return string(bytes.Fields(b)[1])
}

type wakeHandler struct {
	*recorder
	user   atomic.Value // goroutine id of the poller
	trap   func()
	trapOK atomic.Bool
}

func (h *wakeHandler) Deliver(from sdi.Rank, hd, p []byte) {
	if string(hd) == "A" && h.user.Load() == goid() && h.trapOK.CompareAndSwap(false, true) {
		h.trap()
	}
	h.recorder.Deliver(from, hd, p)
}

// lost wake-up. The progress goroutine's TryLock fails while a user
// Poll holds the lock; it arms and sleeps. A completion that came before
// its Arm but after the user's prov.Poll wakes nobody.
func TestNoLostWakeup(t *testing.T) {
	for attempt := range 50 {
		h1 := &wakeHandler{recorder: newRecorder(false)}
		h0 := newRecorder(false)
		sds, cards, _ := wpair(t, [2]sdi.Handler{h0, h1}, rdma.Settings{})
		if err := sds[0].Connect(ctxT(t), 1, cards[1]); err != nil {
			t.Fatal(err)
		}
		var stop atomic.Bool
		h1.trap = func() {
			if _, err := sds[0].Send(&sdi.Frame{Peer: 1, Header: []byte("B"), Payload: []byte("b")}); err != nil {
				t.Error(err)
			}
			time.Sleep(20 * time.Millisecond)
			stop.Store(true)
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			h1.user.Store(goid())
			for !stop.Load() {
				sds[1].Poll()
			}
		})
		time.Sleep(5 * time.Millisecond)
		sds[0].Send(&sdi.Frame{Peer: 1, Header: []byte("A"), Payload: []byte("a")})
		h1.await(t, "A", func() bool { return len(h1.frames) >= 1 })
		if !h1.trapOK.Load() {
			stop.Store(true)
			wg.Wait()
			continue // the progress goroutine won A; try again
		}
		wg.Wait()
		deadline := time.Now().Add(2 * time.Second)
		for time.Now().Before(deadline) {
			h1.mu.Lock()
			n := len(h1.frames)
			h1.mu.Unlock()
			if n == 2 {
				t.Logf("attempt %d: B delivered by the progress goroutine", attempt)
				return
			}
			time.Sleep(time.Millisecond)
		}
		n := sds[1].Poll()
		t.Fatalf("attempt %d: B sat in the completion queue for 2 s with the progress goroutine asleep; one Poll then handled %d", attempt, n)
	}
	t.Skip("the progress goroutine always won")
}

// Flush returns before the SendDone of the frame it waited for (the
// fin path closes drained, unlocks, closes the region, then calls SendDone).
func TestFlushAfterSendDone(t *testing.T) {
	hs := [2]*recorder{newRecorder(false), newRecorder(false)}
	sds, cards, ws := wpair(t, [2]sdi.Handler{hs[0], hs[1]}, rdma.Settings{})
	const size = 100_000
	ws[0].slowRegSize, ws[0].slowRegDelay = size, 200*time.Millisecond
	if err := sds[0].Connect(ctxT(t), 1, cards[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := sds[0].Send(&sdi.Frame{Peer: 1, Header: []byte("L"), Payload: make([]byte, size), Token: 7}); err != nil {
		t.Fatal(err)
	}
	flushAfterDone(t, sds[0], hs[0], 7)
}

// fins of a replaced connection stay in p.fins and go out on the new
// one: Send on the new connection would-blocks behind them and the peer
// drops the new connection on a fin for a frame it does not know. The
// replaced connection is also finished without a PeerDown.
func TestReconnectWhileBehind(t *testing.T) {
	hs := [2]*recorder{newRecorder(false), newRecorder(false)}
	set := rdma.Settings{RecvSlots: 4}
	sds, cards, ws := wpair(t, [2]sdi.Handler{hs[0], hs[1]}, set)
	if err := sds[0].Connect(ctxT(t), 1, cards[1]); err != nil {
		t.Fatal(err)
	}
	// Rank 0 stops polling: it returns no credits to rank 1.
	ws[0].paused.Store(true)
	// Rank 1 spends its 4 credits.
	for i := range 4 {
		if _, err := sds[1].Send(&sdi.Frame{Peer: 0, Header: []byte{byte(i)}, Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	// Rank 0 sends a large frame; rank 1 reads it, delivers it and owes a
	// fin it has no credit for.
	big := make([]byte, 100_000)
	if _, err := sds[0].Send(&sdi.Frame{Peer: 1, Header: []byte("L"), Payload: big, Token: 42}); err != nil {
		t.Fatal(err)
	}
	hs[1].await(t, "the large frame", func() bool { return len(hs[1].frames) == 1 })
	// Rank 1's progress is slow from here on; the link fails.
	ws[1].paused.Store(true)
	softrdma.Sever(ws[0].Provider, ws[1].Provider)
	ws[0].paused.Store(false)
	sds[0].Poll()
	hs[0].await(t, "rank 0 to see the failure", func() bool { return len(hs[0].down) == 1 })
	// Rank 0 reconnects; rank 1 accepts (its accept goroutine does not need
	// progress) and replaces the old connection.
	// Rank 1 catches up while rank 0 reconnects: it refuses rank 0
	// until its old connection has flushed and been reported. (The
	// wrapper hid the flushes from the progress goroutine, which then
	// sleeps: one Poll stands in for the completion that would wake it.)
	time.AfterFunc(50*time.Millisecond, func() { ws[1].paused.Store(false); sds[1].Poll() })
	if err := sds[0].Connect(ctxT(t), 1, cards[1]); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		sds[1].Poll()
		time.Sleep(time.Millisecond)
	}
	// Rank 0 sends a frame on the new connection; rank 1's reposting sends
	// the stale fin.
	if _, err := sendWithin(sds[0], &sdi.Frame{Peer: 1, Header: []byte("new"), Payload: []byte("x")}, time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	hs[0].mu.Lock()
	down0 := len(hs[0].down)
	hs[0].mu.Unlock()
	hs[1].mu.Lock()
	down1 := len(hs[1].down)
	hs[1].mu.Unlock()
	_, err := sendWithin(sds[1], &sdi.Frame{Peer: 0, Header: []byte("back"), Payload: []byte("y")}, time.Second)
	t.Logf("rank 0 PeerDown reports: %d (want 1); rank 1 PeerDown reports: %d (want 1); rank 1 send on the new connection: %v", down0, down1, err)
	if down0 != 1 || down1 != 1 || err != nil {
		t.Fail()
	}
}

// a place given for a frame of a connection that is then replaced is
// never ended: no Deliver into it and no PeerDown.
func TestPlaceEndedOnReconnect(t *testing.T) {
	h1 := newRecorder(true)
	h0 := newRecorder(false)
	var ws1 *wprov
	ph := &placeHook{recorder: h1}
	sds, cards, ws := wpair(t, [2]sdi.Handler{h0, ph}, rdma.Settings{})
	ws1 = ws[1]
	ph.onPlace = func() { ws1.paused.Store(true) } // the read's completion is slow
	if err := sds[0].Connect(ctxT(t), 1, cards[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := sds[0].Send(&sdi.Frame{Peer: 1, Header: []byte("L"), Payload: make([]byte, 100_000), Token: 1}); err != nil {
		t.Fatal(err)
	}
	h1.await(t, "the place", func() bool { return len(h1.placed) == 1 })
	softrdma.Sever(ws[0].Provider, ws[1].Provider)
	sds[0].Poll()
	h0.await(t, "rank 0 to see the failure", func() bool { return len(h0.down) == 1 })
	// Rank 1 catches up while rank 0 reconnects: it refuses rank 0
	// until its old connection has flushed and been reported. (The
	// wrapper hid the flushes from the progress goroutine, which then
	// sleeps: one Poll stands in for the completion that would wake it.)
	time.AfterFunc(50*time.Millisecond, func() { ws1.paused.Store(false); sds[1].Poll() })
	if err := sds[0].Connect(ctxT(t), 1, cards[1]); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		sds[1].Poll()
		time.Sleep(time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	h1.mu.Lock()
	defer h1.mu.Unlock()
	if len(h1.placed) != 0 && len(h1.down) == 0 {
		t.Fatalf("a place was given, and neither Delivered into (%d delivered in place) nor ended by PeerDown", h1.same)
	}
}

type placeHook struct {
	*recorder
	onPlace func()
}

func (h *placeHook) Place(from sdi.Rank, hd []byte, n int) []byte {
	b := h.recorder.Place(from, hd, n)
	h.onPlace()
	return b
}

// Close while one Connect dials and another waits for it: Close sets
// stateGone without closing p.settled; the dialer's Dial then succeeds,
// retires the conn and returns nil (after Close), and never closes
// settled, so the waiter blocks until its own context ends.
func TestConnectWaiterAfterClose(t *testing.T) {
	hs := [2]*recorder{newRecorder(false), newRecorder(false)}
	sds, cards, ws := wpair(t, [2]sdi.Handler{hs[0], hs[1]}, rdma.Settings{})
	in, release := make(chan struct{}), make(chan struct{})
	ws[0].beforeAccept = func() { close(in); <-release }
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	first := make(chan error, 1)
	go func() { first <- sds[1].Connect(ctx, 0, cards[0]) }()
	<-in
	second := make(chan error, 1)
	go func() { second <- sds[1].Connect(ctx, 0, cards[0]) }()
	time.Sleep(20 * time.Millisecond)
	closed := make(chan error, 1)
	go func() { closed <- sds[1].Close(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	close(release)
	t.Logf("Close: %v; first Connect: %v", <-closed, <-first)
	start := time.Now()
	err := <-second
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the waiting Connect returned %v only %v after Close, when its context ended", err, d)
	}
}

// an eager frame accepted (done=true) on a connection that the link
// failure flushed is lost without a PeerDown when the peer's reconnect
// replaces the connection before this rank saw the flush.
func TestNoSilentLossOnReconnect(t *testing.T) {
	hs := [2]*recorder{newRecorder(false), newRecorder(false)}
	sds, cards, ws := wpair(t, [2]sdi.Handler{hs[0], hs[1]}, rdma.Settings{})
	if err := sds[0].Connect(ctxT(t), 1, cards[1]); err != nil {
		t.Fatal(err)
	}
	ws[1].paused.Store(true) // rank 1's progress lags
	softrdma.Sever(ws[0].Provider, ws[1].Provider)
	done, err := sds[1].Send(&sdi.Frame{Peer: 0, Header: []byte("lost"), Payload: []byte("x")})
	t.Logf("rank 1 Send after the link failed: done=%v err=%v", done, err)
	sds[0].Poll()
	hs[0].await(t, "rank 0 to see the failure", func() bool { return len(hs[0].down) == 1 })
	// Rank 1 catches up while rank 0 reconnects: it refuses rank 0
	// until its old connection has flushed and been reported. (The
	// wrapper hid the flushes from the progress goroutine, which then
	// sleeps: one Poll stands in for the completion that would wake it.)
	time.AfterFunc(50*time.Millisecond, func() { ws[1].paused.Store(false); sds[1].Poll() })
	if err := sds[0].Connect(ctxT(t), 1, cards[1]); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		sds[1].Poll()
		time.Sleep(time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	hs[0].mu.Lock()
	got := len(hs[0].frames)
	hs[0].mu.Unlock()
	hs[1].mu.Lock()
	down := len(hs[1].down)
	hs[1].mu.Unlock()
	t.Logf("got=%d down=%d frames=%q", got, down, hs[0].frames)
	if err == nil && got == 0 && down == 0 {
		t.Fatal("rank 1 accepted a frame, rank 0 never got it, and rank 1 never reported rank 0 down")
	}
}

// A connection that fails before the accepting rank has taken it up ends
// in a PeerDown there if it delivered a frame (the handler heard from the
// peer on it, and may wait for what follows), once, and the peer stays
// unreachable until it has; if nothing arrived on it, it is no loss the
// handler could see: no report. Either way a new connection comes up
// after, and the old one reports nothing more.
func TestEarlyFailureReported(t *testing.T) {
	for _, early := range []bool{true, false} {
		t.Run(fmt.Sprintf("early frame=%v", early), func(t *testing.T) {
			hs := [2]*recorder{newRecorder(false), newRecorder(false)}
			sds, cards, ws := wpair(t, [2]sdi.Handler{hs[0], hs[1]}, rdma.Settings{})
			release := make(chan struct{})
			ws[1].afterAccept = func() { <-release }
			if err := sds[0].Connect(ctxT(t), 1, cards[1]); err != nil {
				t.Fatal(err)
			}
			frames, downs := 0, 0 // what rank 1 should see in the end
			if early {
				if _, err := sendWithin(sds[0], &sdi.Frame{Peer: 1, Header: []byte("early"), Payload: []byte("x")}, 10*time.Second); err != nil {
					t.Fatal(err)
				}
				hs[1].await(t, "the early frame", func() bool { return len(hs[1].frames) == 1 })
				frames, downs = 1, 1
			}
			softrdma.Sever(ws[0].Provider, ws[1].Provider)
			// Rank 1 must know the connection broke before Accept
			// returns: one Poll of its own could find the progress
			// goroutine at work, and the connection then came up.
			awaitFlushHandled(t, sds[1], ws[1])
			close(release) // Accept returns on a connection that has failed
			if early {
				hs[1].await(t, "rank 1 to report rank 0 down", func() bool { return len(hs[1].down) == 1 })
			}
			hs[0].await(t, "rank 0 to report rank 1 down", func() bool { return len(hs[0].down) == 1 })
			// Rank 0 connects again: rank 1 takes the new connection only
			// once the old one has finished, so any report of it would
			// come first.
			if err := sds[0].Connect(ctxT(t), 1, cards[1]); err != nil {
				t.Fatal(err)
			}
			if _, err := sendWithin(sds[0], &sdi.Frame{Peer: 1, Header: []byte("later"), Payload: []byte("y")}, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			hs[1].await(t, "the later frame", func() bool { return len(hs[1].frames) == frames+1 })
			hs[1].mu.Lock()
			defer hs[1].mu.Unlock()
			if len(hs[1].down) != downs {
				t.Fatalf("rank 1 reported rank 0 down %d times, want %d", len(hs[1].down), downs)
			}
		})
	}
}

// A rank that closes or disconnects while the fin of a frame it read and
// delivered is still owed must send that fin before its goodbye: the peer
// ends a connection on the goodbye and fails every frame it heard no fin
// for, and a failed frame is the loss of the peer to the multidevice,
// though here nothing was lost. The fin is owed from the Deliver on, not
// from its return: the connection ends while Deliver is held, as when the
// handler wakes a goroutine that ends it, and while the fin waits for a
// data credit.
func TestGoodbyeAfterOwedFins(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(ctx context.Context, sd *rdma.SubDevice) error
	}{
		{"close", func(ctx context.Context, sd *rdma.SubDevice) error { return sd.Close(ctx) }},
		{"disconnect", func(ctx context.Context, sd *rdma.SubDevice) error { return sd.Disconnect(ctx, 0) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs := [2]*recorder{newRecorder(false), newRecorder(false)}
			h1 := &holdHandler{recorder: hs[1], header: "L", release: make(chan struct{})}
			var release sync.Once
			releaseAll := func() { release.Do(func() { close(h1.release) }) }
			t.Cleanup(releaseAll) // before the ranks close, should the test fail first
			sds, cards, ws := wpair(t, [2]sdi.Handler{hs[0], h1}, rdma.Settings{RecvSlots: 4})
			if err := sds[0].Connect(ctxT(t), 1, cards[1]); err != nil {
				t.Fatal(err)
			}
			// Rank 1's accept may not have settled yet; this waits for it.
			if err := sds[1].Connect(ctxT(t), 0, cards[0]); err != nil {
				t.Fatal(err)
			}
			ws[0].paused.Store(true) // rank 0 returns no credits for a while
			for i := range 4 {       // rank 1 spends its data credits
				if _, err := sds[1].Send(&sdi.Frame{Peer: 0, Header: []byte{byte(i)}, Payload: []byte("x")}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := sds[0].Send(&sdi.Frame{Peer: 1, Header: []byte("L"), Payload: make([]byte, 100_000), Token: 42}); err != nil {
				t.Fatal(err)
			}
			hs[1].await(t, "the large frame", func() bool { return len(hs[1].frames) == 1 })
			// Rank 1's Deliver returns and rank 0 catches up while rank 1
			// ends the connection. (The wrapper hid the arrivals from the
			// progress goroutine, which then sleeps: one Poll stands in
			// for the completion that would wake it.)
			time.AfterFunc(50*time.Millisecond, func() { releaseAll(); ws[0].paused.Store(false); sds[0].Poll() })
			if err := tc.end(ctxT(t), sds[1]); err != nil {
				t.Fatal(err)
			}
			hs[0].await(t, "SendDone(42)", func() bool { _, ok := hs[0].done[42]; return ok })
			hs[0].mu.Lock()
			defer hs[0].mu.Unlock()
			if err := hs[0].done[42]; err != nil {
				t.Fatalf("rank 1 delivered the frame, yet rank 0 got SendDone(42, %v)", err)
			}
		})
	}
}

// holdHandler records like its recorder, then holds the Deliver of the
// frame with header until release is closed: a slow handler, which widens
// the window between a Deliver and its return.
type holdHandler struct {
	*recorder
	header  string
	release chan struct{}
}

func (h *holdHandler) Deliver(from sdi.Rank, hd, p []byte) {
	h.recorder.Deliver(from, hd, p)
	if string(hd) == h.header {
		<-h.release
	}
}

// Flush waits for the SendDone of every frame, also of those a failed
// connection fails: finish calls them after deregistering the frames, and
// a Flush in between must not take the connection for gone.
func TestFlushAfterFailedSendDone(t *testing.T) {
	hs := [2]*recorder{newRecorder(false), newRecorder(false)}
	sds, cards, ws := wpair(t, [2]sdi.Handler{hs[0], hs[1]}, rdma.Settings{})
	const size = 100_000
	ws[0].slowRegSize, ws[0].slowRegDelay = size, 300*time.Millisecond
	if err := sds[0].Connect(ctxT(t), 1, cards[1]); err != nil {
		t.Fatal(err)
	}
	ws[1].paused.Store(true)                        // rank 1 does not read the frame
	t.Cleanup(func() { ws[1].paused.Store(false) }) // before the ranks close
	if _, err := sds[0].Send(&sdi.Frame{Peer: 1, Header: []byte("L"), Payload: make([]byte, size), Token: 7}); err != nil {
		t.Fatal(err)
	}
	softrdma.Sever(ws[0].Provider, ws[1].Provider)
	time.Sleep(100 * time.Millisecond) // rank 0 finishes the connection, in the slow deregistration
	flushAfterDone(t, sds[0], hs[0], 7)
}

// flushAfterDone flushes sd's frames to rank 1 and checks that the frame
// with token had its SendDone before Flush returned, as Flush promises.
func flushAfterDone(t *testing.T, sd *rdma.SubDevice, h *recorder, token uint64) {
	t.Helper()
	if err := sd.Flush(ctxT(t), 1); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	_, ok := h.done[token]
	h.mu.Unlock()
	if !ok {
		t.Fatalf("Flush returned nil before SendDone(%d)", token)
	}
}
