//go:build udapl && cgo

package udapl

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// epState is where an endpoint is in its life.
type epState uint8

const (
	epConnecting epState = iota // made; setup, connect or accept under way
	epConnected                 // established
	epBroken                    // the connection ended or failed; the engine has not closed it yet
	epClosed                    // closed; its handle may be freed, and posts flush at once
)

// endpoint is one DAT endpoint. Posts may come from any goroutine: mu
// serializes them, and orders them before the close that ends them, so no
// DAT call uses the handle once it may be freed.
type endpoint struct {
	p      *provider
	h      datHandle
	id     uint32
	serial uint64 // names the endpoint's work in the wrTable
	// outcome receives the first connection event, nil when established;
	// it is buffered, and later events are not sent.
	outcome chan error

	mu           sync.Mutex
	state        epState
	disconnected bool  // dat_ep_disconnect was called
	wasUp        bool  // the connection was established once
	cause        error // the asynchronous error that cut the endpoint (see cut), or nil
	selfFlushed  bool  // cut completed its work, flushed; later posts complete so at once
	freeTries    int   // dat_ep_free refused for the state; touched by watch only
}

var _ rdma.Endpoint = (*endpoint)(nil)

// newEndpoint makes a DAT endpoint whose completions carry id and
// registers it, so that the connection events naming it find it.
func (p *provider) newEndpoint(id uint32) (*endpoint, error) {
	p.closeMu.RLock()
	defer p.closeMu.RUnlock()
	if p.closed.Load() {
		return nil, fmt.Errorf("udapl: new endpoint: %w", sdi.ErrClosed)
	}
	if err := p.failure(); err != nil {
		return nil, err
	}
	p.lifeMu.Lock()
	defer p.lifeMu.Unlock()
	h, st := epCreate(p.ia, p.pz, p.dtoEVD, p.connEVD, p.attrs)
	if !st.ok() {
		return nil, fmt.Errorf("udapl: dat_ep_create (queue depth %d, reads %d/%d)%s: %w",
			p.attrs.maxRecv, p.attrs.readIn, p.attrs.readOut, st.memlockHint(), st)
	}
	e := &endpoint{p: p, h: h, id: id, outcome: make(chan error, 1)}
	p.mu.Lock()
	p.serial++
	e.serial = p.serial
	p.eps[h] = e
	p.mu.Unlock()
	return e, nil
}

// PostRecv posts a receive of at most n bytes into r at off.
func (e *endpoint) PostRecv(wr uint64, r rdma.Region, off, n int) error {
	return e.post(rdma.OpRecv, wr, r, off, n, 0, 0)
}

// PostSend sends n bytes of r at off as one message.
func (e *endpoint) PostSend(wr uint64, r rdma.Region, off, n int) error {
	return e.post(rdma.OpSend, wr, r, off, n, 0, 0)
}

// PostRead reads n bytes at (raddr, rkey) of the peer into r at off.
func (e *endpoint) PostRead(wr uint64, r rdma.Region, off, n int, raddr uint64, rkey uint32) error {
	return e.post(rdma.OpRead, wr, r, off, n, raddr, rkey)
}

func (e *endpoint) post(op rdma.Op, wr uint64, r rdma.Region, off, n int, raddr uint64, rkey uint32) error {
	rg, err := e.p.local(r, off, n)
	if err != nil {
		return fmt.Errorf("udapl: post %s on endpoint %d: %w", op, e.id, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state == epClosed || e.selfFlushed {
		// Hardware takes work on a failed connection and flushes it; a
		// closed or cut endpoint does the same, without touching its
		// handle.
		e.p.pushPending(rdma.Completion{Endpoint: e.id, WR: wr, Op: op, Err: flushedBy(e.cause)})
		return nil
	}
	cookie := e.p.wrs.add(e.serial, e.id, wr, op)
	va := rg.addr + uint64(off)
	var st datStatus
	switch op {
	case rdma.OpRecv:
		st = postRecv(e.h, va, n, rg.lmr.lmrContext, cookie)
	case rdma.OpSend:
		st = postSend(e.h, va, n, rg.lmr.lmrContext, cookie)
	default:
		st = postRead(e.h, va, n, rg.lmr.lmrContext, cookie, raddr, rkey)
	}
	if st.ok() {
		return nil
	}
	e.p.wrs.take(cookie) // never posted: the cookie is spent unused
	if st.typ() == datInvalidState && e.state != epConnecting {
		// The connection ended before watch saw its event: the work is
		// cut off, as by a flush.
		e.p.pushPending(rdma.Completion{Endpoint: e.id, WR: wr, Op: op, Err: errFlushed})
		return nil
	}
	return fmt.Errorf("udapl: post %s of %d bytes on endpoint %d: %w", op, n, e.id, st)
}

// connect sends the connection request. The private data travels behind
// one byte of length, because InfiniBand pads it: the listener is told the
// whole 56 bytes, whatever was sent.
func (e *endpoint) connect(ctx context.Context, ap netip.AddrPort, private []byte) error {
	pd := make([]byte, 1+len(private))
	pd[0] = byte(len(private))
	copy(pd[1:], private)
	timeout := datTimeoutInfinite
	if dl, ok := ctx.Deadline(); ok {
		us := max(time.Until(dl)/time.Microsecond, 1)
		timeout = uint32(min(us, time.Duration(datTimeoutInfinite-1)))
	}
	p := e.p
	p.closeMu.RLock()
	defer p.closeMu.RUnlock()
	if p.closed.Load() {
		return sdi.ErrClosed
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state != epConnecting {
		return errors.New("the endpoint was closed during setup")
	}
	if st := epConnect(e.h, ap, timeout, pd); !st.ok() {
		return fmt.Errorf("dat_ep_connect: %w", st)
	}
	return nil
}

// established records the connection; from watch.
func (e *endpoint) established() {
	e.mu.Lock()
	if e.state == epConnecting {
		e.state = epConnected
		e.wasUp = true
	}
	e.mu.Unlock()
	e.settle(nil)
}

// ended records that the connection failed or ended under the endpoint,
// and disconnects it, which moves its queue pair to the error state: the
// work still posted on it completes, flushed. From watch.
func (e *endpoint) ended(why error) {
	e.mu.Lock()
	if e.state == epConnecting || e.state == epConnected {
		e.state = epBroken
	}
	disconnect := e.state == epBroken && !e.disconnected
	if disconnect {
		e.disconnected = true
	}
	e.mu.Unlock()
	e.settle(why)
	if disconnect {
		if st := epDisconnect(e.h); !st.ok() && st.typ() != datInvalidState {
			e.p.log.Warn("dat_ep_disconnect after the connection ended failed", "endpoint", e.id, "error", st)
		}
	}
}

// settle reports the first outcome of the connection to Dial or Accept.
func (e *endpoint) settle(err error) {
	select {
	case e.outcome <- err:
	default:
	}
}

// markClosed moves the endpoint to epClosed. It reports whether this call
// closed it, and whether dat_ep_disconnect is still to be called.
func (e *endpoint) markClosed() (first, disconnect bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state == epClosed {
		return false, false
	}
	e.state = epClosed
	disconnect = !e.disconnected
	e.disconnected = true
	return true, disconnect
}

// Close disconnects and hands the endpoint to watch, which frees it: the
// work still posted then completes, flushed (see freeEndpoint). Close may
// block while the provider waits for the peer's disconnect reply, a
// quarter second at most with the cma provider.
func (e *endpoint) Close() error {
	first, disconnect := e.markClosed()
	if !first {
		return nil
	}
	p := e.p
	p.closeMu.RLock()
	defer p.closeMu.RUnlock()
	if p.closed.Load() {
		return nil // the provider's Close frees it
	}
	var err error
	if disconnect {
		if st := epDisconnect(e.h); !st.ok() && st.typ() != datInvalidState {
			err = fmt.Errorf("udapl: dat_ep_disconnect of endpoint %d: %w", e.id, st)
		}
	}
	p.mu.Lock()
	p.freeq = append(p.freeq, e)
	p.mu.Unlock()
	return err
}
