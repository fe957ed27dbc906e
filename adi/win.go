package adi

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
)

// One-sided communication (MPI-2 RMA): every rank of a communicator
// exposes a byte slice as a window; Put, Get and Accumulate read and
// write other ranks' windows without their taking part. Fence, collective,
// separates epochs and completes every operation of the one that ends
// (active target); Lock and Unlock bracket one origin's operations on one
// target, shared or exclusive, with no part taken by the others (passive
// target).
//
// The operations travel as point-to-point messages on two contexts of the
// window's own, requests on one and Get's replies on the other, so they
// never match the program's messages. A goroutine of each rank, the
// window's server, takes the requests addressed to it and applies them to
// its window in the order each origin sent them; a rank waiting in Fence
// applies them itself meanwhile, one at a time with the server, which
// saves the wake-ups of handing each to it. Fence counts: every rank
// tells every other how many operations it sent it this epoch
// (Alltoall), waits until that many from each origin have been applied,
// and passes a barrier, so that no rank starts the next epoch while an
// operation of this one is still in flight anywhere.
//
// MPI-3's additions live beside this file: the atomic operations
// (GetAccumulate, FetchAndOp, CompareAndSwap) in win_atomic.go, LockAll,
// UnlockAll, FlushAll and FlushLocal in win_sync.go, and the
// request-based operations (Rput, Rget, ...) in win_request.go. A
// fetching operation's reply, like Get's, is sent by whichever goroutine
// applied the operation (the server, or the rank in Fence), once it has;
// FlushAll asks each target it wrote to for an acknowledgement, sent once
// everything that origin sent before has been applied. Dynamic windows
// (win_dynamic.go) resolve an operation's address to the memory attached
// there when they apply it, and tell the origin of one that found none.

// AccOp is the operation Accumulate applies at the target: the target's
// element becomes target ⊕ origin (MPI_Accumulate's predefined ops).
type AccOp uint8

// Accumulate operations. AccBAnd, AccBOr and AccBXor apply to integer
// elements only.
const (
	AccReplace AccOp = iota + 1 // MPI_REPLACE: the origin's value
	AccSum                      // MPI_SUM
	AccProd                     // MPI_PROD
	AccMax                      // MPI_MAX
	AccMin                      // MPI_MIN
	AccBAnd                     // MPI_BAND
	AccBOr                      // MPI_BOR
	AccBXor                     // MPI_BXOR
	// AccNoOp (MPI_NO_OP) leaves the target as it is: GetAccumulate and
	// FetchAndOp with it only read, atomically with respect to the other
	// accumulates. Accumulate refuses it.
	AccNoOp
)

// Win is a window: memory of every rank of a communicator that the others
// read and write with Put, Get and Accumulate between Fences. A Win is
// safe for concurrent use by the goroutines of its rank, but its epochs
// are collective: every rank calls Fence and Free in the same order.
type Win struct {
	c      *Comm // requests go on c, Get's replies on reply
	reply  *Comm
	base   []byte
	sizes  []int       // every rank's window length
	shm    *sharedMem  // WinAllocateShared's segment; nil for WinCreate's windows
	dyn    *dynRegions // WinCreateDynamic's attached memory (owned by amu's holder); nil for the others
	nextID uint64
	// syncWord is what Sync changes on a window whose memory no other
	// rank maps.
	syncWord atomic.Uint64

	mu      sync.Mutex
	pending []pendingOp // sends and replies not yet waited for by a flush or Fence
	sent    []int64     // operations sent to each rank this epoch
	freed   bool
	// Per rank, the operations on it that failed, taken off pending once
	// done so that they do not fail every later wait: the next wait that
	// covers the rank reports them, once (waitMissed).
	failed []opFailures
	// This rank's passive-target epochs: its lock on each target, taken
	// or being taken with Lock, and LockAll's. Per target, the puts and
	// accumulates sent, and how many of them a flush, Unlock or Fence
	// has seen applied: FlushAll asks only the targets where the two
	// differ.
	// A Lock or LockAll whose ctx ended leaves its requests queued at
	// the targets: their grants, and LockAll's targets, are kept here for
	// Unlock and UnlockAll, which wait for them before they release.
	locks      map[int]lockState
	all        lockState
	lockGrants map[int]*Request
	allGrants  []*Request
	allTargets []int
	writes     []uint64
	acked      []uint64
	// On a dynamic window, the reply of each Get, GetAccumulate and
	// CompareAndSwap not yet waited for by a flush or Fence, and what it
	// asked for: a reply shorter than that says the target had no memory
	// attached there. And the misses the targets reported to a flush,
	// for the wait that follows to return.
	expect   map[*Request]rmaAccess
	reported []error
	// Answers to flush and unlock requests that a call whose ctx ended
	// left unread; read by the next that can.
	leftovers []leftover
	// Receives of a dynamic window's Fence reports that a Fence whose
	// ctx ended kept, at most one from each rank; read by the next Fence.
	reports []leftover
	// Fences called on the window: the epoch a dynamic window's Fence
	// sends with its reports, so that the receiving Fence can tell an
	// earlier Fence's report, which it returns too, from its own.
	fences uint64
	// exchanging, set by tests only, runs in a dynamic window's Fence
	// once its receives of the reports are posted, before it sends its own.
	exchanging func()

	// The target's side. Operations that come to this window are taken
	// off the matching queue and applied under amu, by the server or by a
	// rank waiting in Fence (applyNext): one at a time, so each origin's
	// are applied in the order it sent them. Owned by amu's holder:
	// passive-target locks (the rank holding this window exclusively, -1
	// for none; the origins holding it shared; the requests waiting,
	// first come first served), and buffers for a message and for a
	// fetching operation's old contents, sent back.
	amu       sync.Mutex
	exclusive int
	shared    map[int]int
	waiting   []rmaHeaderFrom
	msg       []byte
	scratch   []byte
	// On a dynamic window, the puts and accumulates from each origin
	// that found no memory attached, not yet reported to it.
	missed []missReport
	// The ranks holding or waiting for a lock here, as amu's holder last
	// left the locks (watchLockers): the server looks, without amu, for
	// one of them lost (lockerLost), which would never release its lock.
	lockers atomic.Pointer[[]int]

	// Guarded by smu: operations applied from each origin since the
	// window was made, and what applying met that it could not apply
	// (returned by the next Fence).

	smu       sync.Mutex
	applied   []int64
	expected  []int64 // what the Fences so far announced from each origin
	arrived   chan struct{}
	serverErr error
	// stopCause is why the server stopped, kept for its last word
	// (markStopped): a Fence that returns serverErr clears it.
	stopCause error

	// stopped ends once the server has stopped, its cause saying why:
	// requests to this rank are no longer applied, so this rank's waits
	// on the window end with it (waitAll).
	stopped     context.Context
	markStopped context.CancelCauseFunc
}

// pendingOp is a request of this rank's that a flush or Fence waits for,
// and the rank its operation targets.
type pendingOp struct {
	q      *Request
	target int
}

// opFailures counts the failed operations on one rank not yet reported,
// with the first one's error: one error for them all, as they most often
// fail for one cause (the rank lost), and hundreds of lines said it once
// each.
type opFailures struct {
	n   int
	err error
}

// Request kinds on the wire.
const (
	rmaPut byte = iota + 1
	rmaGet
	rmaAcc
	rmaLock   // op: lockExclusive or lockShared; the grant goes to tag
	rmaUnlock // the acknowledgement goes to tag
	rmaGetAcc // get accumulate: the old contents go to tag; no payload with AccNoOp
	rmaCAS    // compare and swap of one integer: payload origin then compare; the old value goes to tag
	rmaFlush  // the acknowledgement, once everything before it is applied, goes to tag
)

// Lock types in a lock request's op byte.
const (
	lockExclusive AccOp = iota + 1
	lockShared
)

// rmaHeaderSize is an operation's header: kind, element kind, op, five
// bytes of padding, the target offset, the length in bytes and, for Get,
// the reply's tag.
const rmaHeaderSize = 32

const rmaTag = 0 // requests all use one tag: order per origin is the wire's

// rmaHeader is a decoded operation header.
type rmaHeader struct {
	kind, elem byte
	op         AccOp
	offset     uint64
	length     uint64
	tag        uint64
}

func (h rmaHeader) encode(b []byte) []byte {
	b = append(b, h.kind, h.elem, byte(h.op), 0, 0, 0, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, h.offset)
	b = binary.LittleEndian.AppendUint64(b, h.length)
	return binary.LittleEndian.AppendUint64(b, h.tag)
}

// decodeRMA checks an operation message against a window of size bytes
// and returns its header and payload. A dynamic window passes
// math.MaxUint64: only the memory attached there bounds an operation, and
// the window checks that once it has decoded it.
func decodeRMA(msg []byte, size uint64) (rmaHeader, []byte, error) {
	if len(msg) < rmaHeaderSize {
		return rmaHeader{}, nil, fmt.Errorf("operation of %d bytes, shorter than its %d-byte header", len(msg), rmaHeaderSize)
	}
	h := rmaHeader{kind: msg[0], elem: msg[1], op: AccOp(msg[2]),
		offset: binary.LittleEndian.Uint64(msg[8:]), length: binary.LittleEndian.Uint64(msg[16:]), tag: binary.LittleEndian.Uint64(msg[24:])}
	payload := msg[rmaHeaderSize:]
	if h.offset > size || h.length > size-h.offset {
		return h, nil, fmt.Errorf("%d bytes at offset %d of a %d-byte window", h.length, h.offset, size)
	}
	switch h.kind {
	case rmaPut, rmaAcc:
		if uint64(len(payload)) != h.length {
			return h, nil, fmt.Errorf("header says %d bytes, %d came", h.length, len(payload))
		}
		if h.kind == rmaAcc {
			if err := checkAcc(reflect.Kind(h.elem), h.op, int(h.length), false); err != nil {
				return h, nil, err
			}
		}
	case rmaGetAcc:
		want := h.length
		if h.op == AccNoOp {
			want = 0
		}
		if uint64(len(payload)) != want || h.tag > MaxTag {
			return h, nil, fmt.Errorf("get accumulate of %d bytes with %d bytes of payload, reply tag %d", h.length, len(payload), h.tag)
		}
		if err := checkAcc(reflect.Kind(h.elem), h.op, int(h.length), true); err != nil {
			return h, nil, err
		}
	case rmaCAS:
		if err := checkCAS(reflect.Kind(h.elem), int(h.length)); err != nil {
			return h, nil, err
		}
		if uint64(len(payload)) != 2*h.length || h.tag > MaxTag {
			return h, nil, fmt.Errorf("compare and swap of %d bytes with %d bytes of payload, reply tag %d", h.length, len(payload), h.tag)
		}
	case rmaGet:
		if len(payload) != 0 || h.tag > MaxTag {
			return h, nil, fmt.Errorf("get with %d bytes of payload or reply tag %d", len(payload), h.tag)
		}
	case rmaLock, rmaUnlock, rmaFlush:
		if len(payload) != 0 || h.length != 0 || h.tag > MaxTag || h.kind == rmaLock && h.op != lockExclusive && h.op != lockShared {
			return h, nil, fmt.Errorf("%s request with %d bytes, type %d or reply tag %d", rmaName(h.kind), len(payload), h.op, h.tag)
		}
	default:
		return h, nil, fmt.Errorf("unknown operation %d", h.kind)
	}
	return h, payload, nil
}

// WinCreate makes a window of base on every rank of c (MPI_Win_create).
// It is collective; ranks may expose different lengths, or none. base
// belongs to the window until Free: between Fences only the window's
// operations and, for the rank's own elements no operation targets in
// that epoch, the rank itself may touch it.
func (c *Comm) WinCreate(ctx context.Context, base []byte) (*Win, error) {
	return c.winCreate(ctx, "win create", base, nil)
}

// winCreate makes a window of base, or a dynamic one if dyn is set: the
// server starts once the window is whole.
func (c *Comm) winCreate(ctx context.Context, what string, base []byte, dyn *dynRegions) (*Win, error) {
	sizes := make([]int64, c.Size())
	if err := c.Allgather(ctx, Bytes([]int64{int64(len(base))}), Bytes(sizes)); err != nil {
		return nil, fmt.Errorf("adi: %s: %w", what, err)
	}
	req, err := c.Dup(ctx)
	if err != nil {
		return nil, fmt.Errorf("adi: %s: %w", what, err)
	}
	reply, err := c.Dup(ctx)
	if err != nil {
		return nil, fmt.Errorf("adi: %s: %w", what, err)
	}
	w := &Win{c: req, reply: reply, base: base, sizes: make([]int, len(sizes)), exclusive: -1, shared: map[int]int{},
		sent: make([]int64, c.Size()), applied: make([]int64, c.Size()), expected: make([]int64, c.Size()),
		locks: map[int]lockState{}, lockGrants: map[int]*Request{}, writes: make([]uint64, c.Size()), acked: make([]uint64, c.Size()),
		failed: make([]opFailures, c.Size()), arrived: make(chan struct{})}
	w.stopped, w.markStopped = context.WithCancelCause(context.Background())
	for r, n := range sizes {
		w.sizes[r] = int(n)
	}
	if dyn != nil {
		w.dyn, w.missed, w.expect = dyn, make([]missReport, c.Size()), map[*Request]rmaAccess{}
	}
	if err := c.w.bg.serve(w, w.serve); err != nil {
		return nil, fmt.Errorf("adi: %s: %w", what, err)
	}
	return w, nil
}

// Size is the length of rank r's window: 0 on a dynamic window, as in
// MPI, whatever memory r has attached.
func (w *Win) Size(r int) (int, error) {
	if r < 0 || r >= len(w.sizes) {
		return 0, fmt.Errorf("adi: win: %w: %d not in [0,%d)", ErrRank, r, len(w.sizes))
	}
	return w.sizes[r], nil
}

// errWinFreed is what a window's calls return after Free.
var errWinFreed = errors.New("adi: window freed")

// check validates an operation of n bytes at offset of target's window.
func (w *Win) check(what string, target, offset, n int) error {
	w.mu.Lock()
	freed := w.freed
	w.mu.Unlock()
	if freed {
		return fmt.Errorf("adi: %s: %w", what, errWinFreed)
	}
	size, err := w.Size(target)
	if err != nil {
		return err
	}
	if w.dyn != nil {
		// Only the target knows what it has attached: it checks, and
		// tells this rank at the next flush, Unlock or Fence.
		if offset < 0 || n < 0 || n > math.MaxInt-offset {
			return fmt.Errorf("adi: %s: %d bytes at address %#x of rank %d's dynamic window", what, n, offset, target)
		}
		return nil
	}
	if offset < 0 || n < 0 || offset > size || n > size-offset {
		return fmt.Errorf("adi: %s: %d bytes at offset %d of rank %d's window of %d", what, n, offset, target, size)
	}
	return nil
}

// start sends an operation to target and counts it for the epoch, and,
// a put or an accumulate, for FlushAll. The send's request is returned
// for Rput and Raccumulate; a flush waits for it too.
func (w *Win) start(h rmaHeader, payload []byte, target int) (*Request, error) {
	msg := make([]byte, 0, rmaHeaderSize+len(payload))
	msg = append(h.encode(msg), payload...)
	q, err := w.c.Isend(msg, target, rmaTag)
	if err != nil {
		return nil, err
	}
	q.window = true
	w.mu.Lock()
	w.pending = append(w.pending, pendingOp{q, target})
	w.sent[target]++
	if h.kind == rmaPut || h.kind == rmaAcc {
		w.writes[target]++
	}
	w.mu.Unlock()
	return q, nil
}

// fetch sends an operation whose reply brings len(dst) bytes into dst
// (Get, GetAccumulate, CompareAndSwap; lock, unlock and flush, with no
// bytes) and returns the reply's request: once it completes, dst holds
// the data and the target has applied the operation. The flushes wait
// for the replies of operations on data, not for those of lock, unlock
// and flush requests, which their callers wait for: a Lock waiting for
// its grant must not hold up another goroutine's flush.
func (w *Win) fetch(h rmaHeader, payload, dst []byte, target int) (*Request, error) {
	h.tag = w.replyTag()
	q, err := w.reply.Irecv(dst, target, int(h.tag))
	if err != nil {
		return nil, err
	}
	if _, err := w.start(h, payload, target); err != nil {
		q.Cancel() // no reply will come for it
		return nil, err
	}
	q.window = true
	if h.kind != rmaLock && h.kind != rmaUnlock && h.kind != rmaFlush {
		w.mu.Lock()
		w.pending = append(w.pending, pendingOp{q, target})
		if w.dyn != nil && h.length > 0 {
			w.expect[q] = rmaAccess{target: target, kind: h.kind, addr: h.offset, length: h.length}
		}
		w.mu.Unlock()
	}
	return q, nil
}

// wait waits for the requests of a flush or Fence, pending as it began,
// and takes them off pending: others started meanwhile stay there, for
// the flush that follows them. Two goroutines flushing at once both wait
// for what either took. It fails with the failures of operations on
// ranks (nil: on every rank) and, on a dynamic window, with ErrNoRegion
// for each fetching operation whose target had no memory attached there.
func (w *Win) wait(ctx context.Context, pending []pendingOp, ranks []int) error {
	failed, err := w.waitMissed(ctx, pending, ranks)
	return errors.Join(err, failed)
}

// waitMissed is wait with what the operations met apart from the errors
// of waiting: the failures of operations on ranks (nil: on every rank),
// the fetching operations among pending whose answer was empty
// (ErrNoRegion), and what the targets reported to the flushes since the
// last wait, and to calls whose ctx ended. Each is returned once, by
// whichever wait takes it. A failed operation is taken off pending all
// the same, or every later wait would fail with it; its failure waits
// for a wait that covers its rank, so that a rank lost fails neither the
// Flush nor the Unlock of another. Its error is of waiting, or of an
// answer left over that failed: the requests not done then stay pending.
func (w *Win) waitMissed(ctx context.Context, pending []pendingOp, ranks []int) (failed, err error) {
	qs := make([]*Request, len(pending))
	for i, p := range pending {
		qs[i] = p.q
	}
	err = w.waitAll(ctx, qs...)
	done := make(map[*Request]bool, len(pending))
	w.mu.Lock()
	for _, p := range pending {
		st, ok, qerr := p.q.Test()
		if !ok {
			continue
		}
		done[p.q] = true
		a, expected := w.expect[p.q]
		delete(w.expect, p.q)
		switch {
		case qerr != nil:
			f := &w.failed[p.target]
			if f.n++; f.err == nil {
				f.err = qerr
			}
		case expected && uint64(st.Count) < a.length: // the target's answer to a miss is empty
			w.reported = append(w.reported, missReport{kind: a.kind, count: 1, addr: a.addr, length: a.length}.err(a.target))
		}
	}
	w.pending = slices.DeleteFunc(w.pending, func(p pendingOp) bool { return done[p.q] })
	if len(done) < len(pending) { // ctx ended, or the server stopped
		w.mu.Unlock()
		return nil, err
	}
	// Every request is done: err, if any, is their failures, recorded
	// above and taken below.
	errs := w.reported
	w.reported = nil
	leftovers := w.leftovers
	w.leftovers = nil
	for t, f := range w.failed {
		if f.n > 0 && (ranks == nil || slices.Contains(ranks, t)) {
			errs = append(errs, f.report(t))
			w.failed[t] = opFailures{}
		}
	}
	w.mu.Unlock()
	// The answers that calls whose ctx ended left, those come by now.
	left, err := w.settle(ctx, leftovers, false)
	if left != nil { // a nil appended cost every wait an allocation
		errs = append(errs, left)
	}
	return errors.Join(errs...), err
}

// report is the error of f, the failures of operations on rank t.
func (f opFailures) report(t int) error {
	if f.n == 1 {
		return fmt.Errorf("an operation on rank %d failed: %w", t, f.err)
	}
	return fmt.Errorf("%d operations on rank %d failed, the first: %w", f.n, t, f.err)
}

// waitAll is WaitAll for this rank's waits on the window, the statuses
// not kept: it ends as well, with the server's error, once this rank's
// server has stopped. The requests the other ranks send here are no
// longer applied then, and what this rank waits for, which may hang on
// them, may never come: such a wait said only "context deadline
// exceeded" once its ctx ended.
func (w *Win) waitAll(ctx context.Context, qs ...*Request) error {
	// Most waits end while polling, as every Fence's does: watching the
	// server costs a context and an AfterFunc, which made a Fence-based
	// Get of 8 bytes twice as slow, so only a wait that parks pays it.
	if w.polled(qs) {
		return WaitAllInto(ctx, nil, qs...)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(w.stopped, cancel)()
	err := WaitAllInto(wctx, nil, qs...)
	if err != nil && ctx.Err() == nil && wctx.Err() != nil {
		return context.Cause(w.stopped)
	}
	return err
}

// polled drives progress, as WaitAll does before it parks, until every
// request of qs is done, and reports whether they are. If not, the spin
// budget is spent, and WaitAll spends it once more before it parks: a
// wait that parks, a long one, polls up to 2 ms longer, which is the
// price of the short ones not watching the server.
func (w *Win) polled(qs []*Request) bool {
	next := 0
	return w.c.w.dev.Progress(func() bool {
		for next < len(qs) {
			if q := qs[next]; q != nil && q.c != nil && !q.done() {
				return false
			}
			next++
		}
		return true
	})
}

// Put writes origin into target's window at offset (bytes). It completes
// by the next Fence; origin may change as soon as Put returns. Put,
// Get and Accumulate with target ProcNull do nothing.
func (w *Win) Put(origin []byte, target, offset int) error {
	if target == ProcNull {
		return nil
	}
	if err := w.check("put", target, offset, len(origin)); err != nil {
		return err
	}
	_, err := w.start(rmaHeader{kind: rmaPut, offset: uint64(offset), length: uint64(len(origin))}, origin, target)
	return err
}

// Get reads len(dst) bytes of target's window at offset into dst. dst
// holds them after the next Fence, not before.
func (w *Win) Get(dst []byte, target, offset int) error {
	if target == ProcNull {
		return nil
	}
	if err := w.check("get", target, offset, len(dst)); err != nil {
		return err
	}
	_, err := w.fetch(rmaHeader{kind: rmaGet, offset: uint64(offset), length: uint64(len(dst))}, nil, dst, target)
	return err
}

// Accumulate combines origin into target's window at offset (bytes)
// element by element with op, atomically with respect to other
// Accumulates (MPI_Accumulate). It completes by the next Fence.
func Accumulate[T Real](w *Win, origin []T, target, offset int, op AccOp) error {
	if target == ProcNull {
		return nil
	}
	kind := reflect.TypeFor[T]().Kind()
	b := Bytes(origin)
	if err := checkAcc(kind, op, len(b), false); err != nil {
		return fmt.Errorf("adi: accumulate: %w", err)
	}
	if err := w.check("accumulate", target, offset, len(b)); err != nil {
		return err
	}
	_, err := w.start(rmaHeader{kind: rmaAcc, elem: byte(kind), op: op, offset: uint64(offset), length: uint64(len(b))}, b, target)
	return err
}

// Fence ends the epoch (MPI_Win_fence): every operation this rank
// started has completed, every operation that targets this rank has been
// applied to its window, and every other rank has got that far too. It
// is collective, and returns what applying met that it could not apply
// since the last Fence (an operation whose origin was lost as it came,
// say). Inside a Lock or LockAll epoch it fails with ErrRMASync and sends
// nothing; the other ranks then wait in theirs. A Fence that fails on its
// ctx leaves the window's epochs undefined, as a collective leaves its
// communicator's: the counts exchanged may be half read.
func (w *Win) Fence(ctx context.Context) error {
	w.mu.Lock()
	if w.freed {
		w.mu.Unlock()
		return fmt.Errorf("adi: fence: %w", errWinFreed)
	}
	if w.all != lockNone || len(w.locks) > 0 {
		w.mu.Unlock()
		return fmt.Errorf("adi: fence: %w: this rank is in a Lock or LockAll epoch (Unlock first)", ErrRMASync)
	}
	pending, sent, writes := slices.Clone(w.pending), slices.Clone(w.sent), slices.Clone(w.writes)
	clear(w.sent)
	w.fences++
	epoch := w.fences
	w.mu.Unlock()
	// The counts go first, and this rank's own operations are waited for
	// only once it has applied what targets it: a Get's reply needs its
	// target to apply the Get, and a target that is waiting for the counts
	// cannot, so the server would have to, with a wake-up each way.
	from := make([]int64, len(sent))
	if err := w.c.Alltoall(ctx, Bytes(sent), Bytes(from)); err != nil {
		return fmt.Errorf("adi: fence: %w", err)
	}
	w.smu.Lock()
	for o, n := range from {
		w.expected[o] += n
	}
	w.smu.Unlock()
	for {
		w.smu.Lock()
		done := w.caughtUp()
		arrived, serr := w.arrived, w.serverErr
		if done {
			w.serverErr = nil
		}
		w.smu.Unlock()
		if !done && w.c.w.dev.Progress(func() bool {
			// Polls until operations are waiting, and only looks:
			// applying one may block, which Progress's done must not.
			w.smu.Lock()
			up := w.caughtUp()
			w.smu.Unlock()
			_, waiting, _ := w.c.Iprobe(AnySource, rmaTag)
			return up || waiting
		}) {
			// Apply them on this goroutine rather than park: the server is
			// likely parked, and each handoff to it and back costs a
			// wake-up.
			if err := w.applyWaiting(ctx); err != nil {
				return fmt.Errorf("adi: fence: %w", err)
			}
			continue
		}
		if done {
			missed, err := w.waitMissed(ctx, pending, nil)
			if err != nil {
				return fmt.Errorf("adi: fence: %w", err)
			}
			if w.dyn != nil {
				// The targets' reports of operations that missed their
				// memory, exchanged in place of the barrier, which
				// this is as well: nobody returns before every rank
				// has sent its part.
				reported, err := w.exchangeMisses(ctx, epoch)
				if err != nil {
					return fmt.Errorf("adi: fence: %w", errors.Join(missed, reported, err))
				}
				missed = errors.Join(missed, reported)
			} else if err := w.c.Barrier(ctx); err != nil {
				return fmt.Errorf("adi: fence: %w", errors.Join(missed, err))
			}
			// Every target has applied every request this rank sent:
			// the answers that calls whose ctx ended left have come,
			// or are on their way.
			answered, err := w.settle(ctx, w.takeLeftovers(w.ranks()), true)
			missed = errors.Join(missed, answered)
			if err != nil {
				return fmt.Errorf("adi: fence: %w", errors.Join(missed, err))
			}
			w.ack(writes, w.ranks()) // every rank applied what it was sent
			if err := errors.Join(missed, serr); err != nil {
				return fmt.Errorf("adi: fence: %w", err)
			}
			return nil
		}
		select {
		case <-arrived:
		case <-w.stopped.Done():
			w.smu.Lock()
			serr = w.serverErr
			w.smu.Unlock()
			if serr == nil {
				serr = fmt.Errorf("the window's server stopped: %w", ErrFinalized)
			}
			return fmt.Errorf("adi: fence: %w", serr)
		case <-ctx.Done():
			return fmt.Errorf("adi: fence: %w", ctx.Err())
		}
	}
}

// applyWaiting applies the operations waiting for this rank's window
// until none are, or ctx ends. One is applied whole once taken, whatever
// ctx does, as the server would. One this rank could not receive is lost,
// so the window can no longer count its epochs: its server is stopped
// with the error, and every later Fence fails with it.
func (w *Win) applyWaiting(ctx context.Context) error {
	whole := context.WithoutCancel(ctx)
	for ctx.Err() == nil {
		took, err := w.applyNext(whole)
		if err != nil {
			w.halt(err)
			return err
		}
		if !took {
			return nil
		}
	}
	return ctx.Err()
}

// halt stops the window's server after err, a failure to receive an
// operation, which is lost: every later Fence fails with err. The window
// is still Free's or, if never freed, Finalize's to end.
func (w *Win) halt(err error) {
	err = fmt.Errorf("the window stopped: %w", err)
	w.smu.Lock()
	w.serverErr = errors.Join(w.serverErr, err)
	w.stopCause = errors.Join(w.stopCause, err)
	w.smu.Unlock()
	w.c.w.bg.stop(w)
}

// caughtUp reports whether every operation the Fences announced has been
// applied. smu must be held.
func (w *Win) caughtUp() bool {
	for o := range w.expected {
		if w.applied[o] < w.expected[o] {
			return false
		}
	}
	return true
}

// Free ends the window after a last Fence (MPI_Win_free). It is
// collective. Inside a Lock or LockAll epoch it fails with ErrRMASync and
// leaves the window as it was, as Fence does there.
func (w *Win) Free(ctx context.Context) error {
	err := w.Fence(ctx)
	if errors.Is(err, errWinFreed) {
		return fmt.Errorf("adi: free: %w", errWinFreed)
	}
	if errors.Is(err, ErrRMASync) { // nothing sent: the window stays
		return fmt.Errorf("adi: free: %w", err)
	}
	w.mu.Lock()
	w.freed = true
	w.mu.Unlock()
	w.c.w.bg.unserve(w)
	<-w.stopped.Done()
	return errors.Join(err, w.unmap())
}

// serve applies the operations that come to this rank's window until ctx
// ends, and releases the locks of the ranks lost (releaseLost). It runs
// on a goroutine of its own, and parks while nothing comes. It looks for
// lost lockers each time something changes, not at every poll as for
// the operations waiting: on a window every rank holds (LockAll) that
// would be a probe of each rank at every poll.
func (w *Win) serve(ctx context.Context) {
	defer func() {
		w.smu.Lock()
		why := w.stopCause
		w.smu.Unlock()
		if why == nil {
			why = fmt.Errorf("the window's server stopped: %w", ErrFinalized)
		}
		w.markStopped(why)
	}()
	waiting := func() (bool, error) {
		_, ok, err := w.c.Iprobe(AnySource, rmaTag)
		return ok, err
	}
	for {
		lost, err := w.c.awaitProbeOr(ctx, waiting, w.lockerLost)
		switch {
		case err != nil:
		case lost:
			w.releaseLost(ctx)
		default:
			_, err = w.applyNext(ctx) // none if a rank in Fence took it first
		}
		if err != nil {
			if ctx.Err() == nil { // not Free or Finalize: Fence says why
				err = fmt.Errorf("the window's server stopped: %w", err)
				w.smu.Lock()
				w.serverErr = errors.Join(w.serverErr, err)
				w.stopCause = errors.Join(w.stopCause, err)
				w.smu.Unlock()
			}
			return
		}
	}
}

// applyNext applies the next operation waiting for this rank's window, if
// one is, and reports whether one was. An error is one of receiving it;
// what applying it meets goes to the next Fence.
func (w *Win) applyNext(ctx context.Context) (bool, error) {
	w.amu.Lock()
	defer w.amu.Unlock()
	m, st, ok, err := w.c.Improbe(AnySource, rmaTag)
	// A subdevice that matches on its own (sdi.FlagMatching) cannot hand
	// over a message it holds. A probe then a receive from the probed
	// source takes the same message: only amu's holder receives requests
	// on the window's context, and one origin's do not overtake each
	// other. The matched probe stays first, as it is the cheaper.
	held := errors.Is(err, errors.ErrUnsupported)
	if held {
		st, ok, err = w.c.Iprobe(AnySource, rmaTag)
	}
	if err != nil || !ok {
		return false, err
	}
	if cap(w.msg) < st.Count {
		w.msg = make([]byte, st.Count)
	}
	msg := w.msg[:st.Count]
	if held {
		_, err = w.c.Recv(ctx, msg, st.Source, rmaTag)
	} else {
		_, err = m.Recv(ctx, msg)
	}
	if err != nil {
		if ctx.Err() != nil {
			return true, err
		}
		// Its origin was lost while it came: the operation is, and the
		// next Fence says so. The window goes on serving the others,
		// whose Locks and Gets would otherwise wait for their ctx.
		w.smu.Lock()
		w.applied[st.Source]++
		w.serverErr = errors.Join(w.serverErr, fmt.Errorf("operation from rank %d lost: %w", st.Source, err))
		close(w.arrived)
		w.arrived = make(chan struct{})
		w.smu.Unlock()
		return true, nil
	}
	err = w.apply(ctx, st.Source, msg)
	w.smu.Lock()
	w.applied[st.Source]++
	if err != nil && w.serverErr == nil {
		w.serverErr = fmt.Errorf("operation from rank %d: %w", st.Source, err)
	}
	close(w.arrived)
	w.arrived = make(chan struct{})
	w.smu.Unlock()
	return true, nil
}

// apply carries out one operation from rank src.
func (w *Win) apply(ctx context.Context, src int, msg []byte) error {
	size := uint64(len(w.base))
	if w.dyn != nil {
		size = math.MaxUint64
	}
	h, payload, err := decodeRMA(msg, size)
	if err != nil {
		return err
	}
	var at []byte
	switch h.kind {
	case rmaPut, rmaAcc, rmaGetAcc, rmaCAS, rmaGet:
		if w.dyn == nil {
			at = w.base[h.offset : h.offset+h.length]
			break
		}
		// Resolved under amu, which Detach takes too: the memory stays
		// attached until the operation is done with it.
		var ok bool
		if at, ok = w.dyn.find(h.offset, h.length); !ok {
			return w.miss(ctx, src, h)
		}
	}
	switch h.kind {
	case rmaPut, rmaAcc:
		modify(h, at, payload, nil)
	case rmaGetAcc, rmaCAS:
		// Nothing else is applied between reading the old
		// contents and changing them, so the two are one atomic step for
		// every other operation on the window.
		w.scratch = modify(h, at, payload, w.scratch[:0])
		if err := w.reply.Send(ctx, w.scratch, src, int(h.tag)); err != nil {
			return fmt.Errorf("%s reply: %w", rmaName(h.kind), err)
		}
	case rmaFlush:
		// Everything src sent before has been applied: messages from one
		// origin come in order.
		if err := w.reply.Send(ctx, w.takeMissed(src), src, int(h.tag)); err != nil {
			return fmt.Errorf("flush acknowledgement: %w", err)
		}
	case rmaGet:
		if err := w.reply.Send(ctx, at, src, int(h.tag)); err != nil {
			return fmt.Errorf("get reply: %w", err)
		}
	case rmaLock:
		w.waiting = append(w.waiting, rmaHeaderFrom{h, src})
		return w.grant(ctx)
	case rmaUnlock:
		if !w.unhold(src) {
			err = fmt.Errorf("unlock by rank %d, which holds no lock", src)
		}
		// Acknowledged either way: the origin waits for it. The lock is
		// released and the next granted even if the acknowledgement
		// fails (its origin lost): the others would wait for ever.
		if serr := w.reply.Send(ctx, w.takeMissed(src), src, int(h.tag)); serr != nil {
			err = errors.Join(err, fmt.Errorf("unlock acknowledgement: %w", serr))
		}
		return errors.Join(err, w.grant(ctx))
	}
	return nil
}

// modify applies a put, accumulate, get accumulate or compare and swap
// that decodeRMA accepted to at, the window's bytes it names, and
// returns old with what at held before appended, for the two that send
// it back.
func modify(h rmaHeader, at, payload, old []byte) []byte {
	switch h.kind {
	case rmaPut:
		copy(at, payload)
	case rmaAcc:
		accumulate(reflect.Kind(h.elem), h.op, at, payload)
	case rmaGetAcc:
		old = append(old, at...) // before the change
		accumulate(reflect.Kind(h.elem), h.op, at, payload)
	case rmaCAS:
		old = append(old, at...)
		if origin, compare := payload[:h.length], payload[h.length:]; bytes.Equal(at, compare) {
			copy(at, origin)
		}
	}
	return old
}

// rmaHeaderFrom is a lock request and the rank it came from.
type rmaHeaderFrom struct {
	h   rmaHeader
	src int
}

// grant grants the waiting lock requests at the head of the queue that
// the locks held allow: an exclusive one when nobody holds the window, a
// shared one when nobody holds it exclusively. First come, first served,
// so a waiting exclusive request is not starved by later shared ones. A
// request whose rank is lost is dropped, not granted: that rank would
// never release the lock. amu must be held.
func (w *Win) grant(ctx context.Context) error {
	defer w.watchLockers()
	for len(w.waiting) > 0 {
		q := w.waiting[0]
		excl := q.h.op == lockExclusive
		if w.exclusive >= 0 || excl && len(w.shared) > 0 {
			return nil
		}
		w.waiting = w.waiting[1:]
		if excl {
			w.exclusive = q.src
		} else {
			w.shared[q.src]++
		}
		err := w.reply.Send(ctx, nil, q.src, int(q.h.tag))
		switch {
		case errors.Is(err, ErrPeerDown):
			w.unhold(q.src)
		case err != nil:
			return fmt.Errorf("lock grant to rank %d: %w", q.src, err)
		}
	}
	return nil
}

// unhold releases a lock src holds on this window, exclusive or shared,
// and reports whether it held one. amu must be held.
func (w *Win) unhold(src int) bool {
	switch {
	case w.exclusive == src:
		w.exclusive = -1
	case w.shared[src] > 0:
		if w.shared[src]--; w.shared[src] == 0 {
			delete(w.shared, src)
		}
	default:
		return false
	}
	return true
}

// watchLockers publishes the ranks that hold or wait for a lock on this
// window, for lockerLost. amu must be held.
func (w *Win) watchLockers() {
	var ranks []int
	if w.exclusive >= 0 {
		ranks = append(ranks, w.exclusive)
	}
	for r := range w.shared {
		ranks = append(ranks, r)
	}
	for _, q := range w.waiting {
		ranks = append(ranks, q.src)
	}
	if len(ranks) == 0 {
		w.lockers.Store(nil)
		return
	}
	slices.Sort(ranks)
	ranks = slices.Compact(ranks)
	w.lockers.Store(&ranks)
}

// lockerLost reports whether a rank that holds or waits for a lock on
// this window, as watchLockers last published them, is lost.
func (w *Win) lockerLost() bool {
	ranks := w.lockers.Load()
	if ranks == nil {
		return false
	}
	return slices.ContainsFunc(*ranks, w.lost)
}

// lost reports whether rank r is lost with nothing it sent to this
// window left to apply: only then does a probe for r alone fail with
// ErrPeerDown.
func (w *Win) lost(r int) bool {
	_, _, err := w.c.Iprobe(r, rmaTag)
	return errors.Is(err, ErrPeerDown)
}

// releaseLost releases the locks that lost ranks hold on this window and
// drops their requests still waiting, and grants what that frees: nobody
// else would, and every other rank's Lock of the window would wait until
// its ctx ended. What such a rank sent before it was lost, an Unlock
// say, is applied first: lost reports no rank with requests left. What
// granting meets goes to the next Fence.
func (w *Win) releaseLost(ctx context.Context) {
	w.amu.Lock()
	defer w.amu.Unlock()
	if w.exclusive >= 0 && w.lost(w.exclusive) {
		w.exclusive = -1
	}
	for r := range w.shared {
		if w.lost(r) {
			delete(w.shared, r)
		}
	}
	w.waiting = slices.DeleteFunc(w.waiting, func(q rmaHeaderFrom) bool { return w.lost(q.src) })
	if err := w.grant(ctx); err != nil {
		w.smu.Lock()
		if w.serverErr == nil {
			w.serverErr = err
		}
		w.smu.Unlock()
	}
}

// replyTag draws the tag of a reply this rank waits for.
func (w *Win) replyTag() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.nextID++
	return w.nextID % (MaxTag + 1)
}

// Lock starts a passive-target epoch on target's window (MPI_Win_lock):
// it returns once the lock is granted, exclusive or shared, while target
// takes no part. Operations on target between Lock and Unlock are
// complete at Unlock; Flush completes them sooner. A rank holds at most
// one lock on a target, and none beside LockAll's: a second is refused
// with ErrRMASync (a second exclusive lock would wait for itself). If
// ctx ends first, the request stays queued at target and holds it once
// granted; Unlock withdraws it, waiting for the grant first, so that the
// other ranks can lock target again.
func (w *Win) Lock(ctx context.Context, target int, exclusive bool) error {
	if target == ProcNull {
		return nil
	}
	if err := w.check("lock", target, 0, 0); err != nil {
		return err
	}
	w.mu.Lock()
	switch {
	case w.all != lockNone:
		w.mu.Unlock()
		return fmt.Errorf("adi: lock of rank %d's window: %w: this rank is in a LockAll epoch", target, ErrRMASync)
	case w.locks[target] != lockNone:
		w.mu.Unlock()
		return fmt.Errorf("adi: lock of rank %d's window: %w: this rank has locked it already", target, ErrRMASync)
	}
	w.locks[target] = lockWanted
	w.mu.Unlock()
	op := lockShared
	if exclusive {
		op = lockExclusive
	}
	grants, err := w.roundTrips(ctx, rmaHeader{kind: rmaLock, op: op}, []int{target})
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err == nil:
		w.locks[target] = lockHeld
		return nil
	case len(grants) > 0 && (ctx.Err() != nil || w.stopped.Err() != nil): // the grant may come yet
		w.lockGrants[target] = grants[0]
		return fmt.Errorf("adi: lock of rank %d's window: %w (the request stays queued there: Unlock withdraws it)", target, err)
	default:
		delete(w.locks, target)
		return fmt.Errorf("adi: lock of rank %d's window: %w", target, err)
	}
}

// Unlock ends the passive-target epoch on target's window
// (MPI_Win_unlock): the operations this rank started are complete, at
// target too, and the lock is released. Without a lock on target from
// Lock it fails with ErrRMASync and sends nothing. If it fails before
// the release is sent (ctx ended), the lock is still held and Unlock may
// be called again; if target is lost, the lock is gone with it.
func (w *Win) Unlock(ctx context.Context, target int) error {
	if target == ProcNull {
		return nil
	}
	if err := w.check("unlock", target, 0, 0); err != nil {
		return err
	}
	w.mu.Lock()
	was, grant := w.locks[target], w.lockGrants[target]
	if was != lockHeld && grant == nil {
		w.mu.Unlock()
		return fmt.Errorf("adi: unlock of rank %d's window: %w: this rank holds no lock on it from Lock", target, ErrRMASync)
	}
	w.locks[target] = lockReleasing
	delete(w.lockGrants, target)
	w.mu.Unlock()
	var grants []*Request
	if grant != nil {
		grants = []*Request{grant}
	}
	released, err := w.release(ctx, "unlock", []int{target}, grants)
	w.mu.Lock()
	if err != nil && !released {
		w.locks[target] = was
		if grant != nil {
			w.lockGrants[target] = grant
		}
	} else {
		delete(w.locks, target)
	}
	w.mu.Unlock()
	return err
}

// release waits for the grants of locks on targets still coming, if any,
// completes this rank's operations and releases its locks on targets. It
// reports whether the locks are released: a release went out, or none
// could as the targets are lost, and their locks with them. If not, the
// locks are still held.
func (w *Win) release(ctx context.Context, what string, targets []int, grants []*Request) (released bool, err error) {
	if err := w.waitAll(ctx, grants...); err != nil {
		return false, fmt.Errorf("adi: %s: waiting for the lock's grant: %w", what, err)
	}
	// FlushLocal, but operations that failed or, on a dynamic window,
	// missed their memory do not keep the locks: they are reported with
	// the release, those on targets only.
	w.mu.Lock()
	pending := slices.Clone(w.pending)
	w.mu.Unlock()
	missed, err := w.waitMissed(ctx, pending, targets)
	if err != nil {
		return false, fmt.Errorf("adi: %s: flush local: %w", what, err)
	}
	// The acknowledgements, once they come, also record that the
	// targets applied this rank's puts and accumulates (settle).
	answers, reported, err := w.roundTripsMissed(ctx, rmaHeader{kind: rmaUnlock}, targets)
	if err != nil {
		// Kept, a lost target's lock would fail every later Unlock with
		// the loss again, and Fence with ErrRMASync: reported here, once.
		lost := ctx.Err() == nil && errors.Is(err, ErrPeerDown)
		return len(answers) > 0 || lost, fmt.Errorf("adi: %s: %w", what, errors.Join(missed, reported, err))
	}
	if err := errors.Join(missed, reported); err != nil {
		return true, fmt.Errorf("adi: %s: %w", what, err)
	}
	return true, nil
}

// Flush completes every operation this rank started on the window
// before the call as FlushAll does, but at one target only
// (MPI_Win_flush): it asks target alone to acknowledge, if this rank
// wrote to it since its last acknowledgement. The local part waits for
// the operations on every target, which MPI allows: a flush may complete
// more than it must.
func (w *Win) Flush(ctx context.Context, target int) error {
	if target == ProcNull {
		return nil
	}
	if err := w.check("flush", target, 0, 0); err != nil {
		return err
	}
	return w.flush(ctx, "flush", target)
}

// roundTrips sends a request h to every target and waits for every
// answer. It returns the answers' requests even when it fails: those
// sent may still be answered (a lock granted later must be withdrawn).
// On a dynamic window, the answers to unlock and flush requests carry
// the target's report of this rank's puts and accumulates that found no
// memory attached: roundTrips keeps those (ErrNoRegion) for the wait
// that follows it in a flush, which returns them once it has completed
// the rest.
func (w *Win) roundTrips(ctx context.Context, h rmaHeader, targets []int) ([]*Request, error) {
	answers, missed, err := w.roundTripsMissed(ctx, h, targets)
	if missed != nil {
		w.mu.Lock()
		w.reported = append(w.reported, missed)
		w.mu.Unlock()
	}
	return answers, err
}

// roundTripsMissed is roundTrips that returns what the answers report
// missed (ErrNoRegion) apart from its errors, which may come together
// when ctx ends. An unlock or flush waits as well for the answers to
// earlier ones to targets that a call whose ctx ended left (see
// [leftover]): the target applies those requests, and this one after
// them, so they come.
func (w *Win) roundTripsMissed(ctx context.Context, h rmaHeader, targets []int) (answers []*Request, missed, err error) {
	asked, err := w.ask(h, targets)
	answers = make([]*Request, len(asked))
	for i, l := range asked {
		answers[i] = l.q
	}
	if h.kind == rmaLock { // Lock and LockAll keep their grants themselves
		if err == nil {
			err = w.waitAll(ctx, answers...)
		}
		return answers, nil, err
	}
	// A request that could not be sent fails the call, but those sent
	// are read all the same: the live targets answer them, and a flush
	// that left them unread completed nothing there.
	missed, werr := w.settle(ctx, append(w.takeLeftovers(targets), asked...), true)
	return answers, missed, errors.Join(err, werr)
}

// leftover is the answer to a flush or unlock request, or a target's
// report at a Fence (kind 0), that a call stopped waiting for when its
// ctx ended. The target has taken its record of this rank's misses out
// and sent it, or will: the window keeps the answer so that a later call
// reads the report, and returns it, rather than no call at all. Later
// flushes and unlocks of the target, and Fence, wait for the answers to
// requests (w.leftovers), which the target applies whatever happens;
// every wait tests them all. A Fence's report (w.reports) is read by the
// next Fence alone, which waits for it: the target's next Fence sends
// one (see exchangeMisses).
type leftover struct {
	q      *Request
	report []byte // where the report comes: missReportSize bytes, fenceReportSize for a Fence's; nil on a window that is not dynamic
	target int
	kind   byte   // rmaFlush, rmaUnlock, or 0 for a Fence's report
	writes uint64 // a request's: the puts and accumulates sent target before it, applied once it is answered
}

// waitLeftovers waits for the requests of ls, or until ctx ends or the
// server stops (waitAll).
func (w *Win) waitLeftovers(ctx context.Context, ls []leftover) error {
	qs := make([]*Request, len(ls))
	for i, l := range ls {
		qs[i] = l.q
	}
	return w.waitAll(ctx, qs...)
}

// what names l in errors.
func (l leftover) what() string {
	if l.kind == 0 {
		return "fence report"
	}
	return rmaName(l.kind) + " acknowledgement"
}

// keep keeps ls, answers not read yet, for a later call: Fence reports
// for the next Fence, the others for the next wait.
func (w *Win) keep(ls []leftover) {
	if len(ls) == 0 {
		return
	}
	w.mu.Lock()
	for _, l := range ls {
		if l.kind == 0 {
			w.reports = append(w.reports, l)
		} else {
			w.leftovers = append(w.leftovers, l)
		}
	}
	w.mu.Unlock()
}

// takeLeftovers takes the kept answers to flush and unlock requests sent
// to targets: none if there are none, as for a flush with nothing to
// flush, which must not wait for the answers of targets it does not ask.
func (w *Win) takeLeftovers(targets []int) []leftover {
	w.mu.Lock()
	defer w.mu.Unlock()
	var took []leftover
	w.leftovers = slices.DeleteFunc(w.leftovers, func(l leftover) bool {
		if !slices.Contains(targets, l.target) {
			return false
		}
		took = append(took, l)
		return true
	})
	return took
}

// settle reads the answers ls: if block is set, it waits for them until
// ctx ends first, and otherwise takes those that have come. It returns
// the misses they report (ErrNoRegion), and errors of answers that
// failed or, when ctx ended, ctx's; the answers that have not come are
// kept. An answer to a flush or unlock request also says its target
// applied the puts and accumulates sent before it.
func (w *Win) settle(ctx context.Context, ls []leftover, block bool) (missed, err error) {
	if len(ls) == 0 {
		return nil, nil
	}
	var werr error
	if block {
		werr = w.waitLeftovers(ctx, ls)
	}
	var misses, errs []error
	var kept []leftover
	for _, l := range ls {
		done, miss, _, err := w.read(l)
		switch {
		case !done:
			kept = append(kept, l)
		case err != nil:
			errs = append(errs, err)
		case miss != nil:
			misses = append(misses, miss)
		}
	}
	w.keep(kept)
	if len(kept) > 0 && block {
		errs = append(errs, werr)
	}
	return errors.Join(misses...), errors.Join(errs...)
}

// read tests l and, once its answer came (done), reads it: the miss it
// reports (ErrNoRegion), if any, and for a Fence's report the epoch of
// the Fence that sent it; err is the answer's failure or garbling. An answer to a flush or unlock request also says its
// target applied the puts and accumulates sent before it, garbled or
// not: the target answers once it has.
func (w *Win) read(l leftover) (done bool, miss error, epoch uint64, err error) {
	st, done, err := l.q.Test()
	switch {
	case !done:
		return false, nil, 0, nil
	case err != nil:
		if l.kind != 0 {
			w.giveUp(l.target, l.writes, err)
		}
		return true, nil, 0, fmt.Errorf("rank %d's %s: %w", l.target, l.what(), err)
	}
	var m missReport
	if l.kind == 0 {
		epoch, m, err = decodeFenceReport(l.report[:st.Count])
	} else {
		m, err = decodeMissReport(l.report[:st.Count])
		w.mu.Lock()
		w.acked[l.target] = max(w.acked[l.target], l.writes)
		w.mu.Unlock()
	}
	switch {
	case err != nil:
		return true, nil, 0, fmt.Errorf("rank %d's %s: %w", l.target, l.what(), err)
	case m.count > 0:
		miss = m.err(l.target)
	}
	return true, miss, epoch, nil
}

// ask sends a request h (lock, unlock, flush) to every target and
// returns their answers, and on a dynamic window, for unlock and flush,
// where the reports of missed operations come. If a send fails, it
// returns the answers of those sent, with the errors. A lock request
// stops at the first failure, the answers being those of the targets
// before it (LockAll counts on that): it fails, and the fewer requests
// it leaves queued the better. An unlock or flush request goes on to the
// targets after it: an unlock that stopped at a lost rank left this
// rank's locks on the live ranks after it held for ever.
func (w *Win) ask(h rmaHeader, targets []int) ([]leftover, error) {
	var reports []byte
	if w.dyn != nil && (h.kind == rmaUnlock || h.kind == rmaFlush) {
		reports = make([]byte, len(targets)*missReportSize)
	}
	asked := make([]leftover, 0, len(targets))
	var errs []error
	for i, t := range targets {
		var dst []byte
		if reports != nil {
			dst = reports[i*missReportSize : (i+1)*missReportSize]
		}
		// Counted before the request is sent: each of those was sent
		// before it, so the target applies them before it answers.
		w.mu.Lock()
		writes := w.writes[t]
		w.mu.Unlock()
		q, err := w.fetch(h, nil, dst, t)
		if err != nil {
			errs = append(errs, fmt.Errorf("to rank %d: %w", t, err))
			if h.kind == rmaLock {
				break
			}
			w.giveUp(t, writes, err)
			continue
		}
		asked = append(asked, leftover{q: q, report: dst, target: t, kind: h.kind, writes: writes})
	}
	return asked, errors.Join(errs...)
}

// giveUp takes writes, the puts and accumulates sent to target before a
// flush or unlock request that failed with err, as acknowledged if err
// says target is lost: it never will acknowledge them, and every later
// flush would ask it again and fail with the loss this err reports.
func (w *Win) giveUp(target int, writes uint64, err error) {
	if !errors.Is(err, ErrPeerDown) {
		return
	}
	w.mu.Lock()
	w.acked[target] = max(w.acked[target], writes)
	w.mu.Unlock()
}

// ack records that the puts and accumulates to targets counted in
// writes, a copy of w.writes, are applied: targets acknowledged after
// all of them.
func (w *Win) ack(writes []uint64, targets []int) {
	w.mu.Lock()
	for _, t := range targets {
		w.acked[t] = max(w.acked[t], writes[t])
	}
	w.mu.Unlock()
}

// checkAcc checks that op applies to elements of kind and that n bytes
// hold whole elements. AccNoOp is allowed only if fetch is set
// (GetAccumulate, FetchAndOp).
func checkAcc(kind reflect.Kind, op AccOp, n int, fetch bool) error {
	size, integer, err := kindSize(kind)
	if err != nil {
		return err
	}
	switch {
	case op < AccReplace || op > AccNoOp:
		return fmt.Errorf("unknown accumulate operation %d", op)
	case op == AccNoOp && !fetch:
		return errors.New("AccNoOp is for GetAccumulate and FetchAndOp, not Accumulate")
	case op >= AccBAnd && op <= AccBXor && !integer:
		return fmt.Errorf("bitwise accumulate of %v elements", kind)
	case n%size != 0:
		return fmt.Errorf("%d bytes are not whole %d-byte elements", n, size)
	}
	return nil
}

// kindSize is the size of an element of kind, and whether it is an
// integer, for the kinds that one-sided operations combine.
func kindSize(kind reflect.Kind) (size int, integer bool, err error) {
	switch kind {
	case reflect.Int8, reflect.Uint8:
		size, integer = 1, true
	case reflect.Int16, reflect.Uint16:
		size, integer = 2, true
	case reflect.Int32, reflect.Uint32:
		size, integer = 4, true
	case reflect.Int64, reflect.Uint64, reflect.Int, reflect.Uint, reflect.Uintptr:
		size, integer = 8, true
	case reflect.Float32:
		size = 4
	case reflect.Float64:
		size = 8
	default:
		return 0, false, fmt.Errorf("elements of kind %v cannot be accumulated", kind)
	}
	if (kind == reflect.Int || kind == reflect.Uint || kind == reflect.Uintptr) && reflect.TypeFor[int]().Size() != 8 {
		return 0, false, fmt.Errorf("elements of kind %v are not 8 bytes here", kind)
	}
	return size, integer, nil
}

// accumulate applies op to the elements of kind in at (the window) and
// in (the origin's), which checkAcc accepted. The elements are copied
// into aligned slices: a window offset need not be aligned.
func accumulate(kind reflect.Kind, op AccOp, at, in []byte) {
	switch kind {
	case reflect.Int8:
		accInt[int8](op, at, in)
	case reflect.Uint8:
		accInt[uint8](op, at, in)
	case reflect.Int16:
		accInt[int16](op, at, in)
	case reflect.Uint16:
		accInt[uint16](op, at, in)
	case reflect.Int32:
		accInt[int32](op, at, in)
	case reflect.Uint32:
		accInt[uint32](op, at, in)
	case reflect.Int64, reflect.Int:
		accInt[int64](op, at, in)
	case reflect.Uint64, reflect.Uint, reflect.Uintptr:
		accInt[uint64](op, at, in)
	case reflect.Float32:
		accReal[float32](op, at, in)
	case reflect.Float64:
		accReal[float64](op, at, in)
	}
}

func accInt[T Integer](op AccOp, at, in []byte) {
	switch op {
	case AccBAnd:
		accWith(BAnd[T], at, in)
	case AccBOr:
		accWith(BOr[T], at, in)
	case AccBXor:
		accWith(BXor[T], at, in)
	default:
		accReal[T](op, at, in)
	}
}

func accReal[T Real](op AccOp, at, in []byte) {
	switch op {
	case AccReplace:
		copy(at, in)
	case AccSum:
		accWith(Sum[T], at, in)
	case AccProd:
		accWith(Prod[T], at, in)
	case AccMax:
		accWith(Max[T], at, in)
	case AccMin:
		accWith(Min[T], at, in)
	}
}

func accWith[T Real](f Op[T], at, in []byte) {
	n := len(in) / elemSize[T]()
	a, b := make([]T, n), make([]T, n)
	copy(Bytes(a), at)
	copy(Bytes(b), in)
	f(a, b)
	copy(at, Bytes(a))
}
