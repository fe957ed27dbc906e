package multidevice

import (
	"sync/atomic"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// AnySource and AnyTag are the receive wildcards, in world ranks.
const (
	AnySource = -1
	AnyTag    = -1
)

// Status describes a completed receive or a probed message. Source is a
// world rank.
type Status struct {
	Source    int
	Tag       int
	Count     int // bytes received (or, from a probe, the message length)
	Cancelled bool
}

// Request is one nonblocking operation. Its methods are safe for concurrent
// use; the fields below the line are owned as their comments say.
type Request struct {
	d    *Device
	id   uint64
	send bool
	peer int32 // destination of a send; source (or AnySource) of a receive

	done      chan struct{} // closed once, by complete
	completed atomic.Bool
	status    Status // written once before done is closed
	err       error

	// Receive side, guarded by Device.mu until matched.
	tag     int32
	context uint64
	buf     []byte
	claim   *sdi.Claim // shared by the copies of a duplicated ANY_SOURCE receive
	atSub   int        // subdevice index holding the only copy (specific source over a matching subdevice); -1 otherwise

	// Rendezvous receive: set at match, then updated by data frames.
	rndvLen  uint64
	received atomic.Uint64
	truncErr error

	// Send side: frames (and an acknowledgement) still outstanding.
	pending atomic.Int32
	sendErr atomic.Pointer[error]
}

// Done returns a channel closed when the request completes.
func (r *Request) Done() <-chan struct{} { return r.done }

// Test reports whether the request completed, and its result if so.
func (r *Request) Test() (Status, bool, error) {
	if !r.completed.Load() {
		return Status{}, false, nil
	}
	<-r.done // completed is set before the fields are final; done closes after
	return r.status, true, r.err
}

// Result returns the status and error of a completed request; it blocks
// until the request completes.
func (r *Request) Result() (Status, error) {
	<-r.done
	return r.status, r.err
}

// complete finishes the request once; later calls are ignored.
func (r *Request) complete(st Status, err error) bool {
	if !r.completed.CompareAndSwap(false, true) {
		return false
	}
	r.status, r.err = st, err
	close(r.done)
	r.d.notifyAll()
	return true
}

// frameDone accounts one finished frame (or acknowledgement) of a send and
// completes the request when none is left.
func (r *Request) frameDone(err error) {
	if err != nil {
		r.sendErr.CompareAndSwap(nil, &err)
	}
	if r.pending.Add(-1) == 0 {
		var e error
		if p := r.sendErr.Load(); p != nil {
			e = *p
		}
		r.complete(Status{}, e)
	}
}
