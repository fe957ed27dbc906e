//go:build udapl && cgo

package udapl

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// region is a buffer registered as a DAT LMR. The buffer is pinned while it
// is registered: the adapter reads and writes it behind Go's back, and the
// cgo rules allow C to keep a Go pointer only while it is pinned.
type region struct {
	p     *provider
	buf   []byte
	addr  uint64 // the virtual address of buf[0], which RDMA uses (DAT_VA_TYPE_VA)
	lmr   lmr
	pin   runtime.Pinner
	freed atomic.Bool // set before dat_lmr_free; posts refuse the region from then on
}

var _ rdma.Region = (*region)(nil)

// Addr is the virtual address of the region's first byte.
func (r *region) Addr() uint64 { return r.addr }

// RKey is the LMR's rmr_context, which a peer's read names.
func (r *region) RKey() uint32 { return r.lmr.rmrContext }

// Register pins buf and registers it for local access and remote reads and
// writes. It blocks while the adapter pins the pages.
func (p *provider) Register(buf []byte) (rdma.Region, error) {
	if len(buf) == 0 {
		return nil, errors.New("udapl: register: empty buffer")
	}
	p.closeMu.RLock()
	defer p.closeMu.RUnlock()
	if p.closed.Load() {
		return nil, fmt.Errorf("udapl: register: %w", sdi.ErrClosed)
	}
	if err := p.failure(); err != nil {
		return nil, fmt.Errorf("udapl: register: %w", err)
	}
	r := &region{p: p, buf: buf}
	r.pin.Pin(&buf[0])
	base := uintptr(unsafe.Pointer(&buf[0]))
	l, st := lmrCreate(p.ia, p.pz, base, len(buf))
	if !st.ok() {
		r.pin.Unpin()
		return nil, fmt.Errorf("udapl: dat_lmr_create of %d bytes%s: %w", len(buf), st.memlockHint(), st)
	}
	r.lmr, r.addr = l, uint64(base)
	p.mu.Lock()
	p.regions[r] = struct{}{}
	p.mu.Unlock()
	return r, nil
}

// Close deregisters the region and unpins its buffer. Closing it again, or
// after the provider closed, does nothing.
func (r *region) Close() error {
	p := r.p
	p.closeMu.RLock()
	defer p.closeMu.RUnlock()
	p.mu.Lock()
	_, open := p.regions[r]
	delete(p.regions, r)
	p.mu.Unlock()
	if !open {
		return nil
	}
	return r.deregister()
}

// deregister frees the LMR and unpins the buffer. A registration DAT
// refuses to free stays pinned until the IA closes, which frees it.
func (r *region) deregister() error {
	r.freed.Store(true)
	if st := lmrFree(r.lmr.h); !st.ok() {
		r.p.mu.Lock()
		r.p.stuck = append(r.p.stuck, r)
		r.p.mu.Unlock()
		return fmt.Errorf("udapl: dat_lmr_free of %d bytes: %w", len(r.buf), st)
	}
	r.pin.Unpin()
	return nil
}

// local checks that [off, off+n) of r can be the local side of a work
// request on this provider.
func (p *provider) local(r rdma.Region, off, n int) (*region, error) {
	rg, ok := r.(*region)
	switch {
	case !ok || rg.p != p:
		return nil, errors.New("region not registered with this provider")
	case rg.freed.Load():
		return nil, errors.New("region closed")
	case off < 0 || n < 0 || off > len(rg.buf)-n:
		return nil, fmt.Errorf("[%d, +%d) outside a region of %d bytes", off, n, len(rg.buf))
	case n > p.limits.MaxMsg:
		return nil, fmt.Errorf("%d bytes, at most %d", n, p.limits.MaxMsg)
	}
	return rg, nil
}
