// Package shm is the shared-memory subdevice: it moves frames between ranks
// of one host through lock-free single-producer single-consumer rings in
// shared mappings. There are no sockets and no system calls on the data path
// except a futex wake when the receiver sleeps and, where the single copy
// is turned on, the process_vm_readv that copies a large payload from the
// sender's memory straight into its place.
//
// # Usage
//
// The package registers itself as "shm" with [sdi.Register]; import it for
// its side effect, or call [New] directly:
//
//	sd := shm.New(logger)
//	local, err := sd.Open(ctx, sdi.OpenParams{Rank: r, Size: n, Host: h, JobID: id, Handler: hd, Logger: logger})
//	// publish local.Addr; for every peer on this host:
//	err = sd.Connect(ctx, peer, card)
//	done, err := sd.Send(&sdi.Frame{Peer: peer, Header: h, Payload: p})
//
// Configuration (the plugins.hcl block, as JSON): {"ring_bytes": N}, a power
// of two in [64 KiB, 1 GiB], default 1 MiB, the same on every rank of a job;
// "single_copy": true sends every payload of at least "single_copy_min"
// bytes (default 16 KiB) by the single copy, false none, and unset lets
// the sender choose for each of them; the environment variable
// MD_SHM_SINGLE_COPY=1, =0 or =auto overrides the config.
//
// # Segments and rings
//
// Every rank creates one segment, a file /dev/shm/mdshm.<job>.r<rank>.<nonce>
// (mode 0600, unlinked at Close), holding one inbound ring per rank of the
// job. A rank that dies first leaves its segment: mdrun removes the job's
// with [RemoveJobSegments] once its ranks on the host have exited, and
// since Hydra and Slurm do not, every rank's Open also removes the
// segments, of any job, whose creator is gone (its lock, internal/shmem,
// is not held). Ring s carries frames from rank s to the owner. A sender maps the
// receiver's segment at Connect and writes into its own ring there; the
// receiver polls all its rings. A ring is written by exactly one sender
// (goroutines of that sender take turns under a mutex) and read by exactly
// one receiver. The receiver polls only the rings a sender has attached to
// (flagged in the attach table at Connect, announced by the attach
// generation), so its polling cost grows with the ranks that talk to it,
// not with the job.
//
//	segment of rank R (offsets in bytes)
//	+-----------------------------------------------------------------+ 0
//	| magic "MDSHMSG1" | version | nrings | ring_bytes | rank | pid   |
//	| sha256(job)[:16] | sha256(secret)[:16]                          |
//	| probe word address | probe word value (single copy)             |
//	+-----------------------------------------------------------------+ 128
//	| state      (open / closed; senders check it before each frame)  |
//	+-----------------------------------------------------------------+ 256
//	| sleeping   (1 while R is about to wait or waiting)              |
//	+-----------------------------------------------------------------+ 384
//	| doorbell   (futex word senders bump to wake R)                  |
//	+-----------------------------------------------------------------+ 512
//	| attach generation (bumped when a sender attaches to a ring)     |
//	+-----------------------------------------------------------------+ 4096
//	| attach table: a uint32 per ring, set when its sender attached   |
//	| (whole pages: one per 1024 rings)                               |
//	+-----------------------------------------------------------------+
//	| ring 0: tail (producer cursor at disconnect), revoked,          |
//	|         fast frames sent (at disconnect) | pad to 128           |
//	|         head (consumer cursor), copy mode | pad to 256          |
//	|         assist request: cursor, address, length | pad to 384    |
//	|         assist claim, assist done | pad to 512                  |
//	|         fast slot 0 (1024 bytes)                                |
//	|         fast slot 1 (1024 bytes)                                |
//	|         data [ring_bytes]                                       |
//	+-----------------------------------------------------------------+
//	| ring 1 ... ring nrings-1 (same shape)                           |
//	+-----------------------------------------------------------------+
//
// The words that different parties write sit 128 bytes apart so that they
// never share a cache line (nor a prefetched pair of lines).
//
// tmpfs allocates a page when it is first touched, read or written, and a
// touch that finds /dev/shm full kills the process with SIGBUS (a
// container's /dev/shm is 64 MiB unless told otherwise). So no page is
// touched before it is allocated: Open allocates the header and attach
// table, and Connect the pair's two rings, this rank's in the peer's
// segment and the peer's in this one, or fails with an error that says
// how full /dev/shm is and wraps [sdi.ErrPeerUnreachable] (the
// multidevice then carries that peer's traffic over another subdevice).
// Rings of ranks that never connect, those on other hosts, cost only
// address space.
//
// Cursors are monotonic uint64 byte counts, masked with ring_bytes-1 on use.
// A record is a stamp (8 bytes), a [sdi.WireHeader], the opaque header and
// the payload, padded to 64 bytes, so that every record starts on a cache
// line and a small one is a single line:
//
//	data  0                                                     ring_bytes
//	      |..free..|S|W|H|payload|pad|S|W|H|payload|..free..|S|PAD->|
//	               ^head                            ^producer
//
// The stamp is the record's cursor plus one, and the sender stores it
// last: it is how the receiver learns that the record at its head is
// complete, reading the line it reads the record from anyway (MPICH's
// fastboxes and Open MPI's vader poll the data the same way), instead of a
// producer cursor on a line of its own, which cost a second cache miss on
// every small message. The zeroed ring holds no stamp, and one left from
// an earlier lap is a ring's length too low, but any other word of an
// earlier lap, payload included, may hold any value, and the receiver
// reads the word where the next record starts before the sender wrote
// there. So before it stamps a record the sender clears that word, unless
// the record fills the ring: the word is then the stamp of the receiver's
// unread record at its head, a lap too low. The sender keeps its cursor
// to itself and stores it in the ring's tail word only when it lets go of
// the ring, for a later connection to resume.
//
// Two fast slots beside each ring carry small frames (a record of at most
// 1 KiB) while the conversation is a back and forth: the ring walks
// through ring_bytes/64 lines before it reuses one, each landing on a line
// neither core has cached, where the slots stay in both cores' caches. A
// frame goes into a slot when the ring holds nothing the receiver has not
// taken and the slot's previous frame was taken; each ring record carries
// in its wire-header flags (bits 4-5) how many fast frames were sent
// before it, modulo 4, and the receiver takes those first. fast.go has the
// protocol and why it keeps each pair's order.
//
// A record never straddles the wrap: when one does not fit before the end,
// the sender writes a stamped padding record (wire-header flag 1) covering
// the rest and starts the record at offset 0. Records are 64-byte aligned,
// so there is always room for that padding record. MaxFrame is a quarter of
// the ring, so a record plus padding never exceeds half of it and an empty
// ring always accepts any frame.
//
// # Memory ordering
//
// Go's sync/atomic operations are sequentially consistent. Two edges make
// the ring safe:
//
//   - the sender writes the record bytes and clears the word where the
//     next record starts, then stores its stamp; the receiver loads the
//     stamp, then reads the bytes and, at the next record, that word
//     (stamp store -> stamp load);
//   - the receiver returns from Deliver, then stores head; the sender loads
//     head, then overwrites bytes before it (head store -> head load).
//
// The receiver validates every record against the ring size with
// [sdi.DecodeWireHeader] before slicing, so a corrupt or hostile writer can
// make it stop reading that ring (reported through [sdi.Handler.PeerDown]
// with an error wrapping [sdi.ErrBadFrame]) but never make it read outside
// the ring or panic. A record whose lengths claim more than the sender
// wrote yields stale bytes of that sender's own ring, nothing else.
//
// A descriptor record (wire-header flag 2) carries, instead of the
// payload, 16 bytes saying where the payload lies in the sender's memory.
// A payload longer than a sixteenth of the ring that goes through the ring
// is split into fragments: a first one (flag 4) with the header, the whole
// payload's length and the first part, then parts alone (flag 8), each
// published as soon as it is written.
//
// # Sending
//
// Send copies the frame into the ring and returns done=true, so no SendDone
// follows and Flush has nothing to wait for, unless the payload goes by
// descriptor (below). When the ring is full Send
// returns [sdi.ErrWouldBlock] and the caller retries; the subdevice keeps no
// backlog of its own (the multidevice owns the pending queue). Send to a rank
// whose segment is closed, whose process exited or whose ring was found
// corrupt returns an error wrapping [sdi.ErrPeerUnreachable].
//
// # Receiving and waiting
//
// Frames are delivered by whoever holds the receive lock: a goroutine in
// [sdi.Poller.Poll] (the subdevice sets [sdi.FlagPoll]; the multidevice
// calls Poll from a rank that waits for a message, so the frame is handled
// on the waiting goroutine without a wake-up), or else the subdevice's own
// progress goroutine. One lock for all inbound rings keeps Deliver calls
// serialized and in ring order; a poller that finds it taken returns at
// once. Deliver gets slices that point into the ring; they are valid only
// during the call.
//
// The progress goroutine naps (1 ms, parked in the Go scheduler, so that
// the processor goes back to the poller at once even with GOMAXPROCS 1)
// while Poll calls keep coming, so it does not spin beside the poller. When
// no Poll came during a nap it polls itself: it spins for a while, then
// polls with runtime.Gosched in between, then sleeps in futex_wait on the
// doorbell after announcing it in the sleeping word. Senders check that word
// after publishing a record and wake the receiver only when it sleeps, so
// the fast path has no system call. The comment on device.sleep explains why
// no wake-up is lost. A sleep parks one OS thread; it ends at the latest
// after half a second to check whether peers are still alive. It is not
// taken while another goroutine of the process is ready to run (the
// application computing between messages): a goroutine blocked in a
// system call keeps its processor until the runtime's monitor takes it
// back, 20 us to 10 ms later, and a rank bound to one CPU has one. The
// progress goroutine naps instead and looks again.
//
// The progress goroutine also naps when it finds a poller holding the
// receive lock: a poll that reads large payloads holds it for long, and a
// goroutine spinning on the lock beside it takes a core from the reader.
//
// # Large messages: one copy with process_vm_readv, where turned on
//
// Where the kernel allows it, the single copy is chosen per payload of
// at least single_copy_min bytes: the sender takes it while its copies
// into the ring run several times slower than the receiver's copies out
// (choose.go). On the machines it was measured on (2-CPU VMs) the ring,
// whose two copies overlap on two cores fragment by fragment (see
// below), beat the single copy at every size from 16 KiB to 4 MiB while
// the two CPUs shared a cache, and lost 4x at 1 MiB in the stretches
// where lines crossing between them were slow.
// "single_copy": true sends every payload of at least single_copy_min
// bytes by descriptor, false none.
//
// Unless single_copy is false, at Connect a rank probes whether it may
// read the peer's memory with process_vm_readv: it reads the probe word
// whose address and random value the peer published in its segment
// header, in the process whose pid the header names. The kernel allows
// it for processes of the same user unless Yama's ptrace_scope, a seccomp
// filter (some container runtimes) or a pid namespace in between forbids
// it; under ptrace_scope 1 (Ubuntu's default), which allows it only to
// ancestors, every rank declares any process of its user a permitted
// tracer at Open (PR_SET_PTRACER_ANY, as Open MPI does). On success the
// rank sets the copy-mode word of the peer's ring in its own segment; the
// debug log says which path each peer's large messages take ("path" is
// "process_vm_readv", "chosen" or "ring", with the reason) and, when
// chosen, every change of path with the rates behind it.
//
// A sender whose ring's mode says so sends a payload as a descriptor
// record, keeps the payload and
// returns done=false. The receiver asks its Handler where the payload goes
// ([sdi.Placer], found by a type assertion at Open; the multidevice places
// rendezvous data blocks in the user's receive buffer), reads it there
// with process_vm_readv, partial reads looped, or into a buffer of its own
// when the Handler has no place, and delivers. The sender helps: a
// payload of two chunks (64 KiB) or more is split, the receiver publishes
// where it goes in the ring's assist words, and both take chunks from one
// counter, the receiver reading its chunks, the sender (which waits for
// that payload's SendDone anyway, polling) writing its own into the
// receiver's buffer with process_vm_writev, so that two cores copy
// (assist.go; 1 MiB streaming with 64 in flight, 2 cores: 5480 against
// 3852 MB/s without, medians of 10 interleaved runs). A sender that is
// asleep or busy elsewhere (receiving itself, in a bidirectional stream)
// takes few chunks or none, and the receiver reads the rest. Advancing the consumer
// cursor past the record is the acknowledgement: the sender reports
// SendDone when it sees it (when polled, or woken by the doorbell the
// receiver rings after a descriptor), and Flush waits for it. Reading the
// sender's memory is safe because Go's collector does not move heap
// objects and the payload stays referenced until SendDone (singlecopy.go
// has the details, and how a sender that gives up on its descriptors at
// Close or Disconnect revokes them so that a read racing with the reuse
// of the buffer is never delivered). A descriptor is validated like any
// record (length at most MaxFrame, no address wrap), exactly the placed
// length is read, and a read that fails (EFAULT for a bad address, ESRCH
// for a dead sender) reports the sender down and delivers nothing. A dead
// peer's pid may pass to an unrelated process before the death is
// noticed, so Connect holds the peer's process by a pidfd opened before
// the probe, and a copy of a payload either way is preceded by a poll of
// it unless one found the process running within the last millisecond,
// too soon for any pid to be reused: once it reports the exit, the peer
// is down and nothing is copied (pidfd.go). Where pidfd_open is unavailable
// (Linux before 5.3, EPERM under seccomp) the pid is used as it was, and
// the debug log says so once ("path" is "kill").
//
// Without the single copy (the default), large messages go by rendezvous
// in frames of up to MaxFrame (a quarter of the ring), written in fragments of a sixteenth
// of the ring (64 KiB by default, the eager limit, so eager messages are
// not split): the receiver copies one fragment out, into the place its
// Handler gives for the frame or a buffer per ring, while the sender
// copies the next in, so the two copies overlap on two cores even within
// one frame (256 KiB latency through the ring 46-50 us against 62-88 us
// with whole frames, measured interleaved). Fragments of one frame are
// contiguous in the ring: anything else between them is a corrupt ring.
//
// # Places and peers reported down
//
// A payload read from the sender's memory, and a frame that arrives in
// fragments, go into the place the Handler gives ([sdi.Placer]), which
// then gets either that frame's Deliver or the sender's PeerDown, and
// after a PeerDown not one more byte. Every copy into a place, every
// Deliver and every PeerDown happen under the receive lock, so a report
// never falls in the middle of a copy of this rank's own. The report
// stops reading the sender's ring for good and drops the frame being
// assembled (what the sender left in the ring is delivered before it);
// a rank is reported once, so no place is given after. The copies a
// helping sender makes into the place (assist.go) are the exception: a
// process_vm_writev under way in another process cannot be called
// back, so the receiver waits for every chunk the sender took for as
// long as the sender's process runs (even past a Close), and reports it
// down only once it exited; it waits without the receive lock, and
// delivers nothing of that sender's meanwhile. A read that fails (EFAULT, ESRCH, a
// revoked descriptor) reports the sender down, as does the death of a
// sender the receiver is placing a frame of, through its connection or,
// after Disconnect, through the process it keeps for that frame; the
// frame of a sender it cannot watch is not placed. A Close of this
// rank's reports nothing: the multidevice fails its receives itself.
//
// # Limitations
//
// A segment has a ring for every rank of the job, so its virtual size is
// ranks * ring_bytes; only touched pages use memory, and a peer maps the
// whole segment of every rank it connects to. Peers must share the
// host's /dev/shm. Payloads are copied twice (into the ring and out of it)
// unless they take the single copy, which needs process_vm_readv allowed
// and a payload of at least single_copy_min bytes. Under the single copy a sender's payload stays in use until the
// receiver has read it, so a receiver that stops reading holds the
// sender's buffers (the ring path would block the sender instead). A
// sender that helps writes into the receiver's memory at the address the
// receiver published; this rank never reads or writes outside its posted
// buffer on a peer's word, but a peer allowed process_vm_writev into it
// (same user, the permission the single copy needs anyway) could write
// anywhere in it regardless of this protocol. A helping sender stopped
// in the middle of a chunk (SIGSTOP, a debugger) holds up its own frames
// to the receiver, and the receiver's Close, until it goes on or exits;
// the receiver's other rings are drained meanwhile. A rank
// whose process dies without Close is noticed by its pidfd (its pid where
// there is none), within a sleep timeout; its segment file is left behind.
// That pid is trusted only once the probe above found the peer's memory
// in it: until then, and for good where the probe fails, a peer's
// liveness goes by the lock its process holds on its segment (shmem),
// which tells across pid namespaces. So ranks in different pid namespaces
// that share /dev/shm (containers) and a host name connect, and their
// large messages take the ring.
package shm
