package multidevice

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// tmHooks change what the matching subdevice of hookedJob does. They are
// set before the job opens and only read afterwards.
type tmHooks struct {
	// gate, when set, stops rank 0's first PostRecv of a receive without
	// a claim: it signals entered and waits until gate is closed.
	gate, entered chan struct{}
	// hold makes PostRecv of a duplicated receive take the claim and keep
	// the receive without ever filling it, as a transfer under way would.
	hold bool
	// failClose makes Close fail after closing, as one whose ctx ended.
	failClose bool
}

type tmHooked struct {
	*sditest.MatchDev
	hooks *tmHooks
	gated atomic.Bool
}

func (h *tmHooked) PostRecv(p *sdi.PostedRecv) error {
	if h.hooks.gate != nil && h.Rank() == 0 && p.Claim == nil && h.gated.CompareAndSwap(false, true) {
		h.hooks.entered <- struct{}{}
		<-h.hooks.gate
	}
	if h.hooks.hold && p.Claim != nil {
		p.Claim.TryClaim(h.ClaimID())
		return nil
	}
	return h.MatchDev.PostRecv(p)
}

func (h *tmHooked) Close(ctx context.Context) error {
	err := h.MatchDev.Close(ctx)
	if h.hooks.failClose {
		return errors.Join(err, errors.New("tm: close: a transfer still under way"))
	}
	return err
}

// hookedJob is anyJob with hooks on tm: ranks 0..2 talk over tm, rank 3
// over the loopback.
func hookedJob(t testing.TB, hooks *tmHooks) []*Device {
	tm := sditest.NewMatchFabric()
	loop := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: smallCaps})
	newTM := func(l hclog.Logger) sdi.SubDevice {
		return &tmHooked{MatchDev: tm.New(l).(*sditest.MatchDev), hooks: hooks}
	}
	devs := openJob(t, jobSpec{n: 4, subs: []string{"tm", "loop"}, tableOf: anyTables,
		factories: map[string]sdi.Factory{"tm": newTM, "loop": loop.New}})
	if devs[0].matchSub[1] < 0 || devs[0].matchSub[2] < 0 || devs[0].matchSub[3] >= 0 {
		t.Fatal("ranks 1 and 2 are not routed over the matching subdevice alone; the test proves nothing")
	}
	return devs
}

// loseRank reports rank peer lost to d by the subdevice carrying it.
func loseRank(d *Device, peer int) {
	h := &handler{d: d, sub: d.routes[peer][0]}
	h.PeerDown(sdi.Rank(peer), errors.New("link gone"))
}

// waitDone waits for r with a watchdog against hangs.
func waitDone(t *testing.T, r *Request) (Status, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := r.Wait(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatal("request did not complete")
	}
	return st, err
}

// TestHeldRecvPeerLoss: a receive naming a source that a matching
// subdevice carries fails with ErrPeerDown when the source is lost,
// whether it was posted before the loss, after it, or while the loss was
// being handled, but gets what the source sent before.
func TestHeldRecvPeerLoss(t *testing.T) {
	t.Run("posted before", func(t *testing.T) {
		devs := hookedJob(t, &tmHooks{})
		var r, other Request
		if err := devs[0].IrecvRequest(&r, make([]byte, 8), 1, 5, 2); err != nil {
			t.Fatal(err)
		}
		if err := devs[0].IrecvRequest(&other, make([]byte, 8), 2, 5, 2); err != nil {
			t.Fatal(err)
		}
		loseRank(devs[0], 1)
		if _, err := waitDone(t, &r); !errors.Is(err, ErrPeerDown) {
			t.Fatalf("receive from the lost rank: %v, want ErrPeerDown", err)
		}
		if other.isDone() {
			t.Fatalf("receive from rank 2 completed by rank 1's loss: %v", other.err)
		}
		// Reused, r fails at once; the other source still delivers.
		if err := devs[0].IrecvRequest(&r, make([]byte, 8), 1, 5, 2); err != nil {
			t.Fatal(err)
		}
		if _, err := waitDone(t, &r); !errors.Is(err, ErrPeerDown) {
			t.Fatalf("reused receive from the lost rank: %v, want ErrPeerDown", err)
		}
		if err := devs[2].Send(context.Background(), []byte("from two"), 0, 5, 2, false); err != nil {
			t.Fatal(err)
		}
		if st, err := waitDone(t, &other); err != nil || st.Source != 2 {
			t.Fatalf("receive from rank 2: %+v, %v", st, err)
		}
	})
	t.Run("posted after", func(t *testing.T) {
		devs := hookedJob(t, &tmHooks{})
		loseRank(devs[0], 1)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := devs[0].Recv(ctx, make([]byte, 8), 1, 5, 2); !errors.Is(err, ErrPeerDown) {
			t.Fatalf("receive posted after the loss: %v, want ErrPeerDown", err)
		}
	})
	t.Run("sent before the loss", func(t *testing.T) {
		devs := hookedJob(t, &tmHooks{})
		if err := devs[1].Send(context.Background(), []byte("last words"), 0, 5, 2, false); err != nil {
			t.Fatal(err)
		}
		// The message waits, unexpected, in rank 0's tm.
		for {
			if _, ok, err := devs[0].Iprobe(1, 5, 2); err != nil {
				t.Fatal(err)
			} else if ok {
				break
			}
			time.Sleep(time.Millisecond)
		}
		loseRank(devs[0], 1)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		buf := make([]byte, 16)
		st, err := devs[0].Recv(ctx, buf, 1, 5, 2)
		if err != nil || string(buf[:st.Count]) != "last words" {
			t.Fatalf("message sent before the loss: %q, %v", buf[:st.Count], err)
		}
		if _, err := devs[0].Recv(ctx, buf, 1, 5, 2); !errors.Is(err, ErrPeerDown) {
			t.Fatalf("next receive: %v, want ErrPeerDown", err)
		}
	})
	t.Run("lost while posting", func(t *testing.T) {
		// The loss's sweep finds the receive registered but tries to
		// cancel it before the subdevice has it; the receive must then
		// notice the loss itself.
		hooks := &tmHooks{gate: make(chan struct{}), entered: make(chan struct{})}
		devs := hookedJob(t, hooks)
		var r Request
		posted := make(chan error, 1)
		go func() { posted <- devs[0].IrecvRequest(&r, make([]byte, 8), 1, 5, 2) }()
		<-hooks.entered
		loseRank(devs[0], 1)
		swept := make(chan struct{})
		devs[0].out.push(outItem{fn: func() { close(swept) }}) // runs after the sweep's jobs
		<-swept
		close(hooks.gate)
		if err := <-posted; err != nil {
			t.Fatal(err)
		}
		if _, err := waitDone(t, &r); !errors.Is(err, ErrPeerDown) {
			t.Fatalf("receive posted as its source was lost: %v, want ErrPeerDown", err)
		}
	})
}

// TestHeldRecvClose: Close fails the receives that matching subdevices
// hold, but not those a subdevice whose Close failed may still fill.
func TestHeldRecvClose(t *testing.T) {
	tests := []struct {
		name      string
		src       int
		hooks     tmHooks
		wantFail  bool // Close fails (tm's Close does)
		wantError error
	}{
		{name: "named source", src: 1, wantError: ErrClosed},
		{name: "any source", src: AnySource, wantError: ErrClosed},
		{name: "named source, close failed", src: 1, hooks: tmHooks{failClose: true}, wantFail: true},
		{name: "any source held, close failed", src: AnySource, hooks: tmHooks{failClose: true, hold: true}, wantFail: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			devs := hookedJob(t, &tt.hooks)
			var r Request
			if err := devs[0].IrecvRequest(&r, make([]byte, 8), tt.src, 5, 2); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			errs := make([]error, len(devs))
			var wg sync.WaitGroup
			for i, d := range devs {
				wg.Go(func() { errs[i] = d.Close(ctx) })
			}
			wg.Wait()
			if failed := errs[0] != nil; failed != tt.wantFail {
				t.Fatalf("rank 0 Close: %v; want failure %v", errs[0], tt.wantFail)
			}
			if tt.wantError == nil {
				// Close returned: failAll ran. The subdevice that did not
				// close may still write the buffer: r must stay pending.
				if r.isDone() {
					t.Fatalf("receive a subdevice whose Close failed holds completed: %v", r.err)
				}
				return
			}
			if _, err := waitDone(t, &r); !errors.Is(err, tt.wantError) {
				t.Fatalf("receive outstanding at Close: %v, want %v", err, tt.wantError)
			}
		})
	}
}

// TestAnySourceReuseOverMatcher: a request that received from ANY_SOURCE
// over a matching subdevice and its own queue can be reused at once, round
// after round, and every message lands once, in order per source.
func TestAnySourceReuseOverMatcher(t *testing.T) {
	devs := hookedJob(t, &tmHooks{})
	const per = 300
	var wg sync.WaitGroup
	defer wg.Wait() // eager sends: they end even if the receiver stops
	for s := 1; s <= 3; s++ {
		wg.Go(func() { sendCounted(t, devs[s], per) })
	}
	var r Request
	next := map[int]uint64{}
	for round := range 3 * per {
		buf := make([]byte, 8)
		if err := devs[0].IrecvRequest(&r, buf, AnySource, 5, 2); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		st, err := waitDone(t, &r)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if v := binary.LittleEndian.Uint64(buf); v != next[st.Source] {
			t.Fatalf("round %d: message %d from rank %d, want %d", round, v, st.Source, next[st.Source])
		}
		next[st.Source]++
	}
	wg.Wait()
	// Pooled: Recv gives its request back and takes it again.
	for s := 1; s <= 3; s++ {
		if err := devs[s].Send(context.Background(), []byte{byte(s)}, 0, 6, 2, false); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		buf := make([]byte, 1)
		st, err := devs[0].Recv(ctx, buf, AnySource, 6, 2)
		cancel()
		if err != nil || int(buf[0]) != st.Source {
			t.Fatalf("pooled ANY_SOURCE receive: %+v %v %v", st, buf, err)
		}
	}
}

// TestAnySourceReuseCancelOverMatcher reuses one ANY_SOURCE request round
// after round with Cancel racing the matches on tm and the loopback:
// every message lands once, in order per source, and no buffer of a
// finished round is written later.
func TestAnySourceReuseCancelOverMatcher(t *testing.T) {
	devs := hookedJob(t, &tmHooks{})
	const per = 1000
	senders := []int{1, 3} // over tm and over the loopback
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, s := range senders {
		wg.Go(func() { sendCounted(t, devs[s], per) })
	}
	type round struct {
		buf  []byte
		want uint64
	}
	var got []round
	next := map[int]uint64{}
	var r Request
	for i := 0; len(got) < per*len(senders); i++ {
		buf := make([]byte, 8)
		if err := devs[0].IrecvRequest(&r, buf, AnySource, 5, 2); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if i%3 != 0 {
			devs[0].Cancel(&r)
		}
		st, err := waitDone(t, &r)
		if errors.Is(err, ErrCanceled) {
			continue
		}
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if v := binary.LittleEndian.Uint64(buf); v != next[st.Source] {
			t.Fatalf("round %d: message %d from rank %d, want %d", i, v, st.Source, next[st.Source])
		}
		got = append(got, round{buf, next[st.Source]})
		next[st.Source]++
	}
	wg.Wait()
	closeJob(t, devs) // nothing writes any buffer after this
	for _, g := range got {
		if v := binary.LittleEndian.Uint64(g.buf); v != g.want {
			t.Fatalf("buffer of message %d later overwritten with %d", g.want, v)
		}
	}
}

// TestHeldRecvCtxEndsWhileFilled: a receive whose ctx ends after its
// matching subdevice matched it, but before the subdevice filled it,
// waits for the fill and returns the message: it returned the ctx's
// error, and the buffer was written after, the message lost.
func TestHeldRecvCtxEndsWhileFilled(t *testing.T) {
	for _, src := range []int{1, AnySource} {
		devs := hookedJob(t, &tmHooks{})
		if err := devs[1].Send(context.Background(), []byte("late-bytes"), 0, 5, 2, false); err != nil {
			t.Fatal(err)
		}
		for { // unexpected in rank 0's tm
			if _, ok, _ := devs[0].Iprobe(1, 5, 2); ok {
				break
			}
			runtime.Gosched()
		}
		// tm's goroutine, which fills matched receives, is kept busy, so
		// the receive matches at once but is filled only once gate closes.
		tm := devs[0].subs[devs[0].matchSub[1]].sd.(*tmHooked).MatchDev
		gate := make(chan struct{})
		tm.Post(func() { <-gate })
		ended, cancel := context.WithCancel(context.Background())
		cancel()
		go func() {
			time.Sleep(20 * time.Millisecond) // the old code returned by then
			close(gate)
		}()
		buf := make([]byte, 10)
		st, err := devs[0].Recv(ended, buf, src, 5, 2)
		got := string(buf)
		if err != nil || got != "late-bytes" || st.Count != 10 {
			<-gate
			time.Sleep(20 * time.Millisecond)
			t.Errorf("from %d: Recv gave %+v, %v with %q in the buffer (%q a moment later); want the message", src, st, err, got, buf)
		}
	}
}

// sendCounted sends rank 0 the numbers 0..n-1, eight bytes each, with tag
// 5 on context 2.
func sendCounted(t *testing.T, d *Device, n int) {
	for i := range n {
		msg := make([]byte, 8)
		binary.LittleEndian.PutUint64(msg, uint64(i))
		if err := d.Send(context.Background(), msg, 0, 5, 2, false); err != nil {
			t.Error(err)
			return
		}
	}
}

// failingTM fails, through Done, every receive from one source it is
// given, as sdi.PostedRecv.Done allows ("or the subdevice failed"):
// before a message matched it (zero envelope), or after writing half of
// one (mid).
type failingTM struct {
	*sditest.MatchDev
	mid bool
}

func (f failingTM) PostRecv(p *sdi.PostedRecv) error {
	if p.Claim != nil {
		return f.MatchDev.PostRecv(p)
	}
	f.Post(func() {
		if !f.mid {
			p.Done(sdi.Envelope{}, 0, errors.New("tm: receive failed"))
			return
		}
		copy(p.Buf, "half")
		p.Done(sdi.Envelope{Source: p.Source, Tag: p.Tag, Context: p.Context, Len: 8}, 4, errors.New("tm: link lost mid-message"))
	})
	return nil
}

// TestMatcherFailsHeldRecv: a receive that a matching subdevice fails
// reports the source and tag it was posted with (or its message's) and no
// bytes, as the receives the device fails do.
func TestMatcherFailsHeldRecv(t *testing.T) {
	for _, mid := range []bool{false, true} {
		t.Run(fmt.Sprintf("mid=%v", mid), func(t *testing.T) {
			tm := sditest.NewMatchFabric()
			loop := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: smallCaps})
			newTM := func(l hclog.Logger) sdi.SubDevice { return failingTM{tm.New(l).(*sditest.MatchDev), mid} }
			devs := openJob(t, jobSpec{n: 4, subs: []string{"tm", "loop"}, tableOf: anyTables,
				factories: map[string]sdi.Factory{"tm": newTM, "loop": loop.New}})
			r := must(t)(devs[0].Irecv(make([]byte, 8), 1, 5, 2))
			if st, err := waitDone(t, r); err == nil || st != (Status{Source: 1, Tag: 5}) {
				t.Fatalf("held receive failed by its subdevice: %+v, %v; want source 1, tag 5, no bytes and the error", st, err)
			}
		})
	}
}

// sendFailingTM is the matching subdevice whose tagged sends to rank 1
// fail once fail is set, as over a link to rank 1 that broke, with no
// PeerDown (the SDI does not require one): at once, by SendTagged's
// error, or, with later, in the SendDone that follows.
type sendFailingTM struct {
	*sditest.MatchDev
	fail  *atomic.Bool
	later bool
}

func (f sendFailingTM) SendTagged(m *sdi.TaggedMessage) (bool, error) {
	if !f.fail.Load() || m.Peer != 1 {
		return f.MatchDev.SendTagged(m)
	}
	err := fmt.Errorf("tm: link to rank 1 broke: %w", sdi.ErrPeerUnreachable)
	if !f.later {
		return false, err
	}
	token := m.Token
	f.Post(func() { f.Handler().SendDone(token, err) })
	return false, nil
}

// TestMatcherSendFailureLosesPeer: a tagged send that a matching
// subdevice fails is its loss of the peer, as if PeerDown came with it
// (sdi: SendTagged has Send's completion rules): the peer is reported
// lost and the receive waiting for it fails, as after a failed frame
// (frameLost). Only the send failed: the peer stayed up, and a receive
// from it waited for ever.
func TestMatcherSendFailureLosesPeer(t *testing.T) {
	for _, tt := range []struct {
		name  string
		later bool
	}{
		{name: "refused"},
		{name: "failed in SendDone", later: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tm := sditest.NewMatchFabric()
			loop := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: smallCaps})
			fail := new(atomic.Bool)
			newTM := func(l hclog.Logger) sdi.SubDevice {
				return sendFailingTM{tm.New(l).(*sditest.MatchDev), fail, tt.later}
			}
			devs, rb := reportingOpen(t, jobSpec{n: 4, subs: []string{"tm", "loop"}, tableOf: anyTables,
				factories: map[string]sdi.Factory{"tm": newTM, "loop": loop.New}})
			if devs[0].matchSub[1] < 0 {
				t.Fatal("rank 1 is not routed over the matching subdevice; the test proves nothing")
			}
			pending := must(t)(devs[0].Irecv(make([]byte, 8), 1, 5, 2))
			rb.watch(pending)
			fail.Store(true)
			r, err := devs[0].Isend([]byte("x"), 1, 5, 2, false)
			if err == nil {
				_, err = waitDone(t, r)
			}
			if !errors.Is(err, ErrPeerDown) {
				t.Fatalf("send over the broken link: %v, want ErrPeerDown", err)
			}
			if _, err := waitDone(t, pending); !errors.Is(err, ErrPeerDown) {
				t.Errorf("receive from rank 1 after a send to it failed: %v, want ErrPeerDown", err)
			}
			if reports := rb.got(); len(reports) != 1 || !strings.HasPrefix(reports[0], "rank 1: ") || strings.Contains(reports[0], "after") {
				t.Errorf("reports %q: want rank 1's loss, reported before the receive failed", reports)
			}
		})
	}
}

// limitTM is the matching subdevice refusing, as sdi.ErrTooLarge, a tagged
// message larger than its MaxFrame (1 MiB), as Send refuses such a frame.
type limitTM struct{ *sditest.MatchDev }

func (f limitTM) SendTagged(m *sdi.TaggedMessage) (bool, error) {
	if len(m.Payload) > 1<<20 {
		return false, fmt.Errorf("tm: message of %d bytes: %w", len(m.Payload), sdi.ErrTooLarge)
	}
	return f.MatchDev.SendTagged(m)
}

// TestMatcherTooLargeKeepsPeer: a send the matching subdevice refuses as
// too large fails alone; the peer, still up, stays usable and is not
// reported lost. Taking every refusal as the loss of the peer,
// sendTagged marked it down, reported it lost to the launcher and failed
// every later send to it.
func TestMatcherTooLargeKeepsPeer(t *testing.T) {
	tm := sditest.NewMatchFabric()
	loop := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: smallCaps})
	newTM := func(l hclog.Logger) sdi.SubDevice { return limitTM{tm.New(l).(*sditest.MatchDev)} }
	devs, rb := reportingOpen(t, jobSpec{n: 2, subs: []string{"tm", "loop"}, tableOf: anyTables,
		factories: map[string]sdi.Factory{"tm": newTM, "loop": loop.New}})
	if devs[0].matchSub[1] < 0 {
		t.Fatal("rank 1 is not routed over the matching subdevice; the test proves nothing")
	}
	if _, err := devs[0].Isend(make([]byte, 2<<20), 1, 5, 2, false); !errors.Is(err, sdi.ErrTooLarge) {
		t.Fatalf("oversized send: %v, want ErrTooLarge", err)
	}
	rr := must(t)(devs[1].Irecv(make([]byte, 8), 0, 6, 2))
	r, err := devs[0].Isend([]byte("small"), 1, 6, 2, false)
	if err == nil {
		_, err = wait(t, r)
	}
	if err != nil {
		t.Errorf("small send to rank 1 after an oversized one was refused: %v", err)
	} else if _, err := wait(t, rr); err != nil {
		t.Errorf("receive: %v", err)
	}
	if reports := rb.got(); len(reports) != 0 {
		t.Errorf("rank 1, alive, reported lost: %q", reports)
	}
}
