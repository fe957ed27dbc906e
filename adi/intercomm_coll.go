package adi

import (
	"context"
	"errors"
	"fmt"
)

// Collectives on an Intercomm, with MPI's intercommunicator semantics:
// what a group receives comes from the other group. They work as MPICH's
// do, by local collectives and one exchange between the leaders (rank 0
// of each group): a reduction or gather to the local leader, the
// leaders' exchange, then a broadcast or scatter from the local leader.
// A rooted collective's root sends to, or receives from, the other
// group's leader directly; the other ranks of the root's group pass
// ProcNull and take no part.
//
// Every rank of both groups calls the same collectives in the same
// order, one at a time. The leaders' and roots' messages travel on the
// intercommunicator's collective context, tagged with its collective
// sequence number; the local phases on a communicator of the local group
// that nothing else uses. So they never match the intercommunicator's
// point-to-point traffic, nor anything on the communicator the
// intercommunicator was created from, nor on Local.
//
// Mismatched lengths are reported as on a Comm (ErrMismatch): a leader
// that met one, in its local phase or in the exchange, sends poison to
// the other leader and down its local broadcast, so that every rank of
// both groups whose result depends on it gets the error. A rank of the
// root's group other than the root learns nothing of a rooted
// collective, so it cannot report one. Ranks that disagree about the
// root wait for each other until their ctx ends.

// collective runs run as the next collective of ic on this rank: it
// draws ic's next collective tag, runs run with it, and completes what
// run left outstanding.
func (ic *Intercomm) collective(ctx context.Context, name string, run func(k *collective) error) error {
	k, err := ic.remote.begin(ctx, name)
	if err != nil {
		return err
	}
	defer k.done()
	if err := run(k); err != nil {
		return err
	}
	return k.end()
}

// leader reports whether this rank leads its group in ic's collectives.
func (ic *Intercomm) leader() bool { return ic.Rank() == 0 }

// carry takes the error of a local phase of k: a mismatch becomes k's, so
// that this rank sends poison from then on, and anything else ends k.
func (k *collective) carry(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrMismatch):
		if k.mismatch == nil {
			k.mismatch = k.errorf("local group: %w", err)
		}
		return nil
	}
	return k.errorf("local group: %w", err)
}

// localPhase runs run as the next collective of ic's local group, with
// k's mismatch, so that a rank that met one sends poison in it, and hands
// the mismatch it ends with back to k.
func (ic *Intercomm) localPhase(k *collective, run func(lk *collective) error) error {
	lk, err := ic.coll.begin(k.ctx, k.name)
	if err != nil {
		return err
	}
	lk.where = " (local group)" // its errors name local ranks, k's remote ones
	defer lk.done()
	lk.mismatch = k.mismatch
	// A run that ends lk itself (scatterv) returns the mismatch lk
	// recorded: that one goes on to k, and is compared as the very value.
	if err := run(lk); err != nil && err != lk.mismatch {
		return err
	}
	if err := lk.wait(); err != nil {
		return err
	}
	k.mismatch = lk.mismatch
	return nil
}

// localBcast broadcasts buf from the local leader to its group.
func (ic *Intercomm) localBcast(k *collective, buf []byte) error {
	return ic.localPhase(k, func(lk *collective) error {
		if lk.c.hosts != nil {
			return lk.hostBcast(buf, 0)
		}
		return lk.bcast(buf, 0)
	})
}

// rooted runs a rooted collective of ic: atRoot on its root (Root),
// nothing on the other ranks of the root's group (ProcNull), and other on
// the ranks of the other group, which name the root's remote rank.
func (ic *Intercomm) rooted(ctx context.Context, name string, root int, atRoot, other func(k *collective) error) error {
	return ic.collective(ctx, name, func(k *collective) error {
		switch {
		case root == Root:
			return atRoot(k)
		case root == ProcNull:
			return nil
		case root >= 0 && root < ic.RemoteSize():
			return other(k)
		}
		return k.errorf("%w", ic.rootArg(root))
	})
}

// rootArg checks the root of a rooted collective of ic. As for a Comm's
// collectives (collective.go), the blocking forms and the persistent
// forms' Init (collinit_inter.go) check this rank's arguments alike,
// through ic's xxxArgs functions.
func (ic *Intercomm) rootArg(root int) error {
	if root != Root && root != ProcNull && (root < 0 || root >= ic.RemoteSize()) {
		return fmt.Errorf("root: %w: %d is neither Root, ProcNull nor a remote rank in [0,%d)", ErrRank, root, ic.RemoteSize())
	}
	return nil
}

// allgatherArgs checks this rank's arguments to Allgather.
func (ic *Intercomm) allgatherArgs(recv []byte) error {
	if len(recv)%ic.RemoteSize() != 0 {
		return fmt.Errorf("receive buffer of %d bytes for %d remote ranks", len(recv), ic.RemoteSize())
	}
	return nil
}

// alltoallArgs checks this rank's arguments to Alltoall.
func (ic *Intercomm) alltoallArgs(send, recv []byte) error {
	if q := ic.RemoteSize(); len(send)%q != 0 || len(recv)%q != 0 {
		return fmt.Errorf("buffers of %d and %d bytes: each must be a multiple of %d remote ranks", len(send), len(recv), q)
	}
	return nil
}

// interReduceArgs checks this rank's arguments to InterReduce: the ranks
// of the other group reduce, with op; the root's lengths are the other
// group's to agree with.
func interReduceArgs[T Elem](op Op[T], root int) error {
	if root == Root || root == ProcNull {
		return nil
	}
	return opArg(op)
}

// Barrier returns once every rank of both groups has called it.
func (ic *Intercomm) Barrier(ctx context.Context) error {
	return ic.collective(ctx, "intercomm barrier", func(k *collective) error {
		if err := k.carry(ic.coll.Barrier(ctx)); err != nil {
			return err
		}
		if ic.leader() {
			if err := k.exchange(nil, 0, nil, 0); err != nil {
				return err
			}
		}
		return ic.localBcast(k, nil)
	})
}

// Bcast copies buf of the root into buf of every rank of the other group.
// The root passes Root, the other ranks of its group ProcNull (their buf
// is not used), and the ranks of the other group the root's remote rank,
// each with a buffer as long as the root's.
func (ic *Intercomm) Bcast(ctx context.Context, buf []byte, root int) error {
	return ic.rooted(ctx, "intercomm bcast", root, func(k *collective) error { return k.send(buf, 0) }, func(k *collective) error {
		if ic.leader() {
			if err := k.recv(buf, root); err != nil {
				return err
			}
			if err := k.wait(); err != nil {
				return err
			}
		}
		return ic.localBcast(k, buf)
	})
}

// Gather collects send of every rank of the other group into recv of the
// root, remote rank r's at recv[r*len(send):]. Roots as for Bcast. The
// other group's ranks pass send buffers of the same length; the root's
// recv holds RemoteSize() of them.
func (ic *Intercomm) Gather(ctx context.Context, send, recv []byte, root int) error {
	return ic.rooted(ctx, "intercomm gather", root, func(k *collective) error { return k.recv(recv, 0) }, func(k *collective) error {
		all, err := ic.gatherLocal(ctx, k, send)
		if err != nil {
			return err
		}
		if ic.leader() {
			return k.send(all, root)
		}
		return nil
	})
}

// gatherLocal gathers send of every rank of the local group into the
// leader's scratch space of k, which it returns (nil on the others).
func (ic *Intercomm) gatherLocal(ctx context.Context, k *collective, send []byte) ([]byte, error) {
	var all []byte
	if ic.leader() {
		all = scratch[byte](k, 0, ic.Size()*len(send))
	}
	return all, k.carry(ic.coll.Gather(ctx, send, all, 0))
}

// Scatter sends the r-th block of the root's send, send[r*len(recv):],
// into recv of remote rank r, for every rank of the other group. Roots as
// for Bcast. The other group's ranks pass receive buffers of the same
// length; the root's send holds RemoteSize() of them.
func (ic *Intercomm) Scatter(ctx context.Context, send, recv []byte, root int) error {
	return ic.rooted(ctx, "intercomm scatter", root, func(k *collective) error { return k.send(send, 0) }, func(k *collective) error {
		var all []byte
		if ic.leader() {
			all = scratch[byte](k, 0, ic.Size()*len(recv))
			if err := k.recv(all, root); err != nil {
				return err
			}
			if err := k.wait(); err != nil {
				return err
			}
		}
		return ic.localPhase(k, func(lk *collective) error {
			return lk.scatterv(lk.rootBlocks(all, len(recv), 0), recv, 0)
		})
	})
}

// Allgather collects send of every rank of the other group into recv of
// every rank of this one, remote rank r's at recv[r*m:], m being the
// length of the other group's sends. Each group's ranks pass send
// buffers of the same length and receive buffers of RemoteSize() times
// the other group's.
func (ic *Intercomm) Allgather(ctx context.Context, send, recv []byte) error {
	return ic.collective(ctx, "intercomm allgather", func(k *collective) error {
		if err := ic.allgatherArgs(recv); err != nil {
			return k.errorf("%w", err)
		}
		all, err := ic.gatherLocal(ctx, k, send)
		if err != nil {
			return err
		}
		if ic.leader() {
			if err := k.exchange(all, 0, recv, 0); err != nil {
				return err
			}
		}
		return ic.localBcast(k, recv)
	})
}

// Alltoall sends the r-th block of send, send[r*len(send)/RemoteSize():],
// to remote rank r, which receives it at recv[me*m:], me being this rank
// and m the length of its own blocks, for every pair of a rank of one
// group and a rank of the other. send and recv each hold RemoteSize()
// blocks; a group's blocks have the length of the other group's receive
// blocks. Every rank exchanges with every remote rank directly.
func (ic *Intercomm) Alltoall(ctx context.Context, send, recv []byte) error {
	return ic.collective(ctx, "intercomm alltoall", func(k *collective) error {
		if err := ic.alltoallArgs(send, recv); err != nil {
			return k.errorf("%w", err)
		}
		q := ic.RemoteSize()
		out, in := k.blocks(send, len(send)/q), k.blocks(recv, len(recv)/q)
		// Each rank starts with another remote rank, so that no rank is
		// everybody's first.
		me := ic.Rank()
		for i := range q {
			if err := k.recv(in[(me+i)%q], (me+i)%q); err != nil {
				return err
			}
		}
		for i := range q {
			if err := k.send(out[(me+i)%q], (me+i)%q); err != nil {
				return err
			}
		}
		return nil
	})
}

// InterReduce combines send of every rank of the other group into recv
// of the root, in the other group's rank order (op need be associative
// only). Roots as for [Intercomm.Bcast]; the root's send is not used, and
// its recv is as long as the other group's sends. Byte order as for
// [Reduce]. Send lengths within a group on either side of 64 KiB wait
// for each other rather than fail, as for [InterAllreduce].
func InterReduce[T Elem](ctx context.Context, ic *Intercomm, send, recv []T, op Op[T], root int) error {
	return ic.rooted(ctx, "intercomm reduce", root, func(k *collective) error { return k.recv(Bytes(recv), 0) }, func(k *collective) error {
		if err := interReduceArgs(op, root); err != nil {
			return k.errorf("%w", err)
		}
		acc, err := reduceLocal(ctx, ic, k, send, op)
		if err != nil {
			return err
		}
		if ic.leader() {
			return k.send(Bytes(acc), root)
		}
		return nil
	})
}

// reduceLocal reduces send of every rank of the local group, in its rank
// order, into the leader's scratch space of k, which it returns (nil on
// the others).
func reduceLocal[T Elem](ctx context.Context, ic *Intercomm, k *collective, send []T, op Op[T]) ([]T, error) {
	var acc []T
	if ic.leader() {
		acc = scratch[T](k, 0, len(send))
	}
	return acc, k.carry(Reduce(ctx, ic.coll, send, acc, op, 0))
}

// InterAllreduce combines send of every rank of the other group, in its
// rank order (op need be associative only), into recv of every rank of
// this one: each group gets the reduction of the other's data
// (MPI_Allreduce on an intercommunicator). send and recv have the same
// length on every rank of both groups and may be the same slice. Byte
// order as for [Reduce].
//
// Send lengths that differ between the groups, or within one, are
// ErrMismatch on every rank of both groups, except that lengths within a
// group on either side of 64 KiB, where [Reduce] changes algorithm, make
// its ranks run different algorithms, which wait for each other until
// their ctx ends instead of failing, as on a Comm: a program must not
// count on the error.
func InterAllreduce[T Elem](ctx context.Context, ic *Intercomm, send, recv []T, op Op[T]) error {
	return ic.collective(ctx, "intercomm allreduce", func(k *collective) error {
		if err := allreduceArgs(send, recv, op); err != nil {
			return k.errorf("%w", err)
		}
		acc, err := reduceLocal(ctx, ic, k, send, op)
		if err != nil {
			return err
		}
		if ic.leader() {
			if err := k.exchange(Bytes(acc), 0, Bytes(recv), 0); err != nil {
				return err
			}
		}
		return ic.localBcast(k, Bytes(recv))
	})
}
