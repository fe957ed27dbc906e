package multidevice

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

func pattern(n, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + seed)
	}
	return b
}

// TestSendRecvSizes covers eager, rendezvous and multi-block rendezvous, to
// a peer and to self, with receives posted before and after arrival.
func TestSendRecvSizes(t *testing.T) {
	devs := loopJob(t, 2, smallCaps)
	for _, tc := range []struct {
		name      string
		size      int
		from, to  int
		postFirst bool
	}{
		{"empty", 0, 0, 1, false},
		{"one byte", 1, 0, 1, true},
		{"eager limit", 256, 1, 0, false},
		{"rendezvous", 257, 0, 1, true},
		{"rendezvous unexpected", 700, 0, 1, false},
		{"multi-block", 5000, 1, 0, true},
		{"self eager", 10, 0, 0, false},
		{"self large", 9000, 1, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := pattern(tc.size, tc.size)
			buf := make([]byte, tc.size+3)
			var rr *Request
			if tc.postFirst {
				rr = must(t)(devs[tc.to].Irecv(buf, tc.from, 5, 2))
			}
			sr := must(t)(devs[tc.from].Isend(msg, tc.to, 5, 2, false))
			if !tc.postFirst {
				rr = must(t)(devs[tc.to].Irecv(buf, tc.from, 5, 2))
			}
			st, err := wait(t, rr)
			if err != nil {
				t.Fatalf("recv: %v", err)
			}
			if _, err := wait(t, sr); err != nil {
				t.Fatalf("send: %v", err)
			}
			if st.Source != tc.from || st.Tag != 5 || st.Count != tc.size || st.Cancelled {
				t.Fatalf("status %+v, want source %d tag 5 count %d", st, tc.from, tc.size)
			}
			if !bytes.Equal(buf[:st.Count], msg) {
				t.Fatal("payload corrupted")
			}
		})
	}
}

// TestTruncation: a message longer than the buffer is an error that says
// so, for eager and rendezvous, and the sender still completes.
func TestTruncation(t *testing.T) {
	devs := loopJob(t, 2, smallCaps)
	for _, size := range []int{100, 3000} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			msg := pattern(size, 1)
			buf := make([]byte, 50)
			rr := must(t)(devs[1].Irecv(buf, 0, 0, 2))
			sr := must(t)(devs[0].Isend(msg, 1, 0, 2, false))
			st, err := wait(t, rr)
			if !errors.Is(err, ErrTruncated) {
				t.Fatalf("err = %v, want ErrTruncated", err)
			}
			if st.Count != 50 || !bytes.Equal(buf, msg[:50]) {
				t.Fatalf("count %d; the buffer must hold the message's first bytes", st.Count)
			}
			if _, err := wait(t, sr); err != nil {
				t.Fatalf("sender: %v", err)
			}
		})
	}
}

// TestSsendWaitsForMatch: a synchronous send cannot complete before the
// receiver posts the matching receive (eager and rendezvous sizes).
func TestSsendWaitsForMatch(t *testing.T) {
	devs := loopJob(t, 2, smallCaps)
	for _, size := range []int{8, 2000} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			sr := must(t)(devs[0].Isend(pattern(size, 0), 1, 9, 2, true))
			// Let the frames arrive and be queued as unexpected.
			deadline := time.Now().Add(2 * time.Second)
			for time.Now().Before(deadline) {
				if _, ok, _ := devs[1].Iprobe(0, 9, 2); ok {
					break
				}
				time.Sleep(time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond)
			if _, done, _ := sr.Test(); done {
				t.Fatal("Ssend completed before any receive was posted")
			}
			rr := must(t)(devs[1].Irecv(make([]byte, size), 0, 9, 2))
			if _, err := wait(t, rr); err != nil {
				t.Fatal(err)
			}
			if _, err := wait(t, sr); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestSendCtxEndGivesBufBack: a blocking Send whose ctx ends (nobody has
// posted its receive) returns with buf the caller's again. The message
// still arrives, as buf held it at the call: a rendezvous send once sent
// its data from buf when the receive came, long after Send returned, so
// the receiver got what the caller wrote there afterwards.
func TestSendCtxEndGivesBufBack(t *testing.T) {
	devs := loopJob(t, 2, smallCaps)
	for i, tc := range []struct {
		size int
		sync bool
	}{{8, false}, {8, true}, {2000, false}, {2000, true}, {20000, false}} {
		t.Run(fmt.Sprintf("%d sync=%v", tc.size, tc.sync), func(t *testing.T) {
			tag := 20 + i
			buf := pattern(tc.size, i)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			err := devs[0].Send(ctx, buf, 1, tag, 2, tc.sync)
			cancel()
			if (err != nil) != (tc.sync || tc.size > 1000) {
				t.Fatalf("Send = %v; want ctx's error only where it waits for the receiver", err)
			}
			receivedAsAtCall(t, devs[1], buf, pattern(tc.size, i), tag, 2, nil)
		})
	}
}

// receivedAsAtCall writes over buf, which a Send whose ctx ended gave back
// to its caller, lets the peer take the message (release, if any), and
// receives it on d from rank 0: it must be want, what buf held at the
// call.
func receivedAsAtCall(t *testing.T, d *Device, buf, want []byte, tag int, cid uint64, release func()) {
	t.Helper()
	for j := range buf {
		buf[j] = 0xff // the caller's again
	}
	if release != nil {
		release()
	}
	got := make([]byte, len(want))
	if st, err := wait(t, must(t)(d.Irecv(got, 0, tag, cid))); err != nil || st.Count != len(want) {
		t.Fatalf("receive: %+v, %v", st, err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("received %x..., want %x...: bytes written after Send returned", got[:8], want[:8])
	}
}

// stalledSub refuses (ErrWouldBlock) every frame whose payload is size
// bytes while stall is set: a receiver that is alive but does not poll,
// whose ring is full.
type stalledSub struct {
	sdi.SubDevice
	stall *atomic.Bool
	size  int
}

func (s stalledSub) Send(f *sdi.Frame) (bool, error) {
	if s.stall.Load() && len(f.Payload) == s.size {
		return false, sdi.ErrWouldBlock
	}
	return s.SubDevice.Send(f)
}

// TestSendCtxEndsFrameQueued: a blocking Send whose eager frame waits in
// the outbox (the peer's ring stays full) returns when its ctx ends, and
// the message, once the peer takes it, is what buf held at the call. The
// first way of giving buf back waited for the frame instead, for as long
// as the peer did not make room; so did an Ssend over a subdevice that
// matches on its own, until the receive was posted.
func TestSendCtxEndsFrameQueued(t *testing.T) {
	f := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: smallCaps})
	var stall atomic.Bool
	mk := func(l hclog.Logger) sdi.SubDevice { return stalledSub{f.New(l), &stall, 64} }
	loop := openJob(t, jobSpec{n: 2, subs: []string{"loop"}, factories: map[string]sdi.Factory{"loop": mk}})
	tm := sditest.NewMatchFabric()
	matching := openJob(t, jobSpec{n: 2, subs: []string{"tm"}, factories: map[string]sdi.Factory{"tm": tm.New}})
	for i, tc := range []struct {
		name string
		devs []*Device
		sync bool
	}{{"queued", loop, false}, {"queued sync", loop, true}, {"matching sync", matching, true}} {
		t.Run(tc.name, func(t *testing.T) {
			stall.Store(true)
			tag := 30 + i
			buf := pattern(64, i)
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- tc.devs[0].Send(ctx, buf, 1, tag, 0, tc.sync) }()
			select {
			case err := <-done:
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Send = %v, want the ctx's deadline", err)
				}
			case <-time.After(10 * time.Second):
				stall.Store(false)
				t.Fatal("Send with a 50 ms ctx did not return in 10 s while its frame waited")
			}
			receivedAsAtCall(t, tc.devs[1], buf, pattern(64, i), tag, 0, func() { stall.Store(false) })
		})
	}
}

// TestSendCtxEndsFrameWaitsOnLine: a blocking Send through a gateway
// whose eager frame waits for credit (the line's window is full, the
// destination drains slowly) returns when its ctx ends, and the message
// is what buf held at the call. A line copies a frame into its block only
// as it admits it, so Send copies a frame still waiting then, and nothing
// up front: that copy cost a failover line 2.8 times its latency at 64
// KiB.
func TestSendCtxEndsFrameWaitsOnLine(t *testing.T) {
	devs, _ := openSites(t, siteJob{sites: []int{0, 1, -1}, relays: 1, slowRank: 1, slow: 100 * time.Millisecond,
		forward: ForwardOptions{BlockSize: 512, Window: 1024}})
	for i := range 2 { // fill the window
		must(t)(devs[0].Isend(pattern(400, i), 1, 40, 0, false))
	}
	buf := pattern(400, 2) // eager (fwdCaps)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := devs[0].Send(ctx, buf, 1, 41, 0, false); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Send of a frame the full line cannot admit = %v, want the ctx's deadline", err)
	}
	receivedAsAtCall(t, devs[1], buf, pattern(400, 2), 41, 0, nil)
}

// TestCancelPostedRecv: a cancelled receive does not consume the next
// message; the next receive gets it.
func TestCancelPostedRecv(t *testing.T) {
	devs := loopJob(t, 2, smallCaps)
	r1 := must(t)(devs[1].Irecv(make([]byte, 8), AnySource, AnyTag, 2))
	devs[1].Cancel(r1)
	st, err := wait(t, r1)
	if !errors.Is(err, ErrCanceled) || !st.Cancelled {
		t.Fatalf("cancelled receive: %+v, %v", st, err)
	}
	must(t)(devs[0].Isend([]byte("x"), 1, 3, 2, false))
	buf := make([]byte, 8)
	st, err = wait(t, must(t)(devs[1].Irecv(buf, AnySource, AnyTag, 2)))
	if err != nil || st.Count != 1 || buf[0] != 'x' {
		t.Fatalf("second receive: %+v %v", st, err)
	}
	// Cancelling a completed receive changes nothing.
	devs[1].Cancel(r1)
}

// TestProbe: Iprobe sees an unexpected message with its length without
// consuming it; contexts isolate.
func TestProbe(t *testing.T) {
	devs := loopJob(t, 2, smallCaps)
	if _, ok, err := devs[1].Iprobe(AnySource, AnyTag, 2); ok || err != nil {
		t.Fatalf("probe on empty queue: %v %v", ok, err)
	}
	must(t)(devs[0].Isend(pattern(1234, 0), 1, 77, 2, false))
	var st Status
	// Changed is taken before Iprobe looks: an arrival between the two
	// closes it, where one before Changed would be missed.
	timeout := time.After(5 * time.Second)
	for {
		changed := devs[1].Changed()
		var ok bool
		st, ok, _ = devs[1].Iprobe(0, AnyTag, 2)
		if ok {
			break
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatal("message never became visible to Iprobe")
		}
	}
	if st.Source != 0 || st.Tag != 77 || st.Count != 1234 {
		t.Fatalf("probe status %+v", st)
	}
	if _, ok, _ := devs[1].Iprobe(0, AnyTag, 4); ok {
		t.Fatal("probe on another context matched")
	}
	rr := must(t)(devs[1].Irecv(make([]byte, st.Count), st.Source, st.Tag, 2))
	if st2, err := wait(t, rr); err != nil || st2.Count != 1234 {
		t.Fatalf("receive after probe: %+v %v", st2, err)
	}
}

// TestArgumentErrors: bad ranks and tags are refused with sentinels.
func TestArgumentErrors(t *testing.T) {
	devs := loopJob(t, 2, smallCaps)
	d := devs[0]
	if _, err := d.Isend(nil, 2, 0, 2, false); !errors.Is(err, ErrRank) {
		t.Errorf("send to rank 2 of 2: %v", err)
	}
	if _, err := d.Isend(nil, 1, -4, 2, false); !errors.Is(err, ErrTag) {
		t.Errorf("send with tag -4: %v", err)
	}
	if _, err := d.Irecv(nil, -7, 0, 2); !errors.Is(err, ErrRank) {
		t.Errorf("receive from -7: %v", err)
	}
	if _, err := d.Irecv(nil, 0, -9, 2); !errors.Is(err, ErrTag) {
		t.Errorf("receive tag -9: %v", err)
	}
}

// gatedSub holds back rendezvous data frames once pass of them went.
type gatedSub struct {
	sdi.SubDevice
	pass *atomic.Int64 // data frames still let through; negative: all
}

func (g gatedSub) Send(f *sdi.Frame) (bool, error) {
	if isData(f.Header) {
		if g.pass.Load() == 0 {
			return false, sdi.ErrWouldBlock
		}
		g.pass.Add(-1)
	}
	return g.SubDevice.Send(f)
}

// TestRecvGivenUp: a blocking receive whose context ends while its large
// message's data is still coming returns, and from then on nothing is
// written into its buffer; the sender completes, the blocks that come
// later are dropped quietly, and the next message between the two ranks
// is received whole.
func TestRecvGivenUp(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pass    int64 // data blocks that arrive before the receive gives up
		matched bool  // receive through a matched probe
	}{
		{name: "no block came", pass: 0},
		{name: "two blocks came", pass: 2},
		{name: "matched, two blocks came", pass: 2, matched: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: smallCaps})
			var pass atomic.Int64
			pass.Store(tc.pass)
			gated := func(l hclog.Logger) sdi.SubDevice { return gatedSub{f.New(l), &pass} }
			devs := openJob(t, jobSpec{n: 2, subs: []string{"loop"}, factories: map[string]sdi.Factory{"loop": gated}})
			s := must(t)(devs[1].Isend(pattern(5000, 1), 0, 5, 0, false))
			buf := make([]byte, 5000)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			var err error
			if tc.matched {
				var m *Message
				for ok := false; !ok && err == nil; {
					m, _, ok, err = devs[0].Improbe(1, 5, 0)
				}
				if err == nil {
					_, err = devs[0].Mrecv(ctx, m, buf)
				}
			} else {
				_, err = devs[0].Recv(ctx, buf, 1, 5, 0)
			}
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("receive: %v, want the context's end", err)
			}
			before := bytes.Clone(buf)
			pass.Store(-1)
			if _, err := wait(t, s); err != nil {
				t.Fatalf("send: %v", err)
			}
			s = must(t)(devs[1].Isend(pattern(3000, 2), 0, 5, 0, false))
			next := make([]byte, 3000)
			if _, err := devs[0].Recv(context.Background(), next, 1, 5, 0); err != nil || !bytes.Equal(next, pattern(3000, 2)) {
				t.Fatalf("next message: %v, intact: %v", err, bytes.Equal(next, pattern(3000, 2)))
			}
			wait(t, s)
			if !bytes.Equal(buf, before) {
				t.Error("the buffer of a receive that returned was written afterwards")
			}
			devs[0].mu.Lock()
			left := len(devs[0].abandoned)
			devs[0].mu.Unlock()
			if left != 0 {
				t.Errorf("%d given-up receives still expect data", left)
			}
		})
	}
}

// TestRecvGivenUpWhilePlaced: a blocking receive whose context ends while
// a subdevice writes its message straight into its buffer (sdi.Placer)
// waits for that write, and returns the message, instead of returning
// while the buffer is still being written.
func TestRecvGivenUpWhilePlaced(t *testing.T) {
	d := loopJob(t, 2, smallCaps)[1]
	h := &handler{d: d, sub: 1}
	buf := make([]byte, 300)
	type result struct {
		st  Status
		err error
	}
	res := make(chan result, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	go func() {
		st, err := d.Recv(ctx, buf, 0, 3, 0)
		res <- result{st, err}
	}()
	hb := make([]byte, shortHeaderSize)
	putShort(hb, 3, 0, 0)
	var place []byte
	for deadline := time.Now().Add(20 * time.Second); place == nil; time.Sleep(time.Millisecond) {
		if place = h.Place(0, hb, 200); place == nil && time.Now().After(deadline) {
			t.Fatal("the receive was never posted")
		}
	}
	<-ctx.Done()
	select {
	case r := <-res:
		t.Fatalf("Recv returned while its message was being placed: %+v %v", r.st, r.err)
	case <-time.After(50 * time.Millisecond):
	}
	copy(place, pattern(200, 1))
	h.Deliver(0, hb, place)
	r := <-res
	if r.err != nil || r.st.Count != 200 || !bytes.Equal(buf[:200], pattern(200, 1)) {
		t.Fatalf("the placed message: %+v %v", r.st, r.err)
	}
}

// TestQueuedAfterClose: a frame queued after Close stopped the outbox (a
// goroutine still sending while another closes the device) fails its
// request with ErrClosed instead of leaving it waiting for ever.
func TestQueuedAfterClose(t *testing.T) {
	devs := loopJob(t, 2, smallCaps)
	d := devs[0]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	closeJob(t, devs)
	r := d.newRequest(true, 1)
	r.arm()
	r.pending.Store(1)
	of := r.eagerFrame()
	of.req = r
	of.f.Peer = 1
	d.out.push(outItem{sub: d.subs[len(d.subs)-1], frame: of})
	select {
	case <-r.Done():
	case <-ctx.Done():
		t.Fatal("a frame queued after Close never completed")
	}
	if _, err := r.Result(); !errors.Is(err, ErrClosed) {
		t.Fatalf("frame queued after Close: %v, want ErrClosed", err)
	}
}

// TestCloseHoldsPlacesOfUnclosed: when Close fails the receives a
// subdevice was given as places, their buffers go back to the program
// only if that subdevice closed: one whose Close failed (its ctx ended
// with a transfer under way) may still write into them.
func TestCloseHoldsPlacesOfUnclosed(t *testing.T) {
	for _, tc := range []struct {
		name     string
		unclosed map[int]bool
		done     bool
	}{
		{"subdevice closed", nil, true},
		{"another subdevice unclosed", map[int]bool{0: true}, true},
		{"placing subdevice unclosed", map[int]bool{1: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _, r, _, _ := placeEagerJob(t)
			d.failAll(ErrClosed, tc.unclosed)
			if done := r.isDone(); done != tc.done {
				t.Fatalf("receive being placed done after failAll: %v, want %v", done, tc.done)
			}
			if !tc.done {
				return
			}
			if _, err := r.Result(); !errors.Is(err, ErrClosed) {
				t.Fatalf("receive being placed: %v, want ErrClosed", err)
			}
		})
	}
}

// TestClosedReceiveStatus: receives that Close fails (or the loss of rank
// 0 as it closes, for the one it was placing) report the source and tag
// they were posted with, wildcards included, or those of the message they
// matched, and no bytes: not rank 0's tag 0, which a program could take
// for a message's.
func TestClosedReceiveStatus(t *testing.T) {
	devs := loopJob(t, 3, smallCaps)
	d := devs[1]
	// Posted first, so that the message of tag 3 placed below matches it.
	placed := must(t)(d.Irecv(make([]byte, 300), 0, AnyTag, 0))
	hb := make([]byte, shortHeaderSize)
	putShort(hb, 3, 0, 0)
	if (&handler{d: d, sub: 1}).Place(0, hb, 200) == nil {
		t.Fatal("no place for a message a posted receive takes")
	}
	wild := must(t)(d.Irecv(make([]byte, 8), AnySource, AnyTag, 0))
	own := must(t)(d.Irecv(make([]byte, 8), 2, 7, 0))
	closeJob(t, devs)
	for _, tc := range []struct {
		name string
		r    *Request
		want Status
	}{
		{"matched, being placed", placed, Status{Source: 0, Tag: 3}},
		{"wildcards", wild, Status{Source: AnySource, Tag: AnyTag}},
		{"source and tag", own, Status{Source: 2, Tag: 7}},
	} {
		if st, err := wait(t, tc.r); err == nil || st != tc.want {
			t.Errorf("%s: %+v, %v; want %+v and an error", tc.name, st, err, tc.want)
		}
	}
}
