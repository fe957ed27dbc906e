package multidevice

import "sync/atomic"

// spare holds one recycled value for the blocking Send and Recv, tried
// before their sync.Pool: they are on a ping-pong's path, where a pool
// round trip costs ~11 ns here and a swap and a compare-and-swap ~5.
// Callers that find it empty, or full when giving back, use the pool.
type spare[T any] struct{ p atomic.Pointer[T] }

// take returns the held value, or nil.
func (s *spare[T]) take() *T {
	if s.p.Load() == nil {
		return nil
	}
	return s.p.Swap(nil)
}

// give holds x if nothing is held and reports whether it did.
func (s *spare[T]) give(x *T) bool { return s.p.CompareAndSwap(nil, x) }
