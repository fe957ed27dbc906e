//go:build verbs && cgo

package verbs

/*
#include "cverbs.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
)

// ibCMRejConsumerDefined is the IB CM reject reason rdma_reject sends
// (IB_CM_REJ_CONSUMER_DEFINED): the peer's provider refused the request, as
// opposed to its connection manager finding nobody to ask.
const ibCMRejConsumerDefined = 28

// ibCMRejInvalidServiceID is the reject reason for a request to a port
// nobody listens on.
const ibCMRejInvalidServiceID = 8

// cmEvent is a connection manager event, copied and acked.
type cmEvent struct {
	event   C.int
	status  int
	id      *C.struct_rdma_cm_id
	private []byte // of a connection request, as received (padded)
}

func (ev cmEvent) name() string {
	return C.GoString(C.rdma_event_str(C.enum_rdma_cm_event_type(ev.event)))
}

// err describes an event that ends a connection attempt.
func (ev cmEvent) err() error {
	switch ev.event {
	case C.RDMA_CM_EVENT_REJECTED:
		switch ev.status {
		case ibCMRejConsumerDefined:
			return fmt.Errorf("%w by the peer", rdma.ErrRejected)
		case ibCMRejInvalidServiceID:
			return errors.New("nobody listens at the card's address and port (the peer closed, or the card is stale)")
		}
		return fmt.Errorf("refused by the connection manager (IB CM reject reason %d)", ev.status)
	case C.RDMA_CM_EVENT_ESTABLISHED:
		return errors.New("connection established out of turn")
	}
	if ev.status < 0 {
		return fmt.Errorf("%s: %w", ev.name(), syscall.Errno(-ev.status))
	}
	return fmt.Errorf("%s (status %d)", ev.name(), ev.status)
}

// cmLoop is the CM goroutine: it reads the event channel until Close closes
// cmFile. Between taking an event and acking it, it only looks the id up
// under mu, which no one holds while waiting for an ack, and hands the event
// to a Dial or Accept waiting on the endpoint.
//
// The hand-over happens under cmMu, with rdma_get_cm_event: librdmacm moves
// the QP to error inside rdma_get_cm_event when it reads a REJECTED (or a
// connect response it cannot complete), the flushed receives can make the
// engine close the endpoint before this goroutine gets further, and await,
// woken by the close, takes cmMu to find the event that says why.
func (p *provider) cmLoop() {
	defer p.cmWG.Done()
	var raw C.struct_mdv_cm_event
	var rev *C.struct_rdma_cm_event
	for {
		var ev cmEvent
		var e *endpoint
		var got bool
		var cerr error
		err := p.cmConn.Read(func(uintptr) bool {
			p.cmMu.Lock()
			defer p.cmMu.Unlock()
			r := C.mdv_get_cm_event(p.ch, &raw, &rev)
			switch {
			case r == -C.EAGAIN:
				return false
			case r == -C.EINTR:
				return true
			case r != 0:
				cerr = errno(r)
				return true
			}
			got = true
			ev = cmEvent{
				event:   raw.event,
				status:  int(raw.status),
				id:      raw.id,
				private: C.GoBytes(unsafe.Pointer(&raw.private_data[0]), C.int(raw.private_len)),
			}
			if ev.event != C.RDMA_CM_EVENT_CONNECT_REQUEST {
				p.mu.Lock()
				e = p.byID[ev.id]
				p.mu.Unlock()
			}
			if e != nil {
				e.notify(ev)
			}
			return true
		})
		if err != nil {
			return
		}
		if cerr != nil {
			// No connection could be made or noticed ending any more.
			p.fail(&deviceError{device: p.device, port: p.port, what: "reading its connection manager events failed", err: fmt.Errorf("rdma_get_cm_event: %w", cerr)})
			return
		}
		if !got {
			continue
		}
		C.rdma_ack_cm_event(rev)
		p.handle(ev, e)
	}
}

// handle acts on an acked event; e is the endpoint of the event's id, if
// any, which cmLoop has handed the event to already.
func (p *provider) handle(ev cmEvent, e *endpoint) {
	if p.log.IsTrace() {
		p.log.Trace("connection manager event", "event", ev.name(), "status", ev.status)
	}
	if ev.event == C.RDMA_CM_EVENT_CONNECT_REQUEST {
		p.request(ev)
		return
	}
	if ev.event == C.RDMA_CM_EVENT_DEVICE_REMOVAL && (e != nil || ev.id == p.listen) {
		// Every id on the device gets one; the first fails the provider.
		// librdmacm wants the ids and everything on the device freed; the
		// engine's closing of the failed connections frees their QPs and
		// ids, and Close the rest.
		p.fail(&deviceError{device: p.device, port: p.port, what: "the device was removed (" + ev.name() + ")"})
		return
	}
	if e == nil {
		return
	}
	switch ev.event {
	case C.RDMA_CM_EVENT_ESTABLISHED:
		e.setEstablished()
	case C.RDMA_CM_EVENT_DISCONNECTED, C.RDMA_CM_EVENT_REJECTED,
		C.RDMA_CM_EVENT_UNREACHABLE, C.RDMA_CM_EVENT_CONNECT_ERROR:
		e.fail()
	}
}

// request queues a connection request for delivery. A request without
// well-formed private data did not come from this provider and is refused
// here.
func (p *provider) request(ev cmEvent) {
	r := &request{p: p, cm: ev.id}
	priv, err := decodePrivate(ev.private)
	if err != nil {
		p.log.Debug("refusing a connection request", "error", err)
		r.drop()
		return
	}
	r.private = priv
	p.mu.Lock()
	if p.closed || p.failed.Load() != nil {
		p.mu.Unlock()
		r.drop()
		return
	}
	p.requests[r] = struct{}{}
	p.queue = append(p.queue, r)
	p.mu.Unlock()
	select {
	case p.queued <- struct{}{}:
	default:
	}
}

// deliver is the delivery goroutine: it hands queued requests to the
// engine, so the CM goroutine never waits for the engine. Requests still
// queued at Close are refused by teardown.
func (p *provider) deliver() {
	defer p.bg.Done()
	defer close(p.reqs)
	for {
		p.mu.Lock()
		var r *request
		if len(p.queue) > 0 {
			r = p.queue[0]
			p.queue[0] = nil
			p.queue = p.queue[1:]
		}
		p.mu.Unlock()
		if r == nil {
			select {
			case <-p.queued:
				continue
			case <-p.done:
				return
			}
		}
		select {
		case p.reqs <- r:
		case <-p.done:
			return
		}
	}
}

// request is a connection request not yet answered. Its cm id belongs to
// the provider (p.requests) until Accept or Reject claims it.
type request struct {
	p       *provider
	cm      *C.struct_rdma_cm_id
	private []byte
}

var _ rdma.Request = (*request)(nil)

func (r *request) Private() []byte { return append([]byte(nil), r.private...) }

// claim takes the request out of the provider's hands and counts the
// answer as an operation in flight. On a failed provider the request is
// refused instead, and claim returns why.
func (r *request) claim() error {
	p := r.p
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return errClosed
	}
	if _, ok := p.requests[r]; !ok {
		p.mu.Unlock()
		return errors.New("verbs: connection request already answered")
	}
	delete(p.requests, r)
	p.ops.Add(1)
	de := p.failed.Load()
	p.mu.Unlock()
	if de != nil {
		r.drop()
		p.ops.Done()
		return de
	}
	return nil
}

// Accept waits, after rdma_accept, for the connection to be established,
// so that the dialer's QP is ready to receive before the engine sends. It
// has no context: the connection manager ends the wait with an event
// within its own timeouts, and Close ends it at once.
func (r *request) Accept(id uint32, setup func(rdma.Endpoint) error) (rdma.Endpoint, error) {
	if err := r.claim(); err != nil {
		return nil, err
	}
	p := r.p
	defer p.ops.Done()
	e := p.newEndpoint(id, r.cm)
	fail := func(err error, reject bool) (rdma.Endpoint, error) {
		if reject {
			if rc := C.mdv_reject(r.cm); rc != 0 {
				p.log.Debug("rejecting after a failed accept failed", "error", errno(rc))
			}
		}
		if cerr := e.Close(); cerr != nil {
			p.log.Debug("closing a failed endpoint", "endpoint", id, "error", cerr)
		}
		return nil, fmt.Errorf("verbs: accept: %w", err)
	}
	if err := e.createQP(); err != nil {
		return fail(err, true)
	}
	if err := setup(e); err != nil {
		return fail(fmt.Errorf("setup: %w", err), true)
	}
	if rc := C.mdv_accept(r.cm); rc != 0 {
		return fail(fmt.Errorf("rdma_accept: %w", errno(rc)), true)
	}
	if err := e.await(context.Background(), C.RDMA_CM_EVENT_ESTABLISHED); err != nil {
		return fail(err, false)
	}
	return e, nil
}

func (r *request) Reject() error {
	if err := r.claim(); err != nil {
		return err
	}
	defer r.p.ops.Done()
	var errs []error
	if rc := C.mdv_reject(r.cm); rc != 0 {
		errs = append(errs, fmt.Errorf("verbs: rdma_reject: %w", errno(rc)))
	}
	if rc := C.mdv_destroy_id(r.cm); rc != 0 {
		errs = append(errs, fmt.Errorf("verbs: rdma_destroy_id: %w", errno(rc)))
	}
	return errors.Join(errs...)
}

// drop refuses a request the engine will never answer and frees its id.
func (r *request) drop() {
	if rc := C.mdv_reject(r.cm); rc != 0 {
		r.p.log.Debug("rdma_reject failed", "error", errno(rc))
	}
	if rc := C.mdv_destroy_id(r.cm); rc != 0 {
		r.p.log.Debug("rdma_destroy_id failed", "error", errno(rc))
	}
}
