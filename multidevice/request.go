package multidevice

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// AnySource and AnyTag are the receive wildcards, in world ranks.
const (
	AnySource = -1
	AnyTag    = -1
)

// Status describes a completed receive or a probed message. Source is a
// world rank. A receive that fails reports the source and tag of the
// message it matched or, before a match, those it was posted with
// (wildcards included), and Count 0.
type Status struct {
	Source    int
	Tag       int
	Count     int // bytes received (or, from a probe, the message length)
	Cancelled bool
}

// Request states. A request is complete for readers only in reqDone: the
// completer writes status and err between winning reqPending->reqCompleting
// and storing reqDone (or, when nobody can race it, before its one
// reqPending->reqDone; see completeOwned). reqWaiter is or'ed into
// reqPending by Done: somebody selects on the channel, so the completer
// must close it. One word for both saves a completion a locked
// instruction.
const (
	reqPending int32 = iota
	reqCompleting
	reqDone
	reqPhase  int32 = 3 // the bits of the three above
	reqWaiter int32 = 4
)

// closedChan is what Done returns for a request that completed before
// anybody asked for a channel.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Request is one nonblocking operation. Its methods are safe for concurrent
// use; the fields below the line are owned as their comments say.
type Request struct {
	d *Device
	// id names r in protocol messages and maps: set only for what needs
	// it (rendezvous, synchronous sends, receives with copies in matching
	// subdevices), 0 otherwise, which saves an atomic per message.
	id   uint64
	send bool
	peer int32 // destination of a send; source (or AnySource) of a receive

	// state is reqPending (with reqWaiter once Done was called),
	// reqCompleting or reqDone. Done sets reqWaiter only while pending and
	// a completer leaves pending with one atomic operation, so exactly one
	// of them sees the other: a request nobody selects on completes
	// without taking chMu.
	state  atomic.Int32
	chMu   sync.Mutex
	ch     chan struct{} // made by Done on demand, closed by complete
	closed bool          // under chMu: complete has closed ch
	// status is written once before state becomes reqDone; a receive's
	// holds, from the start, the source and tag it was posted with and,
	// from its match, the message's (see failStatus).
	status Status
	err    error

	// Receive side, guarded by Device.mu until matched.
	tag     int32
	context uint64
	buf     []byte
	claim   *sdi.Claim // shared by the copies of a duplicated ANY_SOURCE receive
	atSub   int        // subdevice index holding the only copy (specific source over a matching subdevice); -1 otherwise

	// Rendezvous receive: set at match, then updated by data frames.
	rndvLen  uint64
	truncErr error
	// Under Device.mu: bytes written, blocks being written into buf
	// (placed or copying), and the failure that completes r once none is.
	received uint64
	rndvBusy int32
	rndvFail error

	// Send side: frames (and an acknowledgement) still outstanding, and
	// the frame the request keeps for its eager sends. Pooled requests
	// come with one; a request the caller allocates takes pooled frames
	// until it is reused for a send, and keeps one from then on: one
	// frame in every such request would make an Isend into a fresh
	// request allocate more, and a pool round trip costs a streaming
	// loop that reuses its requests ~120 instructions a message.
	of      *outFrame
	pending atomic.Int32
	sendErr atomic.Pointer[error]
}

// Done returns a channel closed when the request completes. The channel is
// made on the first call, so requests that nobody selects on cost none.
func (r *Request) Done() <-chan struct{} {
	r.chMu.Lock()
	defer r.chMu.Unlock()
	if r.closed {
		return closedChan
	}
	for {
		s := r.state.Load()
		if s&reqPhase != reqPending {
			// A completer left pending without seeing reqWaiter and will
			// not close a channel made now; it stores reqDone shortly.
			return closedChan
		}
		if s&reqWaiter != 0 || r.state.CompareAndSwap(s, s|reqWaiter) {
			break
		}
	}
	if r.ch == nil {
		r.ch = make(chan struct{})
	}
	return r.ch
}

func (r *Request) isDone() bool { return r.state.Load() == reqDone }

// Test reports whether the request completed, and its result if so.
func (r *Request) Test() (Status, bool, error) {
	if !r.isDone() {
		return Status{}, false, nil
	}
	return r.status, true, r.err
}

// Result returns the status and error of a completed request; it blocks
// until the request completes, without driving progress (see Wait).
func (r *Request) Result() (Status, error) {
	if !r.isDone() {
		<-r.Done()
		r.awaitDone()
	}
	return r.status, r.err
}

// awaitDone waits out a completer between the close of Done's channel (or
// Done's early return) and its store of reqDone: a few instructions.
func (r *Request) awaitDone() {
	for !r.isDone() {
		runtime.Gosched()
	}
}

// Wait blocks until the request completes or ctx is done, and returns its
// result. The calling goroutine drives progress itself for a bounded time
// (see the package doc) and then parks. On ctx's end the request stays
// pending and Wait returns an error wrapping ctx.Err().
func (r *Request) Wait(ctx context.Context) (Status, error) {
	if !r.isDone() && !r.d.spin(r.pollers(), r.isDone) {
		return r.park(ctx)
	}
	return r.status, r.err
}

// park is Wait once spinning did not see r complete; waitRecv, which
// spins its own way, parks through it too.
func (r *Request) park(ctx context.Context) (Status, error) {
	select {
	case <-r.Done():
	case <-ctx.Done():
		return Status{}, fmt.Errorf("multidevice: wait: %w", ctx.Err())
	}
	// Callers may rely on Test reporting done once Wait returned.
	r.awaitDone()
	return r.status, r.err
}

// pollers returns the pollable subdevices that can complete r: those that
// carry traffic with its peer, or all for an ANY_SOURCE receive.
func (r *Request) pollers() []*polled {
	if r.peer == AnySource {
		return r.d.prog.pollers
	}
	return r.d.prog.peerPollers[r.peer]
}

// complete finishes the request once; later calls are ignored.
func (r *Request) complete(st Status, err error) bool {
	var s int32
	for {
		s = r.state.Load()
		if s&reqPhase != reqPending {
			return false
		}
		if r.state.CompareAndSwap(s, reqCompleting|s&reqWaiter) {
			break
		}
	}
	d := r.d
	r.status, r.err = st, err
	if s&reqWaiter != 0 {
		r.closeCh()
	}
	// The last touch of r: its owner may recycle it once it sees reqDone.
	r.state.Store(reqDone)
	d.notifyAll()
	return true
}

// failStatus is the status a receive reports when it fails: no bytes,
// and the source and tag of the message it matched or, before a match,
// those it was posted with (wildcards included), not rank 0 and tag 0.
// A send's is empty.
func (r *Request) failStatus() Status {
	return Status{Source: r.status.Source, Tag: r.status.Tag}
}

// completeOwned is complete for a completer that nobody can race: it
// took r out of the only place other completers find it (the posted
// queue, under Device.mu) or won its claim. Then the status can be
// written first and r completed with one atomic operation.
func (r *Request) completeOwned(st Status, err error) {
	d := r.d
	r.status, r.err = st, err
	if !r.state.CompareAndSwap(reqPending, reqDone) {
		// Only Done changes a pending request's state: it set reqWaiter.
		r.closeCh()
		r.state.Store(reqDone)
	}
	d.notifyAll()
}

// closeCh closes the channel Done handed out.
func (r *Request) closeCh() {
	r.chMu.Lock()
	r.closed = true
	if r.ch != nil {
		close(r.ch)
	}
	r.chMu.Unlock()
}

// completeUnseen completes r before it was handed to anybody: nobody can
// complete it concurrently or select on it, and no WaitAny waits for it,
// so one store does what complete does, and none for a reused request
// that is still done from its previous operation (see rearm).
func (r *Request) completeUnseen() {
	if r.state.Load() != reqDone {
		r.state.Store(reqDone)
	}
}

// arm makes r pending before anything else can see it. A request reused
// for a send is left done by rearm, since an eager send usually
// completes at once and then need not change its state twice.
func (r *Request) arm() {
	if r.state.Load() != reqPending {
		r.state.Store(reqPending)
	}
}

// frameDone accounts one finished frame (or acknowledgement) of a send and
// completes the request when none is left.
func (r *Request) frameDone(err error) {
	if err != nil {
		e := err // only a failure pays for the pointer
		r.sendErr.CompareAndSwap(nil, &e)
	}
	if r.pending.Add(-1) == 0 {
		var e error
		if p := r.sendErr.Load(); p != nil {
			e = *p
		}
		r.complete(Status{}, e)
	}
}

// reusable reports whether nothing but its owner can still reach r: it
// completed, and no frame of it is still queued or in flight (a send
// failed by a lost peer completes before its frames are done). A receive
// a matching subdevice held alone (atSub) completes only by that
// subdevice's Done, a CancelRecv that removed it or, once the subdevice
// closed, failAll, so nothing holds it then. The copies of a duplicated
// ANY_SOURCE receive (claim) may still sit in matching subdevices until
// their queued cancels run, but r's completer won the claim, so they
// write nothing and call no Done (sdi.Matcher), and the cancels carry
// r's id, not r (dropCopies): a new receive in r has a new id and claim.
func (r *Request) reusable() bool {
	return r.isDone() && r.pending.Load() == 0
}

// reset readies a completed request for reuse by the device's pool. The
// completer stored reqDone last, so nobody else touches r any more. Atomic
// fields are stored only when they changed: each store is a locked
// instruction, and most requests leave them as they were.
func (r *Request) reset() {
	r.rearm()
	r.state.Store(reqPending)
}

// rearm readies r, done with its previous operation, for a send: as reset,
// but the state stays done until the send arms it (isend), which saves
// two locked stores for every send that completes at once.
func (r *Request) rearm() {
	r.ch, r.closed = nil, false
	r.id, r.send, r.peer = 0, false, 0
	r.status, r.err = Status{}, nil
	r.tag, r.context, r.buf, r.claim, r.atSub = 0, 0, nil, nil, -1
	r.rndvLen, r.truncErr, r.received, r.rndvBusy, r.rndvFail = 0, nil, 0, 0, nil
	if r.of != nil {
		r.of.f.Payload = nil // the rest of the frame is overwritten by the next send
	}
	if r.sendErr.Load() != nil {
		r.sendErr.Store(nil)
	}
}
