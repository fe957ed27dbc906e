package adi

import (
	"fmt"
	"reflect"
	"unsafe"
)

// Atomic one-sided operations (MPI-3): each reads elements of a target's
// window and changes them in one step. A window's operations are applied
// one at a time, so each is atomic with respect to every other
// operation on the window (Put, Accumulate and these alike), element by
// element and indeed as a whole. A window's own rank changing its memory
// directly is not covered, as in MPI.
//
// Like Get, they start the operation and return: the results are in
// place after the next FlushLocal, FlushAll, Unlock, UnlockAll or Fence,
// not before, and the result buffers belong to the window until then.
// The origin values are copied before they return. A target of ProcNull
// does nothing and leaves the results as they were.

// GetAccumulate combines origin into target's window at offset (bytes)
// with op, element by element, and returns in result what the elements
// held before (MPI_Get_accumulate). result and origin have the same
// length, unless op is AccNoOp, which only reads and ignores origin.
// AccReplace makes it an atomic swap. See above for completion.
func GetAccumulate[T Real](w *Win, origin, result []T, target, offset int, op AccOp) error {
	return getAccumulate(w, "get accumulate", origin, result, target, offset, op)
}

func getAccumulate[T Real](w *Win, what string, origin, result []T, target, offset int, op AccOp) error {
	_, err := startGetAccumulate(w, what, origin, result, target, offset, op)
	return err
}

// startGetAccumulate starts a GetAccumulate and returns the request of
// its reply (nil for ProcNull).
func startGetAccumulate[T Real](w *Win, what string, origin, result []T, target, offset int, op AccOp) (*Request, error) {
	kind := reflect.TypeFor[T]().Kind()
	b := Bytes(result)
	if err := checkAcc(kind, op, len(b), true); err != nil {
		return nil, fmt.Errorf("adi: %s: %w", what, err)
	}
	var payload []byte
	if op != AccNoOp {
		if len(origin) != len(result) {
			return nil, fmt.Errorf("adi: %s: %d origin elements for %d result elements", what, len(origin), len(result))
		}
		payload = Bytes(origin)
	}
	if target == ProcNull {
		return nil, nil
	}
	if err := w.check(what, target, offset, len(b)); err != nil {
		return nil, err
	}
	q, err := w.fetch(rmaHeader{kind: rmaGetAcc, elem: byte(kind), op: op, offset: uint64(offset), length: uint64(len(b))}, payload, b, target)
	if err != nil {
		return nil, fmt.Errorf("adi: %s: %w", what, err)
	}
	return q, nil
}

// FetchAndOp combines origin into the element at offset (bytes) of
// target's window with op and stores what the element held before in
// *result (MPI_Fetch_and_op): a GetAccumulate of one element. With
// AccSum it draws tickets from a shared counter; with AccNoOp it reads
// atomically. *result is set once the operation completes (see above):
// the usual pattern is
//
//	var ticket int64
//	err := errors.Join(adi.FetchAndOp(w, 1, &ticket, 0, 0, adi.AccSum), w.FlushLocal(ctx))
func FetchAndOp[T Real](w *Win, origin T, result *T, target, offset int, op AccOp) error {
	if result == nil {
		return fmt.Errorf("adi: fetch and op: nil result")
	}
	return getAccumulate(w, "fetch and op", []T{origin}, unsafe.Slice(result, 1), target, offset, op)
}

// CompareAndSwap compares the integer at offset (bytes) of target's
// window with compare and, if they are equal, replaces it with origin;
// either way *result gets what it held before (MPI_Compare_and_swap), so
// the swap happened if and only if *result == compare. *result is set
// once the operation completes (see above).
func CompareAndSwap[T Integer](w *Win, origin, compare T, result *T, target, offset int) error {
	const what = "compare and swap"
	if result == nil {
		return fmt.Errorf("adi: %s: nil result", what)
	}
	kind := reflect.TypeFor[T]().Kind()
	b := Bytes(unsafe.Slice(result, 1))
	if err := checkCAS(kind, len(b)); err != nil {
		return fmt.Errorf("adi: %s: %w", what, err)
	}
	if target == ProcNull {
		return nil
	}
	if err := w.check(what, target, offset, len(b)); err != nil {
		return err
	}
	payload := append(Bytes([]T{origin}), Bytes([]T{compare})...)
	if _, err := w.fetch(rmaHeader{kind: rmaCAS, elem: byte(kind), offset: uint64(offset), length: uint64(len(b))}, payload, b, target); err != nil {
		return fmt.Errorf("adi: %s: %w", what, err)
	}
	return nil
}

// checkCAS checks that a compare and swap is of one integer of kind, n
// bytes long.
func checkCAS(kind reflect.Kind, n int) error {
	size, integer, err := kindSize(kind)
	switch {
	case err != nil:
		return err
	case !integer:
		return fmt.Errorf("compare and swap of %v elements: integers only", kind)
	case n != size:
		return fmt.Errorf("compare and swap of %d bytes, not one %d-byte %v", n, size, kind)
	}
	return nil
}

// rmaName names an operation kind in errors.
func rmaName(kind byte) string {
	switch kind {
	case rmaPut:
		return "put"
	case rmaGet:
		return "get"
	case rmaAcc:
		return "accumulate"
	case rmaGetAcc:
		return "get accumulate"
	case rmaCAS:
		return "compare and swap"
	case rmaLock:
		return "lock"
	case rmaUnlock:
		return "unlock"
	case rmaFlush:
		return "flush"
	}
	return fmt.Sprintf("operation %d", kind)
}
