//go:build verbs && cgo

package verbs

/*
#include "cverbs.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
)

// The device's asynchronous events (ibv_get_async_event(3)) are how it
// reports what no completion can: a queue pair that broke, a completion
// queue that overran, a device that died, a port that went down or came
// back. They arrive on the async_fd of the device context, and every one
// must be acked (ibv_ack_async_event), or destroying its QP or CQ waits
// forever.
//
// librdmacm opens each device once per process, and every rdma_cm id on it,
// of every provider in the process, shares that context and so that one
// fd. Each event is read once, by whoever reads first; so one asyncReader
// per context reads them all and hands each to the provider it concerns.
// That is why there is a package-level table of readers, where every other
// piece of state hangs off its provider. (Another user of librdmacm in the
// process that reads the same fd, such as the udapl subdevice's DAPL
// provider on the same device, takes the events it reads; this package
// cannot see those.)
var readers = struct {
	mu sync.Mutex
	m  map[*C.struct_ibv_context]*asyncReader
}{m: make(map[*C.struct_ibv_context]*asyncReader)}

// asyncReader reads the async fd of one context in the netpoller, as the
// CM and completion channels are read, until the last provider on the
// context detaches. It is shared by those providers, which attach and
// detach under readers.mu.
type asyncReader struct {
	ctx  *C.struct_ibv_context
	file *os.File // a duplicate of the async fd; closing it stops run
	conn syscall.RawConn
	wg   sync.WaitGroup

	// mu guards provs. run holds it while it routes an event, from the
	// read to the ack, so a provider that detached is never routed to.
	mu    sync.Mutex
	provs []*provider
}

// attachAsync makes p one of the providers its context's reader routes
// events to, starting the reader if p is the first.
func attachAsync(p *provider) error {
	readers.mu.Lock()
	defer readers.mu.Unlock()
	r := readers.m[p.ctx]
	if r == nil {
		f, rc, err := pollable(int(C.mdv_async_fd(p.ctx)), "ibv async event")
		if err != nil {
			return err
		}
		r = &asyncReader{ctx: p.ctx, file: f, conn: rc}
		readers.m[p.ctx] = r
		r.wg.Add(1)
		go r.run()
	}
	r.mu.Lock()
	r.provs = append(r.provs, p)
	r.mu.Unlock()
	p.async = r
	return nil
}

// detachAsync removes p from its reader, and stops the reader if p was the
// last. Once it returns no event is routed to p.
func detachAsync(p *provider) {
	r := p.async
	if r == nil {
		return
	}
	p.async = nil
	readers.mu.Lock()
	r.mu.Lock()
	for i, q := range r.provs {
		if q == p {
			r.provs = append(r.provs[:i], r.provs[i+1:]...)
			break
		}
	}
	last := len(r.provs) == 0
	r.mu.Unlock()
	if last && readers.m[r.ctx] == r {
		delete(readers.m, r.ctx)
	}
	// Not waited for under readers.mu, which a dying reader takes. A
	// provider that opens meanwhile starts a reader of its own.
	readers.mu.Unlock()
	if last {
		r.file.Close()
		r.wg.Wait()
	}
}

// run reads events until detachAsync closes the file. An error other than
// EAGAIN ends it: the providers on the context can no longer learn of
// their device's failures, so they fail.
func (r *asyncReader) run() {
	defer r.wg.Done()
	for {
		var raw C.struct_ibv_async_event
		var ev C.struct_mdv_async_event
		var got bool
		var cerr error
		err := r.conn.Read(func(uintptr) bool {
			rc := C.mdv_get_async_event(r.ctx, &raw, &ev)
			switch {
			case rc == -C.EAGAIN:
				return false
			case rc == -C.EINTR:
				return true
			case rc != 0:
				cerr = errno(rc)
				return true
			}
			got = true
			return true
		})
		if err != nil {
			return
		}
		if cerr != nil {
			r.died(cerr)
			return
		}
		if !got {
			continue
		}
		r.mu.Lock()
		acts := r.route(ev)
		C.ibv_ack_async_event(&raw)
		r.mu.Unlock()
		for _, act := range acts {
			act()
		}
	}
}

// died fails every provider on the context, and leaves the context to a
// new reader should another provider open on it.
func (r *asyncReader) died(err error) {
	readers.mu.Lock()
	if readers.m[r.ctx] == r {
		delete(readers.m, r.ctx)
	}
	readers.mu.Unlock()
	r.mu.Lock()
	provs := append([]*provider(nil), r.provs...)
	r.mu.Unlock()
	for _, p := range provs {
		p.guarded(func() {
			p.fail(&deviceError{device: p.device, port: p.port, what: "reading its asynchronous events failed", err: fmt.Errorf("ibv_get_async_event: %w", err)})
		})
	}
}

// route finds what an event concerns, before it is acked, and returns what
// to do about it after. It runs under r.mu and takes no lock that anyone
// holds while destroying a QP or CQ, which waits for this event's ack.
func (r *asyncReader) route(ev C.struct_mdv_async_event) []func() {
	typ := int(ev.event_type)
	name := asyncEventName(typ)
	var acts []func()
	switch typ {
	case C.IBV_EVENT_QP_FATAL, C.IBV_EVENT_QP_REQ_ERR, C.IBV_EVENT_QP_ACCESS_ERR,
		C.IBV_EVENT_COMM_EST, C.IBV_EVENT_SQ_DRAINED, C.IBV_EVENT_PATH_MIG,
		C.IBV_EVENT_PATH_MIG_ERR, C.IBV_EVENT_QP_LAST_WQE_REACHED:
		// A QP number is unique on the device while its QP lives, and the
		// QP lives until this event is acked.
		qpn := uint32(ev.qp_num)
		for _, p := range r.provs {
			p.qpMu.RLock()
			e := p.byQPN[qpn]
			p.qpMu.RUnlock()
			if e != nil {
				acts = append(acts, func() { p.guarded(func() { e.asyncEvent(typ, name) }) })
				return acts
			}
		}
		for _, p := range r.provs {
			acts = append(acts, func() {
				p.guarded(func() {
					p.log.Debug("asynchronous event for a queue pair of no endpoint", "device", p.device, "event", name, "qp_num", qpn)
				})
			})
		}
	case C.IBV_EVENT_CQ_ERR:
		for _, p := range r.provs {
			if p.cq == ev.cq {
				acts = append(acts, func() {
					p.guarded(func() {
						p.fail(&deviceError{device: p.device, port: p.port, what: name + " on its completion queue (it overran: completions were lost)"})
					})
				})
			}
		}
	case C.IBV_EVENT_DEVICE_FATAL:
		for _, p := range r.provs {
			acts = append(acts, func() {
				p.guarded(func() { p.fail(&deviceError{device: p.device, port: p.port, what: name}) })
			})
		}
	default:
		port := int(ev.port)
		for _, p := range r.provs {
			acts = append(acts, func() { p.guarded(func() { p.portEvent(typ, name, port) }) })
		}
	}
	return acts
}

// portEvent logs an event of the device or one of its ports. A port that
// goes down fails nothing by itself: the connections through it fail when
// their retries run out, with failed completions, and those that were idle
// stay up if the port comes back in time.
func (p *provider) portEvent(typ int, name string, port int) {
	ours := port == p.port
	switch {
	case typ == C.IBV_EVENT_PORT_ERR && ours:
		p.log.Warn("the device port went down; its connections fail if it does not come back before their retries run out", "device", p.device, "port", port, "event", name)
	case typ == C.IBV_EVENT_PORT_ACTIVE && ours:
		p.log.Info("the device port is active", "device", p.device, "port", port, "event", name)
	default:
		p.log.Debug("asynchronous device event", "device", p.device, "port", port, "event", name)
	}
}

// asyncEvent acts on an event of the endpoint's QP. The three fatal ones
// (the QP is in error and may not flush its work by itself) fail the
// endpoint as a disconnect does: its work flushes, carrying the event as the
// reason, and the peer is told.
func (e *endpoint) asyncEvent(typ int, name string) {
	p := e.p
	switch typ {
	case C.IBV_EVENT_QP_FATAL, C.IBV_EVENT_QP_REQ_ERR, C.IBV_EVENT_QP_ACCESS_ERR:
		p.log.Warn("a queue pair failed; its connection fails", "device", p.device, "endpoint", e.id, "event", name)
		e.failWith(fmt.Errorf("verbs: %s reported %s on the queue pair of endpoint %d", p.device, name, e.id))
	case C.IBV_EVENT_COMM_EST:
		e.commEstablished()
	case C.IBV_EVENT_PATH_MIG_ERR:
		p.log.Warn("asynchronous queue pair event", "device", p.device, "endpoint", e.id, "event", name)
	default:
		p.log.Debug("asynchronous queue pair event", "device", p.device, "endpoint", e.id, "event", name)
	}
}

// asyncEventName names an event type as the header does, with
// libibverbs' description.
func asyncEventName(typ int) string {
	desc := C.GoString(C.ibv_event_type_str(C.enum_ibv_event_type(typ)))
	if n, ok := asyncEventNames[typ]; ok {
		return n + " (" + desc + ")"
	}
	return fmt.Sprintf("event %d (%s)", typ, desc)
}

var asyncEventNames = map[int]string{
	C.IBV_EVENT_CQ_ERR:              "IBV_EVENT_CQ_ERR",
	C.IBV_EVENT_QP_FATAL:            "IBV_EVENT_QP_FATAL",
	C.IBV_EVENT_QP_REQ_ERR:          "IBV_EVENT_QP_REQ_ERR",
	C.IBV_EVENT_QP_ACCESS_ERR:       "IBV_EVENT_QP_ACCESS_ERR",
	C.IBV_EVENT_COMM_EST:            "IBV_EVENT_COMM_EST",
	C.IBV_EVENT_SQ_DRAINED:          "IBV_EVENT_SQ_DRAINED",
	C.IBV_EVENT_PATH_MIG:            "IBV_EVENT_PATH_MIG",
	C.IBV_EVENT_PATH_MIG_ERR:        "IBV_EVENT_PATH_MIG_ERR",
	C.IBV_EVENT_DEVICE_FATAL:        "IBV_EVENT_DEVICE_FATAL",
	C.IBV_EVENT_PORT_ACTIVE:         "IBV_EVENT_PORT_ACTIVE",
	C.IBV_EVENT_PORT_ERR:            "IBV_EVENT_PORT_ERR",
	C.IBV_EVENT_LID_CHANGE:          "IBV_EVENT_LID_CHANGE",
	C.IBV_EVENT_PKEY_CHANGE:         "IBV_EVENT_PKEY_CHANGE",
	C.IBV_EVENT_SM_CHANGE:           "IBV_EVENT_SM_CHANGE",
	C.IBV_EVENT_SRQ_ERR:             "IBV_EVENT_SRQ_ERR",
	C.IBV_EVENT_SRQ_LIMIT_REACHED:   "IBV_EVENT_SRQ_LIMIT_REACHED",
	C.IBV_EVENT_QP_LAST_WQE_REACHED: "IBV_EVENT_QP_LAST_WQE_REACHED",
	C.IBV_EVENT_CLIENT_REREGISTER:   "IBV_EVENT_CLIENT_REREGISTER",
	C.IBV_EVENT_GID_CHANGE:          "IBV_EVENT_GID_CHANGE",
	C.IBV_EVENT_WQ_FATAL:            "IBV_EVENT_WQ_FATAL",
}

// deviceError is why a provider failed as a whole: its device, port and
// the event or failure that ended it. Every connection of the provider
// fails with it, and Dial, Accept, Register and posts return it.
type deviceError struct {
	device string
	port   int
	what   string // the event, or what failed
	err    error  // the underlying error, if any
}

func (e *deviceError) Error() string {
	s := fmt.Sprintf("verbs: device %s port %d failed: %s", e.device, e.port, e.what)
	if e.err != nil {
		s += ": " + e.err.Error()
	}
	return s
}

func (e *deviceError) Unwrap() error { return e.err }

// errDeviceFailed matches every deviceError with errors.Is.
var errDeviceFailed = errors.New("verbs: device failed")

func (e *deviceError) Is(target error) bool { return target == errDeviceFailed }
