package adi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/hpc-multidevice/multidevice/internal/shmem"
)

// ErrNotShared: WinAllocateShared was called on a communicator whose ranks
// are not all on one host, or SharedQuery on a window it did not make.
var ErrNotShared = errors.New("adi: not a shared-memory window")

// sharedAlign is where each rank's part of a shared window starts: on its
// own cache line, so that one rank's stores do not slow its neighbour's,
// and aligned for any atomic operation on it.
const sharedAlign = 64

// sharedMem is the shared-memory segment of a window from
// WinAllocateShared, mapped in this process. The segment starts with a
// header line; the parts follow, in rank order:
//
//	0          64                          start[1]
//	| sync word |  rank 0's part  | pad |  rank 1's part  | ...
//
// The sync word is what Sync changes, the same word for every rank.
type sharedMem struct {
	seg   *shmem.Segment
	start []int   // where each rank's part begins in the segment
	word  *uint64 // the sync word, in seg; nil without a segment
}

// WinAllocateShared allocates size bytes on every rank of c in one
// shared-memory segment that every rank of c maps
// (MPI_Win_allocate_shared), and returns the window and this rank's part
// of it. Every rank of c must be on one host: split the world with
// SplitHost first. Other ranks' parts are reached through SharedQuery and
// then read and written directly, with loads and stores (as numbers
// through Elems), as well as through the window's Put, Get and
// Accumulate.
//
// The parts lie in rank order, each starting on a 64-byte boundary, and
// start zeroed. Unlike MPI's default they are not contiguous: a rank's
// part ends at its own length (the slices' capacity too), so code that
// walks past its part into the next one, as C code may, must ask
// SharedQuery for the next instead. Their memory is allocated at once, so a window larger
// than the host's shared memory (/dev/shm) fails here rather than when it
// is first touched. Ranks may ask for different sizes, or 0.
//
// Direct access follows the usual rule of shared memory: a rank must not
// read what another writes at the same time. Writes are seen by a rank
// that synchronizes with the writer after them: a Barrier or Fence, a
// message the writer sends after writing, or an atomic operation of
// sync/atomic on the shared memory itself. The slices are valid until
// Free or Finalize, which unmap them: a use after that is as undefined as
// in C, and may read or write whatever is mapped there next.
//
// It is collective. It fails on every rank with ErrNotShared when c spans
// hosts, and on every rank when one asks for a negative size or cannot
// map the segment.
func (c *Comm) WinAllocateShared(ctx context.Context, size int) (*Win, []byte, error) {
	for _, r := range c.ranks {
		if h := c.w.dev.Host(r); h != c.w.dev.Host(c.ranks[0]) {
			return nil, nil, fmt.Errorf("adi: win allocate shared: %w: rank %d is on host %q, rank 0 on %q (SplitHost gives the ranks of one host)",
				ErrNotShared, c.index[r], h, c.w.dev.Host(c.ranks[0]))
		}
	}
	sizes := make([]int64, c.Size())
	if err := c.Allgather(ctx, Bytes([]int64{int64(size)}), Bytes(sizes)); err != nil {
		return nil, nil, fmt.Errorf("adi: win allocate shared: %w", err)
	}
	start, total, err := sharedLayout(sizes)
	if err != nil {
		return nil, nil, fmt.Errorf("adi: win allocate shared: %w", err)
	}
	var seg *shmem.Segment
	if total > 0 {
		if seg, err = c.mapShared(ctx, total); err != nil {
			return nil, nil, fmt.Errorf("adi: win allocate shared: %w", err)
		}
	}
	var base []byte
	if seg != nil {
		at := start[c.rank]
		base = seg.Bytes()[at : at+size : at+size]
	}
	w, err := c.WinCreate(ctx, base)
	if err != nil {
		if seg != nil {
			seg.Close()
		}
		return nil, nil, fmt.Errorf("adi: win allocate shared: %w", err)
	}
	w.shm = &sharedMem{seg: seg, start: start}
	if seg != nil {
		// A mapping starts on a page: aligned for any atomic operation.
		w.shm.word = (*uint64)(unsafe.Pointer(unsafe.SliceData(seg.Bytes())))
	}
	return w, base, nil
}

// Sync orders this rank's accesses to the window's memory (MPI_Win_sync):
// its loads and stores before Sync are seen by every rank before its
// loads and stores after. On a window from WinAllocateShared it is an
// atomic read-modify-write of a word in the segment every rank maps,
// sequentially consistent as sync/atomic is (a locked instruction, a full
// fence, on amd64). It neither blocks nor takes part in any epoch.
//
// Sync alone does not make another rank see a store: the two ranks also
// need a signal between them, and each a Sync on its side of it, as in
// MPI's unified model:
//
//	writer: store; w.Sync(); signal (a Barrier, a message, a flag set with sync/atomic)
//	reader: wait for the signal; w.Sync(); load
//
// The writer's Sync comes before the signal and the reader's after, so
// the reader's read-modify-write of the sync word follows the writer's,
// and the reader's loads see every store the writer made before its
// Sync. A Barrier or message on its own orders Go code in one process,
// but the ranks of a host are usually processes, which the Go memory
// model does not cover: there the pair of Syncs is what orders the
// memory they share.
//
// On a window no other rank maps (WinCreate's, WinCreateDynamic's, or a
// shared window whose parts are all empty) Sync is legal, as in MPI, and
// does the same on a word of the window's own, which orders nothing
// another rank reads directly: that window's memory is written by the
// window's operations, which Fence, Flush and Unlock complete. It fails
// only on a window already freed, by Free or by Finalize, which frees
// the windows not freed.
func (w *Win) Sync() error {
	// Under the lock, so that Free cannot unmap the segment meanwhile.
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.freed {
		return fmt.Errorf("adi: sync: %w", errWinFreed)
	}
	if w.shm != nil && w.shm.word != nil {
		atomic.AddUint64(w.shm.word, 1)
		return nil
	}
	w.syncWord.Add(1)
	return nil
}

// sharedLayout places the parts of sizes one after the other, after the
// header line, each on a sharedAlign boundary, and returns where each
// begins and the total: 0 if every part is empty, for then there is
// nothing to share.
func sharedLayout(sizes []int64) ([]int, int, error) {
	start := make([]int, len(sizes))
	total, empty := int64(sharedAlign), true // the header line
	for r, n := range sizes {
		if n < 0 {
			return nil, 0, fmt.Errorf("rank %d asked for %d bytes", r, n)
		}
		total = (total + sharedAlign - 1) &^ (sharedAlign - 1)
		if n > math.MaxInt-total {
			return nil, 0, fmt.Errorf("the parts up to rank %d's add up to more than %d bytes", r, math.MaxInt)
		}
		start[r] = int(total)
		total += n
		empty = empty && n == 0
	}
	if empty {
		return start, 0, nil
	}
	return start, int(total), nil
}

// mapShared has rank 0 of c create a segment of total bytes and every
// rank map it. Rank 0 unlinks its name once every rank has mapped it, so
// nothing is left behind however the ranks end. Every rank returns an
// error if one could not map it.
func (c *Comm) mapShared(ctx context.Context, total int) (*shmem.Segment, error) {
	// Rank 0 broadcasts "1" and the name, or "0" and why it failed.
	msg := make([]byte, 1+shmem.MaxNameLen)
	var seg *shmem.Segment
	var err error
	if c.rank == 0 {
		var nonce [8]byte
		rand.Read(nonce[:])
		// Under the job's prefix: if a rank dies before the name is
		// unlinked, mdrun removes the segment with the job's others.
		name := fmt.Sprintf("%swin.%d.%s", shmem.JobPrefix(c.w.boot.JobID()), os.Getpid(), hex.EncodeToString(nonce[:]))
		if seg, err = shmem.CreateReserved(name, total); err != nil {
			copy(msg[1:], err.Error())
		} else {
			msg[0] = 1
			copy(msg[1:], name)
		}
	}
	if err := c.Bcast(ctx, msg, 0); err != nil {
		if seg != nil {
			seg.Close()
		}
		return nil, err
	}
	if msg[0] != 1 {
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("rank 0 could not create the segment: %s", trimNUL(msg[1:]))
	}
	if c.rank != 0 {
		if seg, err = shmem.Open(string(trimNUL(msg[1:]))); err == nil && len(seg.Bytes()) != total {
			err = fmt.Errorf("segment %s holds %d bytes, want %d", trimNUL(msg[1:]), len(seg.Bytes()), total)
			seg.Close()
			seg = nil
		}
	}
	mapped := make([]byte, c.Size())
	mine := []byte{0}
	if err == nil {
		mine[0] = 1
	}
	aerr := c.Allgather(ctx, mine, mapped)
	if c.rank == 0 && seg != nil {
		// Rank 0 alone would fail if this did, leaving the others
		// waiting in WinCreate; Close unlinks again, and reports.
		_ = seg.Unlink()
	}
	if err == nil && aerr == nil {
		for r, ok := range mapped {
			if ok != 1 {
				err = fmt.Errorf("rank %d could not map the segment", r)
				break
			}
		}
	}
	if err = errors.Join(err, aerr); err != nil {
		if seg != nil {
			seg.Close()
		}
		return nil, err
	}
	return seg, nil
}

// trimNUL is b up to its first NUL byte.
func trimNUL(b []byte) []byte {
	for i, x := range b {
		if x == 0 {
			return b[:i]
		}
	}
	return b
}

// SharedQuery returns rank r's part of a window from WinAllocateShared,
// as this process maps it (MPI_Win_shared_query), to read and write
// directly. ProcNull gives the part of the lowest rank whose part is not
// empty (nil if none). It fails with ErrNotShared on a window WinCreate
// or WinCreateDynamic made. The slice is valid until Free.
func (w *Win) SharedQuery(r int) ([]byte, error) {
	if w.shm == nil {
		made := "WinCreate"
		if w.dyn != nil {
			made = "WinCreateDynamic"
		}
		return nil, fmt.Errorf("adi: shared query: %w: the window was made by %s", ErrNotShared, made)
	}
	// Under the lock, so that Free cannot unmap the segment meanwhile.
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.freed {
		return nil, fmt.Errorf("adi: shared query: %w", errWinFreed)
	}
	if r == ProcNull {
		for q, n := range w.sizes {
			if n > 0 {
				r = q
				break
			}
		}
		if r == ProcNull {
			return nil, nil
		}
	}
	if r < 0 || r >= len(w.sizes) {
		return nil, fmt.Errorf("adi: shared query: %w: %d not in [0,%d)", ErrRank, r, len(w.sizes))
	}
	if w.shm.seg == nil {
		return []byte{}, nil
	}
	at, n := w.shm.start[r], w.sizes[r]
	return w.shm.seg.Bytes()[at : at+n : at+n], nil
}

// unmap ends a window once its server, which wrote into its memory, has
// stopped (Free, Finalize) and no rank in Fence is applying an
// operation: it unmaps a shared window's segment, gives a dynamic
// window's attached memory back to the program, and makes the window's
// calls refuse (errWinFreed), Sync and SharedQuery among them, as after
// Free.
func (w *Win) unmap() error {
	w.amu.Lock() // nor a rank in Fence applying an operation
	defer w.amu.Unlock()
	if w.dyn != nil {
		w.dyn.regions = nil // the program's memory, no longer the window's
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.freed = true
	if w.shm == nil || w.shm.seg == nil {
		return nil
	}
	return w.shm.seg.Close()
}
