package udapl

import (
	"errors"
	"testing"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
)

func TestWRTableTake(t *testing.T) {
	var w wrTable
	c1 := w.add(1, 7, 100, rdma.OpRecv)
	c2 := w.add(1, 7, 101, rdma.OpSend)
	if c1 == c2 {
		t.Fatalf("two open work requests share cookie %#x", c1)
	}
	got, owner, ok := w.take(c2)
	if want := (rdma.Completion{Endpoint: 7, WR: 101, Op: rdma.OpSend}); !ok || got != want || owner != 1 {
		t.Fatalf("take(c2) = %+v, %d, %v, want %+v of owner 1", got, owner, ok, want)
	}
	if _, _, ok := w.take(c2); ok {
		t.Fatal("a cookie completed twice")
	}
	// The slot is reused with a new generation: the old cookie stays dead.
	c3 := w.add(2, 8, 102, rdma.OpRead)
	if uint32(c3) != uint32(c2) || c3 == c2 {
		t.Fatalf("reused slot: cookie %#x after %#x, want the same slot with another generation", c3, c2)
	}
	if _, _, ok := w.take(c2); ok {
		t.Fatal("a stale cookie matched the slot's new work request")
	}
	if got, owner, ok := w.take(c3); !ok || got.WR != 102 || got.Op != rdma.OpRead || got.Endpoint != 8 || owner != 2 {
		t.Fatalf("take(c3) = %+v, %d, %v", got, owner, ok)
	}
	for _, bad := range []uint64{0, 1 << 40, uint64(len(w.slots))} {
		if _, _, ok := w.take(bad); ok {
			t.Fatalf("take(%#x) matched a cookie never issued", bad)
		}
	}
	if got, _, ok := w.take(c1); !ok || got.WR != 100 {
		t.Fatalf("take(c1) = %+v, %v", got, ok)
	}
}

func TestWRTableFlushOwner(t *testing.T) {
	var w wrTable
	a1 := w.add(1, 10, 1, rdma.OpRecv)
	b1 := w.add(2, 20, 1, rdma.OpRecv)
	a2 := w.add(1, 10, 2, rdma.OpSend)
	a3 := w.add(1, 10, 3, rdma.OpRead)
	if _, _, ok := w.take(a3); !ok {
		t.Fatal("take(a3) failed")
	}
	errCut := errors.New("cut")
	out := w.flushOwner(1, errCut, nil)
	if len(out) != 2 {
		t.Fatalf("flushOwner returned %d completions, want 2: %+v", len(out), out)
	}
	seen := map[uint64]rdma.Op{}
	for _, c := range out {
		if c.Endpoint != 10 || c.Err != errCut {
			t.Fatalf("flushed completion %+v, want endpoint 10 with the flush error", c)
		}
		seen[c.WR] = c.Op
	}
	if seen[1] != rdma.OpRecv || seen[2] != rdma.OpSend {
		t.Fatalf("flushed %v, want WR 1 recv and WR 2 send", seen)
	}
	// The adapter's own completions for the flushed work come too late.
	for _, c := range []uint64{a1, a2} {
		if _, _, ok := w.take(c); ok {
			t.Fatalf("cookie %#x completed after its flush", c)
		}
	}
	if got, _, ok := w.take(b1); !ok || got.Endpoint != 20 {
		t.Fatalf("the other endpoint's work: take(b1) = %+v, %v", got, ok)
	}
	if out := w.flushOwner(1, errCut, nil); len(out) != 0 {
		t.Fatalf("second flushOwner returned %+v", out)
	}
}

// TestWRTableGenerationWraps checks that a slot never issues generation 0,
// so cookie 0 stays invalid for ever.
func TestWRTableGenerationWraps(t *testing.T) {
	var w wrTable
	c := w.add(1, 1, 1, rdma.OpSend)
	w.slots[0].gen = ^uint32(0)
	c = uint64(w.slots[0].gen)<<32 | uint64(uint32(c))
	if _, _, ok := w.take(c); !ok {
		t.Fatal("take failed")
	}
	if c := w.add(1, 1, 2, rdma.OpSend); c>>32 == 0 {
		t.Fatalf("generation wrapped to 0: cookie %#x", c)
	}
}
