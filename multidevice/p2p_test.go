package multidevice

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"
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
