package adi

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/hpc-multidevice/multidevice/multidevice"
)

// Partitioned point-to-point communication (MPI 4.0's MPI_Psend_init,
// MPI_Precv_init, MPI_Pready and MPI_Parrived): one message whose buffer
// is cut into equal partitions that several goroutines fill and hand
// over one by one, the receiver consuming each as it arrives.
//
// A partitioned request is persistent: Start (or StartAll) begins a
// round, Wait or Test (or WaitAll, WaitAny, ...) completes it, and the
// next Start begins the next one with the buffer's contents then. In a
// round the sender marks each partition ready once (Pready,
// PreadyRange, PreadyList), from any goroutine; the receiver asks
// whether a partition of its own has arrived (Parrived). The two sides
// may cut the same number of bytes into different numbers of partitions.
//
// How it travels. PsendInit and PrecvInit are local: the k-th PsendInit
// on a communicator from rank a to rank b with tag t matches the k-th
// PrecvInit on it at b from a with t, and both sides compute from those
// a context id of the pair's own (partitionContext), the channel, that
// no other message uses. Each sender partition is one message on the
// channel, tagged with its index, sent when it is readied, straight
// into its place in the receive buffer; an empty buffer travels as one
// empty message, sent when its last partition is readied, however many
// partitions it has. The receiver learns the
// sender's partitioning from a setup message the sender sends once, at
// its first Start, on the odd id after the channel's (as a
// communicator's collectives use the odd id after its own; a reserved
// tag would take one from the partitions' indexes), and posts
// its receives when that has come, and at every later Start. A round's
// messages cannot overtake the round before's: they share a context,
// source and tags, and matching is in order.
//
// No goroutine runs per partition. A round's completion is watched by
// one of the world's background workers (as a nonblocking collective
// is) only while something is left to wait for: on the sender, once the
// last partition is readied and some send has not completed yet; on the
// receiver, from Start until every partition has come. A round that is
// already over completes without one. Finalize fails what is still in
// flight, which ends those workers; a sender round whose partitions were
// not all readied has no worker and never completes (its Wait returns
// when its ctx ends).
//
// A channel breaks when a round could no longer match the other side's:
// the sender's one setup was lost or does not decode, or a message of a
// round was neither sent nor received (its send or its receive failed to
// start, so the next round's message would take its place). The round it
// breaks in fails, and every later Start of the request returns the
// error, which Wait, Test and Parrived report too.
//
// What it costs. A sender keeps a multidevice request (about 240 bytes)
// and a byte per message, and a bit per partition (256 MiB for an empty
// buffer in MaxTag+1 partitions); a receiver a request per sender
// message, their count taken from the setup, which the receiver refuses
// when it claims more messages than bytes (an empty buffer is one
// message): no more than the sender holds for its own buffer, and
// nothing per partition of its own. A round costs a send and a receive
// per sender message. BenchmarkPartitioned measured, on the loopback
// fabric with 2 cores, per partition per round: 0.8 to 1.7 µs and about
// 500 bytes allocated (by the device, for each message) at 64 bytes
// (eager), 3 to 4 µs and 2.3 KB at 1 KiB (rendezvous), 9 ns and 1 byte
// for an empty buffer in 1024 partitions.

// ErrPartitionLength: a partitioned receive matched a partitioned send
// of another length. The receive's round fails with it (its buffer is
// left as it was), every round; the sender's rounds complete, their
// data discarded.
var ErrPartitionLength = errors.New("adi: partitioned send and receive lengths differ")

// partitioned is a partitioned request's channel and its current round.
// Its atomics are what Pready and Parrived, called from any goroutine,
// read; the rest is written by Start, or by the goroutine completing a
// round before it publishes the completion.
type partitioned struct {
	c     *Comm
	send  bool
	buf   []byte
	parts int // this side's partitions
	peer  int // the other side's rank in c, or ProcNull
	world int // its world rank
	tag   int
	id    uint64 // the channel: partitions on id (tag = index), the setup on id|1

	round atomic.Uint64 // Starts so far
	// live is set from a Start until its round completes: Pready
	// refuses, and Parrived answers true, outside.
	live atomic.Bool
	op   atomic.Pointer[localOp] // the round's completion

	setup    [setupSize]byte
	setupReq multidevice.Request
	setupOut bool // the sender's setup was sent

	// broken is set once the channel's rounds could no longer match the
	// other side's; every later Start fails with it. Written by Start, or
	// by a round's worker before it completes the round.
	broken error

	// Sender.
	msgs int // messages a round travels as: parts, or 1 for an empty buffer
	// readied holds a bit per partition: partition i is ready in round r
	// when its bit is r's parity. A round completes only once every
	// partition was readied, so each round begins with every bit at the
	// parity of the one before: nothing needs clearing, and a partition
	// costs one bit however large its count.
	readied []atomic.Uint64
	failed  []bool       // per message: its send failed to start this round
	issued  atomic.Int64 // partitions readied this round
	sendErr atomic.Pointer[error]
	sends   []multidevice.Request

	// Receiver. remote, mismatch and recvs are written before posted
	// publishes the round's receives.
	posted   atomic.Uint64 // the round whose receives are all posted
	remote   int           // the sender's messages per round; 0 until the setup came
	mismatch error         // the lengths differ: receives drain into nothing
	recvs    []multidevice.Request
	// npost counts the receives posted this round, all of them unless
	// posting one failed with postErr.
	npost   int
	postErr error
}

// PsendInit makes a partitioned send of buf, cut into partitions equal
// parts, to rank dest with tag (MPI_Psend_init). It is local and sends
// nothing. Start begins a round; Pready, PreadyRange or PreadyList then
// hand over each partition once, from any goroutines, and Wait completes
// the round when all of them are sent: buf may be written again. A
// partition may not change from its Pready until that Wait.
//
// It matches the PrecvInit at dest from this rank with tag that is in
// the same place in the order of dest's partitioned receive inits on
// the communicator as this one is among this rank's partitioned send
// inits to dest with tag. len(buf) must be a multiple of partitions
// (1..MaxTag+1); dest may be ProcNull.
//
// Each partition of a non-empty buf costs about 240 bytes on each side
// for as long as the request lives, and a send and a receive per round;
// an empty buf one bit per partition and one empty message per round
// (see the package's partitioned section, "What it costs").
func (c *Comm) PsendInit(buf []byte, partitions, dest, tag int) (*Request, error) {
	return c.partitionedInit("psend init", true, buf, partitions, dest, tag)
}

// PrecvInit makes a partitioned receive into buf, cut into partitions
// equal parts, from rank source with tag (MPI_Precv_init); see
// PsendInit. The matching send must send len(buf) bytes, in any number
// of partitions. AnySource and AnyTag are refused, as MPI refuses them.
// Start begins a round, Parrived tells whether one partition has come
// (its bytes may then be read), and Wait completes the round once all
// have.
func (c *Comm) PrecvInit(buf []byte, partitions, source, tag int) (*Request, error) {
	return c.partitionedInit("precv init", false, buf, partitions, source, tag)
}

func (c *Comm) partitionedInit(name string, send bool, buf []byte, parts, peer, tag int) (*Request, error) {
	switch {
	case parts < 1 || int64(parts) > int64(MaxTag)+1:
		return nil, fmt.Errorf("adi: %s: %d partitions (1..%d: one tag each)", name, parts, int64(MaxTag)+1)
	case len(buf)%parts != 0:
		return nil, fmt.Errorf("adi: %s: %d bytes do not divide into %d equal partitions", name, len(buf), parts)
	case tag == AnyTag || peer == AnySource:
		return nil, fmt.Errorf("adi: %s: partitioned communication takes no AnySource or AnyTag", name)
	}
	if err := checkTag(tag, false); err != nil {
		return nil, fmt.Errorf("adi: %s: %w", name, err)
	}
	p := &partitioned{c: c, send: send, buf: buf, parts: parts, peer: peer, world: -1, tag: tag}
	if peer != ProcNull {
		var err error
		if send {
			p.world, err = c.dest(peer)
		} else {
			p.world, err = c.source(peer)
		}
		if err != nil {
			return nil, fmt.Errorf("adi: %s: %w", name, err)
		}
		sender, receiver := c.rank, peer
		if !send {
			sender, receiver = peer, c.rank
		}
		p.id = partitionContext(c.context, sender, receiver, tag, nextPartitionedInit(c, send, peer, tag))
	}
	if send {
		p.msgs = parts
		if len(buf) == 0 {
			p.msgs = 1
		}
		p.readied = make([]atomic.Uint64, (parts+63)/64)
		if peer != ProcNull {
			p.failed = make([]bool, p.msgs)
			p.sends = make([]multidevice.Request, p.msgs)
		}
	}
	return &Request{c: c, local: inactive, part: p}, nil
}

// partitionKind sets partitioned channels' ids apart from the ids of
// the communicators deriveContext makes: different inputs to a
// different mix, so the two meet only as rarely as two 64-bit hashes.
const partitionKind uint64 = 0x7061727469746e64 // "partitnd"

// partitionContext is the context id of the k-th partitioned channel
// from sender to receiver (ranks in the communicator whose id is
// parent) with tag. Both sides compute it alike without talking. It is
// even, so that the odd id after it carries the setup, and in the range
// of ids derived by all ranks alike (top bit clear; group.go), never
// the world's.
func partitionContext(parent uint64, sender, receiver, tag int, k uint64) uint64 {
	x := mix64(parent ^ partitionKind)
	x = mix64(x ^ (uint64(uint32(sender))<<32 | uint64(uint32(receiver))))
	x = mix64(x ^ uint64(uint32(tag)))
	x = mix64(x ^ k)
	x &^= 1 | groupContext
	if x <= worldContext {
		x += 4
	}
	return x
}

// partitionedInits counts the partitioned inits made on a communicator
// per side, peer and tag: the count is what matches a send init with its
// receive init.
type partitionedInits struct {
	mu sync.Mutex
	m  map[initKey]uint64
}

type initKey struct {
	send      bool
	peer, tag int
}

// nextPartitionedInit counts one more partitioned init on c and returns
// its number, from 1.
func nextPartitionedInit(c *Comm, send bool, peer, tag int) uint64 {
	p := &c.partInits
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = make(map[initKey]uint64)
	}
	k := initKey{send, peer, tag}
	p.m[k]++
	return p.m[k]
}

// The setup message tells the receiver how the sender cuts the message:
//
//	byte 0     version (1)
//	bytes 1-3  zero
//	bytes 4-7  messages a round travels as, uint32 little-endian: the sender's
//	           partitions, 1..MaxTag+1, or 1 for an empty buffer
//	bytes 8-15 total length in bytes, uint64 little-endian, a multiple of messages
//
// A receiver keeps a request per message, so it refuses more messages
// than bytes: an empty buffer in more than one message comes only from a
// build before this rule (which sent one empty message per partition;
// those complete without a receive, so refusing them hangs neither side).
const (
	setupSize    = 16
	setupVersion = 1
)

func encodeSetup(b *[setupSize]byte, parts int, length uint64) {
	*b = [setupSize]byte{0: setupVersion}
	binary.LittleEndian.PutUint32(b[4:], uint32(parts))
	binary.LittleEndian.PutUint64(b[8:], length)
}

// errBadSetup: a setup message that does not decode. The receiver does
// not drain the sender's messages after one, as it does after a setup of
// another length: it cannot tell how many they are, nor on which tags or
// of which sizes, since they follow rules it does not know (another
// version, or garbage). A receive with AnyTag could drain the channel
// only by staying posted, a worker re-posting it, until Finalize, and
// still not satisfy a sender that waits for more than a receive. The one
// refusal a sender of this version's layout can meet (an empty buffer in
// several messages, from a build before that was refused) needs no drain:
// its messages are empty, and an empty message completes without one.
var errBadSetup = errors.New("adi: bad partitioned setup message")

// decodeSetup reads a setup message, checking every field: the bytes
// come from another rank.
func decodeSetup(b []byte) (parts int, length uint64, err error) {
	if len(b) != setupSize {
		return 0, 0, fmt.Errorf("%w: %d bytes, want %d", errBadSetup, len(b), setupSize)
	}
	if b[0] != setupVersion || b[1] != 0 || b[2] != 0 || b[3] != 0 {
		return 0, 0, fmt.Errorf("%w: version %d, flags %#x (this build speaks version %d)", errBadSetup, b[0], b[1:4], setupVersion)
	}
	n := binary.LittleEndian.Uint32(b[4:])
	length = binary.LittleEndian.Uint64(b[8:])
	switch {
	case n == 0 || uint64(n) > uint64(MaxTag)+1:
		return 0, 0, fmt.Errorf("%w: %d partitions", errBadSetup, n)
	case uint64(n) > max(length, 1):
		// The receiver keeps a request per message: this bounds them by
		// the sender's bytes (a multiple of n holds this anyway, but for 0).
		return 0, 0, fmt.Errorf("%w: %d bytes in %d messages (an empty buffer travels as one message, a longer one as at most one per byte)", errBadSetup, length, n)
	case length%uint64(n) != 0:
		return 0, 0, fmt.Errorf("%w: %d bytes in %d partitions", errBadSetup, length, n)
	case uint64(int(n)) != uint64(n): // 32-bit platforms
		return 0, 0, fmt.Errorf("%w: %d partitions exceed this platform's int", errBadSetup, n)
	}
	return int(n), length, nil
}

// overlap returns the first and last of sp sender partitions that hold
// bytes of receiver partition j of rp, both cutting the same length into
// equal parts: sender partition i and receiver partition j overlap when
// i/sp < (j+1)/rp and j/rp < (i+1)/sp. Computed on partition counts, not
// bytes, so that it holds for an empty buffer too.
func overlap(j, rp, sp int) (lo, hi int) {
	lo = int(uint64(j) * uint64(sp) / uint64(rp))
	hi = int((uint64(j+1)*uint64(sp)+uint64(rp)-1)/uint64(rp)) - 1
	return lo, hi
}

// partitioned returns q's partitioned state for op, checking that q is
// a partitioned request of the side op needs.
func (q *Request) partitioned(op string, send bool) (*partitioned, error) {
	if q == nil {
		return nil, fmt.Errorf("adi: %s: %w", op, errNilRequest)
	}
	p := q.part
	switch {
	case p == nil:
		return nil, fmt.Errorf("adi: %s: not a partitioned request (PsendInit, PrecvInit)", op)
	case p.send != send && send:
		return nil, fmt.Errorf("adi: %s: a partitioned receive (PrecvInit) has no partitions to ready", op)
	case p.send != send:
		return nil, fmt.Errorf("adi: %s: a partitioned send (PsendInit) has no partitions that arrive", op)
	}
	return p, nil
}

// Pready marks partition i of a partitioned send ready and starts
// sending it (MPI_Pready). It does not block and may be called from any
// goroutine, once per partition in each round, between Start and the
// round's completion. A partition out of range, readied twice in a
// round, or readied outside a round is refused with an error.
func (q *Request) Pready(i int) error {
	p, err := q.partitioned("pready", true)
	if err != nil {
		return err
	}
	return p.ready("pready", i)
}

// PreadyRange marks partitions lo to hi, both included, ready
// (MPI_Pready_range); see Pready. A range that is empty or not within
// the partitions readies none; otherwise the errors of each partition's
// Pready are returned joined.
func (q *Request) PreadyRange(lo, hi int) error {
	p, err := q.partitioned("pready range", true)
	if err != nil {
		return err
	}
	if lo > hi || lo < 0 || hi >= p.parts {
		return fmt.Errorf("adi: pready range: [%d,%d] is not a range within partitions [0,%d)", lo, hi, p.parts)
	}
	var errs []error
	for i := lo; i <= hi; i++ {
		if err := p.ready("pready range", i); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// PreadyList marks the partitions listed ready (MPI_Pready_list); see
// Pready. A list naming a partition out of range readies none;
// otherwise the errors of each partition's Pready are returned joined.
func (q *Request) PreadyList(partitions []int) error {
	p, err := q.partitioned("pready list", true)
	if err != nil {
		return err
	}
	for _, i := range partitions {
		if i < 0 || i >= p.parts {
			return fmt.Errorf("adi: pready list: partition %d not in [0,%d)", i, p.parts)
		}
	}
	var errs []error
	for _, i := range partitions {
		if err := p.ready("pready list", i); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Parrived reports whether receiver partition i of a partitioned
// receive has arrived whole (MPI_Parrived): its bytes may then be read,
// before the round completes. It does not block and may be called from
// any goroutine. On a request with no round in progress (not started,
// or its round completed) it reports true, as MPI says for an inactive
// one, unless that round failed. A partition out of range is an error,
// and so is a round that cannot receive (the matched send's length
// differs: ErrPartitionLength) or failed.
func (q *Request) Parrived(i int) (bool, error) {
	p, err := q.partitioned("parrived", false)
	if err != nil {
		return false, err
	}
	if i < 0 || i >= p.parts {
		return false, fmt.Errorf("adi: parrived: partition %d not in [0,%d)", i, p.parts)
	}
	if !p.live.Load() {
		// Inactive, or its round completed: a round that failed says
		// so until the next Start.
		if op := p.op.Load(); op != nil && op.err != nil {
			return false, fmt.Errorf("adi: parrived: %w", op.err)
		}
		return true, nil
	}
	if p.posted.Load() != p.round.Load() {
		return false, nil // the setup has not come yet
	}
	if p.mismatch != nil {
		return false, fmt.Errorf("adi: parrived: %w", p.mismatch)
	}
	lo, hi := overlap(i, p.parts, p.remote)
	for k := lo; k <= hi; k++ {
		if k >= p.npost {
			return false, fmt.Errorf("adi: parrived: %w", p.postErr)
		}
		_, done, err := p.recvs[k].Test()
		if !done {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("adi: parrived: partition %d: %w", i, err)
		}
	}
	return true, nil
}

// startPartitioned begins a new round of q, a partitioned request. A
// request whose round has not completed is refused with ErrRequestBusy;
// one whose channel broke, with the error that broke it, which its
// Wait then returns too.
func (q *Request) startPartitioned() error {
	if q.c != nil && !q.done() {
		return fmt.Errorf("adi: start: %w", ErrRequestBusy)
	}
	p := q.part
	if e := p.sendErr.Load(); e != nil && p.broken == nil {
		// A message of the send's last round was never sent: the
		// receive posted for it would take this round's, and so on.
		p.broken = fmt.Errorf("adi: partitioned send to rank %d, tag %d: a message of an earlier round was not sent, so later rounds would not match the receiver's: %w", p.peer, p.tag, *e)
	}
	if p.broken != nil {
		q.c, q.local = p.c, p.fail(p.broken)
		return p.broken
	}
	var op *localOp
	var err error
	if p.send {
		op, err = p.startSend()
	} else {
		op = p.startRecv()
	}
	if err != nil {
		q.c, q.local = p.c, inactive
		return fmt.Errorf("adi: start: %w", err)
	}
	q.c, q.local = p.c, op
	return nil
}

// fail is the round of a broken channel: over as it begins, with err. It
// counts no round, so a sender's readied bits keep the parity of the
// last round that completed.
func (p *partitioned) fail(err error) *localOp {
	op := &localOp{done: make(chan struct{}), err: err}
	if !p.send {
		op.st = p.failStatus()
	}
	close(op.done)
	p.op.Store(op)
	return op
}

// begin opens round r with op. live goes last: Pready and Parrived read
// the round's state only after they saw it.
func (p *partitioned) begin() (*localOp, uint64) {
	op := &localOp{done: make(chan struct{})}
	p.op.Store(op)
	return op, p.round.Add(1)
}

// complete ends the round of op with st and err.
func (p *partitioned) complete(op *localOp, st Status, err error) {
	op.st, op.err = st, err
	p.live.Store(false)
	close(op.done)
	p.c.w.dev.Notify() // for WaitAny, which waits on Changed
}

// startSend begins a send round; the first sends the setup.
func (p *partitioned) startSend() (*localOp, error) {
	if !p.setupOut && p.peer != ProcNull {
		encodeSetup(&p.setup, p.msgs, uint64(len(p.buf)))
		if err := p.c.w.dev.IsendRequest(&p.setupReq, p.setup[:], p.world, 0, p.id|1, false); err != nil {
			return nil, fmt.Errorf("partitioned send to rank %d: setup: %w", p.peer, err)
		}
		p.setupOut = true
	}
	clear(p.failed)
	p.issued.Store(0)
	p.sendErr.Store(nil)
	op, _ := p.begin()
	p.live.Store(true)
	return op, nil
}

// ready readies partition i of a send round; the call that readies the
// last partition sees to the round's completion.
func (p *partitioned) ready(name string, i int) error {
	if i < 0 || i >= p.parts {
		return fmt.Errorf("adi: %s: partition %d not in [0,%d)", name, i, p.parts)
	}
	if !p.live.Load() {
		return fmt.Errorf("adi: %s: partition %d: the request is inactive (not started, or its round completed)", name, i)
	}
	w, bit := &p.readied[i/64], uint64(1)<<(i%64)
	var again bool
	if p.round.Load()&1 == 1 {
		again = w.Or(bit)&bit != 0
	} else {
		again = w.And(^bit)&bit == 0
	}
	if again {
		return fmt.Errorf("adi: %s: partition %d is already ready in this round", name, i)
	}
	var err error
	if len(p.buf) > 0 {
		err = p.sendMsg(name, i, "partition")
	}
	// The issuer of the last partition sees every other's send started,
	// or failed, before its Add: theirs came first in the Adds' order.
	if p.issued.Add(1) == int64(p.parts) {
		if len(p.buf) == 0 {
			err = p.sendMsg(name, 0, "the empty message of partition")
		}
		p.allReadied()
	}
	return err
}

// sendMsg starts sending message i of the round. A send that failed to
// start is recorded, for the round's result and to break the channel at
// the next Start.
func (p *partitioned) sendMsg(name string, i int, what string) error {
	if p.peer == ProcNull {
		return nil
	}
	n := len(p.buf) / p.msgs
	if err := p.c.w.dev.IsendRequest(&p.sends[i], p.buf[i*n:(i+1)*n], p.world, i, p.id, false); err != nil {
		p.failed[i] = true
		err = fmt.Errorf("adi: %s: %s %d to rank %d: %w", name, what, i, p.peer, err)
		p.sendErr.CompareAndSwap(nil, &err)
		return err
	}
	return nil
}

// allReadied completes the send round once its sends have: at once if
// they already have (an eager send usually completes as it starts),
// else on a background worker.
func (p *partitioned) allReadied() {
	op := p.op.Load()
	if p.sendsOver() {
		p.complete(op, Status{}, p.sendsErr(context.Background()))
		return
	}
	if _, err := p.c.w.bg.launch(p.c, "partitioned send", func() {}, func(ctx context.Context) error {
		p.complete(op, Status{}, p.sendsErr(ctx))
		return nil
	}); err != nil {
		p.complete(op, Status{}, err)
	}
}

// sendsOver reports whether the round's sends and the setup completed.
func (p *partitioned) sendsOver() bool {
	if p.setupOut {
		if _, done, _ := p.setupReq.Test(); !done {
			return false
		}
	}
	for i := range p.sends {
		if _, done, _ := p.sends[i].Test(); !done && !p.failed[i] {
			return false
		}
	}
	return true
}

// sendsErr waits for the round's sends and the setup and returns the
// first failure, the round's.
func (p *partitioned) sendsErr(ctx context.Context) error {
	var first error
	if e := p.sendErr.Load(); e != nil {
		first = *e
	}
	if p.setupOut {
		if _, err := p.setupReq.Wait(ctx); err != nil && first == nil {
			first = fmt.Errorf("adi: partitioned send to rank %d: setup: %w", p.peer, err)
		}
	}
	for i := range p.sends {
		if p.failed[i] {
			continue
		}
		if _, err := p.sends[i].Wait(ctx); err != nil && first == nil {
			first = fmt.Errorf("adi: partitioned send to rank %d: partition %d: %w", p.peer, i, err)
		}
	}
	return first
}

// startRecv begins a receive round. The first posts the setup's receive
// and leaves posting the partitions' to a worker that waits for it;
// later rounds post them at once.
func (p *partitioned) startRecv() *localOp {
	op, r := p.begin()
	p.live.Store(true)
	switch {
	case p.peer == ProcNull:
		p.complete(op, nullStatus, nil)
		return op
	case p.remote == 0:
		if err := p.c.w.dev.IrecvRequest(&p.setupReq, p.setup[:], p.world, 0, p.id|1); err != nil {
			p.complete(op, p.failStatus(), fmt.Errorf("adi: partitioned receive from rank %d: setup: %w", p.peer, err))
			return op
		}
		p.await(op, func(ctx context.Context) error {
			st, err := p.setupReq.Wait(ctx)
			if err != nil {
				// The sender sends one setup, and whatever failed its
				// receive (Finalize, a lost peer, a longer one from
				// another build) took it: a setup receive posted at the
				// next Start would wait forever.
				p.broken = fmt.Errorf("adi: partitioned receive from rank %d, tag %d: setup: %w", p.peer, p.tag, err)
				return p.broken
			}
			if err := p.accept(st); err != nil {
				return err
			}
			p.post(r)
			return nil
		})
		return op
	}
	p.post(r)
	if p.recvsOver() {
		st, err := p.recvsResult(context.Background())
		p.complete(op, st, err)
		return op
	}
	p.await(op, nil)
	return op
}

// await has a worker run first (if any), then wait for the round's
// receives and complete op.
func (p *partitioned) await(op *localOp, first func(ctx context.Context) error) {
	if _, err := p.c.w.bg.launch(p.c, "partitioned receive", func() {}, func(ctx context.Context) error {
		if first != nil {
			if err := first(ctx); err != nil {
				p.complete(op, p.failStatus(), err)
				return nil
			}
		}
		st, err := p.recvsResult(ctx)
		p.complete(op, st, err)
		return nil
	}); err != nil {
		p.complete(op, p.failStatus(), err)
	}
}

// failStatus is what a round of a partitioned receive that fails reports,
// as a receive does (Status): its source and tag, no bytes.
func (p *partitioned) failStatus() Status { return Status{Source: p.peer, Tag: p.tag} }

// accept takes in the setup that st received: the sender's partitions,
// and whether its length is this receive's.
func (p *partitioned) accept(st multidevice.Status) error {
	parts, length, err := decodeSetup(p.setup[:st.Count])
	if err != nil {
		// Nothing is drained: see errBadSetup.
		p.broken = fmt.Errorf("adi: partitioned receive from rank %d, tag %d: %w", p.peer, p.tag, err)
		return p.broken
	}
	if length != uint64(len(p.buf)) {
		p.mismatch = fmt.Errorf("adi: partitioned receive from rank %d, tag %d: %w: the send has %d bytes (%d partitions), the receive buffer %d",
			p.peer, p.tag, ErrPartitionLength, length, parts, len(p.buf))
	}
	p.remote = parts
	p.recvs = make([]multidevice.Request, parts)
	return nil
}

// post posts round r's receives, one per sender partition, each into
// its place in the buffer; or, when the lengths differ, into nothing, so
// that the sender's data is drained (a truncated receive still lets its
// sender complete) and the sender does not hang.
func (p *partitioned) post(r uint64) {
	n := len(p.buf) / p.remote
	p.npost, p.postErr = 0, nil
	for i := range p.recvs {
		into := p.buf[i*n : (i+1)*n]
		if p.mismatch != nil {
			into = nil
		}
		if err := p.c.w.dev.IrecvRequest(&p.recvs[i], into, p.world, i, p.id); err != nil {
			// Finalize fails a post, and so may a matching subdevice
			// (sdi.FlagMatching) that refuses it, or a receive a lost
			// peer left unreusable (ErrRequestBusy). The sender's
			// later messages of this round are then left unmatched,
			// and the next round's receives would take them: the
			// round fails, and the channel is broken.
			p.postErr = fmt.Errorf("adi: partitioned receive from rank %d, tag %d: message %d: %w", p.peer, p.tag, i, err)
			p.broken = p.postErr
			break
		}
		p.npost++
	}
	p.posted.Store(r)
}

// recvsOver reports whether the round's posted receives completed.
func (p *partitioned) recvsOver() bool {
	for i := range p.npost {
		if _, done, _ := p.recvs[i].Test(); !done {
			return false
		}
	}
	return true
}

// recvsResult waits for the round's receives and returns its status and
// error.
func (p *partitioned) recvsResult(ctx context.Context) (Status, error) {
	first := p.postErr
	n := len(p.buf) / p.remote
	for i := range p.npost {
		st, err := p.recvs[i].Wait(ctx)
		switch {
		case p.mismatch != nil && errors.Is(err, ErrTruncated): // drained
			err = nil
		case err != nil:
			err = fmt.Errorf("adi: partitioned receive from rank %d: partition %d: %w", p.peer, i, err)
		case st.Count != n && p.mismatch == nil:
			err = fmt.Errorf("adi: partitioned receive from rank %d: partition %d: %d bytes, want %d", p.peer, i, st.Count, n)
		}
		if err != nil && first == nil {
			first = err
		}
	}
	if first == nil {
		first = p.mismatch
	}
	if first != nil {
		return p.failStatus(), first
	}
	return Status{Source: p.peer, Tag: p.tag, Count: len(p.buf)}, nil
}
