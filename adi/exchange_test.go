package adi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
)

// TestSendrecvRing shifts a buffer around a ring in both directions with
// Sendrecv and SendrecvReplace. With messages beyond the eager limit every
// rank's send waits for its neighbour's receive: blocking Sends would
// leave the whole ring waiting.
func TestSendrecvRing(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5} {
		for _, size := range []int{0, 100, 3000, 70000} {
			t.Run(fmt.Sprintf("ranks=%d/bytes=%d", n, size), func(t *testing.T) {
				cs := loopJob(t, n)
				ctx := ctxT(t)
				each(t, cs, func(c *adi.Comm) error {
					me, right, left := c.Rank(), (c.Rank()+1)%n, (c.Rank()+n-1)%n
					got := make([]byte, size+10)
					st, err := c.Sendrecv(ctx, pattern(me, right, size), right, 7, got, left, 7)
					if err != nil {
						return err
					}
					if st.Source != left || st.Tag != 7 || st.Count != size || !bytes.Equal(got[:size], pattern(left, me, size)) {
						return fmt.Errorf("sendrecv: status %+v, or the data from rank %d is wrong", st, left)
					}
					buf := pattern(me, left, size)
					st, err = c.SendrecvReplace(ctx, buf, left, 8, adi.AnySource, adi.AnyTag)
					if err != nil {
						return err
					}
					if st.Source != right || st.Tag != 8 || st.Count != size || !bytes.Equal(buf, pattern(right, me, size)) {
						return fmt.Errorf("sendrecv replace: status %+v, or the data from rank %d is wrong", st, right)
					}
					return nil
				})
			})
		}
	}
}

func TestSendrecvErrors(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	if _, err := cs[0].Sendrecv(ctx, nil, 2, 0, nil, 1, 0); !errors.Is(err, adi.ErrRank) {
		t.Errorf("destination out of range: %v, want ErrRank", err)
	}
	if _, err := cs[0].Sendrecv(ctx, nil, 1, 0, nil, 5, 0); !errors.Is(err, adi.ErrRank) {
		t.Errorf("source out of range: %v, want ErrRank", err)
	}
	if _, err := cs[0].Sendrecv(ctx, nil, 1, -3, nil, 1, 0); !errors.Is(err, adi.ErrTag) {
		t.Errorf("bad send tag: %v, want ErrTag", err)
	}
	// The receive of a send that failed is cancelled, not left posted to
	// take the next message.
	if _, err := cs[0].Sendrecv(ctx, nil, 1, -3, make([]byte, 1), 1, 4); err == nil {
		t.Fatal("bad send tag accepted")
	}
	if err := cs[1].Send(ctx, []byte{42}, 0, 4); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := cs[0].Iprobe(1, 4); err != nil || !ok {
		// Probe until it is here: sends from the same process are
		// delivered by the loopback fabric at once or soon.
		if _, err := cs[0].Probe(ctx, 1, 4); err != nil {
			t.Fatalf("the message meant for a new receive: %v", err)
		}
	}
	got := make([]byte, 1)
	if _, err := cs[0].Recv(ctx, got, 1, 4); err != nil || got[0] != 42 {
		t.Fatalf("receive after the failed sendrecv: %v %v", got, err)
	}
	// Refused for its receive tag with nothing to receive (ProcNull), it
	// sends nothing either; it once sent, then reported ErrTag. A
	// message sent after it is the first to arrive.
	if _, err := cs[0].Sendrecv(ctx, []byte{1}, 1, 5, nil, adi.ProcNull, -5); !errors.Is(err, adi.ErrTag) {
		t.Errorf("bad receive tag from ProcNull: %v, want ErrTag", err)
	}
	if err := cs[0].Send(ctx, []byte{2}, 1, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := cs[1].Recv(ctx, got, 0, 5); err != nil || got[0] != 2 {
		t.Errorf("first message after the refused Sendrecv: %v %v, want the one sent after it", got, err)
	}
}

// TestWaitAnySkipsInactive: WaitAny, WaitSome, TestAny and TestSome skip
// what MPI's skip: null requests, zero ones never started, and persistent
// requests between their operations. An inactive persistent request once
// came out of WaitAny at once, as if completed, in place of the pending
// receive beside it.
func TestWaitAnySkipsInactive(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	idle, err := cs[1].RecvInit(make([]byte, 8), 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	var zero adi.Request
	if i, _, ok, err := adi.TestAny(nil, &zero, idle); i != -1 || !ok || err != nil {
		t.Errorf("TestAny with no active request = %d, %v, %v; want -1, true, nil (MPI_UNDEFINED)", i, ok, err)
	}
	if i, _, err := adi.WaitAny(ctx, nil, &zero, idle); i != -1 || err != nil {
		t.Errorf("WaitAny with no active request = %d, %v; want -1", i, err)
	}
	if idx, _, err := adi.WaitSome(ctx, nil, &zero, idle); len(idx) != 0 || err != nil {
		t.Errorf("WaitSome with no active request = %v, %v; want none", idx, err)
	}
	pending, err := cs[1].Irecv(make([]byte, 8), 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if idx, _, err := adi.TestSome(nil, &zero, idle, pending); len(idx) != 0 || err != nil {
		t.Errorf("TestSome before the message = %v, %v; want none", idx, err)
	}
	go cs[0].Send(ctx, []byte("x"), 1, 2)
	if i, st, err := adi.WaitAny(ctx, nil, &zero, idle, pending); i != 3 || err != nil || st.Count != 1 {
		t.Errorf("WaitAny = %d, %+v, %v; want 3, the pending receive", i, st, err)
	}
}

// TestMatchedProbe: goroutines of one rank probe for any message and
// receive what they probed; every message is received once, by the
// goroutine that probed it, with the length the probe announced, whether
// small or large. With Probe and Recv instead, a goroutine could receive
// the message another one probed, into a buffer sized for the wrong one.
func TestMatchedProbe(t *testing.T) {
	cs := loopJob(t, 3)
	ctx := ctxT(t)
	const perSender, receivers = 40, 4
	sizes := func(i int) int { return []int{1, 0, 600, 70000, 33}[i%5] }
	var wg sync.WaitGroup
	for s := 1; s <= 2; s++ {
		wg.Go(func() {
			for i := range perSender {
				if err := cs[s].Send(ctx, pattern(s, i, sizes(i)), 0, i); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	var mu sync.Mutex
	seen := map[[2]int]bool{}
	for range receivers {
		wg.Go(func() {
			for range 2 * perSender / receivers {
				m, st, err := cs[0].Mprobe(ctx, adi.AnySource, adi.AnyTag)
				if err != nil {
					t.Error(err)
					return
				}
				buf := make([]byte, st.Count)
				got, err := m.Recv(ctx, buf)
				if err != nil {
					t.Error(err)
					return
				}
				if got != st || !bytes.Equal(buf, pattern(st.Source, st.Tag, sizes(st.Tag))) {
					t.Errorf("probed %+v, received %+v, data right: %v", st, got, bytes.Equal(buf, pattern(st.Source, st.Tag, sizes(st.Tag))))
				}
				mu.Lock()
				if seen[[2]int{st.Source, st.Tag}] {
					t.Errorf("message %d from rank %d received twice", st.Tag, st.Source)
				}
				seen[[2]int{st.Source, st.Tag}] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(seen) != 2*perSender {
		t.Errorf("%d messages received, want %d", len(seen), 2*perSender)
	}
	if _, _, ok, err := cs[0].Improbe(adi.AnySource, adi.AnyTag); ok || err != nil {
		t.Errorf("a message left over: %v %v", ok, err)
	}
}

func TestMatchedProbeRules(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	if _, _, ok, err := cs[0].Improbe(1, 3); ok || err != nil {
		t.Fatalf("probe with nothing sent: %v %v", ok, err)
	}
	if _, _, _, err := cs[0].Improbe(7, 3); !errors.Is(err, adi.ErrRank) {
		t.Errorf("source out of range: %v, want ErrRank", err)
	}
	for _, size := range []int{10, 5000} {
		msg := pattern(1, 0, size)
		if err := cs[1].Send(ctx, msg[:0], 0, 2); err != nil { // a plain receive must not take the probed one
			t.Fatal(err)
		}
		req := must(cs[1].Isend(msg, 0, 3))
		m, st, err := cs[0].Mprobe(ctx, 1, 3)
		if err != nil || st.Count != size {
			t.Fatalf("mprobe: %+v %v", st, err)
		}
		if _, ok, _ := cs[0].Iprobe(1, 3); ok {
			t.Error("a probed message is still seen by Iprobe")
		}
		short := make([]byte, size/2)
		q, err := m.Irecv(short)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Irecv(short); err == nil {
			t.Error("a message received twice")
		}
		if st, err := q.Wait(ctx); !errors.Is(err, adi.ErrTruncated) || st.Count != size/2 || !bytes.Equal(short, msg[:size/2]) {
			t.Errorf("truncated receive of %d bytes: %+v %v", size, st, err)
		}
		if _, err := req.Wait(ctx); err != nil {
			t.Errorf("send of %d bytes: %v", size, err)
		}
		if _, err := cs[0].Recv(ctx, nil, 1, 2); err != nil {
			t.Fatal(err)
		}
	}
	var m *adi.Message
	if _, err := m.Recv(ctx, nil); err == nil {
		t.Error("receive of a nil message accepted")
	}
}

// TestProbeWakesOnLoss: a blocking probe parked waiting for a rank fails
// with ErrPeerDown when that rank is lost, not when its context ends.
func TestProbeWakesOnLoss(t *testing.T) {
	for _, matched := range []bool{false, true} {
		t.Run(fmt.Sprintf("matched=%v", matched), func(t *testing.T) {
			ws, f := loopWorlds(t, 2)
			c := ws[0].Comm()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			res := make(chan error, 1)
			go func() {
				var err error
				if matched {
					_, _, err = c.Mprobe(ctx, 1, 7)
				} else {
					_, err = c.Probe(ctx, 1, 7)
				}
				res <- err
			}()
			time.Sleep(100 * time.Millisecond) // past the spin: parked
			f.Sever(1)
			if err := <-res; !errors.Is(err, adi.ErrPeerDown) {
				t.Fatalf("probe of a lost rank: %v, want ErrPeerDown", err)
			}
		})
	}
}

// rotatedComms splits the world of ws into one communicator in which world
// rank r is rank (r+1) mod the size, so that a status's source tells
// world and communicator ranks apart, and returns each rank's.
func rotatedComms(t *testing.T, ws []*adi.World) []*adi.Comm {
	t.Helper()
	ctx := ctxT(t)
	rotated := make([]*adi.Comm, len(ws))
	each(t, comms(ws), func(c *adi.Comm) (err error) {
		rotated[c.Rank()], err = c.Split(ctx, 0, (c.Rank()+1)%len(ws))
		return err
	})
	if t.Failed() {
		t.FailNow()
	}
	return rotated
}

// TestFailedRecvStatus: a receive that fails when its source is lost
// reports that source as a rank of its communicator, and its tag, not
// world rank 0's number there and tag 0.
func TestFailedRecvStatus(t *testing.T) {
	ws, f := loopWorlds(t, 3)
	ctx := ctxT(t)
	comms := rotatedComms(t, ws) // world rank 1 is rank 2 there
	q, err := comms[0].Irecv(make([]byte, 8), 2, 7)
	if err != nil {
		t.Fatal(err)
	}
	f.Sever(1)
	if st, err := q.Wait(ctx); !errors.Is(err, adi.ErrPeerDown) || st != (adi.Status{Source: 2, Tag: 7}) {
		t.Fatalf("receive from a lost rank: %+v, %v; want ErrPeerDown, source 2, tag 7", st, err)
	}
}

// TestPersistent: persistent requests made once carry a halo exchange
// around the ring for several rounds, each round with the send buffer's
// contents then; an inactive request waits for nothing, a busy one cannot
// be started again, and ProcNull works as in Isend and Irecv.
func TestPersistent(t *testing.T) {
	const n, rounds = 3, 5
	cs := loopJob(t, n)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		me := c.Rank()
		out, in := make([]byte, 1000), make([]byte, 1000) // past the eager limit
		send, err := c.SendInit(out, (me+1)%n, 4)
		if err != nil {
			return err
		}
		recv, err := c.RecvInit(in, (me+n-1)%n, 4)
		if err != nil {
			return err
		}
		null, err := c.RecvInit(nil, adi.ProcNull, 4)
		if err != nil {
			return err
		}
		if st, err := recv.Wait(ctx); err != nil || st != (adi.Status{}) {
			return fmt.Errorf("wait on a request never started: %+v %v", st, err)
		}
		for round := range rounds {
			copy(out, pattern(me, round, len(out)))
			if err := adi.StartAll(recv, send, null); err != nil {
				return err
			}
			sts, err := adi.WaitAll(ctx, recv, send, null)
			if err != nil {
				return err
			}
			if sts[0].Source != (me+n-1)%n || !bytes.Equal(in, pattern((me+n-1)%n, round, len(in))) {
				return fmt.Errorf("round %d: status %+v or data wrong", round, sts[0])
			}
			if sts[2].Source != adi.ProcNull {
				return fmt.Errorf("round %d: receive from ProcNull: %+v", round, sts[2])
			}
		}
		return nil
	})
	if _, err := cs[0].RecvInit(nil, 1, -7); !errors.Is(err, adi.ErrTag) {
		t.Errorf("RecvInit with a bad tag: %v", err)
	}
	if _, err := cs[0].SendInit(nil, 9, 1); !errors.Is(err, adi.ErrRank) {
		t.Errorf("SendInit to no rank: %v", err)
	}
	var q adi.Request
	if err := q.Start(); err == nil {
		t.Error("Start of a request that is not persistent")
	}
	// Nobody sends tag 9: the receive stays in flight.
	idle, err := cs[0].RecvInit(make([]byte, 1), 1, 9)
	if err != nil {
		t.Fatal(err)
	}
	if err := idle.Start(); err != nil {
		t.Fatal(err)
	}
	if err := idle.Start(); !errors.Is(err, adi.ErrRequestBusy) {
		t.Errorf("Start of a receive in flight: %v, want ErrRequestBusy", err)
	}
	idle.Cancel()
	if st, err := idle.Wait(ctx); !errors.Is(err, adi.ErrCanceled) || !st.Cancelled {
		t.Errorf("cancelled persistent receive: %+v %v", st, err)
	}
	if err := idle.Start(); err != nil { // and it starts again
		t.Errorf("restart after a cancel: %v", err)
	}
	idle.Cancel()
	idle.Wait(ctx)
}

// TestFailedPrecvStatus: a partitioned receive whose source is lost
// reports that source and its tag, as a receive does, in the round that
// failed and in the next (its channel is broken).
func TestFailedPrecvStatus(t *testing.T) {
	ws, f := loopWorlds(t, 3)
	ctx := ctxT(t)
	comms := rotatedComms(t, ws) // world rank 1 is rank 2 there
	pr, err := comms[0].PrecvInit(make([]byte, 64), 4, 2, 7)
	if err != nil {
		t.Fatal(err)
	}
	if err := pr.Start(); err != nil {
		t.Fatal(err)
	}
	f.Sever(1)
	for round := 1; round <= 2; round++ {
		if round == 2 {
			pr.Start() // fails as it begins: its error is Wait's
		}
		if st, err := pr.Wait(ctx); !errors.Is(err, adi.ErrPeerDown) || st != (adi.Status{Source: 2, Tag: 7}) {
			t.Fatalf("round %d of a partitioned receive from a lost rank: %+v, %v; want ErrPeerDown, source 2, tag 7", round, st, err)
		}
	}
}

// TestRecvTimeoutStatus: a blocking Recv or Sendrecv whose ctx ends first
// reports its receive cancelled, as Isendrecv does, not rank 0's tag 0.
func TestRecvTimeoutStatus(t *testing.T) {
	comms := loopJob(t, 3)
	ctx := ctxT(t)
	for _, tc := range []struct {
		name string
		call func(context.Context) (adi.Status, error)
	}{
		{"recv", func(ctx context.Context) (adi.Status, error) { return comms[0].Recv(ctx, make([]byte, 8), 2, 7) }},
		{"sendrecv", func(ctx context.Context) (adi.Status, error) { // its rendezvous send is never received
			return comms[0].Sendrecv(ctx, make([]byte, 1<<20), 2, 9, make([]byte, 8), 2, 7)
		}},
	} {
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		st, err := tc.call(short)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || st != (adi.Status{Source: adi.AnySource, Tag: adi.AnyTag, Cancelled: true}) {
			t.Errorf("%s when its ctx ended: %+v, %v; want the deadline's error and a cancelled receive", tc.name, st, err)
		}
	}
}

// TestProbeTimeoutStatus: a blocking Probe or Mprobe whose ctx ends first
// reports what Recv does then, a cancelled wildcard status, not rank 0's
// message with tag 0.
func TestProbeTimeoutStatus(t *testing.T) {
	comms := loopJob(t, 3)
	ctx := ctxT(t)
	for _, tc := range []struct {
		name string
		call func(context.Context) (adi.Status, error)
	}{
		{"probe", func(ctx context.Context) (adi.Status, error) { return comms[0].Probe(ctx, 2, 7) }},
		{"probe any", func(ctx context.Context) (adi.Status, error) { return comms[0].Probe(ctx, adi.AnySource, adi.AnyTag) }},
		{"mprobe", func(ctx context.Context) (adi.Status, error) {
			m, st, err := comms[0].Mprobe(ctx, 2, 7)
			if m != nil {
				return st, fmt.Errorf("Mprobe returned a message with %v", err)
			}
			return st, err
		}},
	} {
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		st, err := tc.call(short)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || st != (adi.Status{Source: adi.AnySource, Tag: adi.AnyTag, Cancelled: true}) {
			t.Errorf("%s when its ctx ended: %+v, %v; want the deadline's error and a cancelled status", tc.name, st, err)
		}
	}
}

// TestManyFailedRequestsError: WaitAll, TestAll and TestSome over
// hundreds of requests that failed for one cause (their source lost)
// return an error errors.Is finds every cause in, one per failed request,
// but whose message names each cause once: it once held a line per
// request, tens of kilobytes.
func TestManyFailedRequestsError(t *testing.T) {
	const lost = 300
	ws, f := loopWorlds(t, 3)
	cs := comms(ws)
	ctx := ctxT(t)
	var reqs []*adi.Request
	for i := range lost {
		reqs = append(reqs, must(cs[0].Irecv(make([]byte, 8), 2, i%7)))
	}
	canceled := must(cs[0].Irecv(make([]byte, 8), 1, 9)) // nobody sends it
	canceled.Cancel()
	reqs = append(reqs, must(cs[0].Irecv(make([]byte, 8), 1, 8)), canceled, nil)
	if err := cs[1].Send(ctx, make([]byte, 16), 0, 8); err != nil { // longer than its receive
		t.Fatal(err)
	}
	f.Sever(2)
	for {
		if done, _ := adi.TestAll(nil, reqs...); done {
			break
		}
		time.Sleep(time.Millisecond)
	}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"WaitAll", func() error { _, err := adi.WaitAll(ctx, reqs...); return err }},
		{"WaitAllInto", func() error { return adi.WaitAllInto(ctx, nil, reqs...) }},
		{"TestAll", func() error { _, err := adi.TestAll(nil, reqs...); return err }},
		{"TestSome", func() error { _, _, err := adi.TestSome(reqs...); return err }},
	} {
		err := tc.call()
		for _, want := range []error{adi.ErrPeerDown, adi.ErrTruncated, adi.ErrCanceled} {
			if !errors.Is(err, want) {
				t.Errorf("%s: %v does not wrap %v", tc.name, err, want)
			}
		}
		var each interface{ Unwrap() []error }
		if !errors.As(err, &each) || len(each.Unwrap()) != lost+2 {
			t.Errorf("%s: the error does not hold one error for each of the %d failed requests", tc.name, lost+2)
		}
		if n := len(err.Error()); n > 2048 {
			t.Errorf("%s: %d bytes of error for %d failed requests: %.300s...", tc.name, n, lost+2, err)
		}
	}
}

// TestWaitAnyPersistentOnce: a persistent request whose round WaitAny,
// WaitSome, TestAny, TestSome, Wait or Test has reported is inactive, as
// MPI makes it, until it is started again. The usual halo loop (StartAll,
// then WaitAny once per request) once got the first request that completed
// at every call and never saw the others.
func TestWaitAnyPersistentOnce(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	const k = 3
	for round := range 2 {
		recvs := make([]*adi.Request, k)
		for i := range recvs {
			recvs[i] = must(cs[1].RecvInit(make([]byte, 1), 0, i))
		}
		bar0, bar1 := must(cs[0].BarrierInit()), must(cs[1].BarrierInit())
		reqs := append(recvs, bar1)
		if err := adi.StartAll(reqs...); err != nil {
			t.Fatal(err)
		}
		if err := bar0.Start(); err != nil {
			t.Fatal(err)
		}
		for i := range k {
			if err := cs[0].Send(ctx, []byte{byte(i)}, 1, i); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := bar0.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		seen := map[int]bool{}
		for range k + 1 {
			var idx []int
			var err error
			if round == 0 {
				var i int
				i, _, err = adi.WaitAny(ctx, reqs...)
				idx = []int{i}
			} else {
				idx, _, err = adi.WaitSome(ctx, reqs...)
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, i := range idx {
				if i < 0 || seen[i] {
					t.Fatalf("round %d: request %d reported again (seen %v)", round, i, seen)
				}
				seen[i] = true
			}
			if len(seen) == k+1 {
				break
			}
		}
		if i, _, err := adi.WaitAny(ctx, reqs...); i != -1 || err != nil {
			t.Errorf("round %d: WaitAny once every round was reported = %d, %v; want -1", round, i, err)
		}
		if i, _, ok, _ := adi.TestAny(reqs...); i != -1 || !ok {
			t.Errorf("round %d: TestAny once every round was reported = %d, %v; want -1, true", round, i, ok)
		}
		if st, err := recvs[0].Wait(ctx); err != nil || st != (adi.Status{}) {
			t.Errorf("round %d: Wait on a reported round = %+v, %v; want an inactive request's empty status", round, st, err)
		}
	}
	// Wait reports a round once too, and Start makes the request active again.
	q := must(cs[1].RecvInit(make([]byte, 1), 0, 7))
	for range 2 {
		if err := q.Start(); err != nil {
			t.Fatal(err)
		}
		if err := cs[0].Send(ctx, []byte{7}, 1, 7); err != nil {
			t.Fatal(err)
		}
		if st, err := q.Wait(ctx); err != nil || st.Tag != 7 {
			t.Fatalf("Wait = %+v, %v; want the message", st, err)
		}
		if i, _, ok, _ := adi.TestAny(q); i != -1 || !ok {
			t.Errorf("TestAny after Wait reported the round = %d, %v; want -1, true", i, ok)
		}
	}
}

// TestPersistentRoundReportedOnce: a round is reported by exactly one
// call. A Wait whose ctx had ended once marked a round that completed as
// it returned reported, so the round's status was lost; and a Wait and a
// concurrent Test (Request's methods may run concurrently) both reported
// it, so WaitAny beside a Wait could return it twice.
func TestPersistentRoundReportedOnce(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	t.Run("wait after a timed-out wait", func(t *testing.T) {
		q := must(cs[1].RecvInit(make([]byte, 4), 0, 3))
		dead, cancel := context.WithCancel(context.Background())
		cancel()
		for round := range 200 {
			if err := q.Start(); err != nil {
				t.Fatal(err)
			}
			go cs[0].Send(ctx, []byte{1, 2, 3, 4}, 1, 3)
			st, err := q.Wait(dead)
			for err != nil {
				st, err = q.Wait(dead)
			}
			if st.Count != 4 || st.Tag != 3 {
				t.Fatalf("round %d: Wait = %+v after Waits that timed out; the round's status was lost", round, st)
			}
		}
	})
	t.Run("wait beside test", func(t *testing.T) {
		q := must(cs[1].RecvInit(make([]byte, 4), 0, 4))
		for round := range 200 {
			if err := q.Start(); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var a, b adi.Status
			wg.Go(func() { a, _ = q.Wait(ctx) })
			wg.Go(func() {
				for {
					if st, ok, _ := q.Test(); ok {
						b = st
						return
					}
				}
			})
			if err := cs[0].Send(ctx, []byte{1, 2, 3, 4}, 1, 4); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			if n := btoi(a.Count == 4) + btoi(b.Count == 4); n != 1 {
				t.Fatalf("round %d: reported by %d calls (Wait %+v, Test %+v), want 1", round, n, a, b)
			}
		}
	})
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestIntoRefusesPersistent: an Into call given a persistent or
// partitioned request refuses it, leaving it as it was: Start starts its
// operation. IrecvInto once took it, and its round already reported made
// the next Wait return at once, before the message came.
func TestIntoRefusesPersistent(t *testing.T) {
	cs := loopJob(t, 2)
	q := must(cs[1].RecvInit(make([]byte, 4), 0, 3))
	p := must(cs[0].PsendInit(make([]byte, 4), 2, 1, 3))
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"IrecvInto persistent", cs[1].IrecvInto(q, make([]byte, 4), 0, 9)},
		{"IsendInto persistent", cs[1].IsendInto(q, []byte{1}, 0, 9)},
		{"IssendInto partitioned", cs[0].IssendInto(p, []byte{1}, 1, 9)},
		{"IrecvInto ProcNull persistent", cs[1].IrecvInto(q, nil, adi.ProcNull, 9)},
	} {
		if !errors.Is(tc.err, adi.ErrRequestBusy) || !strings.Contains(tc.err.Error(), "Start starts it") {
			t.Errorf("%s: %v, want ErrRequestBusy saying Start starts it", tc.name, tc.err)
		}
	}
	ctx := ctxT(t)
	if err := q.Start(); err != nil {
		t.Fatal(err)
	}
	if err := cs[0].Send(ctx, []byte{1, 2, 3, 4}, 1, 3); err != nil {
		t.Fatal(err)
	}
	if st, err := q.Wait(ctx); err != nil || st.Tag != 3 || st.Count != 4 {
		t.Fatalf("the persistent receive after the refused calls: %+v, %v", st, err)
	}
}

// TestSendrecvRefusedTakesNothing: a Sendrecv refused for a tag touches
// no message waiting for it. The device once posted the receive before
// it checked the send's tag, so a refused call took the message: an eager
// one was delivered into recv under the error, a rendezvous one matched
// and given up, its data lost while its sender completed as if received.
func TestSendrecvRefusedTakesNothing(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	for _, tc := range []struct {
		name             string
		size             int // loopJob's eager limit is below 3000
		sendTag, recvTag int
	}{
		{"eager/send tag negative", 5, -5, 4},
		{"eager/send tag AnyTag", 5, adi.AnyTag, 4},
		{"rendezvous/send tag AnyTag", 3000, adi.AnyTag, 4},
		{"rendezvous/send tag above MaxTag", 3000, adi.MaxTag + 1, adi.AnyTag},
		{"eager/receive tag negative", 5, 4, -5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := pattern(0, 1, tc.size)
			s := must(cs[0].Isend(msg, 1, 4))
			if _, err := cs[1].Probe(ctx, 0, 4); err != nil {
				t.Fatal(err)
			}
			recv := make([]byte, tc.size)
			if _, err := cs[1].Sendrecv(ctx, []byte("x"), 0, tc.sendTag, recv, 0, tc.recvTag); !errors.Is(err, adi.ErrTag) {
				t.Fatalf("Sendrecv with tags %d and %d: %v, want ErrTag", tc.sendTag, tc.recvTag, err)
			}
			if tc.size > 0 && bytes.Equal(recv, msg) {
				t.Error("the refused Sendrecv wrote the waiting message into its buffer")
			}
			if _, ok, err := cs[1].Iprobe(0, 4); err != nil || !ok {
				t.Fatalf("the refused Sendrecv took the waiting message (probe: %v %v)", ok, err)
			}
			got := make([]byte, tc.size)
			if st, err := cs[1].Recv(ctx, got, 0, 4); err != nil || st.Count != tc.size || !bytes.Equal(got, msg) {
				t.Fatalf("receive of the message after the refused Sendrecv: %+v %v", st, err)
			}
			if _, err := s.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestWaitAllEndedCtxReportsAll: WaitAll and WaitAllInto of requests that
// have all completed, under a ctx that has ended, report every status and
// every request's own error with its index. They once stopped at the
// first request error whenever ctx had ended, as if it were ctx's: the
// error came back without its request's index, and the later statuses
// stayed zero.
func TestWaitAllEndedCtxReportsAll(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	for _, tc := range []struct {
		name string
		call func(ctx context.Context, reqs ...*adi.Request) ([]adi.Status, error)
	}{
		{"WaitAll", adi.WaitAll},
		{"WaitAllInto", func(ctx context.Context, reqs ...*adi.Request) ([]adi.Status, error) {
			sts := make([]adi.Status, len(reqs))
			return sts, adi.WaitAllInto(ctx, sts, reqs...)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			short := must(cs[1].Irecv(make([]byte, 2), 0, 1)) // truncated
			fits := must(cs[1].Irecv(make([]byte, 8), 0, 2))
			if err := cs[0].Send(ctx, []byte("toolong"), 1, 1); err != nil {
				t.Fatal(err)
			}
			if err := cs[0].Send(ctx, []byte("fine"), 1, 2); err != nil {
				t.Fatal(err)
			}
			for {
				if done, _ := adi.TestAll(nil, short, fits); done {
					break
				}
				time.Sleep(time.Millisecond)
			}
			ended, cancel := context.WithCancel(ctx)
			cancel()
			sts, err := tc.call(ended, short, fits)
			if !errors.Is(err, adi.ErrTruncated) || errors.Is(err, context.Canceled) || sts[1] != (adi.Status{Source: 0, Tag: 2, Count: 4}) {
				t.Fatalf("statuses %+v, error %v; want the second request's status and the first's ErrTruncated", sts, err)
			}
			if !strings.HasPrefix(err.Error(), "request 0: ") {
				t.Errorf("the error does not name its request: %v", err)
			}
		})
	}
}

// TestAllNilEntryStatus: TestAll writes the zero status for a nil entry,
// as WaitAllInto does, rather than leave what the caller's slice held
// there (a status from an earlier round of a reused slice).
func TestAllNilEntryStatus(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	q := must(cs[1].Irecv(make([]byte, 8), 0, 3))
	if err := cs[0].Send(ctx, []byte("x"), 1, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	stale := adi.Status{Source: 1, Tag: 9, Count: 5}
	for _, tc := range []struct {
		name string
		call func(sts []adi.Status) error
	}{
		{"TestAll", func(sts []adi.Status) error { _, err := adi.TestAll(sts, nil, q); return err }},
		{"WaitAllInto", func(sts []adi.Status) error { return adi.WaitAllInto(ctx, sts, nil, q) }},
	} {
		sts := []adi.Status{stale, stale}
		if err := tc.call(sts); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if sts[0] != (adi.Status{}) {
			t.Errorf("%s: status of the nil entry %+v, want the zero status", tc.name, sts[0])
		}
	}
}

// TestTagErrorNamesAnyTag: a tag refused where AnyTag is allowed (a
// receive's) says AnyTag would do, and one refused where it is not (a
// send's) does not.
func TestTagErrorNamesAnyTag(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	for _, tc := range []struct {
		name string
		call func() error
		any  bool
	}{
		{"Recv from ProcNull", func() error { _, err := cs[0].Recv(ctx, nil, adi.ProcNull, -5); return err }, true},
		{"Iprobe of ProcNull", func() error { _, _, err := cs[0].Iprobe(adi.ProcNull, -5); return err }, true},
		{"Sendrecv receive tag", func() error { _, err := cs[0].Sendrecv(ctx, nil, 1, 0, nil, 1, -5); return err }, true},
		{"Send to ProcNull", func() error { return cs[0].Send(ctx, nil, adi.ProcNull, -5) }, false},
		{"Sendrecv send tag", func() error { _, err := cs[0].Sendrecv(ctx, nil, 1, -5, nil, 1, 0); return err }, false},
	} {
		err := tc.call()
		if !errors.Is(err, adi.ErrTag) {
			t.Fatalf("%s with tag -5: %v, want ErrTag", tc.name, err)
		}
		if got := strings.Contains(err.Error(), "AnyTag"); got != tc.any {
			t.Errorf("%s: %q mentions AnyTag: %v, want %v", tc.name, err, got, tc.any)
		}
	}
}

// rankMention finds the ranks an error message names: "rank N", unless
// it is "world rank N", which names a world rank as such.
var rankMention = regexp.MustCompile(`(world )?rank (-?[0-9]+)`)

// namesOnlyRank reports whether msg names, apart from world ranks said to
// be world ranks, rank r and no other.
func namesOnlyRank(msg string, r int) bool {
	found := false
	for _, m := range rankMention.FindAllStringSubmatch(msg, -1) {
		switch {
		case m[1] != "":
		case m[2] != strconv.Itoa(r):
			return false
		default:
			found = true
		}
	}
	return found
}

// TestTruncationErrorNamesCommRank: on a communicator whose ranks are not
// the world's, a truncated receive's error names the sender by its rank
// there, the one Status.Source gives, on every way a receive reports it.
// The device names ranks in the world, and its truncation error once came
// out naming the sender by its world rank, wrapped by adi with the rank
// the receive was posted for: "rank -1" for AnySource.
func TestTruncationErrorNamesCommRank(t *testing.T) {
	ws, _ := loopWorlds(t, 3)
	ctx := ctxT(t)
	comms := rotatedComms(t, ws) // world rank 1 is rank 2 there, world rank 0 rank 1
	recver, sender := comms[0], comms[1]
	const from, tag = 2, 1
	small := make([]byte, 10)
	for _, tc := range []struct {
		name string
		recv func(size int) (adi.Status, error)
	}{
		{"Recv", func(int) (adi.Status, error) { return recver.Recv(ctx, small, from, tag) }},
		{"Recv from AnySource", func(int) (adi.Status, error) { return recver.Recv(ctx, small, adi.AnySource, tag) }},
		{"Irecv and Wait", func(int) (adi.Status, error) {
			return must(recver.Irecv(small, adi.AnySource, tag)).Wait(ctx)
		}},
		{"Irecv and WaitAll", func(int) (adi.Status, error) {
			q := must(recver.Irecv(small, adi.AnySource, tag))
			for {
				if done, _ := adi.TestAll(nil, q); done {
					break
				}
				time.Sleep(time.Millisecond)
			}
			sts, err := adi.WaitAll(ctx, q) // completed: read without a Wait
			return sts[0], err
		}},
		{"Sendrecv", func(int) (adi.Status, error) {
			st, err := recver.Sendrecv(ctx, nil, from, 9, small, adi.AnySource, tag)
			if _, rerr := sender.Recv(ctx, nil, 1, 9); rerr != nil {
				t.Error(rerr)
			}
			return st, err
		}},
		{"Isendrecv", func(int) (adi.Status, error) {
			st, err := must(recver.Isendrecv(nil, from, 9, small, adi.AnySource, tag)).Wait(ctx)
			if _, rerr := sender.Recv(ctx, nil, 1, 9); rerr != nil {
				t.Error(rerr)
			}
			return st, err
		}},
		{"Mprobe and Recv", func(int) (adi.Status, error) {
			m, _, err := recver.Mprobe(ctx, adi.AnySource, tag)
			if err != nil {
				return adi.Status{}, err
			}
			return m.Recv(ctx, small)
		}},
	} {
		for _, size := range []int{100, 3000} { // eager, rendezvous
			t.Run(fmt.Sprintf("%s/bytes=%d", tc.name, size), func(t *testing.T) {
				sent := make(chan error, 1)
				go func() { sent <- sender.Send(ctx, make([]byte, size), 1, tag) }()
				st, err := tc.recv(size)
				if serr := <-sent; serr != nil {
					t.Fatal(serr)
				}
				if !errors.Is(err, adi.ErrTruncated) || st.Source != from {
					t.Fatalf("status %+v, error %v; want ErrTruncated from rank %d", st, err, from)
				}
				if !namesOnlyRank(err.Error(), from) {
					t.Errorf("the status says rank %d sent it; the error names another rank: %v", from, err)
				}
			})
		}
	}
}

// TestPeerDownErrorNamesCommRank: on a communicator whose ranks are not
// the world's, the error of a receive or probe whose source was lost
// names that source by its rank there, and by its world rank, which the
// device's own words about the loss use.
func TestPeerDownErrorNamesCommRank(t *testing.T) {
	ws, f := loopWorlds(t, 3)
	ctx := ctxT(t)
	comms := rotatedComms(t, ws) // world rank 1 is rank 2 there
	c := comms[0]
	q := must(c.Irecv(make([]byte, 8), 2, 7))
	f.Sever(1)
	const want = "rank 2 (world rank 1)"
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"Irecv and Wait", func() error { _, err := q.Wait(ctx); return err }},
		{"Recv", func() error { _, err := c.Recv(ctx, nil, 2, 7); return err }},
		{"Probe", func() error { _, err := c.Probe(ctx, 2, 7); return err }},
		{"Mprobe", func() error { _, _, err := c.Mprobe(ctx, 2, 7); return err }},
	} {
		err := tc.call()
		if !errors.Is(err, adi.ErrPeerDown) {
			t.Fatalf("%s: %v, want ErrPeerDown", tc.name, err)
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want it to name %s", tc.name, err, want)
		}
	}
}

// TestRecvErrorNamesAnySource: a receive from AnySource that fails before
// it matched says so; its error once named "rank -1".
func TestRecvErrorNamesAnySource(t *testing.T) {
	cs := loopJob(t, 2)
	short, cancel := context.WithTimeout(ctxT(t), 10*time.Millisecond)
	defer cancel()
	_, err := cs[0].Recv(short, nil, adi.AnySource, 3)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "any source") || strings.Contains(err.Error(), "-1") {
		t.Fatalf("receive from AnySource whose ctx ended: %v; want the deadline's error naming any source", err)
	}
}

// TestWaitAllEndedCtxKeepsCompletedError: a persistent receive that
// completed with ErrTruncated, waited for with an ended ctx beside a
// request still pending. WaitAllInto's Wait claims the persistent
// request's round, so a later Wait reports nothing: the truncation must
// come back from WaitAllInto, with the ctx's end of the pending one.
func TestWaitAllEndedCtxKeepsCompletedError(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	p, err := cs[1].RecvInit(make([]byte, 2), 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	pending := must(cs[1].Irecv(make([]byte, 8), 0, 5)) // never sent
	defer pending.Cancel()
	marker := must(cs[1].Irecv(make([]byte, 8), 0, 2))
	if err := cs[0].Send(ctx, []byte("toolong"), 1, 1); err != nil {
		t.Fatal(err)
	}
	if err := cs[0].Send(ctx, []byte("m"), 1, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := marker.Wait(ctx); err != nil { // delivered in order: p has completed
		t.Fatal(err)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	err = adi.WaitAllInto(ended, make([]adi.Status, 2), p, pending)
	if !errors.Is(err, adi.ErrTruncated) || !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitAllInto = %v, want the persistent receive's ErrTruncated and the pending one's ctx end", err)
	}
}

// TestEarlyErrorNamesPostedRank: a call the device refuses at once
// reports no status; its error must name the rank the call was for, not
// the zero status's rank 0.
func TestEarlyErrorNamesPostedRank(t *testing.T) {
	t.Run("closed", func(t *testing.T) {
		ws, _ := loopWorlds(t, 3)
		ctx := ctxT(t)
		c := ws[1].Comm()
		var wg sync.WaitGroup
		for _, w := range ws {
			wg.Go(func() { w.Finalize(ctx) })
		}
		wg.Wait()
		_, err := c.Recv(ctx, make([]byte, 8), 2, 3)
		_, err2 := c.Sendrecv(ctx, []byte("x"), 2, 3, make([]byte, 8), 2, 3)
		for _, e := range []error{err, err2} {
			if e == nil || strings.Contains(e.Error(), "rank 0") || !strings.Contains(e.Error(), "rank 2") {
				t.Errorf("an operation with rank 2 on a finalized world: %v", e)
			}
		}
	})
	t.Run("probed message received twice", func(t *testing.T) {
		cs := loopJob(t, 3)
		ctx := ctxT(t)
		if err := cs[2].Send(ctx, []byte("hi"), 1, 4); err != nil {
			t.Fatal(err)
		}
		m, _, err := cs[1].Mprobe(ctx, adi.AnySource, 4)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Recv(ctx, make([]byte, 8)); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Recv(ctx, make([]byte, 8)); err == nil || strings.Contains(err.Error(), "rank 0") {
			t.Fatalf("second Recv of one probed message: %v", err)
		}
	})
}
