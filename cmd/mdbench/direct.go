package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/bootstrap"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// The direct mode drives one subdevice through the SDI alone, the way the
// thinnest possible MPI over it would: one peer, no matching, no sequence
// numbers, no requests. A frame's one-byte header says whether it carries
// data or an acknowledgement; the handler copies data into the receive
// buffer (the copy any MPI makes into the user's buffer) and counts bytes;
// a waiting rank polls the subdevice if it is a Poller and spins on the
// counters otherwise. The difference to the multidevice figures is what
// the multidevice costs.
const (
	// spinFor matches the multidevice's back-to-back polling phase.
	spinFor = 100 * time.Microsecond

	frameData byte = 0
	frameAck  byte = 1
)

// directRank is one rank of a direct run.
type directRank struct {
	sd     sdi.SubDevice
	poller sdi.Poller // nil unless the subdevice sets FlagPoll
	caps   sdi.Caps
	rank   int
	peer   sdi.Rank
	scale  float64
	sbuf   []byte
	h      *directHandler
	hdr    [2][]byte // the data and acknowledgement headers
	// frame is reused for every Send the subdevice completes at once
	// (done=true); one it keeps in flight keeps its frame, and the next
	// send takes a new one. A frame on send's stack would escape through
	// the interface call and cost an allocation per message.
	frame *sdi.Frame
	// inflight counts frames Send accepted with done=false and whose
	// SendDone has not come yet.
	inflight atomic.Int64
	// wantBytes and wantAcks are what this rank has been sent in total
	// once the current step is over; counting from the start, not from a
	// reading at the start of a test, because the peer may already be
	// sending the next test's messages.
	wantBytes, wantAcks int64
}

// directHandler receives frames. Deliver calls are serialized (one peer).
type directHandler struct {
	r    *directRank
	rbuf []byte
	off  int
	// span is how much of rbuf the current test receives into, as the
	// multidevice loops do: one message's worth for lat, a window's for
	// bw and bibw. Walking all of rbuf instead would put every message
	// into memory no cache holds, a cost the multidevice run does not pay.
	// Atomic because the peer's first message of the next test may arrive
	// on the subdevice's goroutine while this rank still sets it.
	span  atomic.Int64
	bytes atomic.Int64 // data bytes received so far
	acks  atomic.Int64
	down  atomic.Pointer[error]
}

func (h *directHandler) Deliver(_ sdi.Rank, header, payload []byte) {
	if len(header) == 1 && header[0] == frameAck {
		h.acks.Add(1)
		return
	}
	if span := int(h.span.Load()); h.off+len(payload) > span {
		h.off = 0
	}
	if len(payload) > 0 && &payload[0] == &h.rbuf[h.off] {
		h.off += len(payload) // Place put it there
	} else {
		h.off += copy(h.rbuf[h.off:], payload)
	}
	h.bytes.Add(int64(len(payload)))
}

// Place implements sdi.Placer, as the multidevice's handler does, so that
// a subdevice that can move a payload straight into the receive buffer
// (shm with process_vm_readv) does so here too and the direct series stays
// the floor under the multidevice's: data frames go where Deliver would
// copy them.
func (h *directHandler) Place(_ sdi.Rank, header []byte, n int) []byte {
	if len(header) != 1 || header[0] != frameData || n <= 0 || n > len(h.rbuf) {
		return nil
	}
	off := h.off
	if off+n > int(h.span.Load()) {
		off = 0 // where Deliver will look for it
	}
	return h.rbuf[off : off+n : off+n]
}

func (h *directHandler) SendDone(_ uint64, err error) {
	if err != nil {
		h.down.CompareAndSwap(nil, &err)
	}
	h.r.inflight.Add(-1)
}

func (h *directHandler) PeerDown(_ sdi.Rank, err error) { h.down.CompareAndSwap(nil, &err) }

// faultIn touches every page of b and returns it. The handler walks
// through the span of its receive buffer a test uses (a window of
// messages for bw and bibw), so without this a run pays a page fault per
// 4 KiB received the first time round, and direct would not be the
// floor under the multidevice it is meant to be.
func faultIn(b []byte) []byte {
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	return b
}

// runDirect opens j.Sub on two ranks, connects them and runs lat, bw and bibw.
func runDirect(ctx context.Context, j childJob, logger hclog.Logger, emit func(sample)) error {
	boot, err := bootstrap.Open(ctx, logger.Named("bootstrap"))
	if err != nil {
		return err
	}
	defer boot.Close()
	if boot.Size() != 2 {
		return fmt.Errorf("direct mode runs on 2 ranks, not %d", boot.Size())
	}
	factory, err := sdi.Lookup(j.Sub)
	if err != nil {
		return err
	}
	if j.Hosts > 1 && j.Sub == "tcp" {
		// As the multidevice's tcp on pretend hosts (see machineHost).
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("pretend hosts: host name: %w", err)
		}
		factory = machineHostFactory(factory, host)
	}
	send, recv := bufLens(j.Tests, j.Sizes, j.Window)
	d := &directRank{sd: factory(logger.Named(j.Sub)), rank: boot.Rank(), peer: sdi.Rank(1 - boot.Rank()), scale: j.Scale,
		sbuf: make([]byte, send), hdr: [2][]byte{{frameData}, {frameAck}}, frame: new(sdi.Frame)}
	// Written like the multidevice's and the baseline's send buffers: an
	// untouched one is the kernel's zero page throughout, one physical
	// page always in cache, and copying from it (process_vm_readv of a
	// 1 MiB payload) took half the time a real buffer does.
	for i := range d.sbuf {
		d.sbuf[i] = byte(i)
	}
	d.h = &directHandler{r: d, rbuf: faultIn(make([]byte, recv))}
	local, err := d.sd.Open(ctx, sdi.OpenParams{
		Rank: sdi.Rank(boot.Rank()), Size: 2, Host: boot.Host(), JobID: boot.JobID(), Secret: boot.Secret(),
		APIVersion: sdi.APIVersion, Handler: d.h, Logger: logger.Named(j.Sub),
	})
	if err != nil {
		return err
	}
	defer d.sd.Close(context.Background())
	d.caps = local.Caps
	if p, ok := d.sd.(sdi.Poller); ok && local.Caps.Flags.Has(sdi.FlagPoll) {
		d.poller = p
	}
	key := "sdi/" + j.Sub
	if err := boot.Put(key, local.Addr); err != nil {
		return err
	}
	if err := boot.Fence(ctx); err != nil {
		return err
	}
	card, err := boot.Get(ctx, int(d.peer), key)
	if err != nil {
		return err
	}
	if local.Caps.Flags.Has(sdi.FlagJobCards) {
		jc, ok := d.sd.(sdi.JobCards)
		if !ok {
			return fmt.Errorf("%s declares FlagJobCards but does not implement sdi.JobCards", j.Sub)
		}
		cards := make([][]byte, 2)
		cards[d.rank], cards[d.peer] = local.Addr, card
		if err := jc.SetJobCards(ctx, cards); err != nil {
			return err
		}
	}
	if err := d.sd.Connect(ctx, d.peer, card); err != nil {
		return err
	}
	if err := boot.Fence(ctx); err != nil { // both connected
		return err
	}
	for _, test := range j.Tests {
		for _, size := range j.Sizes {
			var v float64
			switch test {
			case "lat":
				v, err = d.lat(ctx, boot, size)
			case "bw":
				v, err = d.stream(ctx, boot, size, j.Window, false)
			case "bibw":
				v, err = d.stream(ctx, boot, size, j.Window, true)
			default:
				err = fmt.Errorf("test %q is not available in direct mode", test)
			}
			if err != nil {
				return fmt.Errorf("direct %s at %d bytes: %w", test, size, err)
			}
			if d.rank == 0 {
				emit(sample{Test: test, Size: size, Value: v})
			}
		}
	}
	if err := d.await(ctx, func() bool { return d.inflight.Load() == 0 }); err != nil {
		return err
	}
	return boot.Fence(ctx) // nobody closes while the peer still reads
}

// await drives progress until cond holds, with the multidevice's waiting
// policy minus the parking: polls back to back for spinFor, then a yield of
// the processor between polls (a machine with fewer cores than spinning
// ranks otherwise stalls), so that the two modes differ only in what the
// multidevice does per message.
func (d *directRank) await(ctx context.Context, cond func() bool) error {
	var start time.Time
	yield := false
	for i := 0; !cond(); i++ {
		if d.poller != nil {
			d.poller.Poll()
		}
		if yield || d.poller == nil {
			runtime.Gosched()
			syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
		}
		// The clock is read first after 16 rounds, as the multidevice's
		// waiter reads it: most waits end before that.
		if i%16 == 15 {
			if start.IsZero() {
				start = time.Now()
			} else {
				yield = time.Since(start) > spinFor
			}
		}
		if i%4096 == 4095 {
			if err := ctx.Err(); err != nil {
				return err
			}
			if p := d.h.down.Load(); p != nil {
				return *p
			}
		}
	}
	return nil
}

// send sends one message of size bytes (in frames of at most MaxFrame), or
// an acknowledgement.
func (d *directRank) send(ctx context.Context, size int, kind byte) error {
	off := 0
	for first := true; first || off < size; first = false {
		n := min(size-off, d.caps.MaxFrame)
		f := d.frame
		*f = sdi.Frame{Peer: d.peer, Header: d.hdr[kind], Payload: d.sbuf[off : off+n]}
		for try := 1; ; try++ {
			done, err := d.sd.Send(f)
			if errors.Is(err, sdi.ErrWouldBlock) {
				// Keep receiving while the peer's ring is full: it may be
				// blocked sending to us (bibw).
				if d.poller != nil {
					d.poller.Poll()
				} else {
					runtime.Gosched()
				}
				if try%4096 == 0 && ctx.Err() != nil {
					return ctx.Err()
				}
				continue
			}
			if err != nil {
				return err
			}
			if !done {
				d.inflight.Add(1)
				d.frame = new(sdi.Frame)
			}
			break
		}
		off += n
	}
	return nil
}

func (d *directRank) lat(ctx context.Context, boot bootstrap.Bootstrap, size int) (float64, error) {
	n := latIters(size, d.scale)
	warm := warmIters(n, size)
	d.h.span.Store(int64(size))
	var t0 time.Time
	for i := range n + warm {
		if i == warm {
			if err := boot.Fence(ctx); err != nil {
				return 0, err
			}
			t0 = time.Now()
		}
		d.wantBytes += int64(size)
		got := func() bool { return d.h.bytes.Load() >= d.wantBytes }
		if d.rank == 0 {
			if err := d.send(ctx, size, frameData); err != nil {
				return 0, err
			}
		}
		if err := d.await(ctx, got); err != nil {
			return 0, err
		}
		if d.rank == 1 {
			if err := d.send(ctx, size, frameData); err != nil {
				return 0, err
			}
		}
	}
	return float64(time.Since(t0).Nanoseconds()) / 1e3 / float64(2*n), nil
}

func (d *directRank) stream(ctx context.Context, boot bootstrap.Bootstrap, size, window int, bidir bool) (float64, error) {
	n := bwIters(size, window, d.scale)
	warm := warmIters(n, size*window)
	d.h.span.Store(int64(size * window))
	var t0 time.Time
	sender := d.rank == 0 || bidir
	receiver := d.rank == 1 || bidir
	for i := range n + warm {
		if i == warm {
			if err := boot.Fence(ctx); err != nil {
				return 0, err
			}
			t0 = time.Now()
		}
		if sender {
			for range window {
				if err := d.send(ctx, size, frameData); err != nil {
					return 0, err
				}
			}
		}
		if receiver {
			d.wantBytes += int64(size * window)
		}
		if err := d.await(ctx, func() bool { return d.h.bytes.Load() >= d.wantBytes && d.inflight.Load() == 0 }); err != nil {
			return 0, err
		}
		if !bidir {
			if d.rank == 1 {
				if err := d.send(ctx, 4, frameAck); err != nil {
					return 0, err
				}
			} else {
				d.wantAcks++
				if err := d.await(ctx, func() bool { return d.h.acks.Load() >= d.wantAcks }); err != nil {
					return 0, err
				}
			}
		}
	}
	mult := 1.0
	if bidir {
		mult = 2
	}
	return mult * float64(size) * float64(window) * float64(n) / time.Since(t0).Seconds() / 1e6, nil
}
