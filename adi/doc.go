// Package adi is the application interface of multidevice: the only package
// an MPI-style Go program needs.
//
// A program calls [Init], gets the world communicator from [World.Comm] and
// exchanges messages with blocking ([Comm.Send], [Comm.Recv], [Comm.Ssend],
// [Comm.Probe]) and nonblocking ([Comm.Isend], [Comm.Irecv], [Comm.Iprobe])
// point-to-point calls. Messages between a pair of ranks on one communicator
// never overtake each other, whatever subdevice or path carries them.
// [Comm.Sendrecv] sends and receives at once, so that ranks exchanging in
// pairs or around a ring cannot block each other. [Comm.Mprobe] and
// [Comm.Improbe] take the message they find out of matching, to be
// received only through the returned [Message]: goroutines that probe
// and then receive from the same sources need them, since between a
// [Comm.Probe] and its receive another goroutine may take the message.
// [Comm.Dup] and [Comm.Split] make communicators with isolated contexts;
// so do [Comm.Create] and [Comm.CreateGroup], from a [Group] built with
// set operations on [Comm.Group]. [Comm.CartCreate] lays ranks out on a
// grid ([DimsCreate] picks its shape), whose [Cart.Shift] names the
// neighbours of a halo exchange, [ProcNull] past an edge that does not
// wrap, and [Cart.Sub] keeps some of its dimensions;
// [Comm.GraphCreate] lays them out on a graph every rank knows whole
// (MPI_Graph_create; [Graph.Neighbors] names any node's neighbours), and
// [Comm.DistGraphCreateAdjacent] describes any graph, each rank giving
// its own edges. With [Reorder] a grid's positions, and a graph's nodes,
// go to ranks so that neighbours share a host where they can
// ([GraphMap] tells a rank its node beforehand), and a distributed
// graph's ranks are numbered host by host; [Weights] weighs a
// distributed graph's edges ([DistGraph.Weights]). On all three, the
// neighbour collectives ([Cart.NeighborAllgather], [Graph.NeighborAlltoall],
// [DistGraph.NeighborAlltoall], ...) exchange with each rank's
// neighbours only, in MPI's slot order, blocking or not
// ([Cart.IneighborAllgather], ...).
//
// Two groups of ranks talk group to group through an [Intercomm], as
// coupled codes do (two programs of one job, [World.AppNum], split the
// world by it): [Comm.IntercommCreate] joins this rank's group to
// another through their leaders, sends and receives on it name ranks of
// the other group, its collectives carry data from one group to the
// other ([Intercomm.Bcast] from a root with [Root], [InterAllreduce],
// the v forms ([Intercomm.Gatherv], ..., [Intercomm.Alltoallv]),
// [InterReduceScatter], ..., and nonblocking: [Intercomm.Ibcast],
// [IinterAllreduce], [Intercomm.Ialltoallv], ...),
// [Intercomm.Split] and [Intercomm.Create] make smaller intercommunicators
// of both, and [Intercomm.Merge] makes one communicator of both.
//
// A program that streams nonblocking messages starts them in requests it
// keeps and reuses ([Comm.IsendInto], [Comm.IrecvInto]) instead of
// getting a new one from every Isend and Irecv; then a steady stream of
// eager messages allocates nothing:
//
//	reqs := make([]adi.Request, window)
//	for {
//		for i := range reqs {
//			err = c.IrecvInto(&reqs[i], bufs[i], peer, tag)
//		}
//		for i := range reqs {
//			_, err = reqs[i].Wait(ctx)
//		}
//	}
//
// # Collectives
//
// [Comm.Barrier], [Comm.Bcast], [Comm.Gather], [Comm.Scatter],
// [Comm.Allgather] and [Comm.Alltoall] move bytes, the last four also
// with a length of its own for every rank ([Comm.Gatherv], ...: one
// slice per rank); [Reduce], [Allreduce], [ReduceScatter],
// [ReduceScatterBlock], [Scan] and [Exscan] combine
// typed slices with an [Op] such as [Sum] or [Max], or any associative
// function of the program's own, applied in rank order. [Bytes] views a
// numeric slice as bytes for the others:
//
//	err = c.Bcast(ctx, adi.Bytes(params), 0)
//	err = adi.Allreduce(ctx, c, local, global, adi.Sum)
//
// Every rank of a communicator calls its collectives in the same order,
// one blocking collective at a time. They travel on a context of their
// own and never match point-to-point receives. Each has a nonblocking form
// ([Comm.Ibarrier], [Comm.Ibcast], ..., [Iallreduce]) that returns a
// [Request]; any number of those may be in flight at once, each in its
// place in the order in which it was started. A persistent form
// ([Comm.BarrierInit], ..., [AllreduceInit]) states a collective once and
// starts it as often as the program likes ([Request.Start]); so do
// [Cart.NeighborAllgatherInit], [Graph.NeighborAlltoallInit],
// [DistGraph.NeighborAlltoallInit], ...,
// and on an intercommunicator [Intercomm.BcastInit],
// [InterAllreduceInit], ....
//
// Ranks that pass disagreeing lengths get [ErrMismatch] where a message
// arrives with another length than its receiver expects, and so does
// every rank whose part of the result depends on such a rank: a rank
// that met a mismatch goes through the rest of the collective sending,
// in place of each of its messages, one of another length, which its
// receiver finds wrong in turn. Lengths can also disagree in ways no
// message shows, as with any MPI, and then ranks wait for each other
// until their ctx ends: a program must not count on the error. Lengths
// on either side of an algorithm's threshold choose different
// algorithms (Allreduce, Reduce and ReduceScatter change at 64 KiB,
// Bcast at 12 KiB on 8 ranks or more): of two ranks calling [Allreduce]
// with 9000 and 4000 float64s, the first waits until its ctx ends.
// The message of another length is empty, or one byte in place of an
// empty message: never what a receiver that agrees with its sender
// expects. A peer that expects exactly that length takes it for its data
// and returns nil: a rank that itself passed an empty vector, or a
// one-element []byte or []bool against an empty one. A rank whose arguments fail its own checks (a root out of range,
// counts that do not fit its slices) returns that error at once and
// sends nothing, so its peers wait for it until their ctx ends. A
// collective that fails otherwise (a peer lost, ctx ending) returns at
// once, and its peers may still be waiting in it. It cancels its
// receives first, and waits only for a message one of them was already
// taking, so that nothing writes into the program's buffers once it
// returned. As in MPI, the communicator's collectives are then
// undefined: end the job, or go on with point-to-point messages only.
//
// Partitioned communication (MPI 4.0) sends one buffer that goroutines
// fill part by part: [Comm.PsendInit] and [Comm.PrecvInit] make
// persistent requests matched by the order of their inits; after
// [Request.Start] each partition is handed over with [Request.Pready]
// ([Request.PreadyRange], [Request.PreadyList]) and sent at once, and the
// receiver reads each of its own partitions as soon as [Request.Parrived]
// reports it; the two sides may cut the buffer into different numbers of
// partitions.
//
// On a communicator whose ranks span several hosts (as the launcher
// names them, [World.Host]), Barrier, Bcast, Reduce and Allreduce work
// host by host: within each host over shared memory, then among one
// leader per host, then within each host again, so that only the
// leaders send between hosts. Reductions do so only where every host's
// ranks are consecutive (block placement, mdrun's default), which keeps
// rank order. Where ranks name the sites (clusters) their hosts belong to
// ([WithSite], MD_SITE), the hosts' leaders do the same by sites, so that
// only one rank per site sends between sites. [WithHostCollectives] or
// MD_HOST_COLLECTIVES=0 turn this off.
//
// # One-sided communication
//
// [Comm.WinCreate] exposes a byte slice of every rank as a [Win]; between
// the collective [Win.Fence] calls that separate epochs, ranks [Win.Put]
// into, [Win.Get] from and [Accumulate] into other ranks' windows without
// those ranks taking part: a goroutine of each rank, the window's server,
// applies what comes, one operation at a time (and a rank waiting in
// Fence does so itself meanwhile). Fence completes every
// operation of the epoch on every rank; or [Win.Lock] and [Win.Unlock]
// bracket one origin's operations on one target, exclusive or shared, the
// others taking no part, and [Win.LockAll] takes a shared lock on every
// rank. Inside those passive-target epochs, [Win.Flush], [Win.FlushAll]
// and [Win.FlushLocal] complete operations without ending the epoch, and
// [Win.Rput], [Win.Rget] and [Raccumulate] return a [Request] of their
// own. [FetchAndOp], [GetAccumulate] and [CompareAndSwap] read and change
// a target's elements in one step: many ranks drawing tickets from one
// counter each get a different one. A synchronization call made in the
// wrong epoch fails with [ErrRMASync] and sends nothing.
//
// [Comm.WinAllocateShared] makes a window whose memory the ranks of one
// host share (MPI-3's shared-memory windows): one segment every rank
// maps, each rank's part found with [Win.SharedQuery] and read and
// written directly, with loads, stores and sync/atomic, as well as
// through the window's operations. A large table each host needs once,
// rather than once per rank, is the usual use. [Win.Sync] orders a
// rank's loads and stores to that memory, paired with a signal.
//
// [Comm.WinCreateDynamic] makes a window with no memory: each rank
// attaches memory with [Win.Attach] and detaches it with [Win.Detach], on
// its own, and the others reach it at the address Attach returned; an
// operation where nothing is attached fails at its origin with
// [ErrNoRegion].
//
// # Usage
//
//	w, err := adi.Init(ctx)
//	if err != nil { ... }
//	defer w.Finalize(ctx)
//	c := w.Comm()
//	if c.Rank() == 0 {
//		err = c.Send(ctx, []byte("hi"), 1, 7)
//	} else if c.Rank() == 1 {
//		buf := make([]byte, 16)
//		st, err := c.Recv(ctx, buf, adi.AnySource, adi.AnyTag)
//		// buf[:st.Count] == "hi", st.Source == 0, st.Tag == 7
//	}
//
// Run it with `mdrun -n 4 ./prog`, or alone as a world of one rank.
//
// Ranks and tags are plain ints (Go's indexes and loop variables are int;
// a distinct type would cost every caller a conversion). Tags are 0 to
// [MaxTag]; negative tags are reserved for the library's system messages.
//
// # Environment
//
//   - MD_PLUGINS: path of a plugins.hcl choosing the subdevices (default:
//     built-in shm and tcp).
//   - MD_CONNTABLE: a connection-table file, or a directory holding one
//     <host>.json per host (as mdconfig writes them); default: derived
//     (same host: shm, else tcp).
//   - MD_LOG_LEVEL: trace, debug, info, warn (default), error, off.
//   - MD_APPNUM: which program of a job of several this rank runs
//     ([World.AppNum]); mdrun sets it.
//   - MD_FORWARD_BLOCK, MD_FORWARD_WINDOW: bytes per forwarded block
//     (default 65536) and the credit window per virtual line through
//     gateways (default 4194304), which bounds what a gateway buffers
//     for one (source, destination) pair; see multidevice.ForwardOptions.
//   - MD_FORWARD_RETRY: the first pause before a route that died (a
//     gateway, or a route of a failover entry) is tried again, as a
//     duration (default 1s, doubling up to 30s), or off.
//
// mdrun sets the MDRUN_* variables that tell a rank who it is (see package
// bootstrap); without them a program is a singleton world.
package adi
