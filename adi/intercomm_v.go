package adi

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
)

// The v-form and reduce-scatter collectives on an Intercomm, with MPI's
// intercommunicator semantics (MPI 4.0 chapter 6, the "inter" paragraphs
// of MPI_Gatherv, Scatterv, Allgatherv, Alltoallv, Reduce_scatter and
// Reduce_scatter_block): what a group receives comes from the other
// group.
//
// In a v-form collective the blocks' lengths are known only where each
// block is received (recv[j] on the receiver) and where it is sent, so a
// leader cannot gather or scatter them for its group as the fixed-length
// collectives do: each block travels directly from the rank that sends
// it to the rank that receives it (in Allgatherv, to the receiving
// group's leader, which broadcasts them), as MPICH's linear algorithms
// for intercommunicators do, and each receive checks its block's length
// exactly. A block that arrives with another length than its receiver's
// is ErrMismatch on the receiver, naming the remote rank it came from;
// Allgatherv passes the error, or the blocks' lengths, on to the rest of
// the receiving group (see there). The senders' results do not depend on
// it, and they do not hear of it.
//
// The reduce-scatters reduce within each group to its leader, exchange
// the reduced vectors between the leaders and scatter from them, so that
// lengths that disagree reach the ranks of both groups as the other
// reductions' do (intercomm_coll.go).

// Gatherv collects send of every rank of the other group into the
// root's recv, remote rank r's into recv[r]. Roots as for
// [Intercomm.Bcast]. The root's recv holds RemoteSize() slices, each as
// long as what its remote rank sends; recv is not used elsewhere, nor
// send in the root's group. A block of another length than its slice is
// ErrMismatch on the root. Each rank of the other group sends to the
// root directly.
func (ic *Intercomm) Gatherv(ctx context.Context, send []byte, recv [][]byte, root int) error {
	return ic.rooted(ctx, "intercomm gatherv", root, func(k *collective) error {
		if err := ic.gathervArgs(recv, Root); err != nil {
			return k.errorf("%w", err)
		}
		for r, b := range recv {
			if err := k.recv(b, r); err != nil {
				return err
			}
		}
		return nil
	}, func(k *collective) error { return k.send(send, root) })
}

// Scatterv sends send[r] of the root into recv of remote rank r, for
// every rank of the other group. Roots as for [Intercomm.Bcast]. The
// root's send holds RemoteSize() slices, each as long as its remote
// rank's recv; send is not used elsewhere, nor recv in the root's group.
// A rank of the other group whose recv has another length than its
// slice gets ErrMismatch. The root sends to each rank directly.
func (ic *Intercomm) Scatterv(ctx context.Context, send [][]byte, recv []byte, root int) error {
	return ic.rooted(ctx, "intercomm scatterv", root, func(k *collective) error {
		if err := ic.scattervArgs(send, Root); err != nil {
			return k.errorf("%w", err)
		}
		for r, b := range send {
			if err := k.send(b, r); err != nil {
				return err
			}
		}
		return nil
	}, func(k *collective) error { return k.recv(recv, root) })
}

// Allgatherv collects send of every rank of the other group into recv
// of every rank of this one, remote rank r's into recv[r]. Every rank
// passes RemoteSize() receive slices, of the same lengths on every rank
// of its group, each as long as what its remote rank sends.
//
// Each rank sends its block to the other group's leader, which receives
// them as Gatherv's root does and broadcasts to its group first their
// lengths, then the blocks. A block of another length than the leader's
// slice for it is ErrMismatch on every rank of the leader's group. A
// rank whose slices disagree with the leader's gets ErrMismatch, and no
// other rank does: it still passes the blocks on to the ranks the
// broadcast reaches through it. The other group is not told: its
// results do not depend on it.
func (ic *Intercomm) Allgatherv(ctx context.Context, send []byte, recv [][]byte) error {
	return ic.collective(ctx, "intercomm allgatherv", func(k *collective) error {
		if err := ic.allgathervArgs(recv); err != nil {
			return k.errorf("%w", err)
		}
		q := ic.RemoteSize()
		// The leader's receives are posted before its own send, so that
		// the two leaders never wait for each other.
		if ic.leader() {
			for r, b := range recv {
				if err := k.recv(b, r); err != nil {
					return err
				}
			}
		}
		if err := k.send(send, 0); err != nil {
			return err
		}
		if ic.leader() {
			if err := k.wait(); err != nil {
				return err
			}
		}
		// The lengths go first, in a broadcast as long on every rank,
		// then the blocks, in one as long as the leader's lengths add up
		// to. Bcast chooses its algorithm by length, so one broadcast of
		// lengths and blocks together, as long as each rank's own slices
		// add up to, ran different algorithms on ranks whose totals lay
		// on either side of a threshold, and they waited for each other.
		// A leader that met a mismatch poisons the lengths, which reaches
		// every rank, and then none takes part in the second broadcast.
		lengths := scratch[byte](k, 0, blocksHeader*q)
		if ic.leader() && k.mismatch == nil {
			putLengths(lengths, recv)
		}
		if err := ic.localBcast(k, lengths); err != nil {
			return err
		}
		if k.mismatch != nil {
			return nil
		}
		// The leader's lengths are those of slices it holds, so they add
		// up; lengthsTotal checks because they are another rank's bytes.
		total, err := lengthsTotal(lengths)
		if err != nil {
			return k.errorf("%w", err)
		}
		// A rank whose slices disagree takes part all the same, with
		// the leader's total, so that the ranks below it in the
		// broadcast get the blocks; it records the mismatch after. With
		// no bytes at all there is no second broadcast, on any rank.
		var blocks []byte
		if total > 0 {
			blocks = scratch[byte](k, 1, total)
			if ic.leader() {
				off := 0
				for _, b := range recv {
					off += copy(blocks[off:], b)
				}
			}
			if err := ic.localBcast(k, blocks); err != nil {
				return err
			}
		}
		if ic.leader() {
			return nil
		}
		if err := checkLengths(lengths, recv); err != nil {
			k.mismatch = k.errorf("%w", err)
			return nil
		}
		off := 0
		for _, b := range recv {
			off += copy(b, blocks[off:])
		}
		return nil
	})
}

// gathervArgs checks this rank's arguments to Gatherv.
func (ic *Intercomm) gathervArgs(recv [][]byte, root int) error {
	if root != Root {
		return nil
	}
	return slicesFor(len(recv), ic.RemoteSize(), "receive", "remote ")
}

// scattervArgs checks this rank's arguments to Scatterv.
func (ic *Intercomm) scattervArgs(send [][]byte, root int) error {
	if root != Root {
		return nil
	}
	return slicesFor(len(send), ic.RemoteSize(), "send", "remote ")
}

// allgathervArgs checks this rank's arguments to Allgatherv.
func (ic *Intercomm) allgathervArgs(recv [][]byte) error {
	return slicesFor(len(recv), ic.RemoteSize(), "receive", "remote ")
}

// alltoallvArgs checks this rank's arguments to Alltoallv.
func (ic *Intercomm) alltoallvArgs(send, recv [][]byte) error {
	return pairSlicesFor(len(send), len(recv), ic.RemoteSize(), "remote ")
}

// interReduceScatterArgs checks this rank's arguments to
// InterReduceScatter, and with blockCounts' counts to
// InterReduceScatterBlock: the counts are this group's.
func interReduceScatterArgs[T Elem](ic *Intercomm, send, recv []T, counts []int, op Op[T]) error {
	if err := checkCounts(counts, ic.Size(), ic.Rank(), len(send), len(recv), "local "); err != nil {
		return err
	}
	return opArg(op)
}

// blocksHeader is the bytes per block of the lengths putLengths writes:
// a little-endian uint64.
const blocksHeader = 8

// putLengths writes the lengths of blocks into b, blocksHeader bytes
// each; b holds exactly that.
func putLengths(b []byte, blocks [][]byte) {
	for r, blk := range blocks {
		binary.LittleEndian.PutUint64(b[blocksHeader*r:], uint64(len(blk)))
	}
}

// lengthsTotal adds up the lengths putLengths wrote into b. b is another
// rank's, so lengths that add up to more than an int holds are an error
// rather than a wrapped total; so is a b that is not whole lengths.
func lengthsTotal(b []byte) (int, error) {
	if len(b)%blocksHeader != 0 {
		return 0, fmt.Errorf("%w: the local group's leader sent %d bytes of block lengths, not a multiple of %d", ErrMismatch, len(b), blocksHeader)
	}
	total := uint64(0)
	for off := 0; off < len(b); off += blocksHeader {
		n := binary.LittleEndian.Uint64(b[off:])
		if n > math.MaxInt-total {
			return 0, fmt.Errorf("%w: the block lengths the local group's leader sent add up to more than %d bytes", ErrMismatch, math.MaxInt)
		}
		total += n
	}
	return int(total), nil
}

// checkLengths compares the lengths putLengths wrote into b with those
// of the slices of recv. Another length is ErrMismatch naming the remote
// rank whose block it is; so is another number of lengths.
func checkLengths(b []byte, recv [][]byte) error {
	if len(b) != blocksHeader*len(recv) {
		return fmt.Errorf("%w: the local group's leader sent %d bytes of block lengths for %d remote ranks", ErrMismatch, len(b), len(recv))
	}
	for r, blk := range recv {
		if n := binary.LittleEndian.Uint64(b[blocksHeader*r:]); n != uint64(len(blk)) {
			return fmt.Errorf("block of remote rank %d: %w: the local group's leader received %d bytes, where this rank's block holds %d", r, ErrMismatch, n, len(blk))
		}
	}
	return nil
}

// Alltoallv sends send[r] to remote rank r, which receives it into its
// recv[me], me being this rank, for every pair of a rank of one group and
// a rank of the other. send and recv each hold RemoteSize() slices; a
// slice of recv has the length of the block its remote rank sends this
// rank, and another length is ErrMismatch on this rank, naming that
// remote rank.
//
// Every rank exchanges with every remote rank directly, as MPICH's
// pairwise exchange does, rather than through the leaders: each pair's
// lengths are known only to that pair, so the leaders could not gather
// or scatter the blocks without being sent their lengths first, every
// byte would travel three times (to the leader, across, from the leader)
// instead of once, and the two leaders would carry all of it. Directly,
// each block's length is checked by the very rank whose block it is.
func (ic *Intercomm) Alltoallv(ctx context.Context, send, recv [][]byte) error {
	return ic.collective(ctx, "intercomm alltoallv", func(k *collective) error {
		if err := ic.alltoallvArgs(send, recv); err != nil {
			return k.errorf("%w", err)
		}
		q := ic.RemoteSize()
		// Each rank starts with another remote rank, so that no rank is
		// everybody's first.
		me := ic.Rank()
		for i := range q {
			if err := k.recv(recv[(me+i)%q], (me+i)%q); err != nil {
				return err
			}
		}
		for i := range q {
			if err := k.send(send[(me+i)%q], (me+i)%q); err != nil {
				return err
			}
		}
		return nil
	})
}

// InterReduceScatter combines send of every rank of the other group, in
// its rank order (op need be associative only), and hands out the result
// in parts over this group: rank r gets counts[r] elements, those after
// the parts of the ranks before it (MPI_Reduce_scatter on an
// intercommunicator). counts index this group's ranks: every rank of a
// group passes the same counts, Size() of them, and a send slice of as
// many elements as they add up to, which must be as many as the other
// group's add up to. recv holds counts[r] elements and does not overlap
// send. Byte order as for [Reduce].
//
// Each group reduces to its leader, the leaders exchange the reduced
// vectors, and each scatters the other group's among its own. Totals
// that differ between the groups, or send lengths within a group, are
// ErrMismatch on every rank of both groups. The leader cuts the result
// by its own counts, and the scatter checks each part's length only, as
// [ReduceScatter] on a Comm does: a rank whose own count differs from
// the leader's count for it gets ErrMismatch, but one whose counts
// differ from the leader's only in other ranks' counts gets, without an
// error, the part the leader's counts give it.
//
// Send lengths within a group on either side of 64 KiB, where [Reduce]
// changes algorithm, make its ranks run different algorithms, which wait
// for each other until their ctx ends instead of failing, as on a Comm: a
// program must not count on the error.
func InterReduceScatter[T Elem](ctx context.Context, ic *Intercomm, send, recv []T, counts []int, op Op[T]) error {
	return ic.collective(ctx, "intercomm reduce_scatter", func(k *collective) error {
		return interReduceScatterv(ctx, ic, k, send, recv, counts, op)
	})
}

// InterReduceScatterBlock is InterReduceScatter with the same count for
// every rank of a group: rank r gets elements [r*len(recv),
// (r+1)*len(recv)) of the other group's combined send, and each rank's
// send holds Size()*len(recv) elements, as many in one group as in the
// other (MPI_Reduce_scatter_block on an intercommunicator).
func InterReduceScatterBlock[T Elem](ctx context.Context, ic *Intercomm, send, recv []T, op Op[T]) error {
	return ic.collective(ctx, "intercomm reduce_scatter_block", func(k *collective) error {
		return interReduceScatterv(ctx, ic, k, send, recv, blockCounts(ic.Size(), len(recv)), op)
	})
}

// interReduceScatterv is the two reduce-scatters' algorithm, as k.
func interReduceScatterv[T Elem](ctx context.Context, ic *Intercomm, k *collective, send, recv []T, counts []int, op Op[T]) error {
	if err := interReduceScatterArgs(ic, send, recv, counts, op); err != nil {
		return k.errorf("%w", err)
	}
	p := ic.Size()
	acc, err := reduceLocal(ctx, ic, k, send, op)
	if err != nil {
		return err
	}
	var parts [][]byte
	if ic.leader() {
		// The other group's result: as long as this group's, or the
		// exchange finds the mismatch. reduceLocal's acc is in slot 0.
		whole := scratch[T](k, 1, len(send)) // the counts add up to it
		if err := k.exchange(Bytes(acc), 0, Bytes(whole), 0); err != nil {
			return err
		}
		parts = make([][]byte, p)
		off := 0
		for r, n := range counts {
			parts[r] = Bytes(whole[off : off+n])
			off += n
		}
	}
	return ic.localPhase(k, func(lk *collective) error { return lk.scatterv(parts, Bytes(recv), 0) })
}
