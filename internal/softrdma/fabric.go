// Package softrdma is an RDMA fabric in software, inside one process: the
// provider the rdma engine's tests run on where there is no RDMA hardware.
//
// It keeps the hardware's rules and reports their breach instead of hiding
// it: a send that finds no receive posted, a read outside a registered
// region or of a region already deregistered, and work posted on a closed
// endpoint fail the endpoint, both ends, with flushed completions, as a
// reliable connection does. Bytes move when the work is posted, or, on a
// Deferred fabric, at the next Poll of any provider, as a device works
// behind the poster's back: a buffer reused or deregistered before its
// completion then shows, and so does work that an endpoint's close
// flushes before it was done. The completions come through the
// completion queue as they would from a device.
package softrdma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
)

// Fabric is one network: providers opened on it reach each other. Its lock
// serializes every transfer, which keeps the model simple; speed is not
// what it is for.
type Fabric struct {
	mu      sync.Mutex
	nextID  uint32
	byCard  map[uint32]*Provider
	regions map[uint32]*region // by rkey, over every provider
	limits  rdma.Limits
	queue   []func() // posted work not yet done, on a deferred fabric
	// Deferred makes posted sends and reads happen at the next Poll of
	// any provider instead of at once. Set it before opening providers.
	Deferred bool
	// Violations counts breaches of the hardware's rules (above); a
	// correct engine leaves it at zero.
	Violations atomic.Int64
	// Errors keeps the first few breaches, for the test's message.
	errs []string
}

// DefaultLimits are a small device's.
var DefaultLimits = rdma.Limits{MaxSendWR: 256, MaxRecvWR: 2048, MaxMsg: 1 << 20, MaxPrivate: 56, CQSize: 1 << 16}

// New returns an empty fabric with the given limits (DefaultLimits if
// zero).
func New(l rdma.Limits) *Fabric {
	if l == (rdma.Limits{}) {
		l = DefaultLimits
	}
	return &Fabric{byCard: make(map[uint32]*Provider), regions: make(map[uint32]*region), limits: l}
}

// Errs returns the breaches the fabric saw.
func (f *Fabric) Errs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.errs...)
}

func (f *Fabric) violateLocked(format string, a ...any) {
	f.Violations.Add(1)
	if len(f.errs) < 16 {
		f.errs = append(f.errs, fmt.Sprintf(format, a...))
	}
}

// Open opens a provider on the fabric.
func (f *Fabric) Open() *Provider {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	p := &Provider{f: f, id: f.nextID, reqs: make(chan rdma.Request, 64), wake: make(chan struct{}, 1)}
	f.byCard[p.id] = p
	return p
}

// Provider is one rank's interface on the fabric.
type Provider struct {
	f      *Fabric
	id     uint32
	reqs   chan rdma.Request
	wake   chan struct{}
	armed  bool              // guarded by f.mu
	cq     []rdma.Completion // guarded by f.mu
	eps    []*endpoint       // open endpoints; guarded by f.mu
	closed bool              // guarded by f.mu
}

var _ rdma.Provider = (*Provider)(nil)

const cardMagic = 0x534f4654 // "SOFT"

// Card is "SOFT" and the provider's number.
func (p *Provider) Card() []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint32(b, cardMagic)
	binary.BigEndian.PutUint32(b[4:], p.id)
	return b
}

// Limits are the fabric's.
func (p *Provider) Limits() rdma.Limits { return p.f.limits }

type region struct {
	buf    []byte
	rkey   uint32
	closed bool
	owner  *Provider
}

func (r *region) Addr() uint64 { return uint64(uintptr(unsafe.Pointer(&r.buf[0]))) }
func (r *region) RKey() uint32 { return r.rkey }
func (r *region) Close() error {
	f := r.owner.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if !r.closed {
		r.closed = true
		delete(f.regions, r.rkey)
	}
	return nil
}

// Register registers buf.
func (p *Provider) Register(buf []byte) (rdma.Region, error) {
	if len(buf) == 0 {
		return nil, errors.New("softrdma: register an empty buffer")
	}
	f := p.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if p.closed {
		return nil, errors.New("softrdma: register: provider closed")
	}
	f.nextID++
	r := &region{buf: buf, rkey: f.nextID, owner: p}
	f.regions[r.rkey] = r
	return r, nil
}

func (p *Provider) pushLocked(c rdma.Completion) {
	if len(p.cq) >= p.f.limits.CQSize {
		// A device loses the completion and fails the queue; the
		// fabric keeps it but counts the overrun.
		p.f.violateLocked("completion queue of %d entries overrun", p.f.limits.CQSize)
	}
	p.cq = append(p.cq, c)
	p.wakeLocked()
}

func (p *Provider) wakeLocked() {
	if p.armed {
		p.armed = false
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// Poll moves completions out.
func (p *Provider) Poll(cs []rdma.Completion) (int, error) {
	f := p.f
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pumpLocked()
	n := copy(cs, p.cq)
	p.cq = p.cq[:copy(p.cq, p.cq[n:])]
	return n, nil
}

// Arm asks for a wake-up at the next completion.
func (p *Provider) Arm() error {
	p.f.mu.Lock()
	p.armed = true
	p.f.mu.Unlock()
	return nil
}

// Wait waits for a completion after Arm.
func (p *Provider) Wait(ctx context.Context) error {
	select {
	case <-p.wake:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Requests delivers connection requests.
func (p *Provider) Requests() <-chan rdma.Request { return p.reqs }

// Close closes every endpoint and stops listening.
func (p *Provider) Close() error {
	f := p.f
	f.mu.Lock()
	if p.closed {
		f.mu.Unlock()
		return nil
	}
	p.closed = true
	delete(f.byCard, p.id)
	for _, e := range append([]*endpoint(nil), p.eps...) {
		e.breakLocked()
	}
	for k, r := range f.regions {
		if r.owner == p {
			r.closed = true
			delete(f.regions, k)
		}
	}
	p.cq = nil
	f.mu.Unlock()
	close(p.reqs)
	return nil
}

// Dial connects to the provider behind card.
func (p *Provider) Dial(ctx context.Context, card, private []byte, id uint32, setup func(rdma.Endpoint) error) (rdma.Endpoint, error) {
	if len(card) != 8 || binary.BigEndian.Uint32(card) != cardMagic {
		return nil, fmt.Errorf("softrdma: dial: card %x is not a softrdma card", card)
	}
	if len(private) > p.f.limits.MaxPrivate {
		return nil, fmt.Errorf("softrdma: dial: %d bytes of private data, at most %d", len(private), p.f.limits.MaxPrivate)
	}
	f := p.f
	f.mu.Lock()
	if p.closed {
		f.mu.Unlock()
		return nil, errors.New("softrdma: dial: provider closed")
	}
	to := f.byCard[binary.BigEndian.Uint32(card[4:])]
	e := p.newEndpointLocked(id)
	f.mu.Unlock()
	if err := setup(e); err != nil {
		e.Close()
		return nil, err
	}
	if to == nil {
		e.Close()
		return nil, fmt.Errorf("softrdma: dial %x: nobody listens there", card)
	}
	req := &request{from: e, private: append([]byte(nil), private...), answer: make(chan error, 1)}
	if err := to.offer(ctx, req); err != nil {
		e.Close()
		return nil, err
	}
	select {
	case err := <-req.answer:
		if err != nil {
			e.Close()
			return nil, err
		}
		return e, nil
	case <-ctx.Done():
		// The listener may still accept; breaking the endpoint flushes
		// the accepted side too.
		e.Close()
		return nil, fmt.Errorf("softrdma: dial %x: %w", card, ctx.Err())
	}
}

func (p *Provider) offer(ctx context.Context, req *request) (err error) {
	defer func() {
		if recover() != nil { // the listener closed its channel
			err = errors.New("softrdma: dial: the listener closed")
		}
	}()
	req.to = p
	select {
	case p.reqs <- req:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *Provider) newEndpointLocked(id uint32) *endpoint {
	e := &endpoint{p: p, id: id}
	p.eps = append(p.eps, e)
	return e
}

type request struct {
	from    *endpoint
	to      *Provider
	private []byte
	answer  chan error
	once    sync.Once
}

func (r *request) Private() []byte { return r.private }

func (r *request) Accept(id uint32, setup func(rdma.Endpoint) error) (rdma.Endpoint, error) {
	f := r.to.f
	f.mu.Lock()
	if r.to.closed {
		f.mu.Unlock()
		r.Reject()
		return nil, errors.New("softrdma: accept: provider closed")
	}
	e := r.to.newEndpointLocked(id)
	f.mu.Unlock()
	if err := setup(e); err != nil {
		e.Close()
		r.Reject()
		return nil, err
	}
	f.mu.Lock()
	if r.from.dead {
		f.mu.Unlock()
		e.Close()
		return nil, errors.New("softrdma: accept: the dialing endpoint is gone")
	}
	e.peer, r.from.peer = r.from, e
	f.mu.Unlock()
	r.once.Do(func() { r.answer <- nil })
	return e, nil
}

func (r *request) Reject() error {
	r.once.Do(func() { r.answer <- rdma.ErrRejected })
	return nil
}

type posted struct {
	wr  uint64
	r   *region
	off int
	n   int
}

// endpoint is one end of a connection; all its fields are guarded by f.mu.
type endpoint struct {
	p     *Provider
	id    uint32
	peer  *endpoint
	recvs []posted
	dead  bool
}

func (e *endpoint) PostRecv(wr uint64, r rdma.Region, off, n int) error {
	f := e.p.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if e.dead { // hardware takes work on a failed connection and flushes it
		e.p.pushLocked(rdma.Completion{Endpoint: e.id, WR: wr, Op: rdma.OpRecv, Err: rdma.ErrFlushed})
		return nil
	}
	rg, err := e.checkLocked("recv", r, off, n)
	if err != nil {
		return err
	}
	if len(e.recvs) >= f.limits.MaxRecvWR {
		return fmt.Errorf("softrdma: post recv: %d receives posted already", len(e.recvs))
	}
	e.recvs = append(e.recvs, posted{wr: wr, r: rg, off: off, n: n})
	return nil
}

func (e *endpoint) checkLocked(what string, r rdma.Region, off, n int) (*region, error) {
	rg, ok := r.(*region)
	if !ok || rg.closed || rg.owner != e.p {
		e.p.f.violateLocked("%s on endpoint %d: region not registered here", what, e.id)
		return nil, fmt.Errorf("softrdma: post %s: region not registered here", what)
	}
	if off < 0 || n < 0 || off+n > len(rg.buf) {
		e.p.f.violateLocked("%s on endpoint %d: [%d, +%d) outside a region of %d bytes", what, e.id, off, n, len(rg.buf))
		return nil, fmt.Errorf("softrdma: post %s: [%d, +%d) outside a region of %d bytes", what, off, n, len(rg.buf))
	}
	return rg, nil
}

func (e *endpoint) PostSend(wr uint64, r rdma.Region, off, n int) error {
	f := e.p.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if e.dead {
		e.p.pushLocked(rdma.Completion{Endpoint: e.id, WR: wr, Op: rdma.OpSend, Err: rdma.ErrFlushed})
		return nil
	}
	rg, err := e.checkLocked("send", r, off, n)
	if err != nil {
		return err
	}
	if n > f.limits.MaxMsg {
		return fmt.Errorf("softrdma: post send of %d bytes, at most %d", n, f.limits.MaxMsg)
	}
	f.startLocked(e, func() { e.sendLocked(wr, rg, off, n) })
	return nil
}

// sendLocked carries out a posted send.
func (e *endpoint) sendLocked(wr uint64, rg *region, off, n int) {
	f := e.p.f
	if e.dead {
		e.p.pushLocked(rdma.Completion{Endpoint: e.id, WR: wr, Op: rdma.OpSend, Err: rdma.ErrFlushed})
		return
	}
	if rg.closed {
		f.violateLocked("send of %d bytes from endpoint %d out of a region deregistered before the send was done", n, e.id)
	}
	q := e.peer
	if q == nil || q.dead {
		e.breakLocked()
		e.p.pushLocked(rdma.Completion{Endpoint: e.id, WR: wr, Op: rdma.OpSend, Err: rdma.ErrFlushed})
		return
	}
	if len(q.recvs) == 0 {
		f.violateLocked("send of %d bytes from endpoint %d: no receive posted at the peer", n, e.id)
		e.breakLocked()
		e.p.pushLocked(rdma.Completion{Endpoint: e.id, WR: wr, Op: rdma.OpSend, Err: errors.New("softrdma: receiver not ready")})
		return
	}
	rv := q.recvs[0]
	if n > rv.n {
		f.violateLocked("send of %d bytes from endpoint %d into a receive of %d", n, e.id, rv.n)
		e.breakLocked()
		e.p.pushLocked(rdma.Completion{Endpoint: e.id, WR: wr, Op: rdma.OpSend, Err: errors.New("softrdma: receive too small")})
		return
	}
	q.recvs = q.recvs[1:]
	copy(rv.r.buf[rv.off:rv.off+n], rg.buf[off:off+n])
	q.p.pushLocked(rdma.Completion{Endpoint: q.id, WR: rv.wr, Op: rdma.OpRecv, Len: n})
	e.p.pushLocked(rdma.Completion{Endpoint: e.id, WR: wr, Op: rdma.OpSend})
}

func (e *endpoint) PostRead(wr uint64, r rdma.Region, off, n int, raddr uint64, rkey uint32) error {
	f := e.p.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if e.dead {
		e.p.pushLocked(rdma.Completion{Endpoint: e.id, WR: wr, Op: rdma.OpRead, Err: rdma.ErrFlushed})
		return nil
	}
	rg, err := e.checkLocked("read", r, off, n)
	if err != nil {
		return err
	}
	if n > f.limits.MaxMsg {
		return fmt.Errorf("softrdma: post read of %d bytes, at most %d", n, f.limits.MaxMsg)
	}
	f.startLocked(e, func() { e.readLocked(wr, rg, off, n, raddr, rkey) })
	return nil
}

// readLocked carries out a posted read.
func (e *endpoint) readLocked(wr uint64, rg *region, off, n int, raddr uint64, rkey uint32) {
	f := e.p.f
	if e.dead {
		e.p.pushLocked(rdma.Completion{Endpoint: e.id, WR: wr, Op: rdma.OpRead, Err: rdma.ErrFlushed})
		return
	}
	if rg.closed {
		f.violateLocked("read of %d bytes by endpoint %d into a region deregistered before the read was done", n, e.id)
	}
	src, ok := f.regions[rkey]
	var base uint64
	if ok {
		base = uint64(uintptr(unsafe.Pointer(&src.buf[0])))
	}
	if !ok || e.peer == nil || src.owner != e.peer.p || raddr < base || raddr+uint64(n) > base+uint64(len(src.buf)) {
		f.violateLocked("read of %d bytes at %#x with rkey %d from endpoint %d: no such remote region", n, raddr, rkey, e.id)
		e.breakLocked()
		e.p.pushLocked(rdma.Completion{Endpoint: e.id, WR: wr, Op: rdma.OpRead, Err: errors.New("softrdma: remote access error")})
		return
	}
	at := raddr - base
	copy(rg.buf[off:off+n], src.buf[at:at+uint64(n)])
	e.p.pushLocked(rdma.Completion{Endpoint: e.id, WR: wr, Op: rdma.OpRead})
}

// startLocked carries out posted work at once, or, on a deferred fabric,
// queues it for the next Poll of any provider, as a device works behind
// the poster's back: a buffer reused or deregistered before the work's
// completion then shows.
func (f *Fabric) startLocked(e *endpoint, work func()) {
	if !f.Deferred {
		work()
		return
	}
	f.queue = append(f.queue, work)
	e.p.wakeLocked() // its progress will poll, and the poll does the work
}

// pumpLocked does the queued work, in the order it was posted.
func (f *Fabric) pumpLocked() {
	for len(f.queue) > 0 {
		q := f.queue
		f.queue = nil
		for _, w := range q {
			w()
		}
	}
}

// Close disconnects both ends.
func (e *endpoint) Close() error {
	f := e.p.f
	f.mu.Lock()
	defer f.mu.Unlock()
	e.breakLocked()
	return nil
}

// breakLocked flushes this end's receives and the peer's, as a connection
// that fails does.
func (e *endpoint) breakLocked() {
	for _, x := range []*endpoint{e, e.peer} {
		if x == nil || x.dead {
			continue
		}
		x.dead = true
		for _, rv := range x.recvs {
			x.p.pushLocked(rdma.Completion{Endpoint: x.id, WR: rv.wr, Op: rdma.OpRecv, Err: rdma.ErrFlushed})
		}
		x.recvs = nil
		for i, y := range x.p.eps {
			if y == x {
				x.p.eps = append(x.p.eps[:i], x.p.eps[i+1:]...)
				break
			}
		}
	}
}

// Sever breaks every connection between a and b, as a failed link does.
func Sever(a, b *Provider) {
	f := a.f
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range append([]*endpoint(nil), a.eps...) {
		if e.peer != nil && e.peer.p == b {
			e.breakLocked()
		}
	}
}
