package adi

import (
	"fmt"
	"unsafe"
)

// Elem is a type whose values travel as the bytes they occupy in memory:
// fixed-size, holding no pointers. Collectives take slices of it.
type Elem interface {
	~bool | Number
}

// Number is a type with arithmetic: [Sum] and [Prod] apply to it.
type Number interface {
	Real | ~complex64 | ~complex128
}

// Real is an ordered number: [Max] and [Min] apply to it.
type Real interface {
	Integer | ~float32 | ~float64
}

// Integer is an integer type: the bitwise operations apply to it.
type Integer interface {
	~int | ~int8 | ~int16 | ~int32 | ~int64 |
		~uint | ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~uintptr
}

// Op combines in into inout, element by element: inout[i] = inout[i] ⊕
// in[i]. The two slices have the same length and do not overlap. A
// reduction applies op to partial results in rank order, so it must be
// associative; it need not be commutative. The predefined operations are
// generic functions that Go instantiates from the slices they reduce:
//
//	err := adi.Allreduce(ctx, c, local, global, adi.Sum)
type Op[T Elem] func(inout, in []T)

// Sum adds (MPI_SUM).
func Sum[T Number](inout, in []T) {
	for i := range inout {
		inout[i] += in[i]
	}
}

// Prod multiplies (MPI_PROD).
func Prod[T Number](inout, in []T) {
	for i := range inout {
		inout[i] *= in[i]
	}
}

// Max keeps the larger (MPI_MAX); a NaN wins, as with Go's max.
func Max[T Real](inout, in []T) {
	for i := range inout {
		inout[i] = max(inout[i], in[i])
	}
}

// Min keeps the smaller (MPI_MIN); a NaN wins, as with Go's min.
func Min[T Real](inout, in []T) {
	for i := range inout {
		inout[i] = min(inout[i], in[i])
	}
}

// BAnd is bitwise and (MPI_BAND).
func BAnd[T Integer](inout, in []T) {
	for i := range inout {
		inout[i] &= in[i]
	}
}

// BOr is bitwise or (MPI_BOR).
func BOr[T Integer](inout, in []T) {
	for i := range inout {
		inout[i] |= in[i]
	}
}

// BXor is bitwise exclusive or (MPI_BXOR).
func BXor[T Integer](inout, in []T) {
	for i := range inout {
		inout[i] ^= in[i]
	}
}

// LAnd is logical and (MPI_LAND).
func LAnd[T ~bool](inout, in []T) {
	for i := range inout {
		inout[i] = inout[i] && in[i]
	}
}

// LOr is logical or (MPI_LOR).
func LOr[T ~bool](inout, in []T) {
	for i := range inout {
		inout[i] = inout[i] || in[i]
	}
}

// Bytes views s as the bytes it occupies in memory, without copying, so
// that a slice of numbers can be sent, received or passed to the byte
// collectives ([Comm.Bcast], [Comm.Gather], ...):
//
//	err := c.Bcast(ctx, adi.Bytes(params), 0)
//
// Writing the bytes writes s (for bool, bytes other than 0 and 1 make
// invalid values). The ranks of a job must agree on byte order
// (and on the size of int and uint), as the hosts of a cluster do.
func Bytes[T Elem](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*elemSize[T]())
}

// Elems views b as the numbers of type T it holds, without copying: the
// inverse of [Bytes]. It is how a program reads and writes a shared
// window's memory ([Win.SharedQuery]) as numbers, and applies sync/atomic
// to them:
//
//	part, err := win.SharedQuery(0)
//	counts, err := adi.Elems[int64](part)
//	atomic.AddInt64(&counts[3], 1)
//
// b must hold a whole number of elements and start on a multiple of
// their size (of 8 for complex types), which is what sync/atomic needs
// on every platform; a window's parts start on 64-byte boundaries.
// Otherwise Elems fails and says which. It takes no bool: another rank
// could store a byte that is neither false nor true.
func Elems[T Number](b []byte) ([]T, error) {
	var zero T
	size := elemSize[T]()
	align := max(int(unsafe.Alignof(zero)), min(size, 8))
	if len(b)%size != 0 {
		return nil, fmt.Errorf("adi: elems: %d bytes are not a whole number of %T, %d bytes each", len(b), zero, size)
	}
	if len(b) == 0 {
		return nil, nil
	}
	if p := uintptr(unsafe.Pointer(unsafe.SliceData(b))); p%uintptr(align) != 0 {
		return nil, fmt.Errorf("adi: elems: bytes at %#x are not aligned for %T, which needs a multiple of %d", p, zero, align)
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/size), nil
}

// elemSize is the size of a T in bytes.
func elemSize[T Elem]() int {
	var zero T
	return int(unsafe.Sizeof(zero))
}
