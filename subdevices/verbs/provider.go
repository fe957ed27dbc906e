//go:build verbs && cgo

package verbs

/*
#cgo LDFLAGS: -lrdmacm -libverbs
#include "cverbs.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// Bounds on what the device allows. Dial and Accept take no queue sizes,
// so every queue pair gets Limits' sizes, which open sets to what the
// engine's settings need.
const (
	cqSizeCap     = 1 << 16
	maxMsgCap     = 1 << 30
	listenBacklog = 1024
	pollBatch     = 64
	// resolveTimeout bounds address and route resolution when ctx allows
	// longer: a peer that does not answer ARP in that time is not there.
	resolveTimeout = 5 * time.Second
)

var errClosed = fmt.Errorf("verbs: provider closed: %w", net.ErrClosed)

// open is the rdma.OpenFunc of the verbs subdevice on host h.
func (h host) open(ctx context.Context, p sdi.OpenParams) (rdma.Provider, rdma.Settings, error) {
	c, err := parseConfig(p.Config)
	if err != nil {
		return nil, rdma.Settings{}, err
	}
	if err := ctx.Err(); err != nil {
		return nil, rdma.Settings{}, err
	}
	t, err := findTarget(h.sys, c, h.addrs)
	if err != nil {
		return nil, rdma.Settings{}, err
	}
	prov, err := openProvider(t, c.settings, p.Logger)
	if err != nil {
		return nil, rdma.Settings{}, err
	}
	return prov, c.settings, nil
}

// provider is an rdma.Provider on one device port, reached through the
// RDMA connection manager. It is safe for concurrent use as rdma.Provider
// says.
//
// Goroutines and ownership:
//   - the CM goroutine (cmLoop) is the only reader of the event channel; it
//     turns connection requests into requests and routes the other events
//     to their endpoints;
//   - the delivery goroutine (deliver) owns sends on reqs and closes it;
//   - the engine's polling goroutine owns wcs and, through Poll, the
//     destruction of endpoints that closed with work outstanding;
//   - Dial, Accept, Reject and Register run on the caller's goroutine and
//     are counted in ops, which Close waits for before it frees anything;
//   - the context's asyncReader (async.go), shared with the other providers
//     on the device, routes the device's asynchronous events here; what it
//     does about one runs as an operation too (guarded);
//   - endpoints and regions guard themselves (see endpoint and region).
type provider struct {
	log    hclog.Logger
	card   []byte
	limits rdma.Limits
	addr   netip.Addr // the listener's; Dial binds to it so routes leave by this port
	device string
	port   int
	maxMR  uint64

	// C resources, made in openProvider and freed in teardown.
	ch     *C.struct_rdma_event_channel
	listen *C.struct_rdma_cm_id
	ctx    *C.struct_ibv_context // librdmacm's; the listener keeps it open
	pd     *C.struct_ibv_pd
	comp   *C.struct_ibv_comp_channel
	cq     *C.struct_ibv_cq

	// Duplicates of the event and completion channel fds in the netpoller.
	// Closing one wakes its waiter and, once Close returns, no callback on
	// it runs any more.
	cmFile   *os.File
	cmConn   syscall.RawConn
	compFile *os.File
	compConn syscall.RawConn

	// cmMu is held around rdma_get_cm_event and rdma_destroy_qp: librdmacm
	// moves a connecting QP to RTR and RTS inside rdma_get_cm_event, so a
	// QP must not be destroyed while that may run.
	cmMu sync.Mutex

	// cqMu keeps Poll and Arm off the CQ while teardown destroys it.
	cqMu     sync.RWMutex
	cqClosed bool
	wcs      []C.struct_mdv_wc // Poll's

	// failed is set once, by fail, when the device or the provider's view
	// of it is gone for good; failCh is closed then. From then on Poll
	// reports every work request still posted as flushed, from the
	// endpoints' slots, and never reads the completion queue again (see
	// fail).
	failed atomic.Pointer[deviceError]
	failCh chan struct{}
	// waitMu orders Wait's check of failed against fail's wake-up of Wait.
	waitMu sync.Mutex

	async *asyncReader // set by attachAsync, cleared by detachAsync

	qpMu  sync.RWMutex
	byQPN map[uint32]*endpoint // completions find their endpoint by qp_num

	// mu guards what follows. It is held only briefly and never while
	// waiting for an event ack (see cmLoop).
	mu       sync.Mutex
	closed   bool
	byID     map[*C.struct_rdma_cm_id]*endpoint // every endpoint not yet destroyed
	requests map[*request]struct{}              // connection requests not yet answered
	queue    []*request                         // of those, the ones not yet delivered
	regions  map[*region]struct{}

	ops    sync.WaitGroup // Dial, Accept, Reject, Register in flight
	cmWG   sync.WaitGroup // the CM goroutine
	bg     sync.WaitGroup // the delivery goroutine
	done   chan struct{}  // closed by Close once the CM goroutine is gone
	queued chan struct{}  // a request was queued
	reqs   chan rdma.Request
}

var _ rdma.Provider = (*provider)(nil)

// openProvider binds and listens on t, makes the shared PD and CQ, and
// starts the provider's goroutines. On error everything made so far is
// freed.
func openProvider(t target, s rdma.Settings, log hclog.Logger) (_ *provider, err error) {
	p := &provider{
		log:      log,
		addr:     t.addr,
		wcs:      make([]C.struct_mdv_wc, pollBatch),
		byQPN:    make(map[uint32]*endpoint),
		byID:     make(map[*C.struct_rdma_cm_id]*endpoint),
		requests: make(map[*request]struct{}),
		regions:  make(map[*region]struct{}),
		done:     make(chan struct{}),
		failCh:   make(chan struct{}),
		queued:   make(chan struct{}, 1),
		reqs:     make(chan rdma.Request),
	}
	defer func() {
		if err != nil {
			if terr := p.teardown(); terr != nil {
				log.Warn("freeing a half-opened provider failed", "error", terr)
			}
		}
	}()

	ch, cerr := C.rdma_create_event_channel()
	if ch == nil {
		return nil, fmt.Errorf("verbs: rdma_create_event_channel (is the rdma_ucm module loaded?): %w", noDevice(cerr))
	}
	p.ch = ch
	if r := C.mdv_create_id(p.ch, &p.listen); r != 0 {
		return nil, fmt.Errorf("verbs: rdma_create_id: %w", noDevice(errno(r)))
	}
	fam, ip := ipBytes(t.addr)
	if r := C.mdv_bind(p.listen, fam, (*C.uint8_t)(&ip[0]), 0); r != 0 {
		return nil, fmt.Errorf("verbs: rdma_bind_addr %v: %w", t.addr, noDevice(errno(r)))
	}
	p.ctx = C.mdv_verbs(p.listen)
	if p.ctx == nil {
		return nil, fmt.Errorf("verbs: %v is not the address of an RDMA device's interface", t.addr)
	}
	p.device = C.GoString(C.mdv_device_name(p.listen))
	p.port = int(C.mdv_port_num(p.listen))
	if t.device != "" && p.device != t.device {
		return nil, fmt.Errorf("verbs: address %v belongs to device %s, not %s", t.addr, p.device, t.device)
	}
	if t.port != 0 && p.port != t.port {
		return nil, fmt.Errorf("verbs: address %v belongs to %s port %d, not port %d", t.addr, p.device, p.port, t.port)
	}

	var lim C.struct_mdv_limits
	if r := C.mdv_query(p.ctx, C.uint8_t(p.port), &lim); r != 0 {
		return nil, fmt.Errorf("verbs: query %s port %d: %w", p.device, p.port, errno(r))
	}
	if lim.port_state != C.IBV_PORT_ACTIVE {
		return nil, fmt.Errorf("verbs: %s port %d is not ACTIVE (state %d): %w", p.device, p.port, int(lim.port_state), rdma.ErrNoDevice)
	}
	// Queue pairs are sized for what the engine posts, not for the
	// device's largest: their rings are pinned memory, per connection.
	sendDepth, recvDepth := s.Depths()
	p.limits = rdma.Limits{
		MaxSendWR:  min(int(lim.max_qp_wr), sendDepth),
		MaxRecvWR:  min(int(lim.max_qp_wr), recvDepth),
		MaxMsg:     min(int(lim.max_msg_sz), maxMsgCap),
		MaxPrivate: maxPrivate,
		CQSize:     min(int(lim.max_cqe), cqSizeCap),
	}
	p.maxMR = uint64(lim.max_mr_size)
	eager := s.EagerBytes
	if eager == 0 {
		eager = rdma.DefaultEagerBytes
	}
	if eager > p.limits.MaxMsg {
		return nil, fmt.Errorf("verbs: eager_bytes %d exceeds the largest message of %s port %d (%d bytes)", eager, p.device, p.port, p.limits.MaxMsg)
	}

	pd, cerr := C.ibv_alloc_pd(p.ctx)
	if pd == nil {
		return nil, fmt.Errorf("verbs: ibv_alloc_pd on %s: %w", p.device, orUnknown(cerr))
	}
	p.pd = pd
	comp, cerr := C.ibv_create_comp_channel(p.ctx)
	if comp == nil {
		return nil, fmt.Errorf("verbs: ibv_create_comp_channel on %s: %w", p.device, orUnknown(cerr))
	}
	p.comp = comp
	cq, cerr := C.ibv_create_cq(p.ctx, C.int(p.limits.CQSize), nil, p.comp, 0)
	if cq == nil {
		return nil, fmt.Errorf("verbs: ibv_create_cq of %d entries on %s%s: %w", p.limits.CQSize, p.device, memlockHint(cerr), orUnknown(cerr))
	}
	p.cq = cq

	if r := C.mdv_listen(p.listen, listenBacklog); r != 0 {
		return nil, fmt.Errorf("verbs: rdma_listen on %v: %w", t.addr, errno(r))
	}
	var lfam C.int
	var lip [16]byte
	var lport C.uint16_t
	C.mdv_local_addr(p.listen, &lfam, (*C.uint8_t)(&lip[0]), &lport)
	ap, err := addrPort(int(lfam), lip, uint16(lport))
	if err != nil {
		return nil, err
	}
	if p.card, err = formatCard(ap); err != nil {
		return nil, err
	}

	if p.cmFile, p.cmConn, err = pollable(int(p.ch.fd), "rdma_cm"); err != nil {
		return nil, err
	}
	if p.compFile, p.compConn, err = pollable(int(p.comp.fd), "ibv_comp_channel"); err != nil {
		return nil, err
	}
	// Last: from here events may act on the provider.
	if err := attachAsync(p); err != nil {
		return nil, err
	}

	p.cmWG.Add(1)
	go p.cmLoop()
	p.bg.Add(1)
	go p.deliver()
	log.Debug("listening", "device", p.device, "port", p.port, "address", ap.String(),
		"max_send_wr", p.limits.MaxSendWR, "max_recv_wr", p.limits.MaxRecvWR,
		"max_msg", p.limits.MaxMsg, "cq_size", p.limits.CQSize)
	return p, nil
}

// pollable hands a library-owned fd to the Go netpoller. The fd is made
// non-blocking, so the library's read returns EAGAIN instead of parking a
// thread, and a duplicate is polled, so closing the *os.File wakes the
// waiter without closing the library's fd under it.
func pollable(fd int, name string) (*os.File, syscall.RawConn, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, nil, fmt.Errorf("verbs: make the %s fd non-blocking: %w", name, err)
	}
	d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("verbs: dup the %s fd: %w", name, err)
	}
	f := os.NewFile(uintptr(d), name)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("verbs: poll the %s fd: %w", name, err)
	}
	return f, rc, nil
}

func (p *provider) Card() []byte                  { return p.card }
func (p *provider) Limits() rdma.Limits           { return p.limits }
func (p *provider) Requests() <-chan rdma.Request { return p.reqs }

// begin counts an operation that uses the provider's C resources, unless
// the provider is closing or failed.
func (p *provider) begin() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errClosed
	}
	if de := p.failed.Load(); de != nil {
		return de
	}
	p.ops.Add(1)
	return nil
}

// guarded runs f as an operation, unless the provider is closing: Close
// waits for it, so f never runs on freed resources.
func (p *provider) guarded(f func()) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.ops.Add(1)
	p.mu.Unlock()
	defer p.ops.Done()
	f()
}

// fail fails the provider as a whole, once: the device died or was
// removed, the completion queue is in error, or an event loop that the
// provider needs stopped. Every endpoint fails as on a disconnect (the QP
// goes to error, the peer is told), the connection requests not yet
// delivered are refused, and Dial, Accept, Register and posts return de
// from now on.
//
// A failed completion queue may have lost completions, or may never give
// the flushed ones; so from now on Poll does not read it, and reports
// every work request still posted as flushed with de, from the endpoints'
// slots. That is also why Poll returns no error for a failed provider: the
// engine, which fails connections by their completions, would only log it.
func (p *provider) fail(de *deviceError) {
	p.mu.Lock()
	if p.closed || p.failed.Load() != nil {
		p.mu.Unlock()
		return
	}
	p.failed.Store(de)
	close(p.failCh)
	eps := make([]*endpoint, 0, len(p.byID))
	for _, e := range p.byID {
		eps = append(eps, e)
	}
	queued := p.queue
	p.queue = nil
	for _, r := range queued {
		delete(p.requests, r)
	}
	p.mu.Unlock()

	p.log.Error("the RDMA device failed: every connection fails and no new one is made", "device", p.device, "port", p.port, "error", de)
	for _, r := range queued {
		r.drop()
	}
	for _, e := range eps {
		e.fail()
	}
	// Wake a Wait in progress; one that starts later sees failed.
	p.waitMu.Lock()
	p.compFile.SetReadDeadline(time.Unix(1, 0))
	p.waitMu.Unlock()
}

// endpoints returns the endpoints not yet destroyed.
func (p *provider) endpoints() []*endpoint {
	p.mu.Lock()
	defer p.mu.Unlock()
	eps := make([]*endpoint, 0, len(p.byID))
	for _, e := range p.byID {
		eps = append(eps, e)
	}
	return eps
}

// flushAll is Poll on a failed provider: it moves up to len(cs) of the work
// requests still posted into cs as flushed completions.
func (p *provider) flushAll(cs []rdma.Completion, de *deviceError) int {
	n := 0
	for _, e := range p.endpoints() {
		if n == len(cs) {
			break
		}
		n += e.flushSlots(cs[n:], de)
	}
	return n
}

// flushPending reports whether a failed provider has work left to report.
func (p *provider) flushPending() bool {
	for _, e := range p.endpoints() {
		if e.posted() > 0 {
			return true
		}
	}
	return false
}

func (p *provider) Poll(cs []rdma.Completion) (int, error) {
	p.cqMu.RLock()
	defer p.cqMu.RUnlock()
	if p.cqClosed {
		return 0, errClosed
	}
	if de := p.failed.Load(); de != nil {
		return p.flushAll(cs, de), nil
	}
	n := 0
	for n < len(cs) {
		want := min(len(cs)-n, len(p.wcs))
		got := int(C.mdv_poll(p.cq, &p.wcs[0], C.int(want)))
		if got < 0 {
			p.fail(&deviceError{device: p.device, port: p.port,
				what: "its completion queue is in error (it overran, or the device failed)", err: fmt.Errorf("ibv_poll_cq returned %d", got)})
			de := p.failed.Load()
			if de == nil { // closing
				return n, errClosed
			}
			return n + p.flushAll(cs[n:], de), nil
		}
		for i := range got {
			if c, ok := p.completion(&p.wcs[i]); ok {
				cs[n] = c
				n++
			}
		}
		if got < want {
			break
		}
	}
	return n, nil
}

// completion turns a work completion into the engine's terms. Only wr_id,
// status and qp_num are valid in a failed completion, which is why the
// operation comes from the endpoint's slot and not from wc.opcode.
func (p *provider) completion(wc *C.struct_mdv_wc) (rdma.Completion, bool) {
	qpn := uint32(wc.qp_num)
	p.qpMu.RLock()
	e := p.byQPN[qpn]
	p.qpMu.RUnlock()
	var wr uint64
	var op rdma.Op
	var cause error
	ok := e != nil
	if ok {
		wr, op, cause, ok = e.complete(uint64(wc.wr_id))
	}
	if !ok {
		p.log.Warn("completion for no posted work request, dropped", "qp_num", qpn, "wr_id", uint64(wc.wr_id))
		return rdma.Completion{}, false
	}
	c := rdma.Completion{Endpoint: e.id, WR: wr, Op: op}
	switch st := wc.status; st {
	case C.IBV_WC_SUCCESS:
		if op == rdma.OpRecv {
			c.Len = int(wc.byte_len)
		}
	case C.IBV_WC_WR_FLUSH_ERR:
		c.Err = fmt.Errorf("verbs: %v on endpoint %d: %w", op, e.id, rdma.ErrFlushed)
	default:
		c.Err = fmt.Errorf("verbs: %v on endpoint %d failed: %s (status %d, vendor error %#x)",
			op, e.id, C.GoString(C.ibv_wc_status_str(C.enum_ibv_wc_status(st))), uint32(st), uint32(wc.vendor_err))
	}
	if c.Err != nil && cause != nil {
		c.Err = fmt.Errorf("%w: %w", c.Err, cause)
	}
	return c, true
}

func (p *provider) Arm() error {
	p.cqMu.RLock()
	defer p.cqMu.RUnlock()
	if p.cqClosed {
		return errClosed
	}
	if p.failed.Load() != nil {
		return nil // Wait does not wait on the completion channel any more
	}
	if r := C.mdv_req_notify(p.cq); r != 0 {
		return fmt.Errorf("verbs: ibv_req_notify_cq: %w", errno(r))
	}
	return nil
}

// Wait parks in the netpoller on the completion channel. A context that
// ends sets a past read deadline; one left over from an earlier Wait only
// makes a later one return early, which the contract allows.
func (p *provider) Wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.waitMu.Lock()
	failed := p.failed.Load() != nil
	var derr error
	if !failed {
		derr = p.compFile.SetReadDeadline(time.Time{})
	}
	p.waitMu.Unlock()
	if failed {
		// Nothing completes any more but what Poll makes up; once that
		// is taken, wait for the end.
		if p.flushPending() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.done:
			return errClosed
		}
	}
	if derr != nil {
		return errClosed
	}
	stop := context.AfterFunc(ctx, func() { p.compFile.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	var cerr error
	err := p.compConn.Read(func(uintptr) bool {
		// The fd's reference held by Read keeps teardown from destroying
		// the channel while this runs.
		n := C.mdv_get_cq_events(p.comp)
		if n < 0 {
			cerr = fmt.Errorf("verbs: ibv_get_cq_event: %w", errno(n))
			return true
		}
		return n > 0
	})
	switch {
	case cerr != nil:
		return cerr
	case errors.Is(err, os.ErrDeadlineExceeded):
		return ctx.Err()
	case err != nil:
		return errClosed
	}
	return nil
}

// Close stops the CM goroutine first (see cmMu), then wakes and waits for
// Dial, Accept and the delivery goroutine, then frees everything.
func (p *provider) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()

	p.cmFile.Close()
	p.cmWG.Wait()
	close(p.done)
	p.ops.Wait()
	p.bg.Wait()
	return p.teardown()
}

// teardown frees the C resources in dependency order: QPs and their ids
// before the CQ and PD they use, MRs before the PD, the CQ before its
// channel, the listener (which keeps librdmacm's device context open)
// after everything made on that context, and the event channel last. It
// runs with no goroutine of the provider left and no operation in flight,
// and it tolerates a half-made provider.
func (p *provider) teardown() error {
	detachAsync(p)
	if p.compFile != nil {
		p.compFile.Close()
	}
	if p.cmFile != nil {
		p.cmFile.Close()
	}
	p.cqMu.Lock()
	p.cqClosed = true
	p.cqMu.Unlock()

	p.mu.Lock()
	eps := make([]*endpoint, 0, len(p.byID))
	for _, e := range p.byID {
		eps = append(eps, e)
	}
	reqs := make([]*request, 0, len(p.requests))
	for r := range p.requests {
		reqs = append(reqs, r)
	}
	p.requests = map[*request]struct{}{}
	p.queue = nil
	regs := make([]*region, 0, len(p.regions))
	for r := range p.regions {
		regs = append(regs, r)
	}
	p.mu.Unlock()

	var errs []error
	for _, e := range eps {
		errs = append(errs, e.destroy())
	}
	for _, r := range reqs {
		r.drop()
	}
	for _, r := range regs {
		errs = append(errs, r.Close())
	}
	if p.cq != nil {
		if r := C.ibv_destroy_cq(p.cq); r != 0 {
			errs = append(errs, fmt.Errorf("verbs: ibv_destroy_cq: %w", syscall.Errno(r)))
		}
		p.cq = nil
	}
	if p.comp != nil {
		if r := C.ibv_destroy_comp_channel(p.comp); r != 0 {
			errs = append(errs, fmt.Errorf("verbs: ibv_destroy_comp_channel: %w", syscall.Errno(r)))
		}
	}
	if p.pd != nil {
		if r := C.ibv_dealloc_pd(p.pd); r != 0 {
			errs = append(errs, fmt.Errorf("verbs: ibv_dealloc_pd: %w", syscall.Errno(r)))
		}
		p.pd = nil
	}
	if p.listen != nil {
		if r := C.mdv_destroy_id(p.listen); r != 0 {
			errs = append(errs, fmt.Errorf("verbs: rdma_destroy_id of the listener: %w", errno(r)))
		}
		p.listen = nil
	}
	if p.ch != nil {
		C.rdma_destroy_event_channel(p.ch)
		p.ch = nil
	}
	return errors.Join(errs...)
}

// errno turns a helper's -errno into an error.
func errno(r C.int) error { return syscall.Errno(-r) }

// noDevice marks the errnos with which the kernel says it has no RDMA
// device (or no rdma_ucm) as rdma.ErrNoDevice too.
func noDevice(err error) error {
	err = orUnknown(err)
	if errors.Is(err, syscall.ENODEV) || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENXIO) {
		return fmt.Errorf("%w: %w", err, rdma.ErrNoDevice)
	}
	return err
}

// orUnknown covers a C call that failed without setting errno.
func orUnknown(err error) error {
	if err == nil {
		return errors.New("failed without an errno")
	}
	return err
}

// ipBytes gives the family (4 or 6) and the network-order bytes of a.
func ipBytes(a netip.Addr) (C.int, [16]byte) {
	var b [16]byte
	if a.Is4() {
		v := a.As4()
		copy(b[:], v[:])
		return 4, b
	}
	return 6, a.As16()
}

func addrPort(fam int, ip [16]byte, port uint16) (netip.AddrPort, error) {
	switch fam {
	case 4:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[:4])), port), nil
	case 6:
		return netip.AddrPortFrom(netip.AddrFrom16(ip).Unmap(), port), nil
	}
	return netip.AddrPort{}, errors.New("verbs: the listener is bound to neither IPv4 nor IPv6")
}
