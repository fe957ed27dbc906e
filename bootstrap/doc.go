// Package bootstrap tells a starting rank who it is and lets the ranks of a
// job exchange business cards before any subdevice is connected.
//
// A [Bootstrap] is a small key-value store with a barrier, the shape the PMI
// interfaces of MPICH's Hydra and Slurm share: every rank Puts its own keys,
// all ranks Fence, then any rank Gets any rank's keys.
//
// # Backends
//
// [Open] asks each backend in turn whether the environment belongs to it and
// uses the first that says yes:
//
//  1. mdrun: any MDRUN_* variable is set. The rank connects to the
//     rendezvous service of the mdrun that started it (see [Server]).
//  2. pmi2: PMI_FD is set (MPICH's Hydra, Slurm's srun --mpi=pmi2, and
//     other PMI process managers). The rank speaks the PMI-2 wire protocol
//     on that descriptor: fullinit, job-getid, info-getjobattr, kvs-put,
//     kvs-fence, kvs-get, abort, finalize.
//  3. pmi1: PMI_FD is set and the manager refused PMI-2. The rank speaks
//     PMI-1 on the same descriptor: init, get_maxes, get_my_kvsname, put,
//     barrier_in, get, abort, finalize; rank and size come from PMI_RANK and
//     PMI_SIZE. MD_PMI_PARENT without PMI_FD marks a process a PMI rank
//     started, whose Open fails (see "A rank's children").
//  4. pmix: PMIX_RANK, PMIX_NAMESPACE or a PMIX_SERVER_URI* variable is
//     set, and none of the above (Open MPI's mpirun and prterun, Slurm's
//     srun --mpi=pmix). The rank is a client of the PMIx library, which
//     the backend is built against only with -tags pmix (see "Under a
//     PMIx launcher"); without it, Open fails saying how to rebuild.
//     MD_PMIX_PARENT alone marks a process a PMIx rank started, whose
//     Open fails (see "A rank's children").
//  5. singleton: nothing is set. The process is rank 0 of a world of one;
//     Put, Fence and Get work locally, JobID and Secret are random.
//
// MD_PMI=1 or MD_PMI=2 pins the PMI version. A backend whose variables are
// present but wrong makes Open fail with an error naming the backend and
// the variable or address ("bootstrap: pmi2: PMI_FD=7: handshake: ..."): a
// rank that silently became a singleton would hang or corrupt a real job.
//
// # Under a PMI process manager
//
// The manager's key-value store is one namespace of printable strings with
// small limits (Hydra and Slurm: keys under 64 bytes, values under 1024), so
// a rank's Put of (key, value) is stored as base64url text cut into chunks
// under keys that carry the rank, the encoded key and the chunk number
// (see pmikvs.go). A key is published once: a second Put of a key after
// the Fence that published it fails, because the managers do not all
// replace values.
//
// Fence is a barrier under every manager. Hydra's PMI-2 kvs-fence answers
// at once and holds back kvs-get until every rank has fenced; the backend
// follows kvs-fence with a get of a key nobody puts, which is answered only
// then.
//
// Host is "<hostname>#<node>", where node is this rank's node in the
// manager's PMI_process_mapping: ranks on one node share shared memory,
// and hosts that share a host name (network namespaces, containers) stay
// apart. Without a mapping, Host is the host name. JobID is the manager's
// job id (PMI-1: the kvsname), with characters unsafe in file names
// replaced. Secret is 32 random bytes that rank 0 publishes through the
// store during Open: the store is as trusted as the manager, which can
// start processes as this user anyway.
//
// When the manager goes away (the descriptor reaches end of file), every
// waiting and later Fence and Get fails with an error wrapping [ErrClosed]
// that says so; nothing hangs. The PMI port model (PMI_PORT) is not
// supported.
//
// # Under a PMIx launcher
//
// The pmix backend is cgo against libpmix (PMIx 4.2 on Debian 12) and is
// built only with the pmix tag, as the RDMA subdevices are with theirs:
//
//	apt-get install libpmix-dev
//	go build -tags pmix ./...
//
// A binary built without the tag (or without cgo) that a PMIx launcher
// starts fails in Open with "bootstrap: pmix: started by a PMIx launcher
// (PMIX_RANK=...), but this binary was built without -tags pmix (or
// without cgo): rebuild with ...": a singleton there would be one of N
// copies of rank 0. Running needs libpmix2.
//
// Open calls PMIx_Init, bounded by its ctx: PMIx_Init blocks in C until
// the server answers, so it runs on a goroutine of its own, and when ctx
// ends first Open returns ctx's error naming PMIX_RANK and the server's
// PMIX_SERVER_URI* variable; an abandoned PMIx_Init that later succeeds
// is finalized at once. Rank is the rank PMIx_Init gives, Size the job's
// PMIX_JOB_SIZE, JobID the namespace with characters unsafe in file names
// replaced, and Host "<hostname>#<node>" with the server's PMIX_NODEID, so
// that, as under PMI, hosts sharing a host name stay apart (without a node
// id, the host name alone). Put is PMIx_Put of a byte object to every rank
// (PMIX_GLOBAL), under the key with "md." before it (or "md64." before its
// base64url when it is not printable ASCII: PMIx keys are C strings, and
// those starting with "pmix" are reserved). A key is published once, as
// under PMI: a client that keeps other ranks' values in its own memory
// (PMIx's "hash" store) goes on returning the first. Fence is PMIx_Commit
// and a PMIx_Fence_nb over the whole namespace that collects every rank's
// puts; a Fence whose ctx ends stays under way, and the next Fence waits
// for the same barrier. A rank's puts may show to others as soon as its
// Fence has begun, before the barrier ends. Get is PMIx_Get with PMIX_IMMEDIATE: the server
// answers from what it holds, so a key nobody put is [ErrNotFound] at
// once instead of a wait for a put that never comes; when ctx ends first,
// Get returns ctx's error and the call ends on its own goroutine, which
// Close waits for. The job secret travels as under PMI. Abort logs the
// reason (Open MPI's mpirun does not print PMIx_Abort's message) and calls
// PMIx_Abort; from Abort's call on, new calls fail with [ErrClosed], and a
// Fence or Get, whether already waiting or called after Abort began,
// returns [ErrClosed] only once PMIx_Abort has returned (or its ctx has
// ended), so a program that exits on a failed Fence cannot end before the
// abort has reached the server (Put, which takes no ctx, fails at once).
// A second after it calls PMIx_Abort, the rank exits with the abort's
// code if the launcher has not ended it by then, whether or not
// PMIx_Abort returned: Open MPI's mpirun ends the job only once the
// aborting rank has exited, as MPI_Abort's caller does, and its
// PMIx_Abort now and then never returns.
// Close calls PMIx_Finalize, and a
// Fence still under way then fails with [ErrClosed]; a Close during an
// Abort, like a Fence, returns only once PMIx_Abort has.
//
// Once PMIx_Init has succeeded, the rank takes out of its environment
// (Go's and, under cgo, the C one) the variables that would let another
// process join as this rank: PMIX_NAMESPACE, PMIX_RANK, PMIX_ID and every
// PMIX_SERVER_URI*; it sets MD_PMIX_PARENT=<namespace>.<rank> instead
// (see "A rank's children"). The launcher's other PMIX_* variables
// (settings such as PMIX_MCA_* and store paths) stay. Code that needs the
// rank after Open asks [Bootstrap.Rank]: PMIX_RANK is gone.
//
// A PMIx server admits a process once, and the client library is one per
// process, so a process has one pmix Bootstrap at a time: a second Open
// while the first is open (or aborted), while another Open is joining, or
// while a PMIx_Init that Open abandoned still runs, fails saying which.
// And a process joins the job once, as under mdrun and PMI: once its
// client is finalized (Close, an Open that failed after PMIx_Init, an
// abandoned PMIx_Init that succeeded late), Open fails with "bootstrap:
// pmix: this process was rank R of namespace N and closed its PMIx
// client; a process joins a PMIx job once". (Joining again would need the
// launcher's variables back in the environment, where a child started
// meanwhile would inherit them.) A PMIx_Init that failed uses the client
// up as well, also one an Open abandoned when its ctx ended: libpmix
// keeps state from it, under which another PMIx_Init succeeds into a job
// that is not the launcher's (rank 0 of 1, splitting the world without a
// word), so a later Open fails with "bootstrap: pmix: an earlier Open's
// PMIx_Init failed (...)", naming that failure.
//
// Verified with Open MPI 4.1.4's mpirun (one host, and two network
// namespace hosts sharing a host name) and Slurm 22.05's srun --mpi=pmix
// (its pmix_v4 plugin) on one node.
//
// Open MPI 4.1.4's mpirun itself sometimes hangs after an abort, with
// every rank gone, when the ranks it killed were waiting in a Fence: a
// deadlock in its PMIx_server_finalize, which a C client of libpmix shows
// as well (about one launch in six when the aborting rank waits to be
// killed, one in forty under load when it exits at once, as Abort now
// does). Killing that mpirun loses nothing: the job has ended.
//
// # A rank's children
//
// A process a rank starts (os/exec) inherits the rank's environment, but
// it is not a rank: under every launcher its Open fails rather than join
// the job as a second copy of its parent. Under mdrun the service refuses
// a second hello for the rank ("rank 0 connected before"); under PMI the
// rank's Open replaces PMI_FD with MD_PMI_PARENT, so the child finds no
// descriptor number to write the handshake to (the number could name one
// of its own files) and fails ("bootstrap: pmi: MD_PMI_PARENT=...: this
// process was started by a rank of a PMI job"); under PMIx the child
// finds MD_PMIX_PARENT and no launcher variable ("bootstrap: pmix:
// MD_PMIX_PARENT=...: this process was started by that rank of a PMIx
// job, not by the launcher"), in a binary built with or without the pmix
// tag. To run such a child as a singleton, start it without the
// launcher's variables (MDRUN_*, PMI_*, MD_PMI_PARENT, MD_PMIX_PARENT) in
// its environment. A rank joins its job once: under PMI and PMIx an Open
// after Close fails. A child that a launcher of its own starts (the rank
// ran mdrun, or mpirun) joins that launcher's job; but Open MPI 4.1.4's
// mpirun, started by a rank of another mpirun, refuses to run
// ("mpirun.openmpi does not support recursive calls") unless the OMPI_*
// variables the outer mpirun gave the rank are taken out of its
// environment, after which its ranks join the inner job. A program that
// is not built on this package and runs under a PMI manager (mpirun under
// Hydra) passes PMI_FD on to its children unchanged, as a number that is
// no longer the manager's connection there. PMI_FD must name one end of a
// stream socketpair, as Hydra's and Slurm's do, so such a child's Open
// writes nothing into a number that is closed there or open on something
// else (a pipe, a file, the Go runtime's eventfd, a network connection, a
// connection through a named Unix socket): beside a PMIx launcher's
// variables it joins that launcher's job, taking PMI_FD out of its
// environment, and alone it fails ("bootstrap: pmi: PMI_FD=7 is a pipe,
// not a socket"). A number that happens to name a socketpair of the
// program's own cannot be told from the manager's; the handshake goes
// into it, and it is left open when that fails.
//
// # Environment
//
// mdrun gives every rank these variables ([Server.Env] builds them):
//
//	MDRUN_ADDR    the rendezvous service, "unix:/path/to/socket" or "tcp:host:port"
//	MDRUN_RANK    this process's rank, 0 <= rank < size
//	MDRUN_SIZE    the number of ranks in the job
//	MDRUN_JOBID   the job's identifier, unique per job
//	MDRUN_SECRET  the job's secret, hexadecimal; the service refuses ranks without it.
//	              "-" reads it from the first line of standard input: mdrun passes
//	              it so to ranks on other hosts, off the remote-exec command line
//	MDRUN_HOST    the launcher's name for this rank's host
//	MDRUN_EXIT_WITH_SERVICE
//	              1 for ranks mdrun starts on other hosts: the rank sends itself
//	              SIGTERM when its connection to the service ends, unless it
//	              called Close first (not during or after an Abort)
//
// mdrun also passes two variables to the ranks when its flags ask for them.
// They are read by the library, not by this package:
//
//	MD_PLUGINS    path of plugins.hcl (mdrun -plugins)
//	MD_CONNTABLE  path of a connection table, or of a directory of per-host tables (mdrun -conntable)
//
// # Protocol
//
// A rank talks to the service over one stream connection. Each message is a
// 4-byte big-endian length followed by that many bytes of JSON (at most
// 2 MiB; at most 4 KiB for a hello, which comes before the peer is known).
// Keys and values are bytes, base64 in the JSON. The client's first message
// is hello, with the protocol version, its rank, the job's size and id, and
// the job secret; the service accepts it, listing the requests it takes
// beyond those of the version (ops), or refuses with a reason and drops
// the connection. After that the
// client sends requests with an id and the service answers each with the
// same id, so a Get can be answered while a Fence of the same rank waits:
//
//	fence     carries the rank's Puts since the last fence; answered when all ranks arrived
//	get       rank and key; answered with the value published at the last fence, or not_found
//	abort     code and reason; the service reports it to the launcher (see [Server.Aborts])
//	finalize  the rank is done; the service answers and closes the connection
//	lost      rank and reason: this rank lost that one ([LostReporter]); not answered,
//	          sent only to a service that lists it, and kept for the launcher ([Departure.Lost])
//
// Anything else (garbage, a wrong secret, a message over the limit, a
// second hello for a rank) makes the service log the reason and drop that
// connection; the job goes on.
package bootstrap
