package adi

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/hpc-multidevice/multidevice/multidevice"
)

// Request is a nonblocking operation. Its methods are safe for concurrent
// use, except Start, which changes the request.
type Request struct {
	r multidevice.Request // by value: one allocation per operation
	c *Comm
	// peer and recv describe the operation r carries, for its errors:
	// the rank of c it was started with (a send's destination, a
	// receive's source; AnySource for a probed message's receive) and
	// whether it is a receive.
	peer int
	recv bool
	// local is set for an operation that the multidevice does not carry
	// (a nonblocking collective, nbcoll.go; one with ProcNull; a
	// persistent request not started), which uses no r.
	local *localOp
	// persist is set for a persistent request: what Start starts.
	persist *persistent
	// part is set for a partitioned request (partitioned.go), which
	// Start starts too.
	part *partitioned
	// window is set for a one-sided operation's request (win.go): the
	// window's flushes wait for it as well, so it can be neither
	// cancelled, which would leave a target's reply with nowhere to go,
	// nor restarted.
	window bool
	// sr is set for an Isendrecv (sendrecv_nb.go): r is its receive, and
	// sr its send. Test and Wait look at both.
	sr *sendrecvOp
	// reported is set once Wait, Test or one of the Any, Some and All
	// calls has reported the completed round of a persistent or
	// partitioned request, and cleared by Start: MPI makes the request
	// inactive then, so that a loop calling WaitAny once per request sees
	// each round once. Atomic because Wait and Test may run concurrently.
	reported atomic.Bool
}

// localOp is an operation of this package's own: done is closed once st
// and err are set.
type localOp struct {
	done chan struct{}
	st   Status
	err  error
}

// Operations with ProcNull complete at once; these are shared, never
// changed.
var (
	nullSend = doneOp(Status{})
	nullRecv = doneOp(Status{Source: ProcNull, Tag: AnyTag})
)

func doneOp(st Status) *localOp {
	o := &localOp{done: make(chan struct{}), st: st}
	close(o.done)
	return o
}

// start readies q for a new point-to-point operation: one that held a
// local operation or an Isendrecv may take it once that is over.
func (q *Request) start() error {
	if q == nil {
		return errNilRequest
	}
	if q.window {
		return errWindowRequest
	}
	if q.sr != nil {
		if !q.done() {
			return fmt.Errorf("adi: %w", ErrRequestBusy)
		}
		q.sr, q.c = nil, nil
	}
	if q.local != nil {
		if !q.local.over() {
			return fmt.Errorf("adi: %w", ErrRequestBusy)
		}
		q.local, q.c = nil, nil
	}
	return nil
}

// startLocal puts o, a local operation, into q, unless q's own operation
// is still in flight.
func (q *Request) startLocal(c *Comm, o *localOp) error {
	if q == nil {
		return errNilRequest
	}
	if q.window {
		return errWindowRequest
	}
	if q.c != nil && !q.done() {
		return fmt.Errorf("adi: %w", ErrRequestBusy)
	}
	q.c, q.local, q.sr = c, o, nil
	return nil
}

// over reports whether the operation finished.
func (o *localOp) over() bool {
	select {
	case <-o.done:
		return true
	default:
		return false
	}
}

// done reports whether q's operation completed (q holds one).
func (q *Request) done() bool {
	if q.reported.Load() {
		return true
	}
	if q.sr != nil {
		_, done, _ := q.sr.test(q)
		return done
	}
	if q.local != nil {
		return q.local.over()
	}
	_, done, _ := q.r.Test()
	return done
}

// errNotStarted is what the methods of a Request that holds no operation
// return: the zero value, or one whose last start failed.
var errNotStarted = errors.New("adi: request holds no operation (never started, or its start failed)")

// errNilRequest is what a nil *Request's methods return, and the Into
// calls given one: an operation that returned an error returned no
// request, and a program that went on with it finds out here rather
// than in a panic.
var errNilRequest = errors.New("adi: nil request (the call that should have made it failed?)")

// refused records that an operation was refused for its arguments before
// anything started in q: q's operation still in flight keeps it (the call
// was wrong twice); a finished one is not q's result any more, so that
// Wait and Test do not report it as this call's.
func (q *Request) refused() {
	if q != nil && !q.window && q.c != nil && q.done() {
		q.c = nil
	}
}

// failedStart records that starting an operation in q failed: unless q was
// refused because it is still busy, it holds no operation any more.
func (q *Request) failedStart(err error) {
	if !errors.Is(err, ErrRequestBusy) {
		q.c = nil
	}
}

// Wait blocks until the request completes or ctx is done. The calling
// goroutine polls for a short while (up to a few milliseconds) before it
// parks, so a message that comes soon is handled without a wake-up. On
// ctx's end the request stays pending (Cancel it, or Wait again).
func (q *Request) Wait(ctx context.Context) (Status, error) {
	if q == nil {
		return Status{}, errNilRequest
	}
	if q.reported.Load() {
		return Status{}, nil // inactive: see reported
	}
	st, err := q.wait(ctx)
	// A round completes once: the call that reports it claims it, and a
	// Wait or Test beside it gets the inactive status. A Wait that ended
	// with its ctx reported nothing, even if the round completed since.
	ended := ctx.Err() != nil && errors.Is(err, ctx.Err())
	if q.restartable() && !ended && !q.reported.CompareAndSwap(false, true) {
		return Status{}, nil
	}
	return st, err
}

// restartable reports whether Start may start q again, so that reporting
// its round makes it inactive.
func (q *Request) restartable() bool { return q.persist != nil || q.part != nil }

func (q *Request) wait(ctx context.Context) (Status, error) {
	if q.c == nil {
		return Status{}, errNotStarted
	}
	if q.sr != nil {
		return q.sr.wait(ctx, q)
	}
	if q.local != nil {
		// Completion first: with both ready, select picks at random, and
		// a finished operation must report itself whatever ctx says, as
		// the point-to-point path does.
		if q.local.over() {
			return q.local.st, q.local.err
		}
		select {
		case <-q.local.done:
			return q.local.st, q.local.err
		case <-ctx.Done():
			return Status{}, fmt.Errorf("adi: wait: %w", ctx.Err())
		}
	}
	st, err := q.r.Wait(ctx)
	if _, done, _ := q.r.Test(); !done {
		return Status{}, fmt.Errorf("adi: wait: %w", ctx.Err())
	}
	return q.result(st, err)
}

// result is the result of the operation r carries, in c's ranks: the
// status's source translated, and an error that names the rank of c the
// operation was with, where the device's own words number ranks in the
// world.
func (q *Request) result(st multidevice.Status, err error) (Status, error) {
	cst := q.c.status(st)
	switch {
	case err == nil:
	case q.recv:
		err = fmt.Errorf("adi: receive from %s: %w", q.c.fromName(q.peer, st), err)
	default:
		err = fmt.Errorf("adi: send to %s: %w", q.c.rankName(q.peer), err)
	}
	return cst, err
}

// Test reports whether the request completed, with its status if so.
func (q *Request) Test() (Status, bool, error) {
	if q == nil {
		return Status{}, true, errNilRequest
	}
	if q.reported.Load() {
		return Status{}, true, nil // inactive: see reported
	}
	st, done, err := q.test()
	if done && q.restartable() && !q.reported.CompareAndSwap(false, true) {
		return Status{}, true, nil // a Wait or Test beside this one reported it
	}
	return st, done, err
}

func (q *Request) test() (Status, bool, error) {
	if q.c == nil {
		return Status{}, true, errNotStarted
	}
	if q.sr != nil {
		return q.sr.test(q)
	}
	if q.local != nil {
		if !q.local.over() {
			return Status{}, false, nil
		}
		return q.local.st, true, q.local.err
	}
	st, done, err := q.r.Test()
	if !done {
		return Status{}, false, nil
	}
	cst, err := q.result(st, err)
	return cst, true, err
}

// reusable refuses a request an Into call may not take: a one-sided
// operation's, which its window keeps, and a persistent or partitioned
// one, whose operation Start starts and the call would replace. A nil q
// is the Into calls' to refuse.
func (q *Request) reusable() error {
	switch {
	case q == nil:
	case q.window: // before the arguments: refused() would drop its result
		return errWindowRequest
	case q.persist != nil || q.part != nil:
		return errPersistentRequest
	}
	return nil
}

// errPersistentRequest: a persistent or partitioned request given to
// IsendInto or IrecvInto.
var errPersistentRequest = fmt.Errorf("adi: %w: the request is persistent or partitioned; Start starts it", ErrRequestBusy)

// errWindowRequest: a one-sided operation's request given to IsendInto
// or IrecvInto.
var errWindowRequest = fmt.Errorf("adi: %w: the request is a one-sided operation's, kept by its window", ErrRequestBusy)

// Cancel asks to cancel the request. A receive that has not matched yet
// completes with ErrCanceled and Status.Cancelled; a matched receive, a
// send, a collective, a partitioned round or a one-sided operation
// completes normally (as MPI allows). Of an Isendrecv only the receive is cancelled: the request
// completes once its send is done, which may have delivered its message,
// and counts as cancelled only if its receive was (see Comm.Isendrecv).
func (q *Request) Cancel() {
	switch {
	case q == nil || q.c == nil || q.window || q.local != nil:
	case q.sr != nil:
		if q.sr.hasRecv {
			q.c.w.dev.Cancel(&q.r)
		}
	default:
		q.c.w.dev.Cancel(&q.r)
	}
}

// WaitAll waits for every request. It returns all statuses and the errors
// joined, each naming the request's index. Nil entries are skipped. As
// errors.Join's, the error holds every request's (errors.Is finds each),
// but its message spells out each distinct error once, with the first
// few requests it failed, and only counts beyond a few such errors: it
// stays short when hundreds of requests fail for one cause. TestAll,
// TestSome and StartAll join theirs the same way.
//
// The calling goroutine drives progress for all of them at once before it
// waits for each in turn, so that frames queued for several requests keep
// moving without a hand-over to a background goroutine between requests.
func WaitAll(ctx context.Context, reqs ...*Request) ([]Status, error) {
	sts := make([]Status, len(reqs))
	return sts, WaitAllInto(ctx, sts, reqs...)
}

// WaitAllInto is WaitAll with the statuses written into sts, which holds
// one per request, or not kept at all when sts is nil (MPI's
// MPI_STATUSES_IGNORE). A loop that streams messages through a window of
// reused requests (IsendInto, IrecvInto) then waits without allocating.
func WaitAllInto(ctx context.Context, sts []Status, reqs ...*Request) error {
	if sts != nil && len(sts) != len(reqs) {
		return fmt.Errorf("adi: wait all: %d statuses for %d requests", len(sts), len(reqs))
	}
	var dev *multidevice.Device
	for _, q := range reqs {
		if q != nil && q.c != nil {
			dev = q.c.w.dev
			break
		}
	}
	if dev != nil {
		next := 0
		dev.Progress(func() bool {
			for next < len(reqs) {
				if q := reqs[next]; q != nil && q.c != nil && !q.done() {
					return false
				}
				next++
			}
			return true
		})
	}
	var errs requestErrors
	for i, q := range reqs {
		if q == nil { // MPI_REQUEST_NULL: nothing to wait for
			if sts != nil {
				sts[i] = Status{}
			}
			continue
		}
		// Progress above leaves most requests done: read those directly,
		// and translate a status only when the caller keeps it.
		var st Status
		mst, done, err := q.r.Test()
		switch {
		case q.c == nil || q.local != nil || q.sr != nil || q.restartable() || !done:
			st, err = q.Wait(ctx)
		case sts != nil || err != nil:
			st, err = q.result(mst, err)
		}
		if sts != nil {
			sts[i] = st
		}
		if err != nil {
			// Only ctx's end stops the wait: a request's own error under
			// an ended ctx (it had completed) is reported as any other.
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				if len(errs) == 0 {
					return err
				}
				// The errors before it are reported once: a persistent
				// request's Wait above claimed its round's.
				return append(errs, &requestError{i, err})
			}
			errs = append(errs, &requestError{i, err})
		}
	}
	return errs.join()
}

// WaitAny waits until one of the requests completes and returns its index.
// Nil entries, requests never started and persistent ones not started now
// are skipped; with none left it returns -1.
func WaitAny(ctx context.Context, reqs ...*Request) (int, Status, error) {
	i := -1 // if no request is left
	var st Status
	var err error
	if werr := await(ctx, "wait any", reqs, func() (ok bool) {
		i, st, ok, err = TestAny(reqs...)
		return ok
	}); werr != nil {
		return -1, Status{}, werr
	}
	return i, st, err
}

// WaitSome waits until at least one of the requests completes and returns
// the indexes of all that have, with their statuses (MPI_Waitsome). Nil
// entries are skipped, so a caller sets those it has dealt with to nil, and
// so are requests not started (see WaitAny); with none left it returns no
// index.
func WaitSome(ctx context.Context, reqs ...*Request) ([]int, []Status, error) {
	var idx []int
	var sts []Status
	var err error
	if werr := await(ctx, "wait some", reqs, func() bool {
		idx, sts, err = TestSome(reqs...)
		return len(idx) > 0
	}); werr != nil {
		return nil, nil, werr
	}
	return idx, sts, err
}

// await drives progress and waits until done reports true, or no request
// of reqs is left (it returns nil then too), or ctx ends.
func await(ctx context.Context, what string, reqs []*Request, done func() bool) error {
	for {
		var changed <-chan struct{}
		var dev *multidevice.Device
		for _, q := range reqs {
			if q.active() {
				dev = q.c.w.dev
				changed = dev.Changed()
				break
			}
		}
		if changed == nil || done() {
			return nil
		}
		if dev.Progress(done) {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("adi: %s: %w", what, ctx.Err())
		}
	}
}

// TestAny reports the first completed request, if any. With no active
// request (see WaitAny) it reports index -1 and true, as MPI_Testany
// reports MPI_UNDEFINED, so that a loop testing until true ends.
func TestAny(reqs ...*Request) (int, Status, bool, error) {
	active := false
	for i, q := range reqs {
		if !q.active() {
			continue
		}
		active = true
		if st, ok, err := q.Test(); ok {
			return i, st, true, err
		}
	}
	return -1, Status{}, !active, nil
}

// TestSome returns the indexes and statuses of the requests that have
// completed, none if none has (MPI_Testsome), and their errors joined,
// each naming its request's index. Nil entries and requests not started
// are skipped.
func TestSome(reqs ...*Request) ([]int, []Status, error) {
	var idx []int
	var sts []Status
	var errs requestErrors
	for i, q := range reqs {
		if !q.active() {
			continue
		}
		if st, ok, err := q.Test(); ok {
			idx, sts = append(idx, i), append(sts, st)
			if err != nil {
				errs = append(errs, &requestError{i, err})
			}
		}
	}
	return idx, sts, errs.join()
}

// TestAll reports whether every request has completed (MPI_Testall); if
// so, it writes their statuses into sts (one per request, or none kept
// when sts is nil) and returns their errors joined, each naming its
// request's index. Nil entries count as completed, with the zero status.
func TestAll(sts []Status, reqs ...*Request) (bool, error) {
	if sts != nil && len(sts) != len(reqs) {
		return false, fmt.Errorf("adi: test all: %d statuses for %d requests", len(sts), len(reqs))
	}
	for _, q := range reqs {
		if q != nil && q.c != nil && !q.done() {
			return false, nil
		}
	}
	var errs requestErrors
	for i, q := range reqs {
		if q == nil { // as WaitAllInto: the caller's slice may hold an old status
			if sts != nil {
				sts[i] = Status{}
			}
			continue
		}
		st, _, err := q.Test()
		if sts != nil {
			sts[i] = st
		}
		if err != nil {
			errs = append(errs, &requestError{i, err})
		}
	}
	return true, errs.join()
}

// requestError is the error of one request among several, naming its
// index.
type requestError struct {
	index int
	err   error
}

func (e *requestError) Error() string { return fmt.Sprintf("request %d: %v", e.index, e.err) }

func (e *requestError) Unwrap() error { return e.err }

// requestErrors joins the errors of the requests that failed in one
// call over several (WaitAll, TestAll, TestSome, StartAll). errors.Is
// and errors.As look into every one, as into errors.Join's, but the
// message names each distinct error once, with the requests it failed,
// and at most maxErrorCauses of them: hundreds of requests to one lost
// rank once made it tens of kilobytes, a line each.
type requestErrors []*requestError

// maxErrorCauses bounds the distinct errors a requestErrors message
// spells out; the others are only counted.
const maxErrorCauses = 4

// maxErrorIndexes bounds the request indexes a message lists for one
// error; the others are only counted.
const maxErrorIndexes = 3

// join returns errs as one error, or nil if there is none.
func (errs requestErrors) join() error {
	if len(errs) == 0 {
		return nil
	}
	return errs
}

func (errs requestErrors) Error() string {
	type cause struct {
		msg     string
		indexes []int // the first maxErrorIndexes
		n       int
	}
	var causes []*cause
	byMsg := map[string]*cause{}
	for _, e := range errs {
		msg := e.err.Error()
		c := byMsg[msg]
		if c == nil {
			c = &cause{msg: msg}
			byMsg[msg] = c
			causes = append(causes, c)
		}
		if c.n++; len(c.indexes) < maxErrorIndexes {
			c.indexes = append(c.indexes, e.index)
		}
	}
	var b strings.Builder
	for i, c := range causes[:min(len(causes), maxErrorCauses)] {
		if i > 0 {
			b.WriteByte('\n')
		}
		if c.n == 1 {
			fmt.Fprintf(&b, "request %d: %s", c.indexes[0], c.msg)
			continue
		}
		b.WriteString("requests ")
		for j, index := range c.indexes {
			switch {
			case j == 0:
			case j == len(c.indexes)-1 && c.n == len(c.indexes):
				b.WriteString(" and ")
			default:
				b.WriteString(", ")
			}
			b.WriteString(strconv.Itoa(index))
		}
		if more := c.n - len(c.indexes); more > 0 {
			fmt.Fprintf(&b, " and %d more", more)
		}
		fmt.Fprintf(&b, ": %s", c.msg)
	}
	if len(causes) > maxErrorCauses {
		n := 0
		for _, c := range causes[maxErrorCauses:] {
			n += c.n
		}
		fmt.Fprintf(&b, "\nand %d more requests failed in %d other ways", n, len(causes)-maxErrorCauses)
	}
	return b.String()
}

// Unwrap returns every request's error, as errors.Join's does.
func (errs requestErrors) Unwrap() []error {
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = e
	}
	return out
}

// persistent is what a persistent request starts each time: its
// operation's arguments, fixed at SendInit or RecvInit, or for a
// persistent collective (collinit.go) the nonblocking collective to start.
type persistent struct {
	send, sync bool
	buf        []byte
	peer, tag  int
	coll       func() (*Request, error)
}

// active reports whether q holds an operation that WaitAny, WaitSome,
// TestAny and TestSome wait for: not nil (MPI_REQUEST_NULL), started, and
// not a persistent request between its operations (not started, or its
// round reported), which MPI's skip as they do null ones.
func (q *Request) active() bool {
	return q != nil && q.c != nil && q.local != inactive && !q.reported.Load()
}

// inactive is the status of a persistent request between its operations:
// Wait and Test return at once, with an empty status (as MPI's do).
var inactive = doneOp(Status{})

// SendInit makes a persistent standard-mode send of buf to dest with tag
// (MPI_Send_init): Start sends it, as many times as the program likes,
// each time with buf's contents then; Wait or Test completes each. Until
// the first Start, and again once Wait, Test, WaitAny or another of the
// Any, Some and All calls has reported a round, the request is inactive:
// Wait and Test return an empty status at once, and WaitAny and the like
// skip it, as MPI's do. SsendInit makes a synchronous
// one, RecvInit a receive.
func (c *Comm) SendInit(buf []byte, dest, tag int) (*Request, error) {
	return c.persistent(&persistent{send: true, buf: buf, peer: dest, tag: tag})
}

// SsendInit makes a persistent synchronous-mode send; see SendInit.
func (c *Comm) SsendInit(buf []byte, dest, tag int) (*Request, error) {
	return c.persistent(&persistent{send: true, sync: true, buf: buf, peer: dest, tag: tag})
}

// RecvInit makes a persistent receive into buf from source (or
// AnySource) with tag (or AnyTag) (MPI_Recv_init); see SendInit.
func (c *Comm) RecvInit(buf []byte, source, tag int) (*Request, error) {
	return c.persistent(&persistent{buf: buf, peer: source, tag: tag})
}

func (c *Comm) persistent(p *persistent) (*Request, error) {
	var err error
	switch {
	case p.send && p.peer != ProcNull:
		_, err = c.dest(p.peer)
	case !p.send && p.peer != ProcNull:
		_, err = c.source(p.peer)
	}
	if err == nil {
		err = checkTag(p.tag, !p.send)
	}
	if err != nil {
		return nil, err
	}
	return &Request{c: c, local: inactive, persist: p}, nil
}

// Start starts a persistent request's operation (MPI_Start). A request
// whose last operation has not completed is refused with ErrRequestBusy.
// Start changes the request, so it must not run concurrently with any
// other method of the same request (as MPI says for MPI_Start too).
func (q *Request) Start() error {
	if q == nil {
		return fmt.Errorf("adi: start: %w", errNilRequest)
	}
	q.reported.Store(false) // a new round, or the last one still running
	if q.part != nil {
		return q.startPartitioned()
	}
	p, c := q.persist, q.c
	if p == nil {
		return errors.New("adi: start: not a persistent request (SendInit, SsendInit, RecvInit, PsendInit, PrecvInit, or a collective's Init)")
	}
	if p.coll != nil {
		return q.startCollective()
	}
	var err error
	if p.send {
		err = c.isendInto(q, p.buf, p.peer, p.tag, p.sync)
	} else {
		err = c.irecvInto(q, p.buf, p.peer, p.tag)
	}
	if err != nil && !errors.Is(err, ErrRequestBusy) {
		q.c, q.local = c, inactive // still the program's persistent request
	}
	return err
}

// startCollective starts q's persistent collective as the next
// collective of its communicator.
func (q *Request) startCollective() error {
	if !q.done() {
		return fmt.Errorf("adi: start: %w", ErrRequestBusy)
	}
	r, err := q.persist.coll()
	if err != nil {
		q.local = inactive // not the last round's result
		return fmt.Errorf("adi: start: %w", err)
	}
	q.local = r.local
	return nil
}

// StartAll starts every request, as Start (MPI_Startall), and returns the
// errors joined, each naming its request's index.
func StartAll(reqs ...*Request) error {
	var errs requestErrors
	for i, q := range reqs {
		if err := q.Start(); err != nil {
			errs = append(errs, &requestError{i, err})
		}
	}
	return errs.join()
}
