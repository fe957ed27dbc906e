package adi

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"
	"unsafe"

	"github.com/hpc-multidevice/multidevice/multidevice"
)

// Collectives. Every rank of a communicator calls the same collectives in
// the same order, one at a time (as MPI requires): each call draws the next
// tag of the communicator's collective sequence, and its messages travel
// on the communicator's collective context, so they never match the
// application's point-to-point receives, ANY_SOURCE and ANY_TAG included,
// nor those of an earlier or later collective. Between a pair of ranks a
// collective's messages are received in the order they were sent, like
// any other messages.
//
// The algorithms are MPICH's, chosen so that every rank sends and
// receives O(log p) times where that is possible, and large vectors are
// sent and combined about once in all rather than once per step:
//
//	Barrier    dissemination: ceil(log2 p) rounds of empty messages
//	Bcast      binomial tree from the root; from 12 KiB and 8 ranks a
//	           binomial scatter and a ring allgather (van de Geijn)
//	Reduce     binomial tree towards rank 0, in rank order, then to the root;
//	           from 64 KiB Rabenseifner's reduce-scatter and gather
//	Allreduce  recursive doubling, from 64 KiB Rabenseifner's reduce-scatter
//	           and allgather; the ranks above a power of two folded in
//	Scan       recursive doubling (Exscan too)
//	ReduceScatter  Reduce to rank 0, then Scatterv (ReduceScatterBlock too)
//	Gather     every rank to the root, received all at once (Gatherv too)
//	Scatter    the root to every rank, sent all at once (Scatterv too)
//	Allgather  ring: p-1 steps of one block to the right neighbour (Allgatherv too)
//	Alltoall   every pair at once, each rank starting with its next neighbour (Alltoallv too)
//
// On communicators that span hosts, Barrier and Bcast run these
// algorithms within hosts and among hosts' leaders (hostcoll.go), and so
// do Reduce and Allreduce where each host's ranks are consecutive.
//
// What disagreeing lengths and failed collectives do is in the package
// doc (doc.go, "Ranks that pass disagreeing lengths"): a mismatch a
// message shows sends poison (a message of another length) through the
// rest of the collective, so that every rank whose result depends on it
// gets ErrMismatch.

// ErrMismatch reports that the ranks of a collective passed arguments that
// disagree: a message of another length than this rank's buffers call for.
var ErrMismatch = errors.New("adi: collective arguments disagree between ranks")

// collState is what a communicator keeps for its collectives from one call
// to the next, so that a collective in a loop allocates nothing: the call
// in progress, the requests it starts (heap-allocated requests made an
// 8-byte allreduce between two processes three times slower, most of it
// in the garbage collector) and scratch space for reductions. A
// communicator runs one collective at a time; busy turns a second one
// started meanwhile into an error instead of a data race.
type collState struct {
	busy    atomic.Bool
	k       collective
	reqs    []*multidevice.Request
	scratch [4][]uint64 // word-aligned, for any Elem
}

// collective is one collective call in progress on a rank: its tag and
// the requests it has outstanding. It is owned by the calling goroutine.
type collective struct {
	c    *Comm
	ctx  context.Context
	name string
	// where follows name in errors: " (local group)" in an
	// intercommunicator's local phases, whose ranks are not the remote
	// ones its other errors name.
	where string
	tag   int
	reqs  []pending
	used  int // requests of c.coll.reqs this call has started
	// mismatch is the first receive of the wrong length; from then on
	// this rank sends poison (see above).
	mismatch error
}

// pending is an outstanding request of a collective: the rank it goes
// to or comes from, for errors, and for a receive how many bytes it must
// bring.
type pending struct {
	r    *multidevice.Request
	recv bool
	peer int
	want int
}

var errCollectiveBusy = errors.New("another collective is running on this communicator (a communicator runs one at a time; Dup one for each goroutine)")

// begin starts collective name on c; done ends it.
func (c *Comm) begin(ctx context.Context, name string) (*collective, error) {
	if !c.coll.busy.CompareAndSwap(false, true) {
		return nil, fmt.Errorf("adi: %s: %w", name, errCollectiveBusy)
	}
	seq := c.collSeq.Add(1)
	k := &c.coll.k
	*k = collective{c: c, ctx: ctx, name: name, tag: int(seq % (MaxTag + 1)), reqs: k.reqs[:0]}
	return k, nil
}

func (k *collective) done() {
	k.ctx = nil
	k.c.coll.busy.Store(false)
}

func (k *collective) errorf(format string, args ...any) error {
	return fmt.Errorf("adi: %s%s: "+format, append([]any{k.name, k.where}, args...)...)
}

// start starts an operation in the next of the communicator's requests.
// One that a failed collective left in flight is replaced.
func (k *collective) start(op func(r *multidevice.Request) error) (*multidevice.Request, error) {
	s := &k.c.coll
	if k.used == len(s.reqs) {
		s.reqs = append(s.reqs, new(multidevice.Request))
	}
	r := s.reqs[k.used]
	err := op(r)
	if err != nil && errors.Is(err, ErrRequestBusy) {
		r = new(multidevice.Request)
		s.reqs[k.used] = r
		err = op(r)
	}
	if err != nil {
		return nil, err
	}
	k.used++
	return r, nil
}

// who is rank r of the collective's communicator as its caller knows
// it: the same rank, or on a view (hostcoll.go) the rank it stands for.
func (k *collective) who(r int) int {
	if k.c.of != nil {
		return k.c.of[r]
	}
	return r
}

// poison is what a rank that met a mismatch sends in place of an empty
// message; in place of any other, it sends an empty one. Small, so that it
// goes eagerly and the sender need not wait for a receiver that may have
// given up already. A length that changes with the replaced message's
// (one byte, or three in place of a one-byte message) was tried: a rank
// that agrees with the root took it for its data where it expected one
// or three bytes (a []bool flag), a worse gap than the empty poison's,
// which only a rank that itself passed an empty vector can take.
var poison = []byte{0}

// send starts sending buf to rank r of the communicator, or after a
// mismatch a message of another length (poison).
func (k *collective) send(buf []byte, r int) error {
	if k.mismatch != nil {
		if len(buf) == 0 {
			buf = poison
		} else {
			buf = nil
		}
	}
	req, err := k.start(func(q *multidevice.Request) error {
		return k.c.w.dev.IsendRequest(q, buf, k.c.ranks[r], k.tag, k.c.context|1, false)
	})
	if err != nil {
		return k.fail(k.errorf("send to rank %d: %w", k.who(r), err))
	}
	k.reqs = append(k.reqs, pending{r: req, peer: k.who(r)})
	return nil
}

// recv starts receiving exactly len(buf) bytes from rank r. It does after
// a mismatch too: a peer's large message waits for its receive.
func (k *collective) recv(buf []byte, r int) error {
	req, err := k.start(func(q *multidevice.Request) error {
		return k.c.w.dev.IrecvRequest(q, buf, k.c.ranks[r], k.tag, k.c.context|1)
	})
	if err != nil {
		return k.fail(k.errorf("receive from rank %d: %w", k.who(r), err))
	}
	k.reqs = append(k.reqs, pending{r: req, recv: true, peer: k.who(r), want: len(buf)})
	return nil
}

// wait completes every outstanding request. A receive that brought another
// length than its buffer's is recorded as the collective's mismatch, and
// the collective goes on; any other error ends it.
func (k *collective) wait() error {
	for i, p := range k.reqs {
		st, err := p.r.Wait(k.ctx)
		if p.recv && (err == nil && st.Count != p.want || err != nil && errors.Is(err, ErrTruncated)) {
			if k.mismatch == nil {
				k.mismatch = k.mismatchFrom(p, st.Count, err != nil)
			}
			continue
		}
		if err != nil {
			// p itself stays for fail: a receive whose wait ended with
			// ctx is still posted.
			k.reqs = k.reqs[i:]
			if p.recv {
				return k.fail(k.errorf("from rank %d: %w", p.peer, err))
			}
			return k.fail(k.errorf("to rank %d: %w", p.peer, err))
		}
	}
	k.reqs, k.used = k.reqs[:0], 0
	return nil
}

// mismatchFrom describes a receive from p.peer that brought count bytes
// where p.want were expected, or more than that (truncated). A message of
// poison's shape (empty, or poison itself: more than an empty buffer
// holds) may be poison, and then its sender only passes on a mismatch it
// met from another rank: the error says so rather than blaming the
// sender's arguments.
func (k *collective) mismatchFrom(p pending, count int, truncated bool) error {
	what := fmt.Sprintf("%d bytes where %d were expected", count, p.want)
	if truncated {
		what = fmt.Sprintf("more than the %d bytes expected", p.want)
	}
	if !truncated && (count == 0 || count == len(poison)) || truncated && p.want == 0 {
		what += fmt.Sprintf(" (rank %d passed another length, or passes on a mismatch it met)", p.peer)
	}
	return k.errorf("from rank %d: %w: %s", p.peer, ErrMismatch, what)
}

// end completes the collective: it waits for what is outstanding and
// reports a mismatch met on the way.
func (k *collective) end() error {
	if err := k.wait(); err != nil {
		return err
	}
	return k.mismatch
}

// exchange sends sbuf to rank dst and receives rbuf from rank src.
func (k *collective) exchange(sbuf []byte, dst int, rbuf []byte, src int) error {
	if err := k.recv(rbuf, src); err != nil {
		return err
	}
	if err := k.send(sbuf, dst); err != nil {
		return err
	}
	return k.wait()
}

// fail gives up the receives still outstanding, the one whose wait failed
// included, and returns err once nothing writes into their buffers. A
// receive left posted took a late peer's message into the caller's
// buffer after the collective returned, or into the communicator's
// scratch space in the middle of its next collective: a wrong result and
// no error. Abandon cancels a receive that has not matched and drops the
// rest of a rendezvous that has, so a stalled sender cannot hold the
// failed call. Sends stay in flight (they write nothing here); start
// replaces their requests next time.
func (k *collective) fail(err error) error {
	for _, p := range k.reqs {
		if p.recv {
			k.c.w.dev.Abandon(p.r, err)
		}
	}
	k.reqs = k.reqs[:0]
	return err
}

// scratch returns n elements of the communicator's scratch slot i, which
// keeps its memory for later calls; its contents are not cleared.
func scratch[T Elem](k *collective, i, n int) []T {
	if n == 0 {
		return nil
	}
	words := (n*elemSize[T]() + 7) / 8
	s := &k.c.coll.scratch[i]
	if cap(*s) < words {
		*s = make([]uint64, words)
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(*s))), n)
}

// beginAt is begin for a collective with a root, which it checks.
func (c *Comm) beginAt(ctx context.Context, name string, root int) (*collective, error) {
	k, err := c.begin(ctx, name)
	if err != nil {
		return nil, err
	}
	if err := rootArg(root, c.Size()); err != nil {
		err = k.errorf("%w", err)
		k.done()
		return nil, err
	}
	return k, nil
}

// Local argument checks. Each checks what this rank alone can tell of
// its arguments to a collective; arguments that disagree between ranks
// show only once messages arrive (ErrMismatch). The blocking forms call
// them once they drew their tag, and the persistent forms call them at
// Init (collinit.go), so that a wrong call fails where it is made, and
// both check alike. Their errors name the argument; the caller puts the
// collective's name in front.

// rootArg checks the root of a rooted collective on p ranks.
func rootArg(root, p int) error {
	if root < 0 || root >= p {
		return fmt.Errorf("root: %w: %d not in [0,%d)", ErrRank, root, p)
	}
	return nil
}

// blocksFit checks that b, a collective's what ("send", "receive")
// buffer, holds p blocks of n bytes.
func blocksFit(b []byte, n, p int, what string) error {
	if len(b) < p*n {
		return fmt.Errorf("%s buffer of %d bytes, %d ranks of %d bytes need %d", what, len(b), p, n, p*n)
	}
	return nil
}

// slicesFor checks that a v-form collective got n what slices, one for
// each of p ranks of a group: "" for a Comm's, "remote " for an
// Intercomm's other group.
func slicesFor(n, p int, what, group string) error {
	if n != p {
		return fmt.Errorf("%d %s slices for %d %sranks", n, what, p, group)
	}
	return nil
}

// pairSlicesFor is slicesFor for an alltoallv's send and receive slices.
func pairSlicesFor(send, recv, p int, group string) error {
	if send != p || recv != p {
		return fmt.Errorf("%d send and %d receive slices for %d %sranks", send, recv, p, group)
	}
	return nil
}

// sameLength checks a reduction's receive slice against its send slice.
func sameLength(send, recv int) error {
	if recv != send {
		return fmt.Errorf("receive slice of %d elements for a send slice of %d", recv, send)
	}
	return nil
}

// opArg checks a reduction's operation, which would otherwise fail as a
// nil call in the middle of the collective, on a goroutine of its own
// for the nonblocking and persistent forms.
func opArg[T Elem](op Op[T]) error {
	if op == nil {
		return errors.New("op: nil operation")
	}
	return nil
}

// gatherArgs checks this rank's arguments to Gather.
func (c *Comm) gatherArgs(send, recv []byte, root int) error {
	if c.Rank() != root {
		return nil
	}
	return blocksFit(recv, len(send), c.Size(), "receive")
}

// gathervArgs checks this rank's arguments to Gatherv.
func (c *Comm) gathervArgs(recv [][]byte, root int) error {
	if c.Rank() != root {
		return nil
	}
	return slicesFor(len(recv), c.Size(), "receive", "")
}

// scatterArgs checks this rank's arguments to Scatter.
func (c *Comm) scatterArgs(send, recv []byte, root int) error {
	if c.Rank() != root {
		return nil
	}
	return blocksFit(send, len(recv), c.Size(), "send")
}

// scattervArgs checks this rank's arguments to Scatterv.
func (c *Comm) scattervArgs(send [][]byte, root int) error {
	if c.Rank() != root {
		return nil
	}
	return slicesFor(len(send), c.Size(), "send", "")
}

// allgatherArgs checks this rank's arguments to Allgather.
func (c *Comm) allgatherArgs(send, recv []byte) error {
	return blocksFit(recv, len(send), c.Size(), "receive")
}

// allgathervArgs checks this rank's arguments to Allgatherv.
func (c *Comm) allgathervArgs(recv [][]byte) error {
	return slicesFor(len(recv), c.Size(), "receive", "")
}

// alltoallArgs checks this rank's arguments to Alltoall.
func (c *Comm) alltoallArgs(send, recv []byte) error {
	if p := c.Size(); len(send)%p != 0 || len(recv) != len(send) {
		return fmt.Errorf("buffers of %d and %d bytes: both must be the same multiple of %d ranks", len(send), len(recv), p)
	}
	return nil
}

// alltoallvArgs checks this rank's arguments to Alltoallv.
func (c *Comm) alltoallvArgs(send, recv [][]byte) error {
	return pairSlicesFor(len(send), len(recv), c.Size(), "")
}

// reduceArgs checks this rank's arguments to Reduce.
func reduceArgs[T Elem](c *Comm, send, recv []T, op Op[T], root int) error {
	if c.Rank() == root {
		if err := sameLength(len(send), len(recv)); err != nil {
			return err
		}
	}
	return opArg(op)
}

// allreduceArgs checks this rank's arguments to Allreduce, Scan or
// Exscan.
func allreduceArgs[T Elem](send, recv []T, op Op[T]) error {
	if err := sameLength(len(send), len(recv)); err != nil {
		return err
	}
	return opArg(op)
}

// reduceScatterArgs checks this rank's arguments to ReduceScatter, and
// with blockCounts' counts to ReduceScatterBlock.
func reduceScatterArgs[T Elem](c *Comm, send, recv []T, counts []int, op Op[T]) error {
	if err := checkCounts(counts, c.Size(), c.Rank(), len(send), len(recv), ""); err != nil {
		return err
	}
	return opArg(op)
}

// blockCounts are a reduce-scatter-block's counts: n for each of p ranks.
func blockCounts(p, n int) []int {
	counts := make([]int, p)
	for r := range counts {
		counts[r] = n
	}
	return counts
}

// Barrier returns once every rank of c has called it.
func (c *Comm) Barrier(ctx context.Context) error {
	k, err := c.begin(ctx, "barrier")
	if err != nil {
		return err
	}
	defer k.done()
	if c.hosts != nil {
		err = k.hostBarrier()
	} else {
		err = k.dissemination()
	}
	if err != nil {
		return err
	}
	return k.end()
}

// dissemination is the barrier's algorithm: in round i every rank
// signals the rank 2^i after it and waits for the one 2^i before it.
func (k *collective) dissemination() error {
	p, r := k.c.Size(), k.c.Rank()
	for dist := 1; dist < p; dist *= 2 {
		if err := k.exchange(nil, (r+dist)%p, nil, (r-dist+p)%p); err != nil {
			return err
		}
	}
	return nil
}

// Bcast copies buf of rank root into buf of every other rank of c. Every
// rank passes a buffer of the same length.
func (c *Comm) Bcast(ctx context.Context, buf []byte, root int) error {
	k, err := c.beginAt(ctx, "bcast", root)
	if err != nil {
		return err
	}
	defer k.done()
	if c.hosts != nil {
		err = k.hostBcast(buf, root)
	} else {
		err = k.bcast(buf, root)
	}
	if err != nil {
		return err
	}
	return k.end()
}

// bcast is Bcast's algorithm, chosen by the ranks and bytes it moves.
func (k *collective) bcast(buf []byte, root int) error {
	if k.c.Size() >= bcastScatterRanks && len(buf) >= bcastScatterFrom {
		return k.bcastScatter(buf, root)
	}
	return k.binomial(root, func(int, int) []byte { return buf })
}

// binomial sends down a binomial tree from root: each rank receives from
// its parent, then sends to its children, the farthest first. part(v, m)
// is what goes to rank v (relative to the root) for itself and the m-1
// ranks of its subtree after it: the whole buffer for a broadcast, their
// blocks for a scatter.
func (k *collective) binomial(root int, part func(v, m int) []byte) error {
	p := k.c.Size()
	vr := (k.c.Rank() - root + p) % p // rank relative to the root
	mask := 1
	for ; mask < p; mask <<= 1 {
		if vr&mask != 0 {
			if err := k.recv(part(vr, mask), (vr-mask+root)%p); err != nil {
				return err
			}
			if err := k.wait(); err != nil {
				return err
			}
			break
		}
	}
	for mask >>= 1; mask > 0; mask >>= 1 {
		if vr+mask < p {
			if err := k.send(part(vr+mask, mask), (vr+mask+root)%p); err != nil {
				return err
			}
		}
	}
	return nil
}

// From bcastScatterFrom bytes and bcastScatterRanks ranks Bcast scatters
// the buffer and gathers it back around a ring (van de Geijn's broadcast,
// as MPICH does from its defaults of 12 KiB and 8 ranks): the root sends
// about the buffer's length in all instead of log2(p) times it, and every
// rank sends and receives about twice the buffer. With fewer ranks the
// binomial tree's log2(p) steps cost less than the ring's p-1. Two cores
// cannot time either with 8 ranks, so the figures are MPICH's.
const (
	bcastScatterFrom  = 12 << 10
	bcastScatterRanks = 8
)

// bcastScatter is van de Geijn's broadcast: buf is cut into Size() blocks
// of ceil(n/p) bytes (the last ones shorter or empty), rank v relative to
// the root owning block v. A binomial tree from the root scatters them,
// each rank receiving the blocks of its subtree, and a ring allgather
// brings every block to every rank.
func (k *collective) bcastScatter(buf []byte, root int) error {
	p, n := k.c.Size(), len(buf)
	size := (n + p - 1) / p
	blocks := func(v, m int) []byte { // blocks v to v+m-1, relative
		return buf[min(v*size, n):min((v+m)*size, n)]
	}
	if err := k.binomial(root, blocks); err != nil {
		return err
	}
	// The ring writes blocks this rank is still sending to its subtree,
	// the same bytes, but not while a subdevice may be reading them.
	if err := k.wait(); err != nil {
		return err
	}
	parts := make([][]byte, p)
	for r := range parts {
		parts[r] = blocks((r-root+p)%p, 1)
	}
	return k.allgatherv(parts[k.c.Rank()], parts)
}

// Gather collects send of every rank of c into recv of rank root, rank r's
// at recv[r*len(send):]. Every rank passes a send buffer of the same
// length; recv is used on the root only and must hold Size()*len(send)
// bytes there.
func (c *Comm) Gather(ctx context.Context, send, recv []byte, root int) error {
	k, err := c.beginAt(ctx, "gather", root)
	if err != nil {
		return err
	}
	defer k.done()
	if err := c.gatherArgs(send, recv, root); err != nil {
		return k.errorf("%w", err)
	}
	return k.gatherv(send, k.rootBlocks(recv, len(send), root), root)
}

// Gatherv collects send of every rank r of c into recv[r] of rank root.
// recv is used on the root only and holds Size() slices there, each as
// long as what its rank sends.
func (c *Comm) Gatherv(ctx context.Context, send []byte, recv [][]byte, root int) error {
	k, err := c.beginAt(ctx, "gatherv", root)
	if err != nil {
		return err
	}
	defer k.done()
	if err := c.gathervArgs(recv, root); err != nil {
		return k.errorf("%w", err)
	}
	return k.gatherv(send, recv, root)
}

func (k *collective) gatherv(send []byte, recv [][]byte, root int) error {
	me := k.c.Rank()
	if me != root {
		if err := k.send(send, root); err != nil {
			return err
		}
		return k.end()
	}
	for r, b := range recv {
		if r != me {
			if err := k.recv(b, r); err != nil {
				return err
			}
		}
	}
	k.own(recv[me], send)
	return k.end()
}

// Scatter sends the r-th block of send on rank root, send[r*len(recv):],
// into recv of rank r, for every rank of c. Every rank passes a receive
// buffer of the same length; send is used on the root only and must hold
// Size()*len(recv) bytes there.
func (c *Comm) Scatter(ctx context.Context, send, recv []byte, root int) error {
	k, err := c.beginAt(ctx, "scatter", root)
	if err != nil {
		return err
	}
	defer k.done()
	if err := c.scatterArgs(send, recv, root); err != nil {
		return k.errorf("%w", err)
	}
	return k.scatterv(k.rootBlocks(send, len(recv), root), recv, root)
}

// Scatterv sends send[r] of rank root into recv of rank r, for every rank
// r of c. send is used on the root only and holds Size() slices there,
// each as long as its rank's recv.
func (c *Comm) Scatterv(ctx context.Context, send [][]byte, recv []byte, root int) error {
	k, err := c.beginAt(ctx, "scatterv", root)
	if err != nil {
		return err
	}
	defer k.done()
	if err := c.scattervArgs(send, root); err != nil {
		return k.errorf("%w", err)
	}
	return k.scatterv(send, recv, root)
}

func (k *collective) scatterv(send [][]byte, recv []byte, root int) error {
	me := k.c.Rank()
	if me != root {
		if err := k.recv(recv, root); err != nil {
			return err
		}
		return k.end()
	}
	for r, b := range send {
		if r != me {
			if err := k.send(b, r); err != nil {
				return err
			}
		}
	}
	k.own(recv, send[me])
	return k.end()
}

// Allgather collects send of every rank of c into recv of every rank, rank
// r's at recv[r*len(send):]. Every rank passes a send buffer of the same
// length and a receive buffer of Size()*len(send) bytes.
func (c *Comm) Allgather(ctx context.Context, send, recv []byte) error {
	k, err := c.begin(ctx, "allgather")
	if err != nil {
		return err
	}
	defer k.done()
	if err := c.allgatherArgs(send, recv); err != nil {
		return k.errorf("%w", err)
	}
	if err := k.allgatherv(send, k.blocks(recv, len(send))); err != nil {
		return err
	}
	return k.end()
}

// Allgatherv collects send of every rank r of c into recv[r] of every
// rank. Every rank passes Size() receive slices of the same lengths, each
// as long as what its rank sends.
func (c *Comm) Allgatherv(ctx context.Context, send []byte, recv [][]byte) error {
	k, err := c.begin(ctx, "allgatherv")
	if err != nil {
		return err
	}
	defer k.done()
	if err := c.allgathervArgs(recv); err != nil {
		return k.errorf("%w", err)
	}
	if err := k.allgatherv(send, recv); err != nil {
		return err
	}
	return k.end()
}

// allgatherv passes the blocks around the ring: in each step a rank sends
// its right neighbour the block it received in the step before.
func (k *collective) allgatherv(send []byte, recv [][]byte) error {
	p, r := k.c.Size(), k.c.Rank()
	k.own(recv[r], send)
	right, left := (r+1)%p, (r-1+p)%p
	for step := range p - 1 {
		out, in := (r-step+p)%p, (r-step-1+p)%p
		if err := k.exchange(recv[out], right, recv[in], left); err != nil {
			return err
		}
	}
	return nil
}

// Alltoall sends the r-th block of send, send[r*n:(r+1)*n] with n =
// len(send)/Size(), to rank r, which receives it at recv[me*n:], me
// being this rank, for every pair of ranks of c. Every rank passes send
// and receive buffers of the same length, a multiple of Size().
func (c *Comm) Alltoall(ctx context.Context, send, recv []byte) error {
	k, err := c.begin(ctx, "alltoall")
	if err != nil {
		return err
	}
	defer k.done()
	if err := c.alltoallArgs(send, recv); err != nil {
		return k.errorf("%w", err)
	}
	n := len(send) / c.Size()
	return k.alltoallv(k.blocks(send, n), k.blocks(recv, n))
}

// Alltoallv sends send[r] to rank r, which receives it into its recv[me],
// me being this rank, for every pair of ranks of c. Every rank passes
// Size() send and Size() receive slices.
func (c *Comm) Alltoallv(ctx context.Context, send, recv [][]byte) error {
	k, err := c.begin(ctx, "alltoallv")
	if err != nil {
		return err
	}
	defer k.done()
	if err := c.alltoallvArgs(send, recv); err != nil {
		return k.errorf("%w", err)
	}
	return k.alltoallv(send, recv)
}

// alltoallv posts every receive, then every send, each rank starting with
// its next neighbour so that no rank is everybody's first destination.
func (k *collective) alltoallv(send, recv [][]byte) error {
	p, me := k.c.Size(), k.c.Rank()
	for i := 1; i < p; i++ {
		src := (me - i + p) % p
		if err := k.recv(recv[src], src); err != nil {
			return err
		}
	}
	for i := 1; i < p; i++ {
		dst := (me + i) % p
		if err := k.send(send[dst], dst); err != nil {
			return err
		}
	}
	k.own(recv[me], send[me])
	return k.end()
}

// rootBlocks is blocks on the root, which alone uses b; nil elsewhere.
func (k *collective) rootBlocks(b []byte, n int, root int) [][]byte {
	if k.c.Rank() != root {
		return nil
	}
	return k.blocks(b, n)
}

// blocks cuts b into Size() blocks of n bytes; the caller checked that b
// holds them (blocksFit).
func (k *collective) blocks(b []byte, n int) [][]byte {
	return cut(b, k.c.Size(), n)
}

// own copies this rank's own block, which travels nowhere; a length that
// disagrees is a mismatch like any other.
func (k *collective) own(dst, src []byte) {
	if len(dst) != len(src) && k.mismatch == nil {
		k.mismatch = k.errorf("own block: %w: %d bytes into %d", ErrMismatch, len(src), len(dst))
	}
	copy(dst, src)
}

// Reduce combines send of every rank of c into recv of rank root:
// recv = send₀ ⊕ send₁ ⊕ … ⊕ sendₚ₋₁, applied in rank order, so op need
// be associative only, not commutative. Every rank passes a send slice of
// the same length; recv is used on the root only and must be as long
// there. send and recv may be the same slice.
//
// Elements travel as their bytes in memory: the ranks of a job must agree
// on byte order and on the size of int and uint, as the hosts of a
// cluster do.
func Reduce[T Elem](ctx context.Context, c *Comm, send, recv []T, op Op[T], root int) error {
	k, err := c.beginAt(ctx, "reduce", root)
	if err != nil {
		return err
	}
	defer k.done()
	if err := reduceArgs(c, send, recv, op, root); err != nil {
		return k.errorf("%w", err)
	}
	if c.ordered != nil {
		err = hostReduce(k, send, recv, op, root)
	} else {
		err = reduce(k, send, recv, op, root)
	}
	if err != nil {
		return err
	}
	return k.end()
}

// reduce is Reduce's algorithm, chosen by the ranks and bytes it moves.
// The result is in recv on the root when it returns; other ranks' sends
// may still be in flight.
func reduce[T Elem](k *collective, send, recv []T, op Op[T], root int) error {
	if foldingOf(k.c.Size()).halves(len(send), elemSize[T]()) {
		return reduceLarge(k, send, recv, op, root)
	}
	acc, err := reduceToZero(k, send, op)
	if err != nil {
		return err
	}
	switch r := k.c.Rank(); {
	case root == 0 && r == 0:
		copy(recv, acc)
	case r == 0:
		return k.send(Bytes(acc), root)
	case r == root:
		if err := k.recv(Bytes(recv), 0); err != nil {
			return err
		}
		return k.wait()
	}
	return nil
}

// reduceToZero combines send of every rank into rank 0's result on a
// binomial tree, in rank order: at the step of mask, a rank whose bits
// below mask are clear holds the ranks [r, r+mask) combined, and takes the
// next mask ranks' from rank r+mask. It returns the result on rank 0.
func reduceToZero[T Elem](k *collective, send []T, op Op[T]) ([]T, error) {
	p, r := k.c.Size(), k.c.Rank()
	acc := scratch[T](k, 0, len(send))
	copy(acc, send)
	tmp := scratch[T](k, 1, len(send))
	for mask := 1; mask < p; mask <<= 1 {
		if r&mask != 0 {
			if err := k.send(Bytes(acc), r-mask); err != nil {
				return nil, err
			}
			return acc, k.wait()
		}
		if r+mask < p {
			if err := k.recv(Bytes(tmp), r+mask); err != nil {
				return nil, err
			}
			if err := k.wait(); err != nil {
				return nil, err
			}
			op(acc, tmp)
		}
	}
	return acc, nil
}

// reduceLarge is Rabenseifner's reduce: the reduce-scatter of halve, then
// a binomial gather of the parts to new rank 0, which sends the result to
// the root unless it is the root. Ranks beyond a power of two fold in as
// in Allreduce.
func reduceLarge[T Elem](k *collective, send, recv []T, op Op[T], root int) error {
	r, n := k.c.Rank(), len(send)
	f := foldingOf(k.c.Size())
	mine, nr := send, f.newRank(r)
	acc := scratch[T](k, 2, n)
	if r == root {
		acc = recv
	}
	if nr < 0 {
		if err := k.send(Bytes(send), r+1); err != nil {
			return err
		}
		if err := k.wait(); err != nil { // before recv, which may be send, takes the result
			return err
		}
	} else if f.folds(r) {
		mine = scratch[T](k, 1, n)
		if err := k.recv(Bytes(mine), r-1); err != nil {
			return err
		}
		if err := k.wait(); err != nil {
			return err
		}
		op(mine, send)
	}
	if nr >= 0 {
		h, err := reduceScatter(k, mine, acc, scratch[T](k, 0, n), nr, f, op)
		if err != nil {
			return err
		}
		for mask := f.p2 / 2; mask >= 1; mask >>= 1 {
			whole, other := h.back()
			if pnr := nr ^ mask; nr&mask != 0 {
				if err := k.send(Bytes(acc[h.lo:h.lo+h.n]), f.old(pnr)); err != nil {
					return err
				}
				break // its part is on its way to new rank 0
			} else if err := k.recv(Bytes(acc[other.lo:other.lo+other.n]), f.old(pnr)); err != nil {
				return err
			}
			if err := k.wait(); err != nil {
				return err
			}
			h.lo, h.n = whole.lo, whole.n
		}
	}
	switch zero := f.old(0); {
	case r == zero && r == root:
	case r == zero:
		if err := k.send(Bytes(acc), root); err != nil {
			return err
		}
	case r == root:
		if err := k.wait(); err != nil { // acc is recv: its part must be gone
			return err
		}
		if err := k.recv(Bytes(recv), zero); err != nil {
			return err
		}
		return k.wait()
	}
	return nil
}

// Allreduce combines send of every rank of c into recv of every rank:
// recv = send₀ ⊕ send₁ ⊕ … ⊕ sendₚ₋₁, applied in rank order (op need be
// associative only), the same on every rank. send and recv have the same
// length on every rank and may be the same slice. Byte order as for
// [Reduce].
func Allreduce[T Elem](ctx context.Context, c *Comm, send, recv []T, op Op[T]) error {
	k, err := c.begin(ctx, "allreduce")
	if err != nil {
		return err
	}
	defer k.done()
	if err := allreduceArgs(send, recv, op); err != nil {
		return k.errorf("%w", err)
	}
	if c.ordered != nil {
		err = hostAllreduce(k, send, recv, op)
	} else {
		err = allreduce(k, send, recv, op)
	}
	if err != nil {
		return err
	}
	return k.end()
}

// allreduce is Allreduce's algorithm, chosen by the ranks and bytes it
// moves; messages may still be in flight when it returns.
func allreduce[T Elem](k *collective, send, recv []T, op Op[T]) error {
	r, n := k.c.Rank(), len(send)
	// Both algorithms run on a power of two ranks; the ranks beyond it
	// fold in (folding).
	f := foldingOf(k.c.Size())
	mine, nr := send, f.newRank(r) // this rank's part as it stands, its new rank
	if f.folds(r) {
		if nr < 0 {
			if err := k.send(Bytes(send), r+1); err != nil {
				return err
			}
			if err := k.wait(); err != nil {
				return err
			}
			return k.recv(Bytes(recv), r+1)
		}
		mine = scratch[T](k, 1, n)
		if err := k.recv(Bytes(mine), r-1); err != nil {
			return err
		}
		if err := k.wait(); err != nil {
			return err
		}
		op(mine, send)
	}
	var err error
	if f.halves(n, elemSize[T]()) {
		err = halve(k, mine, recv, scratch[T](k, 0, n), nr, f, op)
	} else {
		err = double(k, mine, recv, scratch[T](k, 0, n), nr, f, op)
	}
	if err != nil {
		return err
	}
	if f.folds(r) {
		return k.send(Bytes(recv), r-1)
	}
	return nil
}

// double is recursive doubling among p2 ranks (new ranks, old maps them to
// ranks of the communicator): in each step a rank exchanges what it holds
// with the rank mask away and combines the two, the lower one's on the
// left. It reads mine, this rank's part, and leaves the result in acc;
// mine may be acc.
func double[T Elem](k *collective, mine, acc, tmp []T, nr int, f folding, op Op[T]) error {
	if len(mine) > 0 && &mine[0] != &acc[0] {
		copy(acc, mine)
	}
	res := acc // where the result is; the order of a combination may move it to tmp
	for mask := 1; mask < f.p2; mask <<= 1 {
		pnr := nr ^ mask
		if err := k.exchange(Bytes(res), f.old(pnr), Bytes(tmp), f.old(pnr)); err != nil {
			return err
		}
		if pnr < nr {
			op(tmp, res)
			res, tmp = tmp, res
		} else {
			op(res, tmp)
		}
	}
	if len(res) > 0 && &res[0] != &acc[0] {
		copy(acc, res)
	}
	return nil
}

// folding maps the ranks of a communicator onto the power of two p2 that
// recursive doubling and halving run on. Of the rem ranks beyond it, each
// even rank below 2*rem hands its data to the odd one above it and has no
// new rank; the others take new ranks in the same order as their old
// ones, so rank order survives the folding.
type folding struct{ p2, rem int }

func foldingOf(p int) folding {
	p2 := 1 << (bits.Len(uint(p)) - 1)
	return folding{p2, p - p2}
}

// folds reports whether rank r is one of a folded pair.
func (f folding) folds(r int) bool { return r < 2*f.rem }

// newRank is rank r's new rank, -1 for a rank that hands its data on.
func (f folding) newRank(r int) int {
	switch {
	case !f.folds(r):
		return r - f.rem
	case r%2 == 0:
		return -1
	}
	return r / 2
}

// old is the rank with new rank q.
func (f folding) old(q int) int {
	if q < f.rem {
		return 2*q + 1
	}
	return q + f.rem
}

// halves reports whether a vector of n elements of size bytes goes by
// halving: from halvingFrom bytes, and with an element for each of the p2
// ranks at least.
func (f folding) halves(n, size int) bool { return n*size >= halvingFrom && n >= f.p2 }

// halvingFrom is the size in bytes from which Allreduce takes halve's two
// phases rather than recursive doubling, which sends and combines the
// whole vector in every step. MPICH switches at 2 KiB; between two
// processes here halving read 1.1-1.3x doubling's time from 2 to 32 KiB
// (two rounds where one does) and 0.89-0.94x from 64 KiB to 1 MiB
// (mdbench allreduce --vs-build). With more ranks doubling's cost grows
// with log p and halving's does not, so this errs on the late side.
const halvingFrom = 64 << 10

// halve is Rabenseifner's allreduce among p2 ranks (new ranks, old maps
// them to ranks of the communicator): a reduce-scatter by recursive
// halving leaves each rank with its own part of the vector combined over
// every rank, and an allgather by recursive doubling brings the parts back
// together. Each rank sends and combines about the vector's length in
// all, not that much per step. It reads mine, this rank's part, and
// leaves the result in acc.
func halve[T Elem](k *collective, mine, acc, tmp []T, nr int, f folding, op Op[T]) error {
	h, err := reduceScatter(k, mine, acc, tmp, nr, f, op)
	if err != nil {
		return err
	}
	for mask := f.p2 / 2; mask >= 1; mask >>= 1 {
		whole, other := h.back()
		pnr := nr ^ mask
		if err := k.exchange(Bytes(acc[h.lo:h.lo+h.n]), f.old(pnr), Bytes(acc[other.lo:other.lo+other.n]), f.old(pnr)); err != nil {
			return err
		}
		h.lo, h.n = whole.lo, whole.n
	}
	return nil
}

// span is a range of a vector's elements.
type span struct{ lo, n int }

// halving is where a reduce-scatter by recursive halving left a rank: the
// span of acc it holds combined over every rank, and what it shared with
// its partner before each step, for the way back.
type halving struct {
	lo, n  int
	shared [bits.UintSize]span
	steps  int
}

// back undoes the last step: the span this rank and that step's partner
// shared, and the partner's part of it.
func (h *halving) back() (whole, other span) {
	h.steps--
	whole = h.shared[h.steps]
	if h.lo == whole.lo {
		return whole, span{whole.lo + h.n, whole.n - h.n} // the partner's part follows
	}
	return whole, span{whole.lo, whole.n - h.n} // or comes before
}

// reduceScatter halves the vector among p2 ranks: in each step a rank
// gives its partner half of what it holds and combines the other half
// with the partner's. It pairs the nearest partner first, so every
// combination joins two adjacent blocks of ranks, the lower one on the
// left: rank order holds, as in recursive doubling. The first step sends
// from mine, so that only the half this rank keeps is copied to acc.
func reduceScatter[T Elem](k *collective, mine, acc, tmp []T, nr int, f folding, op Op[T]) (halving, error) {
	h := halving{n: len(acc)}
	from := mine // what this rank's data is read from: mine, then acc
	for mask := 1; mask < f.p2; mask <<= 1 {
		pnr := nr ^ mask
		h.shared[h.steps] = span{h.lo, h.n}
		h.steps++
		keep, give := span{h.lo, h.n / 2}, span{h.lo + h.n/2, h.n - h.n/2}
		if pnr < nr {
			keep, give = give, keep
		}
		in := tmp[keep.lo : keep.lo+keep.n]
		if err := k.exchange(Bytes(from[give.lo:give.lo+give.n]), f.old(pnr), Bytes(in), f.old(pnr)); err != nil {
			return h, err
		}
		have, res := from[keep.lo:keep.lo+keep.n], acc[keep.lo:keep.lo+keep.n]
		if pnr < nr {
			op(in, have)
			copy(res, in)
		} else {
			copy(res, have)
			op(res, in)
		}
		h.lo, h.n, from = keep.lo, keep.n, acc
	}
	if h.steps == 0 { // one rank: nothing to combine
		copy(acc, mine)
	}
	return h, nil
}

// ReduceScatter combines send of every rank of c as Reduce does, in rank
// order, and hands out the result in parts: rank r gets counts[r]
// elements, those after the parts of the ranks before it
// (MPI_Reduce_scatter). Every rank passes the same counts, which add up
// to len(send), and a recv of counts[r] elements, not overlapping send.
// It reduces to rank 0 (a tree, or from 64 KiB Rabenseifner's
// reduce-scatter and gather) and scatters from there: about twice the
// traffic of a direct reduce-scatter for large vectors, kept simple
// because it must keep rank order for operations that do not commute.
func ReduceScatter[T Elem](ctx context.Context, c *Comm, send, recv []T, counts []int, op Op[T]) error {
	k, err := c.begin(ctx, "reduce_scatter")
	if err != nil {
		return err
	}
	defer k.done()
	return reduceScatterv(k, send, recv, counts, op)
}

// ReduceScatterBlock is ReduceScatter with the same count for every rank:
// rank r gets elements [r*len(recv), (r+1)*len(recv)) of the combined
// send, which holds Size()*len(recv) elements (MPI_Reduce_scatter_block).
func ReduceScatterBlock[T Elem](ctx context.Context, c *Comm, send, recv []T, op Op[T]) error {
	k, err := c.begin(ctx, "reduce_scatter_block")
	if err != nil {
		return err
	}
	defer k.done()
	return reduceScatterv(k, send, recv, blockCounts(c.Size(), len(recv)), op)
}

// checkCounts checks a reduce-scatter's counts, one for each of the p
// ranks of a group (named "<group>rank" in errors) of which this rank is
// me, against its send and receive lengths.
func checkCounts(counts []int, p, me, send, recv int, group string) error {
	if len(counts) != p {
		return fmt.Errorf("%d counts for %d %sranks", len(counts), p, group)
	}
	total := 0
	for r, n := range counts {
		if n < 0 {
			return fmt.Errorf("count of %srank %d is %d", group, r, n)
		}
		// Before the sum wraps: counts adding up to 0 modulo 2^64 would
		// pass for an empty send slice.
		if n > send-total {
			return fmt.Errorf("send slice of %d elements for counts adding up to more (the counts through %srank %d do)", send, group, r)
		}
		total += n
	}
	if total != send {
		return fmt.Errorf("send slice of %d elements for counts adding up to %d", send, total)
	}
	if recv != counts[me] {
		return fmt.Errorf("receive slice of %d elements for a count of %d", recv, counts[me])
	}
	return nil
}

func reduceScatterv[T Elem](k *collective, send, recv []T, counts []int, op Op[T]) error {
	p, me := k.c.Size(), k.c.Rank()
	if err := reduceScatterArgs(k.c, send, recv, counts, op); err != nil {
		return k.errorf("%w", err)
	}
	var whole []T // the combined vector, on rank 0
	if foldingOf(p).halves(len(send), elemSize[T]()) {
		if me == 0 {
			whole = scratch[T](k, 3, len(send)) // reduceLarge takes 0 to 2
		}
		if err := reduceLarge(k, send, whole, op, 0); err != nil {
			return err
		}
	} else {
		acc, err := reduceToZero(k, send, op)
		if err != nil {
			return err
		}
		whole = acc
	}
	var parts [][]byte
	if me == 0 {
		parts = make([][]byte, p)
		off := 0
		for r, n := range counts {
			parts[r] = Bytes(whole[off : off+n])
			off += n
		}
	}
	return k.scatterv(parts, Bytes(recv), 0)
}

// Scan combines into recv of every rank r of c the send slices of ranks 0
// to r: recv = send₀ ⊕ … ⊕ sendᵣ, in rank order (MPI_Scan). send and
// recv have the same length on every rank and may be the same slice. Byte
// order as for [Reduce].
func Scan[T Elem](ctx context.Context, c *Comm, send, recv []T, op Op[T]) error {
	k, err := c.begin(ctx, "scan")
	if err != nil {
		return err
	}
	defer k.done()
	return scan(k, send, recv, op, true)
}

// Exscan combines into recv of every rank r > 0 of c the send slices of
// ranks 0 to r-1: recv = send₀ ⊕ … ⊕ sendᵣ₋₁ (MPI_Exscan). Rank 0's recv
// is left as it was. send and recv have the same length on every rank and
// may be the same slice.
func Exscan[T Elem](ctx context.Context, c *Comm, send, recv []T, op Op[T]) error {
	k, err := c.begin(ctx, "exscan")
	if err != nil {
		return err
	}
	defer k.done()
	return scan(k, send, recv, op, false)
}

// scan is recursive doubling: at the step of mask, a rank holds in partial
// its aligned block of mask ranks combined, exchanges it with the rank
// mask away, and keeps the combination of both blocks in rank order;
// what comes from below also goes into its own prefix.
func scan[T Elem](k *collective, send, recv []T, op Op[T], inclusive bool) error {
	if err := allreduceArgs(send, recv, op); err != nil {
		return k.errorf("%w", err)
	}
	p, r, n := k.c.Size(), k.c.Rank(), len(send)
	partial, tmp := scratch[T](k, 0, n), scratch[T](k, 1, n)
	copy(partial, send)
	// prefix is what ranks below r (and r itself when inclusive) combine
	// to; there is none on an exclusive scan's rank 0.
	prefix, below := scratch[T](k, 2, n), scratch[T](k, 3, n)
	have := inclusive
	if inclusive {
		copy(prefix, send)
	}
	for mask := 1; mask < p; mask <<= 1 {
		partner := r ^ mask
		if partner >= p {
			continue
		}
		if err := k.exchange(Bytes(partial), partner, Bytes(tmp), partner); err != nil {
			return err
		}
		if partner > r {
			op(partial, tmp)
			continue
		}
		// tmp comes from below: it goes in front of both.
		copy(below, tmp)
		if have {
			op(below, prefix)
		}
		prefix, below, have = below, prefix, true
		op(tmp, partial)
		partial, tmp = tmp, partial
	}
	if have {
		copy(recv, prefix)
	}
	return k.end()
}
