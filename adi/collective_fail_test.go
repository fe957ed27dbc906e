package adi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
)

// TestCollectiveFailedBcastLeavesBuffer: a Bcast that returned its ctx's
// end must not write the caller's buffer afterwards. The doc lets the
// program go on with point-to-point after a failed collective, which it
// cannot do if a receive the collective left posted takes the root's
// late message into memory the caller has back.
func TestCollectiveFailedBcastLeavesBuffer(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	buf := make([]byte, 8)
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	err := cs[1].Bcast(short, buf, 0) // the root comes only later
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("bcast whose root never came: %v, want the context's end", err)
	}
	copy(buf, "mine....")
	if err := cs[0].Bcast(ctx, []byte("ROOTDATA"), 0); err != nil {
		t.Fatal(err)
	}
	// A point-to-point message sent after the root's bcast arrives after
	// it: once it is here, the bcast's message has been dealt with.
	if err := cs[0].Send(ctx, []byte("x"), 1, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := cs[1].Recv(ctx, make([]byte, 1), 0, 1); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, []byte("mine....")) {
		t.Fatalf("buffer of the failed bcast written after it returned: %q", buf)
	}
}

// TestCollectiveFailedAllreduceLeavesScratch: an Allreduce that returned
// its ctx's end must not leave a receive posted into the communicator's
// scratch space, where a late peer's message would land in the middle of
// the next collective and give a wrong result with no error.
func TestCollectiveFailedAllreduceLeavesScratch(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	failed := make(chan struct{})
	var got []int64
	each(t, cs, func(c *adi.Comm) error {
		if c.Rank() == 0 {
			short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			v := []int64{1}
			err := adi.Allreduce(short, c, v, v, adi.Sum)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("allreduce whose peer came late: %v, want the context's end", err)
			}
			close(failed)
			got = make([]int64, 1)
			return adi.Reduce(ctx, c, []int64{1}, got, adi.Sum, 0)
		}
		<-failed
		// Late enough that rank 0's Reduce has its vector in the
		// scratch space the Allreduce's receive pointed at.
		time.Sleep(20 * time.Millisecond)
		v := []int64{1000}
		if err := adi.Allreduce(ctx, c, v, v, adi.Sum); err != nil {
			return err
		}
		return adi.Reduce(ctx, c, []int64{2}, nil, adi.Sum, 0)
	})
	if len(got) == 1 && got[0] != 3 {
		t.Fatalf("reduce of 1 and 2 after a failed allreduce: %d, want 3", got[0])
	}
}

// TestCollectivePoison: a rank that met a mismatch sends poison, a message
// of another length, in place of its messages, and every rank that agrees
// with the root must get ErrMismatch from it, not take it for data. Poison
// of one byte, or three in place of a one-byte message, passed for the
// data of ranks expecting one or three bytes (a 3-byte Allreduce with one
// rank passing one, Bcasts of 1 and 3 bytes); the empty poison's own gap
// is a rank that passed an empty vector itself (rank 3 in "3 bytes then
// 0", rank 0 in "rank 0 empty"), which the doc names.
func TestCollectivePoison(t *testing.T) {
	allreduce := func(odd int) func(ctx context.Context, c *adi.Comm) error {
		return func(ctx context.Context, c *adi.Comm) error {
			v := make([]int64, 4)
			if c.Rank() == odd {
				v = nil
			}
			return adi.Allreduce(ctx, c, v, v, adi.Sum)
		}
	}
	bytes3 := func(odd int) func(ctx context.Context, c *adi.Comm) error {
		return func(ctx context.Context, c *adi.Comm) error {
			v := []uint8{1, 1, 1}
			if c.Rank() == odd {
				v = []uint8{1}
			}
			return adi.Allreduce(ctx, c, v, v, adi.Sum)
		}
	}
	bcast := func(sizes ...int) func(ctx context.Context, c *adi.Comm) error {
		return func(ctx context.Context, c *adi.Comm) error {
			return c.Bcast(ctx, make([]byte, sizes[c.Rank()]), 0)
		}
	}
	for _, tc := range []struct {
		name  string
		hosts string // a rank per letter, on the host it names; "" for flat
		n     int
		f     func(ctx context.Context, c *adi.Comm) error
		want  []int // ranks that must get ErrMismatch
	}{
		{"allreduce, rank 0 empty", "", 3, allreduce(0), []int{1, 2}},
		{"allreduce by hosts, rank 4 empty", "aaabbb", 6, allreduce(4), []int{0, 1, 2, 3, 5}},
		{"allreduce of 3 bytes, rank 3 one", "", 4, bytes3(3), []int{0, 1, 2, 3}},
		// The tree from 0: 0 -> 2 -> 3. Rank 2 meets the mismatch and
		// passes it on to rank 3.
		{"bcast, 3 bytes then 0", "", 4, bcast(5, 5, 3, 0), []int{2}},
		{"bcast, one byte short", "", 4, bcast(5, 5, 4, 5), []int{2, 3}},
		{"bcast of 1 byte, rank 2 four", "", 4, bcast(1, 1, 4, 1), []int{2, 3}},
		{"bcast of 3 bytes, rank 2 one", "", 4, bcast(3, 3, 1, 3), []int{2, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cs []*adi.Comm
			if tc.hosts == "" {
				cs = loopJob(t, tc.n)
			} else {
				_, cs = hostJob(t, tc.hosts)
			}
			ctx := ctxT(t)
			errs := make([]error, len(cs))
			each(t, cs, func(c *adi.Comm) error {
				errs[c.Rank()] = tc.f(ctx, c)
				return nil
			})
			for _, r := range tc.want {
				if !errors.Is(errs[r], adi.ErrMismatch) {
					t.Errorf("rank %d: %v, want ErrMismatch (all: %v)", r, errs[r], errs)
				}
			}
		})
	}
}

// TestCollectiveSendErrorNamesRank: a collective whose send fails names
// the rank it was sending to, as a failed receive names the one it was
// receiving from: that rank is where to look.
func TestCollectiveSendErrorNamesRank(t *testing.T) {
	cs := loopJob(t, 3)
	short, cancel := context.WithTimeout(ctxT(t), 50*time.Millisecond)
	defer cancel()
	// Large enough for rendezvous: the send waits for root 2, which
	// never comes.
	err := cs[1].Gather(short, make([]byte, 4096), nil, 2)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "to rank 2") {
		t.Fatalf("gather to a root that never came: %v; want the context's end and rank 2 named", err)
	}
}
