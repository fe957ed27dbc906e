package adi_test

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
)

// TestIsendrecvRing: every rank sends to the next and receives from the
// one before, eager and rendezvous sizes, with Isendrecv and with
// IsendrecvReplace; each request completes with the receive's status.
func TestIsendrecvRing(t *testing.T) {
	for _, n := range []int{1, 2, 4} {
		for _, size := range []int{0, 100, 3000} { // loopJob's eager limit is 512
			t.Run(fmt.Sprintf("ranks=%d/bytes=%d", n, size), func(t *testing.T) {
				cs := loopJob(t, n)
				ctx := ctxT(t)
				each(t, cs, func(c *adi.Comm) error {
					me := c.Rank()
					next, prev := (me+1)%n, (me+n-1)%n
					got := make([]byte, size)
					q, err := c.Isendrecv(pattern(me, next, size), next, 7, got, prev, 7)
					if err != nil {
						return err
					}
					// The replace form in the other direction, at once.
					buf := pattern(me, prev, size)
					qr, err := c.IsendrecvReplace(buf, prev, 8, next, 8)
					if err != nil {
						return err
					}
					sts, err := adi.WaitAll(ctx, q, qr)
					if err != nil {
						return err
					}
					if want := (adi.Status{Source: prev, Tag: 7, Count: size}); sts[0] != want {
						return fmt.Errorf("isendrecv status %+v, want %+v", sts[0], want)
					}
					if want := (adi.Status{Source: next, Tag: 8, Count: size}); sts[1] != want {
						return fmt.Errorf("isendrecv_replace status %+v, want %+v", sts[1], want)
					}
					if !bytes.Equal(got, pattern(prev, me, size)) {
						return fmt.Errorf("isendrecv received the wrong bytes")
					}
					if !bytes.Equal(buf, pattern(next, me, size)) {
						return fmt.Errorf("isendrecv_replace received the wrong bytes")
					}
					return nil
				})
			})
		}
	}
}

// TestIsendrecvReplaceLarge: two ranks exchange many rendezvous messages
// in place: what each receives is what the other had in its buffer, not
// bytes the other's receive already wrote there.
func TestIsendrecvReplaceLarge(t *testing.T) {
	const size = 4000
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		me, peer := c.Rank(), 1-c.Rank()
		for it := range 20 {
			buf := pattern(me+2*it, peer, size)
			q, err := c.IsendrecvReplace(buf, peer, it, peer, it)
			if err != nil {
				return err
			}
			if _, err := q.Wait(ctx); err != nil {
				return err
			}
			if !bytes.Equal(buf, pattern(peer+2*it, me, size)) {
				return fmt.Errorf("round %d: received bytes that are not the peer's", it)
			}
		}
		return nil
	})
}

// TestIsendrecvProcNull: ProcNull on either side or both moves nothing
// that way; a ProcNull source gives the null status.
func TestIsendrecvProcNull(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	null := adi.Status{Source: adi.ProcNull, Tag: adi.AnyTag}
	each(t, cs, func(c *adi.Comm) error {
		me, peer := c.Rank(), 1-c.Rank()
		// Rank 0 sends and receives nothing; rank 1 receives from rank 0
		// and sends nowhere.
		dest, source := peer, adi.ProcNull
		if me == 1 {
			dest, source = adi.ProcNull, peer
		}
		got := make([]byte, 4)
		q, err := c.Isendrecv([]byte("null"), dest, 3, got, source, 3)
		if err != nil {
			return err
		}
		st, err := q.Wait(ctx)
		if err != nil {
			return err
		}
		switch want := (adi.Status{Source: 0, Tag: 3, Count: 4}); {
		case me == 0 && st != null:
			return fmt.Errorf("ProcNull source: status %+v, want %+v", st, null)
		case me == 1 && (st != want || string(got) != "null"):
			return fmt.Errorf("ProcNull dest: status %+v and %q, want %+v and \"null\"", st, got, want)
		}
		buf := []byte("keep")
		q, err = c.IsendrecvReplace(buf, adi.ProcNull, 1, adi.ProcNull, 1)
		if err != nil {
			return err
		}
		if st, err := q.Wait(ctx); err != nil || st != null || string(buf) != "keep" {
			return fmt.Errorf("both ProcNull: %+v, %v, %q", st, err, buf)
		}
		return nil
	})
}

// TestIsendrecvErrors: a message longer than the receive buffer is
// ErrTruncated at Wait; bad ranks and tags fail at the call.
func TestIsendrecvErrors(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		peer := 1 - c.Rank()
		short := make([]byte, 3)
		q, err := c.Isendrecv([]byte("longer"), peer, 1, short, peer, 1)
		if err != nil {
			return err
		}
		if st, err := q.Wait(ctx); !errors.Is(err, adi.ErrTruncated) || st.Count != len(short) {
			return fmt.Errorf("6 bytes into 3: %+v, %v, want ErrTruncated", st, err)
		}
		for _, tc := range []struct {
			name string
			err  error
			is   error
		}{
			{"dest 2", callErr(c.Isendrecv(nil, 2, 1, nil, peer, 1)), adi.ErrRank},
			{"source -5", callErr(c.Isendrecv(nil, peer, 1, nil, -5, 1)), adi.ErrRank},
			{"send tag AnyTag", callErr(c.Isendrecv(nil, peer, adi.AnyTag, nil, peer, 1)), adi.ErrTag},
			{"receive tag -7", callErr(c.IsendrecvReplace(nil, adi.ProcNull, 1, peer, -7)), adi.ErrTag},
		} {
			if !errors.Is(tc.err, tc.is) || strings.Count(tc.err.Error(), "adi:") != 1 {
				return fmt.Errorf("%s: %v, want %v, named once as adi's", tc.name, tc.err, tc.is)
			}
		}
		return nil
	})
}

// callErr is a call's error, for tables of failing calls.
func callErr(_ *adi.Request, err error) error { return err }

// TestIsendrecvCancel: Cancel of an Isendrecv whose receive matches
// nothing completes it cancelled once its send is done, and WaitAny,
// WaitSome and TestAll take it like any request.
func TestIsendrecvCancel(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		peer := 1 - c.Rank()
		// Tag 9 is never sent: only Cancel ends the receive.
		got := make([]byte, 8)
		q, err := c.Isendrecv([]byte("hi"), peer, 2, got, peer, 9)
		if err != nil {
			return err
		}
		if ok, err := adi.TestAll(nil, q); ok || err != nil {
			return fmt.Errorf("TestAll before the cancel: %v, %v", ok, err)
		}
		// The peer's "hi" for tag 2, received beside it.
		in := make([]byte, 2)
		r, err := c.Irecv(in, peer, 2)
		if err != nil {
			return err
		}
		if i, _, err := adi.WaitAny(ctx, q, r); i != 1 || err != nil {
			return fmt.Errorf("WaitAny: request %d, %v; want the receive, 1", i, err)
		}
		q.Cancel()
		idx, sts, err := adi.WaitSome(ctx, q, nil)
		if len(idx) != 1 || idx[0] != 0 || !sts[0].Cancelled || !errors.Is(err, adi.ErrCanceled) {
			return fmt.Errorf("WaitSome after Cancel: %v %+v %v, want request 0 cancelled", idx, sts, err)
		}
		if ok, err := adi.TestAll(nil, q); !ok || !errors.Is(err, adi.ErrCanceled) {
			return fmt.Errorf("TestAll after the cancel: %v, %v", ok, err)
		}
		return nil
	})
}

// TestIsendrecvSendFailure: a send that fails (its peer lost) cancels
// the receive, which nothing else would end, and the request completes
// with the send's error.
func TestIsendrecvSendFailure(t *testing.T) {
	ws, f := loopWorlds(t, 3)
	ctx := ctxT(t)
	c := ws[0].Comm()
	// Rendezvous to rank 1, which never receives it; rank 2 never sends.
	q, err := c.Isendrecv(make([]byte, 3000), 1, 1, make([]byte, 8), 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	f.Kill(1)
	st, err := q.Wait(ctx)
	if !errors.Is(err, adi.ErrPeerDown) || !st.Cancelled {
		t.Fatalf("after the destination was lost: %+v, %v; want ErrPeerDown and the receive cancelled", st, err)
	}
}

// TestIsendrecvSendStartFails: a send that fails at the call (its
// destination already lost) after the receive was posted still returns
// the request, which reports the send's error with the receive's
// status: the receive cancelled when nothing had come, or, when a
// message was waiting and the receive matched it, that message, whole
// in recv by the time Wait returns (a rendezvous one included); WaitAll
// reports the same. Before, the call returned only the error and the
// matched message was lost, a rendezvous one written into recv after
// the call.
func TestIsendrecvSendStartFails(t *testing.T) {
	for _, tc := range []struct {
		name    string
		size    int  // of rank 2's message; loopJob's eager limit is 512
		waiting bool // rank 2's message is at rank 0 before the call
		waitAll bool // WaitAll waits, not Wait
	}{
		{"nothing waiting", 5, false, false},
		{"eager waiting", 5, true, false},
		{"rendezvous waiting", 3000, true, false},
		{"nothing waiting, WaitAll", 5, false, true},
		{"eager waiting, WaitAll", 5, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, f := loopWorlds(t, 3)
			ctx := ctxT(t)
			c0, c2 := ws[0].Comm(), ws[2].Comm()
			msg := bytes.Repeat([]byte{0xAB}, tc.size)
			if tc.waiting {
				sq, err := c2.Isend(msg, 0, 1)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { sq.Wait(ctx) })
				if _, err := c0.Probe(ctx, 2, 1); err != nil { // the message, or its announcement, is at rank 0
					t.Fatal(err)
				}
			}
			f.Kill(1)
			waitPeerDown(t, c0, 1)
			recv := make([]byte, tc.size)
			q, err := c0.Isendrecv([]byte("x"), 1, 1, recv, 2, 1)
			if err != nil {
				t.Fatalf("Isendrecv: %v; want the request, which reports the send's failure", err)
			}
			var st adi.Status
			if tc.waitAll {
				var sts []adi.Status
				sts, err = adi.WaitAll(ctx, q)
				st = sts[0]
			} else {
				st, err = q.Wait(ctx)
			}
			if !errors.Is(err, adi.ErrPeerDown) || errors.Is(err, adi.ErrCanceled) == tc.waiting {
				t.Fatalf("Wait: %+v, %v; want ErrPeerDown, and ErrCanceled if nothing was waiting", st, err)
			}
			want := adi.Status{Source: 2, Tag: 1, Count: tc.size}
			if !tc.waiting {
				want = adi.Status{Source: adi.AnySource, Tag: adi.AnyTag, Cancelled: true}
			}
			if st != want {
				t.Fatalf("status %+v, want %+v", st, want)
			}
			if tc.waiting && !bytes.Equal(recv, msg) {
				t.Fatal("Wait returned before the matched message was all in recv")
			}
		})
	}
}

// waitPeerDown waits until c sees rank r lost: until then a send to r
// may still start.
func waitPeerDown(t *testing.T, c *adi.Comm, r int) {
	t.Helper()
	for range 10000 {
		if _, _, err := c.Iprobe(r, 12345); err != nil {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("rank %d never seen lost", r)
}

// TestIsendrecvCancelReceiveOnly: Cancel cancels the receive half only.
// The send half still completes (its message is delivered) and Wait
// waits for it; the request counts as cancelled (Status.Cancelled,
// ErrCanceled) exactly when its receive was cancelled.
func TestIsendrecvCancelReceiveOnly(t *testing.T) {
	for _, tc := range []struct {
		name       string
		size       int  // of the send; loopJob's eager limit is 512
		matched    bool // the peer's message for the receive came before Cancel
		wantCancel bool
	}{
		{"eager send, receive pending", 2, false, true},
		{"rendezvous send, receive pending", 3000, false, true},
		{"eager send, receive matched", 2, true, false},
		{"rendezvous send, receive matched", 3000, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := loopJob(t, 2)
			ctx := ctxT(t)
			got := make([]byte, 8)
			if tc.matched {
				if err := cs[1].Send(ctx, []byte("reply"), 0, 9); err != nil {
					t.Fatal(err)
				}
				if _, err := cs[0].Probe(ctx, 1, 9); err != nil {
					t.Fatal(err)
				}
			}
			out := pattern(0, 1, tc.size)
			q, err := cs[0].Isendrecv(out, 1, 2, got, 1, 9)
			if err != nil {
				t.Fatal(err)
			}
			q.Cancel()
			if tc.size > 512 {
				// The rendezvous send cannot complete before rank 1
				// receives it, so neither can the request.
				if st, done, err := q.Test(); done {
					t.Fatalf("Test after Cancel, before the send completed: done with %+v, %v", st, err)
				}
			}
			in := make([]byte, tc.size)
			if _, err := cs[1].Recv(ctx, in, 0, 2); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(in, out) {
				t.Fatal("the cancelled request's send delivered the wrong bytes")
			}
			st, err := q.Wait(ctx)
			if st.Cancelled != tc.wantCancel || errors.Is(err, adi.ErrCanceled) != tc.wantCancel {
				t.Fatalf("Wait: %+v, %v; want cancelled %v", st, err, tc.wantCancel)
			}
			if !tc.wantCancel && (err != nil || string(got[:st.Count]) != "reply") {
				t.Fatalf("matched receive: %+v, %v, %q", st, err, got[:st.Count])
			}
		})
	}
}

// TestIsendrecvNoWorkers: Isendrecvs in flight take no goroutine each;
// one per call stayed until Finalize before.
func TestIsendrecvNoWorkers(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	const n = 200
	before := runtime.NumGoroutine()
	qs := make([]*adi.Request, n)
	for i := range qs {
		q, err := cs[0].Isendrecv(nil, 1, 3, make([]byte, 1), 1, 99) // tag 99 never comes
		if err != nil {
			t.Fatal(err)
		}
		qs[i] = q
	}
	inFlight := runtime.NumGoroutine()
	for _, q := range qs {
		q.Cancel()
	}
	if _, err := adi.WaitAll(ctx, qs...); !errors.Is(err, adi.ErrCanceled) {
		t.Fatalf("WaitAll after Cancel: %v, want ErrCanceled", err)
	}
	for range n {
		if _, err := cs[1].Recv(ctx, nil, 0, 3); err != nil {
			t.Fatal(err)
		}
	}
	if grew := inFlight - before; grew >= n/2 {
		t.Fatalf("%d Isendrecvs in flight took %d goroutines more", n, grew)
	}
}

// TestIsendrecvRequestReuse: a request of Isendrecv's is refused by
// IrecvInto while either half is in flight, and once it completed
// takes the new receive, whose status it then reports.
func TestIsendrecvRequestReuse(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	q, err := cs[0].Isendrecv(make([]byte, 3000), 1, 1, make([]byte, 1), 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if err := cs[0].IrecvInto(q, buf, 1, 3); !errors.Is(err, adi.ErrRequestBusy) {
		t.Fatalf("IrecvInto a pending Isendrecv's request: %v, want ErrRequestBusy", err)
	}
	// The receive half completes first; the rendezvous send is still
	// waiting for rank 1's receive.
	if err := cs[1].Send(ctx, []byte{7}, 0, 2); err != nil {
		t.Fatal(err)
	}
	if err := cs[0].IrecvInto(q, buf, 1, 3); !errors.Is(err, adi.ErrRequestBusy) {
		t.Fatalf("IrecvInto with the send half in flight: %v, want ErrRequestBusy", err)
	}
	if _, err := cs[1].Recv(ctx, make([]byte, 3000), 0, 1); err != nil {
		t.Fatal(err)
	}
	if st, err := q.Wait(ctx); err != nil || st != (adi.Status{Source: 1, Tag: 2, Count: 1}) {
		t.Fatalf("Isendrecv: %+v, %v", st, err)
	}
	if err := cs[0].IrecvInto(q, buf, 1, 3); err != nil {
		t.Fatalf("IrecvInto a completed Isendrecv's request: %v", err)
	}
	if err := cs[1].Send(ctx, []byte("next"), 0, 3); err != nil {
		t.Fatal(err)
	}
	if st, err := q.Wait(ctx); err != nil || st != (adi.Status{Source: 1, Tag: 3, Count: 4}) || string(buf) != "next" {
		t.Fatalf("the reused request: %+v, %v, %q", st, err, buf)
	}
	// And a request of Isendrecv's reused for a receive from ProcNull.
	q, err = cs[0].Isendrecv(nil, 1, 4, nil, 1, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs[1].Send(ctx, nil, 0, 4); err != nil {
		t.Fatal(err)
	}
	if _, err := cs[1].Recv(ctx, nil, 0, 4); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cs[0].IrecvInto(q, buf, adi.ProcNull, 5); err != nil {
		t.Fatal(err)
	}
	if st, err := q.Wait(ctx); err != nil || st != (adi.Status{Source: adi.ProcNull, Tag: adi.AnyTag}) {
		t.Fatalf("reused for a receive from ProcNull: %+v, %v", st, err)
	}
}

// TestIntercommIsendrecv: Isendrecv and IsendrecvReplace on an
// intercommunicator exchange with remote ranks and name them in their
// statuses; Idup's intercommunicator carries messages once its request
// completed.
func TestIntercommIsendrecv(t *testing.T) {
	xs := intercomms(t, splits[4]) // 3|3: rank i of a group pairs with remote rank i
	ctx := ctxT(t)
	eachIC(t, xs, func(x *icRank) error {
		d, dq, err := x.ic.Idup()
		if err != nil {
			return err
		}
		if _, err := dq.Wait(ctx); err != nil {
			return err
		}
		peer := x.ic.Rank()
		got := make([]byte, 1)
		q, err := d.Isendrecv([]byte{byte(x.me)}, peer, 4, got, adi.AnySource, 4)
		if err != nil {
			return err
		}
		buf := []byte{byte(100 + x.me)}
		qr, err := x.ic.IsendrecvReplace(buf, peer, 5, peer, 5)
		if err != nil {
			return err
		}
		sts, err := adi.WaitAll(ctx, q, qr)
		if err != nil {
			return err
		}
		them := x.remote[peer]
		for i, st := range sts {
			if want := (adi.Status{Source: peer, Tag: 4 + i, Count: 1}); st != want {
				return fmt.Errorf("request %d: status %+v, want %+v", i, st, want)
			}
		}
		if got[0] != byte(them) || buf[0] != byte(100+them) {
			return fmt.Errorf("got %d and %d, want %d and %d", got[0], buf[0], them, 100+them)
		}
		return nil
	})
}

// TestIdup: Idup's request has completed; its communicator is isolated
// from c's, and is the one another rank's Dup, made in the same order,
// makes.
func TestIdup(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		var d *adi.Comm
		var err error
		if c.Rank() == 0 {
			var q *adi.Request
			if d, q, err = c.Idup(); err != nil {
				return err
			}
			if _, done, err := q.Test(); !done || err != nil {
				return fmt.Errorf("Idup's request: done %v, %v", done, err)
			}
		} else if d, err = c.Dup(ctx); err != nil {
			return err
		}
		// The same tag on c and on d: each receive takes its own
		// communicator's message, whichever was sent first.
		peer := 1 - c.Rank()
		if c.Rank() == 0 {
			return errors.Join(d.Send(ctx, []byte("d"), peer, 1), c.Send(ctx, []byte("c"), peer, 1))
		}
		onC, onD := make([]byte, 1), make([]byte, 1)
		if _, err := c.Recv(ctx, onC, peer, 1); err != nil {
			return err
		}
		if _, err := d.Recv(ctx, onD, peer, 1); err != nil {
			return err
		}
		if string(onC) != "c" || string(onD) != "d" {
			return fmt.Errorf("received %q on c and %q on the Idup's", onC, onD)
		}
		return nil
	})
}

// TestIsendrecvFinalize: Finalize ends an Isendrecv still waiting for
// its receive: the request completes with an error.
func TestIsendrecvFinalize(t *testing.T) {
	ws, _ := loopWorlds(t, 2)
	ctx := ctxT(t)
	c := ws[0].Comm()
	q, err := c.Isendrecv([]byte("x"), 1, 1, make([]byte, 1), 1, 99) // tag 99 never comes
	if err != nil {
		t.Fatal(err)
	}
	// Finalize is collective: both ranks, at once.
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for r, w := range ws {
		wg.Go(func() { errs[r] = w.Finalize(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Wait(ctx); err == nil {
		t.Fatal("Isendrecv ended by Finalize: no error")
	}
	if _, err := c.Isendrecv(nil, 1, 1, nil, 1, 1); !errors.Is(err, adi.ErrFinalized) {
		t.Fatalf("Isendrecv after Finalize: %v, want ErrFinalized", err)
	}
}
