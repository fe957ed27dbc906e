//go:build udapl && cgo

package udapl

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// crPrivateCap is the most private data read from a connection request;
// providers report up to 64 bytes, padding included.
const crPrivateCap = 256

// Dial connects to the listener behind card: it makes the endpoint, lets
// setup post its receives, sends the connection request and waits for the
// answer. On any error the endpoint is closed, and what setup posted
// completes, flushed.
func (p *provider) Dial(ctx context.Context, card, private []byte, id uint32, setup func(rdma.Endpoint) error) (rdma.Endpoint, error) {
	ap, err := parseCard(card)
	if err != nil {
		return nil, fmt.Errorf("udapl: dial: %w", err)
	}
	if len(private) > p.limits.MaxPrivate {
		return nil, fmt.Errorf("udapl: dial %v: %d bytes of private data, at most %d", ap, len(private), p.limits.MaxPrivate)
	}
	e, err := p.newEndpoint(id)
	if err != nil {
		return nil, fmt.Errorf("udapl: dial %v: %w", ap, err)
	}
	fail := func(err error) (rdma.Endpoint, error) {
		return nil, errors.Join(fmt.Errorf("udapl: dial %v: %w", ap, err), e.Close())
	}
	if err := setup(e); err != nil {
		return fail(fmt.Errorf("setup: %w", err))
	}
	if err := e.connect(ctx, ap, private); err != nil {
		return fail(err)
	}
	select {
	case err := <-e.outcome:
		if err != nil {
			return fail(err)
		}
		p.log.Debug("connected", "to", ap, "endpoint", id)
		return e, nil
	case <-ctx.Done():
		return fail(ctx.Err())
	case <-p.done:
		return fail(sdi.ErrClosed)
	case <-p.deadCh:
		return fail(p.failure())
	}
}

// request is a connection request listen delivered. Accept, Reject and the
// provider's Close may race; the first to answer wins.
type request struct {
	p       *provider
	cr      datHandle
	private []byte

	mu       sync.Mutex
	answered bool
}

var _ rdma.Request = (*request)(nil)

// Private is the data the peer passed to Dial.
func (r *request) Private() []byte { return r.private }

// answer claims the right to answer the request.
func (r *request) answer() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.answered {
		return false
	}
	r.answered = true
	return true
}

// claim answers the request for the caller and drops it from the provider's
// unanswered ones.
func (r *request) claim(op string) error {
	if !r.answer() {
		return fmt.Errorf("udapl: %s: the request was answered already", op)
	}
	r.p.mu.Lock()
	delete(r.p.crs, r)
	r.p.mu.Unlock()
	return nil
}

// Accept makes the endpoint, lets setup post its receives, accepts, and
// waits until the connection is established, so that the endpoint it
// returns can send at once: before that the queue pair cannot.
func (r *request) Accept(id uint32, setup func(rdma.Endpoint) error) (rdma.Endpoint, error) {
	if err := r.claim("accept"); err != nil {
		return nil, err
	}
	p := r.p
	e, err := p.newEndpoint(id)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("udapl: accept: %w", err), r.reject())
	}
	fail := func(err error) (rdma.Endpoint, error) {
		return nil, errors.Join(fmt.Errorf("udapl: accept: %w", err), e.Close())
	}
	if err := setup(e); err != nil {
		return nil, errors.Join(fmt.Errorf("udapl: accept: setup: %w", err), e.Close(), r.reject())
	}
	if err := r.accept(e); err != nil {
		return fail(err)
	}
	t := time.NewTimer(acceptTimeout)
	defer t.Stop()
	select {
	case err := <-e.outcome:
		if err != nil {
			return fail(err)
		}
		p.log.Debug("accepted", "endpoint", id)
		return e, nil
	case <-t.C:
		return fail(fmt.Errorf("no connection event %v after dat_cr_accept", acceptTimeout))
	case <-p.done:
		return fail(sdi.ErrClosed)
	case <-p.deadCh:
		return fail(p.failure())
	}
}

func (r *request) accept(e *endpoint) error {
	p := r.p
	p.closeMu.RLock()
	defer p.closeMu.RUnlock()
	if p.closed.Load() {
		return sdi.ErrClosed
	}
	if st := crAccept(r.cr, e.h); !st.ok() {
		return fmt.Errorf("dat_cr_accept: %w", st)
	}
	return nil
}

// Reject refuses the request; the peer's Dial fails with ErrRejected.
func (r *request) Reject() error {
	if err := r.claim("reject"); err != nil {
		return err
	}
	return r.reject()
}

func (r *request) reject() error {
	p := r.p
	p.closeMu.RLock()
	defer p.closeMu.RUnlock()
	if p.closed.Load() {
		return nil // dat_ia_close disposes of the request, and the peer sees the connection fail
	}
	if st := crReject(r.cr); !st.ok() {
		return fmt.Errorf("udapl: dat_cr_reject: %w", st)
	}
	return nil
}

// stopping reports whether Close has begun.
func (p *provider) stopping() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// pause waits a loop slice or until Close: the back-off of a loop whose EVD
// fails.
func (p *provider) pause() {
	t := time.NewTimer(loopSlice)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
	}
}

// listen waits for connection requests on the CR EVD and delivers them,
// until Close. It runs on its own goroutine and is the only user of the CR
// EVD. An EVD that keeps failing (loopFailures waits in a row) fails the
// provider: the requests of peers would go unanswered.
func (p *provider) listen() {
	defer p.wg.Done()
	failing := 0
	for !p.stopping() {
		ev, st := cmWait(p.crEVD, uint32(loopSlice/time.Microsecond))
		switch {
		case st.idle():
			failing = 0
			continue
		case !st.ok():
			failing++
			if failing == 1 {
				p.log.Warn("dat_evd_wait on the connection request EVD failed; retrying", "ia", p.iaName, "error", st)
			}
			if failing == loopFailures {
				p.fail(&iaError{ia: p.iaName, what: "waiting for connection requests failed",
					err: fmt.Errorf("dat_evd_wait on the connection request EVD, %d times in a row: %w", failing, st)})
			}
			p.pause()
			continue
		}
		failing = 0
		if ev.number != evConnectionRequest {
			p.log.Debug("event ignored on the connection request EVD", "event", ev.number)
			continue
		}
		p.deliver(ev.handle)
	}
}

// deliver hands a connection request to the engine. A request without
// this subdevice's private data header comes from something else, and is
// refused here.
func (p *provider) deliver(cr datHandle) {
	if err := p.failure(); err != nil {
		if st := crReject(cr); !st.ok() {
			p.log.Debug("dat_cr_reject of a request to a failed IA failed", "error", st)
		}
		return
	}
	var buf [crPrivateCap]byte
	n, st := crPrivate(cr, buf[:])
	n = min(n, len(buf))
	if !st.ok() || n < 1 || int(buf[0]) > n-1 {
		p.log.Warn("connection request without a udapl header, rejected", "private_bytes", n, "error", st)
		if st := crReject(cr); !st.ok() {
			p.log.Warn("dat_cr_reject failed", "error", st)
		}
		return
	}
	r := &request{p: p, cr: cr, private: append([]byte(nil), buf[1:1+int(buf[0])]...)}
	p.mu.Lock()
	p.crs[r] = struct{}{}
	p.mu.Unlock()
	select {
	case p.reqs <- r:
	case <-p.done: // Close rejects it with the other unanswered requests
	}
}

// watch handles connection events and asynchronous errors (async.go),
// cuts the endpoints of a failed provider and frees closed endpoints,
// until Close. It runs on its own goroutine and is the only user of the
// connection and async EVDs. A connection EVD that keeps failing
// (loopFailures waits in a row) fails the provider: connections that end
// would go unnoticed.
func (p *provider) watch() {
	defer p.wg.Done()
	failing := 0
	for !p.stopping() {
		p.breakFailed()
		p.freeEndpoints()
		p.cutAll()
		ev, st := cmWait(p.connEVD, uint32(loopSlice/time.Microsecond))
		switch {
		case st.ok():
			failing = 0
			p.onConnEvent(ev)
		case st.idle():
			failing = 0
		default:
			failing++
			if failing == 1 {
				p.log.Warn("dat_evd_wait on the connection EVD failed; retrying", "ia", p.iaName, "error", st)
			}
			if failing == loopFailures {
				p.fail(&iaError{ia: p.iaName, what: "waiting for connection events failed",
					err: fmt.Errorf("dat_evd_wait on the connection EVD, %d times in a row: %w", failing, st)})
			}
			p.pause()
		}
		p.drainAsync()
		p.cutAll()
	}
}

// onConnEvent passes a connection event to the endpoint it names.
func (p *provider) onConnEvent(ev cmEvent) {
	p.mu.Lock()
	e := p.eps[ev.handle]
	p.mu.Unlock()
	if e == nil {
		p.log.Debug("connection event for no open endpoint", "event", ev.number)
		return
	}
	switch ev.number {
	case evEstablished:
		e.established()
	case evPeerRejected:
		e.ended(fmt.Errorf("%v: %w", ev.number, rdma.ErrRejected))
	case evNonPeerRejected:
		// Nobody listening, or the adapter refusing: not the peer's
		// "not now", which the engine waits out.
		e.ended(fmt.Errorf("connection refused: %v", ev.number))
	case evDisconnected, evBroken:
		p.log.Debug("connection ended", "endpoint", e.id, "event", ev.number)
		e.ended(fmt.Errorf("connection ended: %v", ev.number))
	default: // unreachable, timed out, accept failed
		e.ended(fmt.Errorf("connection failed: %v", ev.number))
	}
}

// drainConn handles the connection events queued now.
func (p *provider) drainConn() {
	for {
		ev, st := cmDequeue(p.connEVD)
		if !st.ok() {
			return // empty; a failing EVD is reported by watch's wait
		}
		p.onConnEvent(ev)
	}
}

// breakFailed disconnects the endpoints whose work failed since the last
// round, so that the peer's work completes, flushed, too.
func (p *provider) breakFailed() {
	p.mu.Lock()
	failed := p.failed
	p.failed = nil
	var eps []*endpoint
	for _, e := range p.eps {
		for _, s := range failed {
			if e.serial == s {
				eps = append(eps, e)
				break
			}
		}
	}
	p.mu.Unlock()
	for _, e := range eps {
		e.ended(errors.New("work on the endpoint failed"))
	}
}

// freeEndpoints frees the endpoints closed since the last round.
func (p *provider) freeEndpoints() {
	p.mu.Lock()
	q := p.freeq
	p.freeq = nil
	p.mu.Unlock()
	var later []*endpoint
	for _, e := range q {
		if !p.freeEndpoint(e) {
			later = append(later, e)
		}
	}
	if len(later) > 0 {
		p.mu.Lock()
		p.freeq = append(p.freeq, later...)
		p.mu.Unlock()
	}
}

// freeEndpoint frees a closed endpoint and completes, flushed, the work
// still open on it; false means DAT refused for the endpoint's state (a
// disconnect still under way) and it is to be tried again.
//
// It runs on watch, the connection EVD's owner, under lifeMu: it first
// handles the events queued for the endpoint while its handle still names
// it, and after the free those the free queued, so that no event naming
// the freed handle is left when a new endpoint may be given its address.
//
// The flushes are made here rather than awaited from the adapter: dapl
// copies the completions the queue pair has made before destroying it, but
// a device may drop those it makes later, and an endpoint that never
// connected has nothing that flushes it. The adapter's own flushes, if any
// come, find their cookies spent and are dropped. No byte is written into
// a region by the endpoint after these completions, since its queue pair
// is gone.
func (p *provider) freeEndpoint(e *endpoint) bool {
	p.lifeMu.Lock()
	defer p.lifeMu.Unlock()
	p.drainConn()
	// dat_ep_free copies what the queue pair completed into the shared
	// DTO EVD without the EVD's lock (dapls_ep_flush_cqs), which would
	// race a dequeue or wait on it and lose or repeat completions of live
	// endpoints: the EVD is ours for the call.
	p.evMu.Lock()
	st := epFree(e.h)
	p.evMu.Unlock()
	if !st.ok() {
		if st.typ() == datInvalidState {
			if e.freeTries == 0 {
				p.log.Debug("dat_ep_free refused for now; retrying", "endpoint", e.id, "error", st)
			}
			e.freeTries++
			return false
		}
		// The endpoint stays until dat_ia_close frees it; it was
		// disconnected, so the adapter flushes its work, unless the
		// provider failed and no longer reads the DTO EVD.
		p.log.Warn("dat_ep_free failed", "endpoint", e.id, "error", st)
		if p.dead.Load() != nil {
			p.pushPending(p.wrs.flushOwner(e.serial, flushedBy(e.causeOf()), nil)...)
		}
		return true
	}
	p.mu.Lock()
	delete(p.eps, e.h)
	delete(p.causes, e.serial)
	p.mu.Unlock()
	p.drainConn()
	p.pushPending(p.wrs.flushOwner(e.serial, flushedBy(e.causeOf()), nil)...)
	return true
}
