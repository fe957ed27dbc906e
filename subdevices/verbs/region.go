//go:build verbs && cgo

package verbs

/*
#include "cverbs.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
)

// region is registered memory. The device holds the buffer's address from
// ibv_reg_mr to ibv_dereg_mr, so the buffer is pinned for that long: the
// cgo rules let C keep a Go pointer only to pinned memory.
type region struct {
	p          *provider
	buf        []byte
	addr       uint64
	lkey, rkey C.uint32_t
	closed     atomic.Bool // read by posts without mu

	mu  sync.Mutex
	mr  *C.struct_ibv_mr
	pin runtime.Pinner
}

var _ rdma.Region = (*region)(nil)

func (p *provider) Register(buf []byte) (rdma.Region, error) {
	if len(buf) == 0 {
		return nil, errors.New("verbs: register: empty buffer")
	}
	if uint64(len(buf)) > p.maxMR {
		return nil, fmt.Errorf("verbs: register: %d bytes exceed %s's largest region (%d bytes)", len(buf), p.device, p.maxMR)
	}
	if err := p.begin(); err != nil {
		return nil, err
	}
	defer p.ops.Done()
	r := &region{p: p, buf: buf, addr: uint64(uintptr(unsafe.Pointer(&buf[0])))}
	r.pin.Pin(&buf[0])
	var cerr C.int
	mr := C.mdv_reg_mr(p.pd, unsafe.Pointer(&buf[0]), C.size_t(len(buf)), &cerr)
	if mr == nil {
		r.pin.Unpin()
		err := syscall.Errno(cerr)
		return nil, fmt.Errorf("verbs: ibv_reg_mr of %d bytes%s: %w", len(buf), memlockHint(err), err)
	}
	r.mr, r.lkey, r.rkey = mr, mr.lkey, mr.rkey
	p.mu.Lock()
	p.regions[r] = struct{}{}
	p.mu.Unlock()
	return r, nil
}

func (r *region) Addr() uint64 { return r.addr }
func (r *region) RKey() uint32 { return uint32(r.rkey) }

// Close deregisters and unpins. If deregistration fails the memory stays
// pinned, since the device may still reach it, and a later Close retries.
func (r *region) Close() error {
	r.mu.Lock()
	if r.mr == nil {
		r.mu.Unlock()
		return nil
	}
	r.closed.Store(true)
	if rc := C.ibv_dereg_mr(r.mr); rc != 0 {
		r.mu.Unlock()
		return fmt.Errorf("verbs: ibv_dereg_mr of %d bytes: %w", len(r.buf), syscall.Errno(rc))
	}
	r.mr = nil
	r.pin.Unpin()
	r.mu.Unlock()
	p := r.p
	p.mu.Lock()
	delete(p.regions, r)
	p.mu.Unlock()
	return nil
}
