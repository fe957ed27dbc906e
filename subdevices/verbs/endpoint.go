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
	"net/netip"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
)

type epState uint8

const (
	epOpen      epState = iota
	epClosed            // Close was called; the QP is in error and its work drains through Poll
	epDestroyed         // the QP and the cm id are gone
)

// endpoint is an RC queue pair on a cm id. It is safe for concurrent use:
// posts come from any goroutine, completions from the polling goroutine,
// connection events from the CM goroutine, all under mu.
//
// The wr_id posted to the device is an index into slots, which hold the
// engine's id and the kind of work: a failed completion carries neither an
// opcode nor a length, only wr_id and qp_num.
type endpoint struct {
	p       *provider
	id      uint32
	events  chan cmEvent  // CM events while Dial or Accept waits; never blocks the CM goroutine
	closing chan struct{} // closed when the endpoint leaves epOpen

	mu           sync.Mutex
	state        epState
	cm           *C.struct_rdma_cm_id
	qp           *C.struct_ibv_qp
	qpn          uint32
	established  bool // the peer holds a connection that rdma_disconnect should end
	disconnected bool
	cause        error // why the QP failed, from an asynchronous event; its flushed work carries it
	slots        []slot
	free         []uint32
	sends, recvs int // posted and not yet polled
}

type slot struct {
	wr   uint64
	op   rdma.Op
	used bool
}

var _ rdma.Endpoint = (*endpoint)(nil)

// newEndpoint registers an endpoint for cm's events. From here the
// endpoint owns cm: Close (or teardown) destroys it.
func (p *provider) newEndpoint(id uint32, cm *C.struct_rdma_cm_id) *endpoint {
	e := &endpoint{p: p, id: id, cm: cm, events: make(chan cmEvent, 4), closing: make(chan struct{})}
	p.mu.Lock()
	p.byID[cm] = e
	p.mu.Unlock()
	return e
}

func (p *provider) Dial(ctx context.Context, card, private []byte, id uint32, setup func(rdma.Endpoint) error) (rdma.Endpoint, error) {
	dst, err := parseCard(card)
	if err != nil {
		return nil, fmt.Errorf("verbs: dial: %w", err)
	}
	if dst.Addr().Is4() != p.addr.Is4() {
		return nil, fmt.Errorf("verbs: dial %v: this rank listens on %v, of the other address family", dst, p.addr)
	}
	priv, err := encodePrivate(private)
	if err != nil {
		return nil, fmt.Errorf("verbs: dial %v: %w", dst, err)
	}
	if err := p.begin(); err != nil {
		return nil, err
	}
	defer p.ops.Done()
	var cm *C.struct_rdma_cm_id
	if r := C.mdv_create_id(p.ch, &cm); r != 0 {
		return nil, fmt.Errorf("verbs: dial %v: rdma_create_id: %w", dst, errno(r))
	}
	e := p.newEndpoint(id, cm)
	if err := e.connect(ctx, dst, priv, setup); err != nil {
		if cerr := e.Close(); cerr != nil {
			p.log.Debug("closing a failed endpoint", "endpoint", id, "error", cerr)
		}
		return nil, fmt.Errorf("verbs: dial %v: %w", dst, err)
	}
	return e, nil
}

// connect walks the active side of the connection manager's handshake:
// resolve the address (from this rank's listening address, so the route
// leaves by the provider's device), resolve the route, make the QP, let the
// engine post its receives, connect.
func (e *endpoint) connect(ctx context.Context, dst netip.AddrPort, priv []byte, setup func(rdma.Endpoint) error) error {
	p := e.p
	fam, src := ipBytes(p.addr)
	_, dip := ipBytes(dst.Addr())
	timeout := C.int(resolveTimeout / time.Millisecond)
	if d, ok := ctx.Deadline(); ok {
		timeout = C.int(max(min(time.Until(d), resolveTimeout), time.Millisecond) / time.Millisecond)
	}
	if r := C.mdv_resolve_addr(e.cm, fam, (*C.uint8_t)(&src[0]), (*C.uint8_t)(&dip[0]), C.uint16_t(dst.Port()), timeout); r != 0 {
		return fmt.Errorf("rdma_resolve_addr: %w", errno(r))
	}
	if err := e.await(ctx, C.RDMA_CM_EVENT_ADDR_RESOLVED); err != nil {
		return fmt.Errorf("resolve address: %w", err)
	}
	if r := C.mdv_resolve_route(e.cm, timeout); r != 0 {
		return fmt.Errorf("rdma_resolve_route: %w", errno(r))
	}
	if err := e.await(ctx, C.RDMA_CM_EVENT_ROUTE_RESOLVED); err != nil {
		return fmt.Errorf("resolve route: %w", err)
	}
	if err := e.createQP(); err != nil {
		return err
	}
	if err := setup(e); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	if r := C.mdv_connect(e.cm, unsafe.Pointer(&priv[0]), C.uint8_t(len(priv))); r != 0 {
		return fmt.Errorf("rdma_connect: %w", errno(r))
	}
	return e.await(ctx, C.RDMA_CM_EVENT_ESTABLISHED)
}

// await waits for the next connection event of the endpoint, which must be
// want.
//
// An event that ends the attempt fails the QP (librdmacm does it for a
// REJECTED inside rdma_get_cm_event, fail does it for the others), and the
// flushed receives setup posted may make the engine close the endpoint at
// once. When the endpoint closes, the event that failed it is the reason,
// and a reject must stay rdma.ErrRejected for the engine: cmLoop hands
// events over under cmMu, so once await has taken cmMu such an event is
// queued.
func (e *endpoint) await(ctx context.Context, want C.int) error {
	select {
	case ev := <-e.events:
		if ev.event == want {
			return nil
		}
		return ev.err()
	case <-ctx.Done():
		return ctx.Err()
	case <-e.closing:
		e.p.cmMu.Lock()
		e.p.cmMu.Unlock() //nolint:staticcheck // an empty critical section: waits out a hand-over in progress
		select {
		case ev := <-e.events:
			if ev.event != want {
				return ev.err()
			}
		default:
		}
		return errors.New("endpoint closed while connecting")
	case <-e.p.done:
		return errClosed
	case <-e.p.failCh:
		return e.p.failed.Load()
	}
}

// createQP makes the endpoint's QP on the shared PD and CQ. librdmacm
// leaves it in INIT, where receives may be posted.
func (e *endpoint) createQP() error {
	p := e.p
	if C.mdv_verbs(e.cm) != p.ctx {
		return fmt.Errorf("the route to the peer leaves through another RDMA device than %s", p.device)
	}
	if r := C.mdv_create_qp(e.cm, p.pd, p.cq, C.uint32_t(p.limits.MaxSendWR), C.uint32_t(p.limits.MaxRecvWR)); r != 0 {
		return fmt.Errorf("rdma_create_qp%s: %w", memlockHint(errno(r)), errno(r))
	}
	qp := C.mdv_qp(e.cm)
	qpn := uint32(qp.qp_num)
	e.mu.Lock()
	e.qp, e.qpn = qp, qpn
	e.mu.Unlock()
	p.qpMu.Lock()
	p.byQPN[qpn] = e
	p.qpMu.Unlock()
	return nil
}

func (e *endpoint) PostRecv(wr uint64, r rdma.Region, off, n int) error {
	return e.post(rdma.OpRecv, wr, r, off, n, 0, 0)
}

func (e *endpoint) PostSend(wr uint64, r rdma.Region, off, n int) error {
	return e.post(rdma.OpSend, wr, r, off, n, 0, 0)
}

func (e *endpoint) PostRead(wr uint64, r rdma.Region, off, n int, raddr uint64, rkey uint32) error {
	return e.post(rdma.OpRead, wr, r, off, n, raddr, rkey)
}

func (e *endpoint) post(op rdma.Op, wr uint64, r rdma.Region, off, n int, raddr uint64, rkey uint32) error {
	reg, ok := r.(*region)
	if !ok || reg.p != e.p {
		return fmt.Errorf("verbs: %v on endpoint %d: the region was not registered with this provider", op, e.id)
	}
	if off < 0 || n < 0 || off > len(reg.buf) || n > len(reg.buf)-off {
		return fmt.Errorf("verbs: %v on endpoint %d: [%d, %d+%d) is outside the region's %d bytes", op, e.id, off, off, n, len(reg.buf))
	}
	if n > e.p.limits.MaxMsg {
		return fmt.Errorf("verbs: %v on endpoint %d: %d bytes exceed Limits.MaxMsg (%d)", op, e.id, n, e.p.limits.MaxMsg)
	}
	if reg.closed.Load() {
		return fmt.Errorf("verbs: %v on endpoint %d: the region is closed", op, e.id)
	}
	addr := C.uint64_t(reg.addr + uint64(off))

	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state != epOpen {
		return fmt.Errorf("verbs: %v on closed endpoint %d: %w", op, e.id, rdma.ErrFlushed)
	}
	if de := e.p.failed.Load(); de != nil {
		// Nothing posted now would complete: Poll reports only what
		// was posted when the provider failed.
		return fmt.Errorf("verbs: %v on endpoint %d: %w: %w", op, e.id, rdma.ErrFlushed, de)
	}
	if op == rdma.OpRecv && e.recvs >= e.p.limits.MaxRecvWR {
		return fmt.Errorf("verbs: endpoint %d already has Limits.MaxRecvWR (%d) receives posted", e.id, e.p.limits.MaxRecvWR)
	}
	if op != rdma.OpRecv && e.sends >= e.p.limits.MaxSendWR {
		return fmt.Errorf("verbs: endpoint %d already has Limits.MaxSendWR (%d) sends and reads posted", e.id, e.p.limits.MaxSendWR)
	}
	s := e.alloc(wr, op)
	var rc C.int
	switch op {
	case rdma.OpRecv:
		rc = C.mdv_post_recv(e.qp, C.uint64_t(s), addr, C.uint32_t(n), reg.lkey)
	case rdma.OpSend:
		rc = C.mdv_post_send(e.qp, C.uint64_t(s), addr, C.uint32_t(n), reg.lkey)
	default:
		rc = C.mdv_post_read(e.qp, C.uint64_t(s), addr, C.uint32_t(n), reg.lkey, C.uint64_t(raddr), C.uint32_t(rkey))
	}
	if rc != 0 {
		e.release(s)
		return fmt.Errorf("verbs: post %v on endpoint %d: %w", op, e.id, syscall.Errno(rc))
	}
	if op == rdma.OpRecv {
		e.recvs++
	} else {
		e.sends++
	}
	return nil
}

// alloc takes a free slot; the counts checked by post bound the table.
func (e *endpoint) alloc(wr uint64, op rdma.Op) uint32 {
	var s uint32
	if n := len(e.free); n > 0 {
		s = e.free[n-1]
		e.free = e.free[:n-1]
	} else {
		s = uint32(len(e.slots))
		e.slots = append(e.slots, slot{})
	}
	e.slots[s] = slot{wr: wr, op: op, used: true}
	return s
}

func (e *endpoint) release(s uint32) {
	e.slots[s] = slot{}
	e.free = append(e.free, s)
}

// complete retires the slot a completion names, and returns the reason the
// QP failed, if an event gave one. The last completion of a closed endpoint
// destroys it: only then is nothing of it left in the CQ, which destroying
// the QP earlier would purge.
func (e *endpoint) complete(wrID uint64) (uint64, rdma.Op, error, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if wrID >= uint64(len(e.slots)) || !e.slots[wrID].used {
		return 0, 0, nil, false
	}
	s := e.slots[wrID]
	e.retireLocked(uint32(wrID))
	return s.wr, s.op, e.cause, true
}

// retireLocked frees slot s, whose work completed, and destroys a closed
// endpoint with nothing posted any more.
func (e *endpoint) retireLocked(s uint32) {
	op := e.slots[s].op
	e.release(s)
	if op == rdma.OpRecv {
		e.recvs--
	} else {
		e.sends--
	}
	if e.state == epClosed && e.sends+e.recvs == 0 {
		if err := e.destroyLocked(); err != nil {
			e.p.log.Warn("destroying a closed endpoint failed", "endpoint", e.id, "error", err)
		}
	}
}

// flushSlots is Poll for an endpoint of a failed provider: it reports up
// to len(cs) of the work still posted as flushed with de, as the device
// would have had it not failed.
func (e *endpoint) flushSlots(cs []rdma.Completion, de *deviceError) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for i := range e.slots {
		if n == len(cs) {
			break
		}
		s := e.slots[i]
		if !s.used {
			continue
		}
		cs[n] = rdma.Completion{Endpoint: e.id, WR: s.wr, Op: s.op,
			Err: fmt.Errorf("verbs: %v on endpoint %d: %w: %w", s.op, e.id, rdma.ErrFlushed, de)}
		n++
		e.retireLocked(uint32(i))
	}
	return n
}

// posted is how much work the endpoint has posted and not yet seen
// complete.
func (e *endpoint) posted() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sends + e.recvs
}

// commEstablished passes IBV_EVENT_COMM_EST on to librdmacm (rdma_notify(3)):
// a message came on the QP before the connection manager's RTU, which may
// be lost, and librdmacm then completes the connection on its strength.
func (e *endpoint) commEstablished() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state == epDestroyed || e.cm == nil {
		return
	}
	if r := C.mdv_notify_comm_est(e.cm); r != 0 && r != -C.EISCONN {
		e.p.log.Debug("rdma_notify of IBV_EVENT_COMM_EST failed", "endpoint", e.id, "error", errno(r))
	}
}

// setEstablished records, for the CM goroutine, that the peer now holds a
// connection. A Dial given up while the handshake was in flight has closed
// the endpoint already; the connection is ended at once then.
func (e *endpoint) setEstablished() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state == epDestroyed {
		return
	}
	e.established = true
	if e.state == epClosed {
		e.disconnectLocked()
	}
}

// fail, run by the CM goroutine when the connection ends or cannot be
// made (and by the provider's fail), moves the QP to error so its posted
// work flushes, and answers the peer's disconnect request, or makes one.
// The endpoint stays open for the engine to close.
func (e *endpoint) fail() { e.failWith(nil) }

// failWith is fail with the reason the QP failed, from an asynchronous
// event; the flushed work carries it, so the engine reports it.
func (e *endpoint) failWith(cause error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state == epDestroyed {
		return
	}
	if e.cause == nil {
		e.cause = cause
	}
	if e.qp != nil {
		if r := C.mdv_qp_error(e.qp); r != 0 {
			e.p.log.Debug("moving a failed queue pair to error failed", "endpoint", e.id, "error", errno(r))
		}
	}
	e.disconnectLocked()
}

// disconnectLocked ends an established connection once; the peer's QP then
// flushes too.
func (e *endpoint) disconnectLocked() {
	if !e.established || e.disconnected {
		return
	}
	e.disconnected = true
	if r := C.mdv_disconnect(e.cm); r != 0 {
		e.p.log.Debug("rdma_disconnect failed", "endpoint", e.id, "error", errno(r))
	}
}

// notify hands an event to a Dial or Accept that waits for one. Events
// after the connection is up have no reader and are dropped.
func (e *endpoint) notify(ev cmEvent) {
	select {
	case e.events <- ev:
	default:
	}
}

// Close moves the QP to error, which flushes its posted work into the CQ,
// and disconnects. The QP and the cm id are destroyed once Poll has taken
// the last of that work.
func (e *endpoint) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state != epOpen {
		return nil
	}
	e.state = epClosed
	close(e.closing)
	var err error
	if e.qp != nil {
		if r := C.mdv_qp_error(e.qp); r != 0 {
			err = fmt.Errorf("verbs: endpoint %d: move the queue pair to error: %w", e.id, errno(r))
		}
	}
	e.disconnectLocked()
	if e.sends+e.recvs == 0 {
		err = errors.Join(err, e.destroyLocked())
	}
	return err
}

// destroy frees the endpoint now, work outstanding or not; teardown uses
// it when the CQ is about to go anyway.
func (e *endpoint) destroy() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch e.state {
	case epDestroyed:
		return nil
	case epOpen:
		close(e.closing)
	}
	e.disconnectLocked()
	return e.destroyLocked()
}

func (e *endpoint) destroyLocked() error {
	p := e.p
	e.state = epDestroyed
	if e.qp != nil {
		p.cmMu.Lock()
		C.rdma_destroy_qp(e.cm)
		p.cmMu.Unlock()
		// Only now may another QP get this number; a QP made since then
		// already replaced the entry.
		p.qpMu.Lock()
		if p.byQPN[e.qpn] == e {
			delete(p.byQPN, e.qpn)
		}
		p.qpMu.Unlock()
		e.qp = nil
	}
	var err error
	if r := C.mdv_destroy_id(e.cm); r != 0 {
		err = fmt.Errorf("verbs: endpoint %d: rdma_destroy_id: %w", e.id, errno(r))
	}
	// Removed after the id is gone, so teardown, which finds endpoints
	// here, waits on mu for a destroy in progress.
	p.mu.Lock()
	if p.byID[e.cm] == e {
		delete(p.byID, e.cm)
	}
	p.mu.Unlock()
	e.cm = nil
	return err
}
