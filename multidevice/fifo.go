package multidevice

import "slices"

// fifo is a queue of pointers in arrival order (the posted receives, the
// unexpected messages) from which matching mostly takes the oldest entry.
// That entry is removed by moving a head index instead of every pointer
// after it (a memmove of pointers pays a GC write barrier per element),
// and a queue that empties starts over at the front of its array, so
// that a window of receives posted and matched again and again never
// reallocates. Not safe for concurrent use (Device.mu guards both).
type fifo[T any] struct {
	all  []*T // the entries are all[head:]
	head int
}

// items returns the entries, oldest first; valid until the next change.
func (q *fifo[T]) items() []*T { return q.all[q.head:] }

// push appends x. A full array whose front was consumed is compacted
// instead of grown.
func (q *fifo[T]) push(x *T) {
	if len(q.all) == cap(q.all) && q.head > 0 {
		n := copy(q.all, q.all[q.head:])
		clear(q.all[n:])
		q.all, q.head = q.all[:n], 0
	}
	q.all = append(q.all, x)
}

// remove removes items()[i], keeping the order of the others.
func (q *fifo[T]) remove(i int) {
	if i == 0 {
		q.removeFirst()
		return
	}
	q.all = slices.Delete(q.all, q.head+i, q.head+i+1)
}

// removeFirst removes the oldest entry, of a queue that has one. Apart
// from remove so that it inlines on matching's fast path.
func (q *fifo[T]) removeFirst() {
	q.all[q.head] = nil
	q.head++
	if q.head == len(q.all) {
		q.all, q.head = q.all[:0], 0
	}
}

// take removes and returns every entry.
func (q *fifo[T]) take() []*T {
	items := slices.Clone(q.items())
	clear(q.all)
	q.all, q.head = q.all[:0], 0
	return items
}
