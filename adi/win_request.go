package adi

import (
	"fmt"
	"reflect"
)

// Request-based one-sided operations (MPI_Rput and the rest): each starts
// its operation as the plain one does and returns a Request, so that a
// program waits for that operation alone, with Wait, Test, WaitAll and
// the others, instead of flushing all of them. As MPI requires, they are
// allowed only in a passive-target epoch on their target (Lock or
// LockAll); outside one they fail with ErrRMASync and send nothing. A
// target of ProcNull does nothing, and its request is complete at once.
//
// What completion of the request means differs, as in MPI:
//   - Rput, Raccumulate: local completion. The operation has left this
//     rank; origin was copied before the call returned, as Put's is, so
//     it is the program's at once. The operation may not be applied at
//     the target yet: FlushAll or Unlock makes sure of that.
//   - Rget, RgetAccumulate: the result is in place, and so the target has
//     applied the operation.
//
// The requests' Status says nothing of use, except on a dynamic window:
// an Rget whose target had nothing attached there completes with Count 0,
// and the error naming the miss comes from the next flush. The window's flushes wait
// for them too, so Cancel leaves them be and IsendInto and IrecvInto
// refuse them (ErrRequestBusy). The operations also complete, as
// the plain ones do, at FlushLocal, FlushAll, Unlock and UnlockAll.

// Rput is Put that returns a Request (MPI_Rput).
func (w *Win) Rput(origin []byte, target, offset int) (*Request, error) {
	if target == ProcNull {
		return &Request{c: w.c, local: nullSend}, nil
	}
	if err := w.check("rput", target, offset, len(origin)); err != nil {
		return nil, err
	}
	if err := w.passive("rput", target); err != nil {
		return nil, err
	}
	q, err := w.start(rmaHeader{kind: rmaPut, offset: uint64(offset), length: uint64(len(origin))}, origin, target)
	if err != nil {
		return nil, fmt.Errorf("adi: rput: %w", err)
	}
	return q, nil
}

// Rget is Get that returns a Request (MPI_Rget): once it completes, dst
// holds the data.
func (w *Win) Rget(dst []byte, target, offset int) (*Request, error) {
	if target == ProcNull {
		return &Request{c: w.c, local: nullRecv}, nil
	}
	if err := w.check("rget", target, offset, len(dst)); err != nil {
		return nil, err
	}
	if err := w.passive("rget", target); err != nil {
		return nil, err
	}
	q, err := w.fetch(rmaHeader{kind: rmaGet, offset: uint64(offset), length: uint64(len(dst))}, nil, dst, target)
	if err != nil {
		return nil, fmt.Errorf("adi: rget: %w", err)
	}
	return q, nil
}

// Raccumulate is Accumulate that returns a Request (MPI_Raccumulate).
func Raccumulate[T Real](w *Win, origin []T, target, offset int, op AccOp) (*Request, error) {
	kind := reflect.TypeFor[T]().Kind()
	b := Bytes(origin)
	if err := checkAcc(kind, op, len(b), false); err != nil {
		return nil, fmt.Errorf("adi: raccumulate: %w", err)
	}
	if target == ProcNull {
		return &Request{c: w.c, local: nullSend}, nil
	}
	if err := w.check("raccumulate", target, offset, len(b)); err != nil {
		return nil, err
	}
	if err := w.passive("raccumulate", target); err != nil {
		return nil, err
	}
	q, err := w.start(rmaHeader{kind: rmaAcc, elem: byte(kind), op: op, offset: uint64(offset), length: uint64(len(b))}, b, target)
	if err != nil {
		return nil, fmt.Errorf("adi: raccumulate: %w", err)
	}
	return q, nil
}

// RgetAccumulate is GetAccumulate that returns a Request
// (MPI_Rget_accumulate): once it completes, result holds what the
// elements held before op changed them.
func RgetAccumulate[T Real](w *Win, origin, result []T, target, offset int, op AccOp) (*Request, error) {
	const what = "rget accumulate"
	if target != ProcNull {
		// The arguments are checked first, then the epoch: a bad
		// argument is the likelier mistake.
		if err := checkAcc(reflect.TypeFor[T]().Kind(), op, len(Bytes(result)), true); err != nil {
			return nil, fmt.Errorf("adi: %s: %w", what, err)
		}
		if err := w.check(what, target, offset, len(Bytes(result))); err != nil {
			return nil, err
		}
		if err := w.passive(what, target); err != nil {
			return nil, err
		}
	}
	q, err := startGetAccumulate(w, what, origin, result, target, offset, op)
	if err != nil {
		return nil, err
	}
	if q == nil { // ProcNull
		return &Request{c: w.c, local: nullRecv}, nil
	}
	return q, nil
}
