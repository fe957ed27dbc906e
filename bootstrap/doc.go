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
//  2. singleton: nothing is set. The process is rank 0 of a world of one;
//     Put, Fence and Get work locally, JobID and Secret are random.
//
// PMI-1 and PMI-2 backends (for Hydra and Slurm) will slot in before the
// singleton. A backend whose variables are present but wrong makes Open fail
// with an error naming the variable or the address: a rank that silently
// became a singleton would hang or corrupt a real job.
//
// # Environment
//
// mdrun gives every rank these variables ([Server.Env] builds them):
//
//	MDRUN_ADDR    the rendezvous service, "unix:/path/to/socket" or "tcp:host:port"
//	MDRUN_RANK    this process's rank, 0 <= rank < size
//	MDRUN_SIZE    the number of ranks in the job
//	MDRUN_JOBID   the job's identifier, unique per job
//	MDRUN_SECRET  the job's secret, hexadecimal; the service refuses ranks without it
//	MDRUN_HOST    the launcher's name for this rank's host
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
// 2 MiB). The client's first message is hello, with the protocol version,
// its rank, the job's size and id, and the job secret; the service accepts
// it or refuses with a reason and drops the connection. After that the
// client sends requests with an id and the service answers each with the
// same id, so a Get can be answered while a Fence of the same rank waits:
//
//	fence     carries the rank's Puts since the last fence; answered when all ranks arrived
//	get       rank and key; answered with the value published at the last fence, or not_found
//	abort     code and reason; the service reports it to the launcher (see [Server.Aborts])
//	finalize  the rank is done; the service answers and closes the connection
//
// Anything else (garbage, a wrong secret, a message over the limit, a
// second hello for a rank) makes the service log the reason and drop that
// connection; the job goes on.
package bootstrap
