package adi_test

import (
	"errors"
	"testing"

	"github.com/hpc-multidevice/multidevice/adi"
)

// TestRequestReuse checks the rules of IsendInto and IrecvInto: a pending
// request is refused and keeps its operation, a completed one is reused,
// a request that holds no operation reports so instead of panicking, and
// a failed start leaves the request reusable.
func TestRequestReuse(t *testing.T) {
	cs := shmJob(t, 2)
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

	var rq, sq adi.Request
	buf := make([]byte, 8)
	if err := b.IrecvInto(&rq, buf, 0, 7); err != nil {
		t.Fatal(err)
	}
	if err := b.IrecvInto(&rq, buf, 0, 8); !errors.Is(err, adi.ErrRequestBusy) {
		t.Fatalf("IrecvInto on a pending request: %v, want ErrRequestBusy", err)
	}
	for i, tc := range []struct {
		msg string
		tag int
	}{{"first", 7}, {"again", 9}, {"third", 9}} {
		if err := a.IsendInto(&sq, []byte(tc.msg), 1, tc.tag); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		st, err := rq.Wait(ctx) // the refused start left the tag-7 receive in place
		if err != nil {
			t.Fatalf("receive %d: %v", i, err)
		}
		if got := string(buf[:st.Count]); got != tc.msg || st.Tag != tc.tag || st.Source != 0 {
			t.Fatalf("receive %d: %q tag %d from %d, want %q tag %d from 0", i, got, st.Tag, st.Source, tc.msg, tc.tag)
		}
		if _, err := sq.Wait(ctx); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		if i == 2 {
			break
		}
		if err := b.IrecvInto(&rq, buf, 0, 9); err != nil {
			t.Fatalf("reusing a completed receive: %v", err)
		}
	}

	// A failed start leaves a request that holds nothing, and can be reused.
	if err := a.IsendInto(&sq, buf, 5, 0); !errors.Is(err, adi.ErrRank) {
		t.Fatalf("IsendInto to rank 5 of 2: %v, want ErrRank", err)
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
