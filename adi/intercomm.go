package adi

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
)

// Intercommunicators (MPI-3.1 section 6.6). An Intercomm joins two
// disjoint groups of ranks, the local group (this rank's) and the remote
// group, so that programs coupled in one job (an ocean model and an
// atmosphere, a solver and its visualiser, as `mdrun -n 4 a : -n 2 b`
// launches them) talk group to group: every destination and source of a
// point-to-point call names a rank of the remote group.
//
// An Intercomm is built from three communicators:
//
//	remote  the remote group's ranks on the intercommunicator's context:
//	        point-to-point traffic on its even id, so that destinations,
//	        sources and statuses translate through the remote group with
//	        Comm's own code; the leaders' and the roots' messages of the
//	        collectives on the odd id after it
//	coll    the local group on a context of its own, for the collectives'
//	        local phases (reduce or gather to the local leader, broadcast
//	        or scatter from it)
//	local   the local group on yet another context: Local's
//
// Messages on the intercommunicator's context come only from the remote
// group: the local group sends there to remote ranks only, and the two
// groups are disjoint. So AnySource receives from the remote group alone.

// Root as the root argument of a rooted collective on an Intercomm
// (MPI_ROOT) names the calling rank as the root: the root's group passes
// Root on the root and ProcNull on its other ranks, and the other group
// passes the root's rank in the root's group, which is a remote rank to
// them.
const Root = -3

// ErrGroupsOverlap: the two groups of an intercommunicator share a rank.
var ErrGroupsOverlap = errors.New("adi: the local and remote groups of an intercommunicator overlap")

// Intercomm is an intercommunicator: the local group, which this rank
// belongs to, and a disjoint remote group, with a context of their own.
// Rank and Size describe the local group; every destination and source
// of its point-to-point calls, and every Status.Source it reports, is a
// rank of the remote group. It is safe for concurrent use; its
// collectives run one at a time, as Comm's do.
type Intercomm struct {
	remote *Comm // remote ranks on the intercommunicator's context
	coll   *Comm // local ranks, for the collectives' local phases
	local  *Comm // local ranks, Local's
	// lowLeader is set on the group whose leader (IntercommCreate's
	// localLeader) has the lower world rank, on every rank of it: Merge
	// puts that group first when both pass the same high.
	lowLeader bool
	derived   atomic.Uint64 // Dup, Merge, Split and Create calls on this one
}

// newIntercomm makes an intercommunicator of the world ranks local and
// remote on context id, where low says whether the local leader has the
// lower world rank of the two leaders. It sends nothing.
func newIntercomm(w *World, id uint64, local, remote []int, low bool) *Intercomm {
	r := &Comm{w: w, context: id, ranks: remote, index: make(map[int]int, len(remote)), remoteGroup: true}
	for i, wr := range remote {
		r.index[wr] = i
	}
	side := uint64(0)
	if !low {
		side = 1
	}
	// Count 0 is no Dup's nor Merge's (those count from 1), and the sides
	// pass different colors, so neither group's communicators share an id
	// with the other's or with a child of this one.
	ic := &Intercomm{
		remote:    r,
		coll:      newComm(w, deriveContext(id, 0, 1+side), local),
		local:     newComm(w, deriveContext(id, 0, 3+side), local),
		lowLeader: low,
	}
	r.rank = ic.coll.rank // for error messages; r's algorithms never run on it
	return ic
}

// Rank is this process's rank in the local group.
func (ic *Intercomm) Rank() int { return ic.local.rank }

// Size is the number of ranks in the local group.
func (ic *Intercomm) Size() int { return ic.local.Size() }

// RemoteSize is the number of ranks in the remote group.
func (ic *Intercomm) RemoteSize() int { return len(ic.remote.ranks) }

// Group returns the local group, in the order of the communicator the
// intercommunicator was created from.
func (ic *Intercomm) Group() Group { return ic.local.Group() }

// RemoteGroup returns the remote group (MPI_Comm_remote_group): the
// ranks that point-to-point calls address.
func (ic *Intercomm) RemoteGroup() Group { return ic.remote.Group() }

// Local returns a communicator of the local group, its ranks in the same
// order as in the communicator IntercommCreate was called on, with a
// context of its own: as a Dup of that communicator made when the
// intercommunicator was, but made without communication, and the same
// one on every call. Its messages never match the intercommunicator's
// nor those of the communicator it was created from.
func (ic *Intercomm) Local() *Comm { return ic.local }

// IntercommCreate makes an intercommunicator between the ranks of c and
// another, disjoint group of ranks that calls IntercommCreate at the same
// time on a communicator of its own (MPI_Intercomm_create). It is
// collective over c: every rank of c calls it, in the same order as c's
// other collectives and its Dup and Split calls, with the same
// localLeader, a rank of c. Only on the local leader do the other
// arguments count (elsewhere peer may be nil): peer is a communicator
// that holds both leaders (often the world), remoteLeader is the other
// group's leader's rank in peer, and tag (0..MaxTag) is the tag the two
// leaders exchange their groups with on peer, which no other traffic
// between them on peer may use meanwhile.
//
// The leaders agree on the context id without any other rank taking
// part: each proposes one derived from its own communicator, as Dup
// would, and both mix the two proposals the same way, whichever is whose.
// The local leader then broadcasts the remote group within c.
//
// A leader that finds fault (remoteLeader outside peer, a bad tag, a
// remote group that shares a rank with the local one: ErrGroupsOverlap)
// returns the error and tells the ranks of c, which return an error
// wrapping the same sentinel. A leader whose ctx ends, or whose peer is
// lost, returns at once; the other ranks of c then wait until their own
// ctx ends, as in a collective that fails.
func (c *Comm) IntercommCreate(ctx context.Context, localLeader int, peer *Comm, remoteLeader, tag int) (*Intercomm, error) {
	n := c.derived.Add(1)
	if localLeader < 0 || localLeader >= c.Size() {
		return nil, fmt.Errorf("adi: intercomm create: local leader: %w: %d not in [0,%d)", ErrRank, localLeader, c.Size())
	}
	// hdr is what the local leader tells the group: an outcome (create*),
	// the context id, the remote group's size and its leader's world rank.
	hdr := make([]int64, 4)
	var remote []int
	var bad error
	if c.Rank() == localLeader {
		var id uint64
		var remoteLeaderWorld int
		remote, id, remoteLeaderWorld, bad = c.leaderHandshake(ctx, n, peer, remoteLeader, tag)
		code := outcome(bad)
		if code == createFailed {
			return nil, bad
		}
		hdr = []int64{int64(code), int64(id), int64(len(remote)), int64(remoteLeaderWorld)}
	}
	if err := c.Bcast(ctx, Bytes(hdr), localLeader); err != nil {
		return nil, fmt.Errorf("adi: intercomm create: %w", err)
	}
	if bad != nil {
		return nil, bad
	}
	if code := int(hdr[0]); code != createOK {
		err := fmt.Errorf("adi: intercomm create: the local leader (rank %d) failed", localLeader)
		if s := outcomeErr(code); s != nil {
			err = fmt.Errorf("%w: %w", err, s)
		}
		return nil, err
	}
	ws := c.w.dev.Size()
	if hdr[2] < 1 || hdr[2] > int64(ws) || hdr[3] < 0 || hdr[3] >= int64(ws) {
		return nil, fmt.Errorf("adi: intercomm create: the local leader sent a remote group of %d ranks led by world rank %d", hdr[2], hdr[3])
	}
	wire := make([]int64, hdr[2])
	if c.Rank() == localLeader {
		for i, wr := range remote {
			wire[i] = int64(wr)
		}
	}
	if err := c.Bcast(ctx, Bytes(wire), localLeader); err != nil {
		return nil, fmt.Errorf("adi: intercomm create: %w", err)
	}
	if remote == nil {
		remote = make([]int, len(wire))
		for i, wr := range wire {
			remote[i] = int(wr)
		}
	}
	low := c.ranks[localLeader] < int(hdr[3])
	return newIntercomm(c.w, uint64(hdr[1]), c.ranks, remote, low), nil
}

// Outcomes of the local leader's part of IntercommCreate, as it
// broadcasts them to its group; createFailed is never broadcast.
const (
	createOK = iota
	createRank
	createTag
	createOverlap
	createMismatch
	createOther
	createFailed // ctx ended or the transport failed: the leader returns at once
)

// outcome classifies the local leader's error for its group.
func outcome(err error) int {
	switch {
	case err == nil:
		return createOK
	case errors.Is(err, ErrRank):
		return createRank
	case errors.Is(err, ErrTag):
		return createTag
	case errors.Is(err, ErrGroupsOverlap):
		return createOverlap
	case errors.Is(err, ErrMismatch):
		return createMismatch
	case errors.Is(err, errCreateArgs):
		return createOther
	}
	return createFailed
}

// outcomeErr is the sentinel the other ranks wrap for a leader's outcome.
func outcomeErr(code int) error {
	switch code {
	case createRank:
		return ErrRank
	case createTag:
		return ErrTag
	case createOverlap:
		return ErrGroupsOverlap
	case createMismatch:
		return ErrMismatch
	case createOther:
		return errCreateArgs
	}
	return nil
}

// errCreateArgs marks a local leader's argument errors that have no
// sentinel of their own, so that outcome tells them from failures.
var errCreateArgs = errors.New("bad peer communicator")

// leaderHandshake is the local leader's part of IntercommCreate: it
// checks its arguments, exchanges a handshake and its group with the
// remote leader over peer, and returns the remote group's world ranks,
// the agreed context id and the remote leader's world rank. n is the
// creation count this call drew on c.
func (c *Comm) leaderHandshake(ctx context.Context, n uint64, peer *Comm, remoteLeader, tag int) ([]int, uint64, int, error) {
	fail := func(format string, args ...any) ([]int, uint64, int, error) {
		return nil, 0, 0, fmt.Errorf("adi: intercomm create: "+format, args...)
	}
	switch {
	case peer == nil:
		return fail("%w: nil, and the local leader needs one", errCreateArgs)
	case peer.w != c.w:
		return fail("peer: %w: %w", errCreateArgs, errOtherWorld)
	case remoteLeader < 0 || remoteLeader >= peer.Size():
		return fail("remote leader: %w: %d not in the peer communicator's [0,%d)", ErrRank, remoteLeader, peer.Size())
	case remoteLeader == peer.Rank():
		return fail("remote leader: %w: %d is the local leader itself", ErrRank, remoteLeader)
	}
	if err := checkTag(tag, false); err != nil {
		return fail("%w", err)
	}
	rlw := peer.ranks[remoteLeader]
	if r, ok := c.index[rlw]; ok {
		return fail("%w: the remote leader (world rank %d) is rank %d of the local group", ErrGroupsOverlap, rlw, r)
	}
	// Each leader proposes an id derived from its own communicator, for
	// the count this call drew on it; no other id of c's is derived from
	// that count.
	mine := deriveContext(c.context, n, 0)
	in := make([]byte, handshakeLen)
	st, err := peer.Sendrecv(ctx, encodeHandshake(mine, len(c.ranks)), remoteLeader, tag, in, remoteLeader, tag)
	if err != nil {
		if errors.Is(err, ErrTruncated) {
			return fail("handshake from the remote leader: %w: %w", ErrMismatch, err)
		}
		return fail("handshake with the remote leader: %w", err)
	}
	h, err := decodeHandshake(in[:st.Count], c.w.dev.Size())
	if err != nil {
		return fail("handshake from the remote leader (world rank %d): %w: %w", rlw, ErrMismatch, err)
	}
	group := make([]byte, 8*h.size)
	st, err = peer.Sendrecv(ctx, encodeGroup(c.ranks), remoteLeader, tag, group, remoteLeader, tag)
	if err != nil {
		if errors.Is(err, ErrTruncated) {
			return fail("group from the remote leader: %w: %w", ErrMismatch, err)
		}
		return fail("group exchange with the remote leader: %w", err)
	}
	remote, err := decodeGroup(group[:st.Count], h.size, c.w.dev.Size())
	if err != nil {
		return fail("group from the remote leader (world rank %d): %w: %w", rlw, ErrMismatch, err)
	}
	if !slices.Contains(remote, rlw) {
		return fail("%w: the remote leader (world rank %d) is not in the group it sent", ErrMismatch, rlw)
	}
	for i, wr := range remote {
		if r, ok := c.index[wr]; ok {
			return fail("%w: world rank %d is rank %d of the local group and rank %d of the remote one", ErrGroupsOverlap, wr, r, i)
		}
	}
	return remote, interContextID(mine, h.proposal), rlw, nil
}

// interContextID is the context id two leaders agree on from their
// proposals, the same whichever is whose: an even id in deriveContext's
// range (top bit clear), never the world's. Like deriveContext's ids, it
// collides with another live communicator's only as rarely as two 64-bit
// hashes do: the proposals are ids derived from each group's
// communicator for a creation count that nothing else uses.
func interContextID(a, b uint64) uint64 {
	lo, hi := min(a, b), max(a, b)
	x := mix64(mix64(lo^0x9e3779b97f4a7c15) ^ hi)
	x &^= 1 | groupContext
	if x <= worldContext {
		x += 4
	}
	return x
}

// The leaders' handshake on peer: handshakeLen bytes, little-endian
// uint64s: handshakeMagic, the sender's proposed context id and the size
// of its group; then a message of the group's world ranks, a uint64 each.
const (
	handshakeLen   = 24
	handshakeMagic = 0x6d64_6963_6f6d_6d31 // "mdicomm1"
)

// handshake is a decoded handshake.
type handshake struct {
	proposal uint64
	size     int
}

func encodeHandshake(proposal uint64, size int) []byte {
	b := make([]byte, handshakeLen)
	binary.LittleEndian.PutUint64(b, handshakeMagic)
	binary.LittleEndian.PutUint64(b[8:], proposal)
	binary.LittleEndian.PutUint64(b[16:], uint64(size))
	return b
}

// decodeHandshake checks and decodes a handshake from a job of worldSize
// ranks. A message that is not one is an error, never a panic: a
// program may have used the tag for something else.
func decodeHandshake(b []byte, worldSize int) (handshake, error) {
	if len(b) != handshakeLen {
		return handshake{}, fmt.Errorf("handshake of %d bytes, want %d", len(b), handshakeLen)
	}
	if m := binary.LittleEndian.Uint64(b); m != handshakeMagic {
		return handshake{}, fmt.Errorf("not an intercommunicator handshake (magic %#x): is the tag used for something else?", m)
	}
	size := binary.LittleEndian.Uint64(b[16:])
	if size < 1 || size > uint64(worldSize) {
		return handshake{}, fmt.Errorf("a group of %d ranks in a job of %d", size, worldSize)
	}
	return handshake{proposal: binary.LittleEndian.Uint64(b[8:]), size: int(size)}, nil
}

func encodeGroup(ranks []int) []byte {
	b := make([]byte, 8*len(ranks))
	for i, wr := range ranks {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(wr))
	}
	return b
}

// decodeGroup checks and decodes a group of size distinct world ranks of
// a job of worldSize ranks.
func decodeGroup(b []byte, size, worldSize int) ([]int, error) {
	if len(b) != 8*size {
		return nil, fmt.Errorf("group of %d bytes, want %d ranks of 8", len(b), size)
	}
	ranks := make([]int, size)
	seen := make(map[int]bool, size)
	for i := range ranks {
		wr := binary.LittleEndian.Uint64(b[8*i:])
		if wr >= uint64(worldSize) {
			return nil, fmt.Errorf("group rank %d is world rank %d, not in [0,%d)", i, wr, worldSize)
		}
		if seen[int(wr)] {
			return nil, fmt.Errorf("group rank %d: world rank %d appears twice", i, wr)
		}
		seen[int(wr)] = true
		ranks[i] = int(wr)
	}
	return ranks, nil
}

// Dup returns an intercommunicator with the same groups and a new,
// isolated context (MPI_Comm_dup on an intercommunicator). It sends
// nothing: every rank of both groups calls Dup, Merge, Split and Create
// on ic in the same order, and so derives the same id.
func (ic *Intercomm) Dup(ctx context.Context) (*Intercomm, error) {
	n := ic.derived.Add(1)
	return newIntercomm(ic.remote.w, deriveContext(ic.remote.context, n, 0), ic.local.ranks, ic.remote.ranks, ic.lowLeader), nil
}

// Merge returns an intracommunicator of both groups (MPI_Intercomm_merge):
// the ranks of the group that passed high false first, then the others,
// each group in its own order. Every rank of a group passes the same
// high; when both groups pass the same, the group whose leader (in
// IntercommCreate) has the lower world rank goes first. It is
// collective over both groups, in the same order as ic's collectives and
// its Dup, Merge, Split and Create calls; every rank derives the new context id alike.
//
// A group whose ranks disagree on high gets an error wrapping
// ErrMismatch on every rank of both groups. It costs an Allreduce of one
// int64 within each group, a byte each way between the leaders and a
// broadcast of one byte within each group.
func (ic *Intercomm) Merge(ctx context.Context, high bool) (*Comm, error) {
	n := ic.derived.Add(1)
	var other [1]byte
	localAgreed := false
	err := ic.collective(ctx, "intercomm merge", func(k *collective) error {
		highs := []int64{0}
		if high {
			highs[0] = 1
		}
		if err := k.carry(Allreduce(ctx, ic.coll, highs, highs, Sum[int64])); err != nil {
			return err
		}
		h := int(highs[0])
		localAgreed = k.mismatch == nil && (h == 0 || h == ic.Size())
		if !localAgreed && k.mismatch == nil {
			k.mismatch = k.errorf("%w: %d of the local group's %d ranks pass high", ErrMismatch, h, ic.Size())
		}
		if ic.Rank() == 0 {
			mine := []byte{0}
			if high {
				mine[0] = 1
			}
			if err := k.exchange(mine, 0, other[:], 0); err != nil {
				return err
			}
		}
		return ic.localBcast(k, other[:])
	})
	if err != nil && localAgreed && errors.Is(err, ErrMismatch) {
		// What failed is the remote group's high, which came here as a
		// message of another length: say so, not "another length".
		err = fmt.Errorf("adi: intercomm merge: the remote group's ranks disagree on high: %w", err)
	}
	if err != nil {
		return nil, err
	}
	first := !high && other[0] == 1 || high == (other[0] == 1) && ic.lowLeader
	ranks := make([]int, 0, ic.Size()+ic.RemoteSize())
	if first {
		ranks = append(append(ranks, ic.local.ranks...), ic.remote.ranks...)
	} else {
		ranks = append(append(ranks, ic.remote.ranks...), ic.local.ranks...)
	}
	return newComm(ic.remote.w, deriveContext(ic.remote.context, n, 0), ranks), nil
}
