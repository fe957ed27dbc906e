//go:build udapl && cgo

package udapl

import (
	"errors"
	"fmt"
)

// DAT reports what no completion can on the IA's async EVD, which the
// provider creates with dat_ia_open and watch drains every round: an
// endpoint whose queue pair broke or timed out (DAT_ASYNC_ERROR_EP_BROKEN,
// _TIMED_OUT), an EVD that overflowed and lost events
// (DAT_ASYNC_ERROR_EVD_OVERFLOW), and an IA that died
// (DAT_ASYNC_ERROR_IA_CATASTROPHIC, _PROVIDER_INTERNAL_ERROR). DAT has no
// acknowledgement: an event is dealt with once dequeued.
//
// dapl 2.1 reports every one of them naming the IA, not the object
// (dapl_evd_qp_async_error_callback, dapl_evd_cq_async_error_callback), so
// a broken endpoint is found by its state: dapl leaves a connected
// endpoint whose queue pair broke in DAT_EP_STATE_ERROR.

// iaError is why a provider failed as a whole: its IA and the event or
// failure that ended it. Every connection of the provider fails with it,
// and Dial, Accept and Register return it.
type iaError struct {
	ia   string
	what string // the event, or what failed
	err  error  // the underlying error, if any
}

func (e *iaError) Error() string {
	s := fmt.Sprintf("udapl: interface adapter %q failed: %s", e.ia, e.what)
	if e.err != nil {
		s += ": " + e.err.Error()
	}
	return s
}

func (e *iaError) Unwrap() error { return e.err }

// errIAFailed matches every iaError with errors.Is.
var errIAFailed = errors.New("udapl: interface adapter failed")

func (e *iaError) Is(target error) bool { return target == errIAFailed }

// loopFailures is how many waits in a row on the connection or connection
// request EVD may fail, a loop slice apart, before the provider takes the
// EVD for dead and fails.
const loopFailures = 3

// failure returns the provider's iaError, or nil while it works.
func (p *provider) failure() error {
	if ie := p.dead.Load(); ie != nil {
		return ie
	}
	return nil
}

// fail fails the provider as a whole, once: the IA died, an EVD of it
// overflowed, or an event loop the provider needs stopped. From then on
// Poll does not read the DTO EVD (it may have lost completions, or never
// give the flushed ones), Dial, Accept and Register return ie, and watch
// cuts every endpoint (cutAll): it disconnects it, which tells the peer,
// and completes its work, flushed, with ie as the reason. fail may be
// called from any goroutine; a provider that is closing does not fail.
func (p *provider) fail(ie *iaError) {
	if p.closed.Load() || !p.dead.CompareAndSwap(nil, ie) {
		return
	}
	close(p.deadCh)
	p.log.Error("the uDAPL interface adapter failed: every connection fails and no new one is made", "ia", p.iaName, "error", ie)
}

// cutAll cuts every endpoint of a failed provider; from watch. It is
// repeated every round, since an endpoint may be made as the provider
// fails; an endpoint is cut once.
func (p *provider) cutAll() {
	ie := p.dead.Load()
	if ie == nil {
		return
	}
	for _, e := range p.endpoints() {
		e.cut(ie)
	}
}

// endpoints returns the endpoints not yet freed.
func (p *provider) endpoints() []*endpoint {
	p.mu.Lock()
	defer p.mu.Unlock()
	eps := make([]*endpoint, 0, len(p.eps))
	for _, e := range p.eps {
		eps = append(eps, e)
	}
	return eps
}

// drainAsync handles the asynchronous errors queued now; from watch. An
// async EVD that cannot be read fails the provider, which could no longer
// learn of its IA's failures.
func (p *provider) drainAsync() {
	if p.asyncEVD == nil {
		return
	}
	for {
		ev, st := cmDequeue(p.asyncEVD)
		if st.typ() == datQueueEmpty {
			return
		}
		if !st.ok() {
			p.fail(&iaError{ia: p.iaName, what: "reading its asynchronous errors failed",
				err: fmt.Errorf("dat_evd_dequeue of the async EVD: %w", st)})
			return
		}
		p.onAsync(ev)
	}
}

// onAsync acts on one asynchronous error.
func (p *provider) onAsync(ev cmEvent) {
	what := ev.number.String()
	if ev.reason != 0 {
		what += fmt.Sprintf(" (reason %d)", ev.reason)
	}
	switch ev.number {
	case evAsyncEPBroken, evAsyncTimedOut:
		p.endpointBroke(ev, what)
	case evAsyncEVDOverflow:
		p.fail(&iaError{ia: p.iaName, what: what + " on " + p.evdName(ev.handle)})
	case evAsyncIACatastrophic, evAsyncProviderFailure:
		p.fail(&iaError{ia: p.iaName, what: what})
	default:
		p.log.Warn("unexpected event on the async EVD", "ia", p.iaName, "event", what)
	}
}

// evdName says which EVD an overflow names. Every EVD of the IA is the
// provider's, and losing the events of any fails it: completions,
// connection events or requests that never come would leave peers
// waiting.
func (p *provider) evdName(h datHandle) string {
	switch h {
	case p.dtoEVD:
		return "the completion EVD (completions were lost)"
	case p.connEVD:
		return "the connection EVD (connection events were lost)"
	case p.crEVD:
		return "the connection request EVD (requests were lost)"
	case p.asyncEVD:
		return "the async EVD"
	}
	return "one of its EVDs (the event names the IA, not the EVD)"
}

// endpointBroke fails the endpoint an EP_BROKEN or TIMED_OUT names, or,
// where the event names the IA as dapl's do, every connected endpoint that
// DAT reports in DAT_EP_STATE_ERROR. The other endpoints carry on.
func (p *provider) endpointBroke(ev cmEvent, what string) {
	p.mu.Lock()
	e := p.eps[ev.handle]
	p.mu.Unlock()
	if e != nil {
		p.log.Warn("an endpoint broke; its connection fails", "ia", p.iaName, "endpoint", e.id, "event", what)
		e.cut(fmt.Errorf("udapl: IA %q reported %s on endpoint %d", p.iaName, what, e.id))
		return
	}
	// An endpoint whose connection ended normally is in the same state;
	// its connection event is handled first, so that it is not taken for
	// a broken one.
	p.drainConn()
	found := 0
	for _, e := range p.endpoints() {
		if !e.isConnected() {
			continue
		}
		// The handle is valid: only watch, this goroutine, frees it.
		s, st := epDATState(e.h)
		if !st.ok() || s != datEPStateDisconnected {
			continue
		}
		found++
		p.log.Warn("an endpoint broke; its connection fails", "ia", p.iaName, "endpoint", e.id, "event", what)
		e.cut(fmt.Errorf("udapl: IA %q reported %s, and endpoint %d is in error", p.iaName, what, e.id))
	}
	if found == 0 {
		p.log.Warn("asynchronous endpoint error, but no connected endpoint is in error", "ia", p.iaName, "event", what)
	}
}

// flushedBy is the error of work cut off for cause (nil: an ordinary
// flush).
func flushedBy(cause error) error {
	if cause == nil {
		return errFlushed
	}
	return fmt.Errorf("%w: %w", errFlushed, cause)
}

// isConnected reports whether the connection is established and has not
// ended.
func (e *endpoint) isConnected() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state == epConnected
}

// cut fails the endpoint for cause, an asynchronous error of it or of the
// whole IA; from watch. It ends the connection as a disconnect does (a
// Dial or Accept waiting on it fails with cause), and an endpoint that had
// connected completes its work at once, flushed with cause as the reason:
// its queue pair is in error or disconnected, so the adapter writes no
// more into it, and a device may never report the flushes itself. Work
// posted on it later completes the same way. An endpoint that never
// connected, or that the engine closed, is flushed when freed.
func (e *endpoint) cut(cause error) {
	p := e.p
	e.mu.Lock()
	if e.cause == nil {
		e.cause = cause
		// Before the disconnect, whose flushes the DTO EVD may report.
		p.mu.Lock()
		p.causes[e.serial] = cause
		p.mu.Unlock()
	}
	e.mu.Unlock()
	e.ended(cause)
	e.mu.Lock()
	if e.selfFlushed || !e.wasUp || e.state == epClosed {
		e.mu.Unlock()
		return
	}
	e.selfFlushed = true
	cs := p.wrs.flushOwner(e.serial, flushedBy(e.cause), nil)
	e.mu.Unlock()
	p.pushPending(cs...)
}

// causeOf returns the error that cut the endpoint, or nil.
func (e *endpoint) causeOf() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cause
}

// causeOwner returns the error that cut the endpoint with serial number
// owner, or that failed the provider, or nil.
func (p *provider) causeOwner(owner uint64) error {
	p.mu.Lock()
	cause := p.causes[owner]
	p.mu.Unlock()
	if cause == nil {
		return p.failure()
	}
	return cause
}
