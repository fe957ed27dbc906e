package adi

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"unsafe"
)

// Dynamic windows (MPI_Win_create_dynamic, MPI 4.0 §12.2.4): a window
// made with no memory, to which each rank attaches memory and from which
// it detaches it whenever it likes, each on its own (Attach and Detach
// are local). Attach hands out the address of the memory's first byte in
// the window, a number the rank sends to those that will reach it;
// their Put, Get, Accumulate and atomic operations name that address
// (plus an offset into the memory) where the other windows take an
// offset from the window's start.
//
// Addresses are the window's own, not the process's: a Go pointer means
// nothing to another process, and the garbage collector owns its values.
// Each rank draws them from a counter, starting at dynFirstAddr, so 0 and
// the addresses just above it are never attached; each region starts on
// a multiple of 64 and is followed by at least 64 addresses that none
// covers, so that running off its end fails rather than reaching the
// next; and an address is never handed out twice in the window's life,
// so that one kept after Detach fails rather than reaching memory
// attached later. Addresses stay below math.MaxInt, so int(addr) is the
// offset the operations take; on a 32-bit platform that limits the
// memory a window attaches over its life to 2 GiB.
//
// The target resolves an operation's address when it applies it, under
// the lock that serializes applying (amu), which Attach and Detach take
// too: an operation is applied to memory attached when it is applied,
// whole, and Detach returns only once no operation is using the memory.
// An operation whose [address, address+length) lies in no one attached
// region touches nothing. The target tells the origin, which returns
// ErrNoRegion naming the target, the address and the length:
//   - a Get, GetAccumulate, FetchAndOp or CompareAndSwap is answered
//     with an empty reply; the origin's next FlushLocal, Flush,
//     FlushAll, Unlock, UnlockAll or Fence fails with it (the request of
//     an Rget or RgetAccumulate completes with Status.Count 0 and no
//     error: Wait cannot tell);
//   - a Put or Accumulate is recorded at the target, and reported in its
//     answer to the origin's next Flush, FlushAll, Unlock or UnlockAll
//     that asks it, or at the next Fence, whichever comes first.
// Each miss is reported once, by one call: also when a flush's, Unlock's
// or Fence's ctx ends after its request or report has left, for the
// target has then taken its record out and sent it. The window keeps an
// answer to a flush or Unlock, and a later flush or Unlock of that
// target, or Fence, reads it (any flush or Unlock once it has come); it
// keeps the receive of a Fence's report, and the next Fence reads it. A
// report that a Fence failed before it could receive (its ctx ended
// before the exchange, or the sender's Fence ran its exchange, this
// rank's did not) is returned by this rank's next Fence. An Unlock or
// UnlockAll that fails with ErrNoRegion alone has still released its
// locks, and a Fence has still ended its epoch; a Flush or FlushAll has
// still completed the rest. Operations of no bytes touch nothing and
// never miss. Where the other windows' Fence ends with a Barrier, a
// dynamic window's ends with the reports: each rank sends every other
// its report, point to point, and waits for theirs, which is a barrier
// too.

// ErrNoRegion: an operation on a dynamic window named an address where
// the target had no memory attached (its error says which target,
// address and length), or Detach was given memory that is not attached.
var ErrNoRegion = errors.New("adi: no memory attached there in the dynamic window")

// errNotDynamic is what Attach and Detach return on the other windows.
var errNotDynamic = errors.New("the window was not made by WinCreateDynamic")

const (
	dynFirstAddr = 1 << 16 // the first address handed out
	dynAlign     = 64      // regions start on multiples of it
	dynGap       = 64      // addresses at least, after a region, that none covers
)

// dynRegion is memory attached to a dynamic window, at addr.
type dynRegion struct {
	addr uint64
	buf  []byte
}

// dynRegions is the memory attached to a dynamic window on this rank.
// Owned by the holder of the window's amu.
type dynRegions struct {
	regions []dynRegion // by address
	next    uint64      // the next address to hand out
}

// WinCreateDynamic makes a window with no memory on every rank of c
// (MPI_Win_create_dynamic); each rank then attaches memory with
// [Win.Attach], and the others reach it at the address Attach returned.
// It is collective. Everything else works as on a window from WinCreate:
// epochs, locks, flushes, atomics and request-based operations; Size is
// 0 for every rank. See [ErrNoRegion] for operations that name an
// address where nothing is attached.
func (c *Comm) WinCreateDynamic(ctx context.Context) (*Win, error) {
	return c.winCreate(ctx, "win create dynamic", nil, &dynRegions{next: dynFirstAddr})
}

// Attach attaches buf to the dynamic window on this rank
// (MPI_Win_attach) and returns the address of its first byte in the
// window: other ranks reach buf[i] at address+i, converted to int, once
// this rank has sent them the address. It is local: the other ranks do
// not take part. buf belongs to the window until Detach, as a window's
// memory does (see WinCreate). It fails if buf is empty, overlaps
// memory attached already, or the window was not made by
// WinCreateDynamic or is freed. It waits while an operation is being
// applied to this rank's memory, not longer.
func (w *Win) Attach(buf []byte) (uint64, error) {
	if w.dyn == nil {
		return 0, fmt.Errorf("adi: attach: %w", errNotDynamic)
	}
	w.amu.Lock()
	defer w.amu.Unlock()
	if err := w.live("attach"); err != nil {
		return 0, err
	}
	addr, err := w.dyn.attach(buf)
	if err != nil {
		return 0, fmt.Errorf("adi: attach: %w", err)
	}
	return addr, nil
}

// Detach detaches buf, attached with Attach, from the dynamic window
// (MPI_Win_detach): buf is the same slice, its first byte and length.
// It is local, and returns once no operation is using buf: buf is the
// program's again. Its address is not handed out again, so an operation
// that names it later fails with ErrNoRegion. Detaching memory that an
// epoch's operations still target is the program's error, as in MPI:
// those applied after Detach miss. It fails with ErrNoRegion if buf is
// not attached.
func (w *Win) Detach(buf []byte) error {
	if w.dyn == nil {
		return fmt.Errorf("adi: detach: %w", errNotDynamic)
	}
	w.amu.Lock()
	defer w.amu.Unlock()
	if err := w.live("detach"); err != nil {
		return err
	}
	if err := w.dyn.detach(buf); err != nil {
		return fmt.Errorf("adi: detach: %w", err)
	}
	return nil
}

// live fails once the window is freed.
func (w *Win) live(what string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.freed {
		return fmt.Errorf("adi: %s: %w", what, errWinFreed)
	}
	return nil
}

// memSpan is where buf lies in this process's memory.
func memSpan(buf []byte) (from, to uintptr) {
	p := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	return p, p + uintptr(len(buf))
}

// attach adds buf at the next address and returns it.
func (d *dynRegions) attach(buf []byte) (uint64, error) {
	if len(buf) == 0 {
		return 0, errors.New("empty memory: there is nothing to attach")
	}
	from, to := memSpan(buf)
	for _, r := range d.regions {
		if f, t := memSpan(r.buf); from < t && f < to {
			return 0, fmt.Errorf("%d bytes overlapping the %d attached at address %#x", len(buf), len(r.buf), r.addr)
		}
	}
	addr := d.next
	if addr > math.MaxInt || uint64(len(buf)) > math.MaxInt-addr {
		return 0, fmt.Errorf("no addresses left for %d bytes: the window handed out %#x of them", len(buf), addr)
	}
	end := addr + uint64(len(buf))
	d.next = (end + dynGap + dynAlign - 1) &^ (dynAlign - 1)
	d.regions = append(d.regions, dynRegion{addr: addr, buf: buf}) // addresses only grow
	return addr, nil
}

// detach removes buf, which must start where an attached region does and
// be as long.
func (d *dynRegions) detach(buf []byte) error {
	from, _ := memSpan(buf)
	i := slices.IndexFunc(d.regions, func(r dynRegion) bool {
		f, _ := memSpan(r.buf)
		return f == from && len(r.buf) > 0
	})
	switch {
	case len(buf) == 0:
		return fmt.Errorf("%w: empty memory is never attached", ErrNoRegion)
	case i < 0:
		return fmt.Errorf("%w: none of the %d regions attached starts at the first of the %d bytes given", ErrNoRegion, len(d.regions), len(buf))
	case len(d.regions[i].buf) != len(buf):
		return fmt.Errorf("%w: the region at address %#x holds %d bytes, not the %d given", ErrNoRegion, d.regions[i].addr, len(d.regions[i].buf), len(buf))
	}
	d.regions = slices.Delete(d.regions, i, i+1)
	return nil
}

// find returns the n bytes at addr if one attached region holds them
// all. Operations of no bytes touch nothing and always find them.
func (d *dynRegions) find(addr, n uint64) ([]byte, bool) {
	if n == 0 {
		return nil, true
	}
	// The last region starting at or before addr.
	i, found := slices.BinarySearchFunc(d.regions, addr, func(r dynRegion, a uint64) int {
		switch {
		case r.addr < a:
			return -1
		case r.addr > a:
			return 1
		}
		return 0
	})
	if !found {
		i--
	}
	if i < 0 {
		return nil, false
	}
	r := d.regions[i]
	off := addr - r.addr
	if off > uint64(len(r.buf)) || n > uint64(len(r.buf))-off {
		return nil, false
	}
	return r.buf[off : off+n], true
}

// miss answers an operation from src that found no memory attached: an
// empty reply for one that fetches, a record for the origin's next
// flush, Unlock or Fence otherwise. amu is held. The window's own Fence
// is not failed: the mistake is the origin's.
func (w *Win) miss(ctx context.Context, src int, h rmaHeader) error {
	switch h.kind {
	case rmaGet, rmaGetAcc, rmaCAS:
		if err := w.reply.Send(ctx, nil, src, int(h.tag)); err != nil {
			return fmt.Errorf("%s reply: %w", rmaName(h.kind), err)
		}
	default:
		m := &w.missed[src]
		if m.count == 0 {
			m.kind, m.addr, m.length = h.kind, h.offset, h.length
		}
		m.count++
	}
	return nil
}

// takeMissed returns the report of src's operations that missed, for
// src, and forgets them; nil if none did. amu is held.
func (w *Win) takeMissed(src int) []byte {
	if w.dyn == nil || w.missed[src].count == 0 {
		return nil
	}
	b := w.missed[src].encode(nil)
	w.missed[src] = missReport{}
	return b
}

// fenceReportTag is the tag of a dynamic window's Fence reports, on the
// requests' context: one for every Fence, never rmaTag, so that a report
// is received by whichever Fence of its target's next posts a receive
// from its sender (see exchangeMisses).
const fenceReportTag = rmaTag + 1

// exchangeMisses tells every origin which of its puts and accumulates
// found no memory attached on this rank, and returns what the targets
// said of this rank's (ErrNoRegion): Fence's last step on a dynamic
// window, the epoch'th Fence. It is a barrier too: no rank returns
// before every rank has sent its part. Its error is the exchange's; the
// misses come with it.
//
// The reports go point to point, under one tag, each with the epoch of
// the Fence that sent it, rather than in an Alltoall, so that a Fence
// whose ctx ended can keep its receives: the other ranks took their
// records out and sent them. Each report is read by one receive, in the
// order its sender sent them (messages from one rank under one tag are
// not overtaken): this Fence waits on the receives earlier Fences kept,
// then receives from each rank until a report of this epoch (or a later
// one) comes, returning the misses of the earlier ones too. So a report
// sent to a Fence of this rank's that failed before its exchange is read
// by the next, and a receive kept by one that failed in it completes
// with the sender's next report, which the sender's next Fence sends
// (also when the sender's own Fence had failed before its exchange and
// sent nothing): the next Fence waits for it rather than leave it. This
// rank's records are taken only once its receives are posted, and sent
// at once, whatever ctx does; those a failed send did not carry are kept
// for the next Fence.
func (w *Win) exchangeMisses(ctx context.Context, epoch uint64) (missed, err error) {
	n, me := len(w.sizes), w.c.Rank()
	recvs := w.takeReports()
	waiting := make([]bool, n)
	for _, l := range recvs {
		waiting[l.target] = true
	}
	for i := 1; i < n; i++ {
		t := (me - i + n) % n
		if waiting[t] {
			continue
		}
		l, err := w.receiveReport(t)
		if err != nil {
			w.keep(recvs) // each is answered by its sender's next report
			return nil, fmt.Errorf("report from rank %d: %w", t, err)
		}
		recvs = append(recvs, l)
	}
	if w.exchanging != nil {
		w.exchanging()
	}
	w.amu.Lock()
	out := slices.Clone(w.missed)
	clear(w.missed)
	w.amu.Unlock()
	var misses []error
	if out[me].count > 0 { // this rank's operations on itself
		misses = append(misses, out[me].err(me))
	}
	for i := 1; i < n; i++ {
		o := (me + i) % n
		q, err := w.c.Isend(encodeFenceReport(epoch, out[o]), o, fenceReportTag)
		if err != nil {
			w.amu.Lock()
			for j := i; j < n; j++ {
				o := (me + j) % n
				w.missed[o] = out[o].merge(w.missed[o])
			}
			w.amu.Unlock()
			w.keep(recvs)
			return errors.Join(misses...), fmt.Errorf("report to rank %d: %w", o, err)
		}
		q.window = true
		w.mu.Lock()
		w.pending = append(w.pending, pendingOp{q, o}) // the next wait completes it
		w.mu.Unlock()
	}
	var errs []error
	for len(recvs) > 0 {
		werr := w.waitLeftovers(ctx, recvs)
		var next, kept []leftover
		for _, l := range recvs {
			done, miss, sent, err := w.read(l)
			if !done {
				kept = append(kept, l)
				continue
			}
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if miss != nil {
				misses = append(misses, miss)
			}
			if sent < epoch && werr == nil {
				// An earlier Fence's, which this rank's did not read:
				// this one's comes next. Once ctx has ended, the next
				// Fence receives it.
				nl, err := w.receiveReport(l.target)
				if err != nil {
					errs = append(errs, fmt.Errorf("report from rank %d: %w", l.target, err))
					continue
				}
				next = append(next, nl)
			}
		}
		w.keep(kept)
		if werr != nil {
			w.keep(next)
			if len(kept) > 0 {
				errs = append(errs, werr)
			}
			break
		}
		recvs = next
	}
	return errors.Join(misses...), errors.Join(errs...)
}

// receiveReport posts a receive of rank t's next Fence report.
func (w *Win) receiveReport(t int) (leftover, error) {
	report := make([]byte, fenceReportSize)
	q, err := w.c.Irecv(report, t, fenceReportTag)
	if err != nil {
		return leftover{}, err
	}
	q.window = true // kept if ctx ends: a report is on its way
	return leftover{q: q, report: report, target: t}, nil
}

// takeReports takes the receives of Fence reports that earlier Fences
// kept: at most one from each rank.
func (w *Win) takeReports() []leftover {
	w.mu.Lock()
	defer w.mu.Unlock()
	took := w.reports
	w.reports = nil
	return took
}

// rmaAccess is a fetching operation on a dynamic window, remembered by
// its origin to name it if it misses.
type rmaAccess struct {
	target       int
	kind         byte
	addr, length uint64
}

// missReport is what a target tells an origin of the origin's operations
// that found no memory attached: how many, and the first.
type missReport struct {
	kind         byte // the first's
	count        uint64
	addr, length uint64 // the first's
}

// missReportSize is an encoded missReport: kind, seven bytes of
// padding, count, address and length.
const missReportSize = 32

// fenceReportSize is an encoded Fence report: the epoch of the Fence
// that sent it, and a missReport.
const fenceReportSize = 8 + missReportSize

// encodeFenceReport encodes m, sent by the epoch'th Fence.
func encodeFenceReport(epoch uint64, m missReport) []byte {
	b := binary.LittleEndian.AppendUint64(make([]byte, 0, fenceReportSize), epoch)
	return m.encode(b)
}

// decodeFenceReport decodes a Fence's report: the Fence's epoch, from 1,
// and a report as decodeMissReport takes it, whole.
func decodeFenceReport(b []byte) (epoch uint64, m missReport, err error) {
	if len(b) != fenceReportSize {
		return 0, missReport{}, fmt.Errorf("fence report of %d bytes, want %d", len(b), fenceReportSize)
	}
	if epoch = binary.LittleEndian.Uint64(b); epoch == 0 {
		return 0, missReport{}, errors.New("fence report of epoch 0: Fences count from 1")
	}
	if m, err = decodeMissReport(b[8:]); err != nil {
		return 0, missReport{}, err
	}
	return epoch, m, nil
}

func (m missReport) encode(b []byte) []byte {
	b = append(b, m.kind, 0, 0, 0, 0, 0, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, m.count)
	b = binary.LittleEndian.AppendUint64(b, m.addr)
	return binary.LittleEndian.AppendUint64(b, m.length)
}

// merge is m, a report of misses, with those of later added.
func (m missReport) merge(later missReport) missReport {
	if m.count == 0 {
		return later
	}
	m.count += later.count
	return m
}

// decodeMissReport decodes a report from a target: none (no bytes, or a
// count of 0 with every byte 0), or one of missReportSize bytes naming
// puts and accumulates, the only operations reported this way.
func decodeMissReport(b []byte) (missReport, error) {
	if len(b) == 0 {
		return missReport{}, nil
	}
	if len(b) != missReportSize {
		return missReport{}, fmt.Errorf("report of %d bytes, want %d", len(b), missReportSize)
	}
	m := missReport{kind: b[0], count: binary.LittleEndian.Uint64(b[8:]),
		addr: binary.LittleEndian.Uint64(b[16:]), length: binary.LittleEndian.Uint64(b[24:])}
	pad := slices.ContainsFunc(b[1:8], func(x byte) bool { return x != 0 })
	switch {
	case m.count == 0 && (pad || m != missReport{}):
		return missReport{}, errors.New("report of no operations with bytes set")
	case m.count == 0:
		return m, nil
	case pad || m.kind != rmaPut && m.kind != rmaAcc:
		return missReport{}, fmt.Errorf("report of %d missed operations of kind %d", m.count, m.kind)
	case m.length == 0 || m.addr > math.MaxUint64-m.length:
		return missReport{}, fmt.Errorf("report of a miss of %d bytes at address %#x", m.length, m.addr)
	}
	return m, nil
}

// err is the error an origin returns for m, from target.
func (m missReport) err(target int) error {
	more := ""
	if m.count > 1 {
		more = fmt.Sprintf(" (the first of %d operations that missed)", m.count)
	}
	return fmt.Errorf("%w: rank %d has none at address %#x for a %s of %d bytes%s",
		ErrNoRegion, target, m.addr, rmaName(m.kind), m.length, more)
}
