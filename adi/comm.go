package adi

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hpc-multidevice/multidevice/multidevice"
)

// Wildcards and limits.
const (
	AnySource = multidevice.AnySource // receive from any rank
	AnyTag    = multidevice.AnyTag    // receive any tag
	MaxTag    = 1<<31 - 1             // the largest tag (MPI_TAG_UB)
	// Undefined as a Split color leaves the calling rank out of every new
	// communicator.
	Undefined = -1
	// ProcNull as the destination or source of a point-to-point call
	// (MPI_PROC_NULL) makes it complete at once, moving nothing: a
	// receive or probe then has the status {Source: ProcNull, Tag:
	// AnyTag, Count: 0}. Cart.Shift returns it past the edges of a
	// dimension that does not wrap, so that a halo exchange needs no
	// special case there.
	ProcNull = -2
)

// checkTag checks a tag the multidevice does not check first: an
// operation's with ProcNull, which it never sees, or a Sendrecv's, which
// must be refused before its receive is posted. wild allows AnyTag.
func checkTag(tag int, wild bool) error {
	if tag < 0 || tag > MaxTag {
		switch {
		case !wild:
			return fmt.Errorf("adi: %w: %d (tags are 0..%d)", ErrTag, tag, MaxTag)
		case tag != AnyTag:
			return fmt.Errorf("adi: %w: %d (tags are 0..%d, or AnyTag)", ErrTag, tag, MaxTag)
		}
	}
	return nil
}

// nullStatus is what a receive or probe from ProcNull finds.
var nullStatus = Status{Source: ProcNull, Tag: AnyTag}

// Status describes a received or probed message. Source is a rank in the
// communicator the receive was posted on. A receive that fails (its source
// lost, the world closed) reports the source and tag of the message it
// matched or, before a match, those it was posted with, wildcards
// included, and Count 0; a cancelled one reports Cancelled.
type Status struct {
	Source    int
	Tag       int
	Count     int // bytes received; for a probe, the message length
	Cancelled bool
}

// worldContext is the world communicator's context id. Each communicator
// owns an even id for point-to-point traffic and the odd id after it for
// its collectives (Split among them), so the two never match.
const worldContext uint64 = 2

// Comm is a communicator: a group of ranks and a context isolating their
// messages from every other communicator's. It is safe for concurrent use.
type Comm struct {
	w       *World
	context uint64
	rank    int   // this process's rank in the communicator
	ranks   []int // communicator rank -> world rank
	index   map[int]int
	// identity is set when rank i of c is world rank i for every rank of
	// the world (the world and its duplicates): statuses then need no
	// look-up in index.
	identity bool
	derived  atomic.Uint64 // communicators created from this one (Dup, Split)
	groupSeq atomic.Uint64 // CreateGroup calls this rank made on this one (group.go)
	collSeq  atomic.Uint64 // collective calls made on this one (collective.go)
	coll     collState
	copies   sync.Pool // of *Comm: nonblocking collectives run on them (nbcoll.go)
	// partInits counts the partitioned inits made on this one
	// (partitioned.go).
	partInits partitionedInits
	// hosts and ordered are where the ranks live, for the collectives
	// that go by hosts and for the reductions among them (hostcoll.go);
	// nil when they would not. hviews and oviews are their views, made
	// by the first collective that needs them; like coll, owned by the
	// running collective.
	hosts, ordered *hostMap
	hviews, oviews *hostViews
	// of maps a view's ranks to those of the communicator it is a view
	// of, for error messages; nil on a communicator.
	of []int
	// remoteGroup marks an intercommunicator's remote group, whose ranks
	// its point-to-point calls take: errors say so, since the remote
	// group's size is not the Intercomm's Size.
	remoteGroup bool
}

func newComm(w *World, context uint64, ranks []int) *Comm {
	c := &Comm{w: w, context: context, ranks: ranks, index: make(map[int]int, len(ranks))}
	c.identity = len(ranks) == w.dev.Size()
	for i, r := range ranks {
		c.index[r] = i
		c.identity = c.identity && r == i
	}
	c.rank = c.index[w.dev.Rank()]
	c.hosts, c.ordered = hostMaps(w, ranks)
	return c
}

// Rank is this process's rank in c.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks in c.
func (c *Comm) Size() int { return len(c.ranks) }

// WorldRank translates a rank of c into a world rank.
func (c *Comm) WorldRank(r int) (int, error) {
	if r < 0 || r >= len(c.ranks) {
		return 0, fmt.Errorf("%w: %d not in [0,%d)", ErrRank, r, len(c.ranks))
	}
	return c.ranks[r], nil
}

func (c *Comm) dest(r int) (int, error) {
	if uint(r) < uint(len(c.ranks)) {
		return c.ranks[r], nil
	}
	_, err := c.WorldRank(r)
	return 0, fmt.Errorf("adi: destination%s: %w", c.groupNote(), err)
}

// groupNote names the remote group in errors about c's ranks.
func (c *Comm) groupNote() string {
	if c.remoteGroup {
		return " (a rank of the intercommunicator's remote group)"
	}
	return ""
}

func (c *Comm) source(r int) (int, error) {
	if uint(r) < uint(len(c.ranks)) {
		return c.ranks[r], nil
	}
	if r == AnySource {
		return AnySource, nil
	}
	_, err := c.WorldRank(r)
	return 0, fmt.Errorf("adi: source%s: %w", c.groupNote(), err)
}

// rankName names rank r of c in an error. The device's errors (a lost
// peer's, a failed send's) number ranks in the world; where c's ranks are
// not the world's, the world rank is named too, so that those words can be
// matched with c's.
func (c *Comm) rankName(r int) string {
	switch {
	case r == AnySource:
		return "any source"
	case r == ProcNull:
		return "ProcNull"
	case c.identity || uint(r) >= uint(len(c.ranks)):
		return "rank " + strconv.Itoa(r)
	}
	return fmt.Sprintf("rank %d (world rank %d)", r, c.ranks[r])
}

// fromName names, in the error of a receive on c from source (or
// AnySource) whose device status is st, the rank its message came from,
// as Status.Source does, or before a match the one the receive was posted
// for. Before a match st is cancelled, its source still the wildcard, or
// zero: a call refused at once (the device closed, a probed message
// received already) reports no status, whose source 0 is nobody's. A
// zero-byte message from world rank 0 with tag 0 whose receive fails is
// named by the posted source too.
func (c *Comm) fromName(source int, st multidevice.Status) string {
	if st != (multidevice.Status{}) && !st.Cancelled && st.Source != AnySource {
		source = c.status(st).Source
	}
	return c.rankName(source)
}

// status converts a device status (world source) to one of c.
func (c *Comm) status(st multidevice.Status) Status {
	src := st.Source
	if !st.Cancelled && !c.identity {
		if r, ok := c.index[st.Source]; ok {
			src = r
		}
	}
	return Status{Source: src, Tag: st.Tag, Count: st.Count, Cancelled: st.Cancelled}
}

// Isend starts a standard-mode send of buf to rank dest with tag. buf must
// not change until the request completes.
func (c *Comm) Isend(buf []byte, dest, tag int) (*Request, error) {
	return c.isend(buf, dest, tag, false)
}

// Issend starts a synchronous-mode send: it completes only once the
// receiver has matched the message.
func (c *Comm) Issend(buf []byte, dest, tag int) (*Request, error) {
	return c.isend(buf, dest, tag, true)
}

func (c *Comm) isend(buf []byte, dest, tag int, sync bool) (*Request, error) {
	q := new(Request)
	if err := c.isendInto(q, buf, dest, tag, sync); err != nil {
		return nil, err
	}
	return q, nil
}

// IsendInto is Isend into q, a Request the caller owns: the zero value, or
// one whose earlier operation completed, which is then reused. A program
// that keeps its requests (an array for a window of messages) and reuses
// them sends and receives without allocating. A request that has not
// completed yet is refused with ErrRequestBusy and left as it was, and so
// is a persistent or partitioned request, which Start starts. q must not
// be used concurrently for anything else meanwhile.
func (c *Comm) IsendInto(q *Request, buf []byte, dest, tag int) error {
	if err := q.reusable(); err != nil {
		return err
	}
	return c.isendInto(q, buf, dest, tag, false)
}

// IssendInto is Issend into q; see IsendInto.
func (c *Comm) IssendInto(q *Request, buf []byte, dest, tag int) error {
	if err := q.reusable(); err != nil {
		return err
	}
	return c.isendInto(q, buf, dest, tag, true)
}

func (c *Comm) isendInto(q *Request, buf []byte, dest, tag int, sync bool) error {
	if dest == ProcNull {
		if err := checkTag(tag, false); err != nil {
			q.refused()
			return err
		}
		return q.startLocal(c, nullSend)
	}
	d, err := c.dest(dest)
	if err != nil {
		q.refused()
		return err
	}
	if err := q.start(); err != nil {
		return err
	}
	if err := c.w.dev.IsendRequest(&q.r, buf, d, tag, c.context, sync); err != nil {
		q.failedStart(err)
		return fmt.Errorf("adi: send to %s: %w", c.rankName(dest), err)
	}
	q.c, q.peer, q.recv = c, dest, false
	return nil
}

// Send sends buf to rank dest with tag and returns when buf may be reused.
// If ctx ends first, Send returns its error and buf is the caller's again,
// but the message is not withdrawn: it may still be received, as buf held
// it at the call (sent from a copy). A caller that sends again after such
// an error may have the message received twice.
func (c *Comm) Send(ctx context.Context, buf []byte, dest, tag int) error {
	return c.send(ctx, buf, dest, tag, false)
}

// Ssend sends synchronously: it returns once the receiver matched the
// message. If ctx ends first, it is as for Send: the message may still be
// matched later.
func (c *Comm) Ssend(ctx context.Context, buf []byte, dest, tag int) error {
	return c.send(ctx, buf, dest, tag, true)
}

func (c *Comm) send(ctx context.Context, buf []byte, dest, tag int, sync bool) error {
	if dest == ProcNull {
		return checkTag(tag, false)
	}
	d, err := c.dest(dest)
	if err != nil {
		return err
	}
	if err := c.w.dev.Send(ctx, buf, d, tag, c.context, sync); err != nil {
		return fmt.Errorf("adi: send to %s: %w", c.rankName(dest), err)
	}
	return nil
}

// Irecv posts a receive into buf from rank source (or AnySource) with tag (or
// AnyTag). A longer message completes the request with ErrTruncated.
func (c *Comm) Irecv(buf []byte, source, tag int) (*Request, error) {
	q := new(Request)
	if err := c.IrecvInto(q, buf, source, tag); err != nil {
		return nil, err
	}
	return q, nil
}

// IrecvInto is Irecv into q, a Request the caller owns; see IsendInto.
func (c *Comm) IrecvInto(q *Request, buf []byte, source, tag int) error {
	if err := q.reusable(); err != nil {
		return err
	}
	return c.irecvInto(q, buf, source, tag)
}

func (c *Comm) irecvInto(q *Request, buf []byte, source, tag int) error {
	if source == ProcNull {
		if err := checkTag(tag, true); err != nil {
			q.refused()
			return err
		}
		return q.startLocal(c, nullRecv)
	}
	s, err := c.source(source)
	if err != nil {
		q.refused()
		return err
	}
	if err := q.start(); err != nil {
		return err
	}
	if err := c.w.dev.IrecvRequest(&q.r, buf, s, tag, c.context); err != nil {
		q.failedStart(err)
		return fmt.Errorf("adi: receive from %s: %w", c.rankName(source), err)
	}
	q.c, q.peer, q.recv = c, source, true
	return nil
}

// Recv receives one message into buf. When ctx ends first the receive is
// cancelled and Recv returns an error wrapping ctx.Err(), with a status
// that says Cancelled. If it had matched a large message whose data was
// still coming, that message is given up (lost to the program; its sender
// completes as usual), and the status names its source and tag: nothing
// is written into buf after Recv returns.
func (c *Comm) Recv(ctx context.Context, buf []byte, source, tag int) (Status, error) {
	if source == ProcNull {
		return nullStatus, checkTag(tag, true)
	}
	s, err := c.source(source)
	if err != nil {
		return Status{}, err
	}
	st, err := c.w.dev.Recv(ctx, buf, s, tag, c.context)
	if err != nil {
		return c.status(st), fmt.Errorf("adi: receive from %s: %w", c.fromName(source, st), err)
	}
	return c.status(st), nil
}

// Iprobe reports whether a message from source with tag is waiting, without
// receiving it.
func (c *Comm) Iprobe(source, tag int) (Status, bool, error) {
	if source == ProcNull {
		if err := checkTag(tag, true); err != nil {
			return Status{}, false, err
		}
		return nullStatus, true, nil
	}
	s, err := c.source(source)
	if err != nil {
		return Status{}, false, err
	}
	st, ok, err := c.w.dev.Iprobe(s, tag, c.context)
	if err != nil {
		return Status{}, false, fmt.Errorf("adi: probe of %s: %w", c.rankName(source), err)
	}
	return c.status(st), ok, nil
}

// Probe blocks until a message from source with tag is waiting and describes
// it. When ctx ends first Probe returns an error wrapping ctx.Err() and,
// as Recv then, a status that says Cancelled, with source AnySource and
// tag AnyTag: no message is described.
func (c *Comm) Probe(ctx context.Context, source, tag int) (Status, error) {
	var st Status
	err := c.awaitProbe(ctx, func() (ok bool, err error) {
		st, ok, err = c.Iprobe(source, tag)
		return ok, err
	})
	if err != nil && errors.Is(err, ctx.Err()) {
		st = probeEnded
	}
	return st, err
}

// probeEnded is the status of a blocking probe whose ctx ended first: a
// cancelled receive's, not the zero Status, which names rank 0's message
// with tag 0.
var probeEnded = Status{Source: AnySource, Tag: AnyTag, Cancelled: true}

// awaitProbe calls try, a probe, until it finds a message or fails, or ctx
// ends: polling for a while, then parked until something arrives.
func (c *Comm) awaitProbe(ctx context.Context, try func() (bool, error)) error {
	_, err := c.awaitProbeOr(ctx, try, nil)
	return err
}

// awaitProbeOr is awaitProbe that also ends, reporting true, once other
// (if set) does: a check too costly to make at every poll, made instead
// each time something changes (a message comes, a request completes, a
// rank is lost), before try.
func (c *Comm) awaitProbeOr(ctx context.Context, try func() (bool, error), other func() bool) (bool, error) {
	poll := c.w.dev.HasMatchingSubDevices()
	for {
		changed := c.w.dev.Changed()
		if other != nil && other() {
			return true, nil
		}
		ok, err := try()
		if err != nil || ok {
			return false, err
		}
		if c.w.dev.Progress(func() bool { ok, err = try(); return ok || err != nil }) {
			return false, err
		}
		var tick <-chan time.Time
		if poll { // matching subdevices queue messages we are not told about
			tick = time.After(100 * time.Microsecond)
		}
		select {
		case <-changed:
		case <-tick:
		case <-ctx.Done():
			return false, fmt.Errorf("adi: probe: %w", ctx.Err())
		}
	}
}

// Sendrecv sends send to rank dest with sendTag and receives into recv
// from source (or AnySource) with recvTag, both at once, and returns when
// both are done with the receive's status. The receive is posted before
// the send starts, so ranks that exchange with each other, pairwise or
// around a ring, cannot wait for each other as two blocking Sends can.
// send and recv must not overlap (SendrecvReplace exchanges in place).
// When ctx ends first, or the send fails, the receive is cancelled, or
// given up as Recv's is. Ranks and tags are checked before anything
// starts: a call refused for them sends nothing and takes no message.
func (c *Comm) Sendrecv(ctx context.Context, send []byte, dest, sendTag int, recv []byte, source, recvTag int) (Status, error) {
	// Here, not in the device: it posts the receive before its send
	// checks the send's tag, so a bad one found there would have taken a
	// waiting message. The ranks are checked below, before it too.
	if checkTag(sendTag, false) != nil {
		return Status{}, fmt.Errorf("adi: sendrecv: send tag %d: %w (tags are 0..%d)", sendTag, ErrTag, MaxTag)
	}
	if checkTag(recvTag, true) != nil {
		return Status{}, fmt.Errorf("adi: sendrecv: receive tag %d: %w (tags are 0..%d, or AnyTag)", recvTag, ErrTag, MaxTag)
	}
	switch {
	case source == ProcNull:
		return nullStatus, c.Send(ctx, send, dest, sendTag)
	case dest == ProcNull:
		return c.Recv(ctx, recv, source, recvTag)
	}
	d, err := c.dest(dest)
	if err != nil {
		return Status{}, err
	}
	s, err := c.source(source)
	if err != nil {
		return Status{}, err
	}
	st, err := c.w.dev.Sendrecv(ctx, send, d, sendTag, recv, s, recvTag, c.context)
	if err != nil {
		return c.status(st), fmt.Errorf("adi: sendrecv to %s and from %s: %w", c.rankName(dest), c.fromName(source, st), err)
	}
	return c.status(st), nil
}

// SendrecvReplace is Sendrecv with one buffer: buf is sent, then
// overwritten by the message received. It costs a copy of buf.
func (c *Comm) SendrecvReplace(ctx context.Context, buf []byte, dest, sendTag, source, recvTag int) (Status, error) {
	return c.Sendrecv(ctx, append([]byte(nil), buf...), dest, sendTag, buf, source, recvTag)
}

// Dup returns a communicator with the same group and a new, isolated
// context. Every rank of c must call Dup in the same order relative to other
// Dup and Split calls on c.
func (c *Comm) Dup(ctx context.Context) (*Comm, error) {
	n := c.derived.Add(1)
	return newComm(c.w, deriveContext(c.context, n, 0), c.ranks), nil
}

// Idup is Dup started nonblockingly (MPI_Comm_idup). Dup sends nothing,
// every rank deriving the new context alike, so Idup makes the new
// communicator at once and returns it with a request that has completed
// already. As MPI says, the new communicator may be used once the
// request completes: a program written for an Idup that communicates
// waits for the request (or tests it) first, and loses nothing here. Every
// rank calls Idup in the same order as its other Dup and Split calls on
// c, as for Dup.
func (c *Comm) Idup() (*Comm, *Request, error) {
	d, err := c.Dup(context.Background())
	if err != nil {
		return nil, nil, err
	}
	return d, &Request{c: c, local: doneOp(Status{})}, nil
}

// Split partitions c: ranks passing the same color form a new communicator,
// ordered by key and then by rank in c. A rank passing Undefined gets nil.
// It is collective: every rank of c must call it.
func (c *Comm) Split(ctx context.Context, color, key int) (*Comm, error) {
	n := c.derived.Add(1)
	// Every rank's color and key, as int64s: those are the same size on
	// every host, where int need not be. A rank with a bad color takes
	// part too, so that the others learn of it rather than wait.
	all := make([]int64, 2*c.Size())
	if err := c.Allgather(ctx, Bytes([]int64{int64(color), int64(key)}), Bytes(all)); err != nil {
		return nil, fmt.Errorf("adi: split: %w", err)
	}
	if color < Undefined {
		return nil, fmt.Errorf("adi: split: color %d must be >= 0 or Undefined", color)
	}
	for r := range c.Size() {
		if all[2*r] < Undefined {
			return nil, fmt.Errorf("adi: split: %w: rank %d passed color %d, neither >= 0 nor Undefined", ErrMismatch, r, all[2*r])
		}
	}
	if color == Undefined {
		return nil, nil
	}
	type member struct{ key, rank int }
	var members []member
	for r := range c.Size() {
		if all[2*r] == int64(color) {
			members = append(members, member{int(all[2*r+1]), r})
		}
	}
	sort.SliceStable(members, func(i, j int) bool {
		if members[i].key != members[j].key {
			return members[i].key < members[j].key
		}
		return members[i].rank < members[j].rank
	})
	ranks := make([]int, len(members))
	for i, m := range members {
		ranks[i] = c.ranks[m.rank]
	}
	return newComm(c.w, deriveContext(c.context, n, colorIndex(all, 2, int64(color))+1), ranks), nil
}

// colorIndex is color's place among the distinct colors >= 0 of records
// of stride words each, a color first, as every rank of a Split sees
// them. A child's context id mixes in that index rather than the color,
// so that no color, however chosen, can make the id of another
// communicator derived from the same parent.
func colorIndex(records []int64, stride int, color int64) uint64 {
	below := make(map[int64]bool)
	for i := 0; i < len(records); i += stride {
		if c := records[i]; c >= 0 && c < color {
			below[c] = true
		}
	}
	return uint64(len(below))
}

// SplitHost returns the communicator of the ranks of c that share this
// rank's host, in their order in c (MPI_Comm_split_type with
// MPI_COMM_TYPE_SHARED): the ranks that shared memory reaches, for
// algorithms that work within a host first. Hosts are the launcher's
// names for them (World.Host). Every rank of c calls it, in the same order
// relative to Dup and Split on c, as for Split; it sends nothing, since
// every rank knows every rank's host since Init.
func (c *Comm) SplitHost(ctx context.Context) (*Comm, error) {
	n := c.derived.Add(1)
	host := c.w.Host()
	color := -1 // the first rank on this host
	var ranks []int
	for r, wr := range c.ranks {
		if c.w.dev.Host(wr) == host {
			if color < 0 {
				color = r
			}
			ranks = append(ranks, wr)
		}
	}
	return newComm(c.w, deriveContext(c.context, n, uint64(color)+1), ranks), nil
}

// deriveContext gives a child communicator an even context id that every
// member computes alike from the parent's id, the creation count and the
// color, without communication. 64-bit mixing makes a collision between
// live communicators vanishingly unlikely. Its ids have the top bit
// clear: CreateGroup's have it set (group.go).
func deriveContext(parent, n, color uint64) uint64 {
	x := parent*0x9e3779b97f4a7c15 ^ n*0xbf58476d1ce4e5b9 ^ color*0x94d049bb133111eb
	x ^= x >> 31
	x *= 0xd6e8feb86659fd93
	x ^= x >> 32
	x &^= 1 | groupContext
	if x <= worldContext {
		x += 4
	}
	return x
}
