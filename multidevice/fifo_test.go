package multidevice

import (
	"slices"
	"testing"
)

// TestFifo checks the queue's order under removals at the front, in the
// middle and at the end, and that a queue drained from the front and
// filled again keeps its array: matching a window of posted receives,
// oldest first, must not reallocate the posted queue every window.
func TestFifo(t *testing.T) {
	vals := make([]int, 10)
	for i := range vals {
		vals[i] = i
	}
	ints := func(q *fifo[int]) []int {
		var out []int
		for _, p := range q.items() {
			out = append(out, *p)
		}
		return out
	}
	tests := []struct {
		name    string
		push    []int
		removes []int // indexes into items(), in turn
		want    []int
	}{
		{name: "front", push: []int{0, 1, 2, 3}, removes: []int{0, 0}, want: []int{2, 3}},
		{name: "middle", push: []int{0, 1, 2, 3}, removes: []int{1}, want: []int{0, 2, 3}},
		{name: "last", push: []int{0, 1, 2, 3}, removes: []int{3}, want: []int{0, 1, 2}},
		{name: "front then middle", push: []int{0, 1, 2, 3, 4}, removes: []int{0, 1, 0}, want: []int{3, 4}},
		{name: "all", push: []int{0, 1, 2}, removes: []int{0, 0, 0}, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var q fifo[int]
			for _, v := range tt.push {
				q.push(&vals[v])
			}
			for _, i := range tt.removes {
				q.remove(i)
			}
			if got := ints(&q); !slices.Equal(got, tt.want) {
				t.Fatalf("items %v, want %v", got, tt.want)
			}
			q.push(&vals[9])
			if got := ints(&q); !slices.Equal(got, append(slices.Clone(tt.want), 9)) {
				t.Fatalf("after a push: items %v, want %v", got, append(tt.want, 9))
			}
		})
	}

	var q fifo[int]
	for i := range 64 {
		q.push(&vals[i%10])
	}
	base := &q.all[:1][0]
	for round := range 3 {
		for range 64 {
			q.remove(0)
		}
		for i := range 64 {
			q.push(&vals[i%10])
		}
		if &q.all[:1][0] != base || len(q.items()) != 64 {
			t.Fatalf("round %d: the queue moved to a new array (or holds %d)", round, len(q.items()))
		}
	}
	// Half drained, then filled past its capacity: compacted, in order.
	for range 32 {
		q.remove(0)
	}
	for i := range 32 {
		q.push(&vals[i%10])
	}
	if len(q.items()) != 64 || &q.all[:1][0] != base {
		t.Fatalf("a full array with a consumed front grew instead of compacting: %d entries", len(q.items()))
	}
	if got := q.take(); len(got) != 64 || len(q.items()) != 0 {
		t.Fatalf("take returned %d and left %d", len(got), len(q.items()))
	}
}
