package adi_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hpc-multidevice/multidevice/adi"
)

// TestRequestReuse checks the rules of IsendInto and IrecvInto: a pending
// request is refused and keeps its operation, a completed one is reused,
// a request that holds no operation reports so instead of panicking, and
// a failed start leaves the request reusable. Over shm every eager frame
// is done when Send returns; the loopback subdevice keeps frames in
// flight and completes them later, so a reused request's own frame (kept
// from its first reuse on) is still out when Isend returns.
func TestRequestReuse(t *testing.T) {
	for _, tc := range []struct {
		name string
		job  func(testing.TB, int) []*adi.Comm
	}{
		{"shm", shmJob},
		{"loopback", loopJob},
	} {
		t.Run(tc.name, func(t *testing.T) { testRequestReuse(t, tc.job(t, 2)) })
	}
}

func testRequestReuse(t *testing.T, cs []*adi.Comm) {
	ctx := ctxT(t)
	a, b := cs[0], cs[1]

	var zero adi.Request
	if _, err := zero.Wait(ctx); err == nil {
		t.Error("Wait on a zero Request: no error")
	}
	if _, done, err := zero.Test(); !done || err == nil {
		t.Errorf("Test on a zero Request = done %v, err %v; want done with an error", done, err)
	}
	zero.Cancel() // must not panic

	// Each case reuses the same two requests: eager sends that complete at
	// once, a synchronous one and a rendezvous one that do not.
	big := make([]byte, 200<<10) // above shm's eager limit
	for i := range big {
		big[i] = byte(i * 7)
	}
	var rq, sq adi.Request
	buf := make([]byte, len(big))
	if err := b.IrecvInto(&rq, buf, 0, 7); err != nil {
		t.Fatal(err)
	}
	if err := b.IrecvInto(&rq, buf, 0, 8); !errors.Is(err, adi.ErrRequestBusy) {
		t.Fatalf("IrecvInto on a pending request: %v, want ErrRequestBusy", err)
	}
	cases := []struct {
		name string
		msg  []byte
		tag  int
		sync bool
	}{
		{"first", []byte("first"), 7, false}, // the tag-7 receive the refused start left in place
		{"again", []byte("again"), 9, false},
		{"synchronous", []byte("sync"), 9, true},
		{"rendezvous", big, 9, false},
		{"eager after rendezvous", []byte("last"), 9, false},
	}
	for i, tc := range cases {
		start := a.IsendInto
		if tc.sync {
			start = a.IssendInto
		}
		if err := start(&sq, tc.msg, 1, tc.tag); err != nil {
			t.Fatalf("%s: send: %v", tc.name, err)
		}
		// Before its receive is posted, a synchronous or rendezvous send
		// cannot have completed, reused request or not.
		if _, done, _ := sq.Test(); done && (tc.sync || len(tc.msg) > 64<<10) {
			t.Fatalf("%s: send done before the receiver matched it", tc.name)
		}
		if i > 0 {
			if err := b.IrecvInto(&rq, buf, 0, tc.tag); err != nil {
				t.Fatalf("%s: reusing a completed receive: %v", tc.name, err)
			}
		}
		st, err := rq.Wait(ctx)
		if err != nil {
			t.Fatalf("%s: receive: %v", tc.name, err)
		}
		if got := buf[:st.Count]; string(got) != string(tc.msg) || st.Tag != tc.tag || st.Source != 0 {
			t.Fatalf("%s: %d bytes tag %d from %d, want %d bytes tag %d from 0 (or other contents)", tc.name, len(got), st.Tag, st.Source, len(tc.msg), tc.tag)
		}
		if _, err := sq.Wait(ctx); err != nil {
			t.Fatalf("%s: send: %v", tc.name, err)
		}
		if _, done, _ := sq.Test(); !done {
			t.Fatalf("%s: send not done after Wait", tc.name)
		}
	}

	// A failed start leaves a request that holds nothing, and can be
	// reused: not its last operation's result, which a refused rank once
	// left it reporting as if a new message had come.
	if err := a.IsendInto(&sq, buf, 5, 0); !errors.Is(err, adi.ErrRank) {
		t.Fatalf("IsendInto to rank 5 of 2: %v, want ErrRank", err)
	}
	if st, done, err := sq.Test(); err == nil {
		t.Errorf("Test after IsendInto to no rank: %+v, %v, no error", st, done)
	}
	if err := b.IrecvInto(&rq, buf, 5, 0); !errors.Is(err, adi.ErrRank) {
		t.Fatalf("IrecvInto from rank 5 of 2: %v, want ErrRank", err)
	}
	if st, err := rq.Wait(ctx); err == nil {
		t.Errorf("Wait after IrecvInto from no rank: %+v, no error", st)
	}
	// The same for a ProcNull receive refused for its tag.
	if err := b.Send(ctx, []byte("old"), 0, 5); err != nil {
		t.Fatal(err)
	}
	if err := a.IrecvInto(&rq, buf, 1, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := rq.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.IrecvInto(&rq, buf, adi.ProcNull, -7); !errors.Is(err, adi.ErrTag) {
		t.Fatalf("IrecvInto from ProcNull with tag -7: %v, want ErrTag", err)
	}
	if st, _, err := rq.Test(); err == nil {
		t.Errorf("Test after IrecvInto from ProcNull with a bad tag: %+v, no error", st)
	}
	if err := a.IsendInto(&sq, buf, 1, -3); !errors.Is(err, adi.ErrTag) {
		t.Fatalf("IsendInto with tag -3: %v, want ErrTag", err)
	}
	if _, err := sq.Wait(ctx); err == nil {
		t.Error("Wait after a failed start: no error")
	}
	if err := b.IrecvInto(&rq, buf, 0, 4); err != nil {
		t.Fatal(err)
	}
	if err := a.IssendInto(&sq, []byte("sync"), 1, 4); err != nil {
		t.Fatalf("reusing after a failed start: %v", err)
	}
	if _, err := rq.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sq.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if string(buf[:4]) != "sync" {
		t.Fatalf("got %q, want %q", buf[:4], "sync")
	}
}

// TestNilRequest: a nil *Request is what a failed Isend or Irecv
// returns. A program that goes on with it gets an error from every
// method, and from the Into calls given it, instead of a panic; Cancel
// does nothing.
func TestNilRequest(t *testing.T) {
	cs := shmJob(t, 2)
	ctx := ctxT(t)
	var q *adi.Request
	q.Cancel()
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"Wait", func() error { _, err := q.Wait(ctx); return err }},
		{"Test", func() error {
			_, done, err := q.Test()
			if !done {
				return errors.New("Test: not done")
			}
			return err
		}},
		{"Start", q.Start},
		{"Pready", func() error { return q.Pready(0) }},
		{"PreadyRange", func() error { return q.PreadyRange(0, 1) }},
		{"PreadyList", func() error { return q.PreadyList([]int{0}) }},
		{"Parrived", func() error { _, err := q.Parrived(0); return err }},
		{"IsendInto", func() error { return cs[0].IsendInto(q, []byte("x"), 1, 0) }},
		{"IssendInto", func() error { return cs[0].IssendInto(q, []byte("x"), 1, 0) }},
		{"IsendInto ProcNull", func() error { return cs[0].IsendInto(q, nil, adi.ProcNull, 0) }},
		{"IrecvInto", func() error { return cs[1].IrecvInto(q, make([]byte, 1), 0, 0) }},
		{"IrecvInto ProcNull", func() error { return cs[1].IrecvInto(q, nil, adi.ProcNull, 0) }},
		{"StartAll", func() error { return adi.StartAll(q) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); err == nil || !strings.Contains(err.Error(), "nil request") {
				t.Fatalf("%s on a nil request: %v, want an error saying it is nil", tc.name, err)
			}
		})
	}
	// Nothing was sent: the next message from rank 0 is the one below.
	if err := cs[0].Send(ctx, []byte("y"), 1, 0); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if _, err := cs[1].Recv(ctx, buf, 0, 0); err != nil || buf[0] != 'y' {
		t.Fatalf("Recv = %q, %v; want the message sent after the nil-request calls", buf, err)
	}
}

// TestWaitFinishedWithEndedCtx: Wait on a request whose operation is
// over reports it, whatever its ctx says, as a finished Isend's does.
// A nonblocking collective's, and an inactive persistent one's, picked
// at random between the two (select with both ready): draining finished
// requests with a cancelled ctx at shutdown failed about half the time.
func TestWaitFinishedWithEndedCtx(t *testing.T) {
	c := loopJob(t, 1)[0]
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	isend, err := c.Isend(nil, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	irecv, err := c.Irecv(nil, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	ib, err := c.Ibarrier()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := adi.WaitAll(ctxT(t), isend, irecv, ib); err != nil {
		t.Fatal(err)
	}
	inactive, err := c.BarrierInit()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		q    *adi.Request
	}{{"Isend", isend}, {"Ibarrier", ib}, {"inactive BarrierInit", inactive}} {
		for i := range 100 {
			if _, err := tc.q.Wait(ended); err != nil {
				t.Fatalf("%s, finished: Wait %d with an ended ctx: %v", tc.name, i, err)
			}
		}
		if _, err := adi.WaitAll(ended, tc.q, tc.q); err != nil {
			t.Fatalf("%s, finished: WaitAll with an ended ctx: %v", tc.name, err)
		}
	}
}
