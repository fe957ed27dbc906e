// Package multidevice is the device under adi: it maps a flat world of
// ranks onto several subdevices (package sdi), chosen per peer and message
// size from a connection table, and implements MPI matching, the eager and
// rendezvous protocols and system messages on top of them. It owns no
// transport code.
//
// # Usage
//
// Applications use package adi, which opens the device for them. A
// program that drives the device itself links the subdevices its
// plugins.hcl names as built in (adi's builtin.go does the same):
//
//	import (
//		_ "github.com/hpc-multidevice/multidevice/subdevices/shm"
//		_ "github.com/hpc-multidevice/multidevice/subdevices/tcp"
//	)
//
//	b, err := bootstrap.Open(ctx, nil) // mdrun's rank, PMI, or a singleton
//	d, err := multidevice.Open(ctx, multidevice.Options{Bootstrap: b})
//	const cid uint64 = 0 // the context id: separates communicators
//	r, err := d.Irecv(buf, multidevice.AnySource, multidevice.AnyTag, cid)
//	err = d.Send(ctx, msg, peer, tag, cid, false)
//	st, err := r.Wait(ctx)
//	err = d.Close(ctx)
//
// # Progress model
//
// Who polls what. A subdevice that sets [sdi.FlagPoll] (shm, tcp) can be driven
// by any goroutine through [sdi.Poller]. A goroutine that waits — in
// [Request.Wait], [Device.Send], [Device.Recv], or adi's WaitAny and Probe
// through [Device.Progress] — polls, in a loop, the pollable subdevices
// that carry its peer's routes (all of them for an ANY_SOURCE receive),
// a quiet one much dearer than the others only every so many rounds (a
// recv system call beside a read of shared memory; pollsched.go), and
// sends what the outbox holds (frames a subdevice refused with
// ErrWouldBlock, clear-to-send and rendezvous data queued by handler
// callbacks); a blocking Recv that one subdevice alone can complete, on a
// host that is not crowded, polls that one directly for its first rounds.
// Frames are therefore delivered, matched and answered on the
// waiting goroutine, with no goroutine wake-up on a message's path. A
// subdevice may do more of the transfer there: shm's sender, polled while
// it waits for a large payload's SendDone, copies part of that payload
// into the receiver's buffer while the receiver copies the rest. While
// a goroutine polls like this (once its wait handled a frame or lasted a
// few rounds, which most waits for a small message on a busy link do
// not), queuing a frame does not wake the outbox goroutine.
//
// When a rank sleeps. Counting from the last frame it delivered or sent,
// the loop polls back to back for 100 µs, then yields
// the processor (runtime.Gosched and sched_yield, so a peer process on the
// same core can run) between polls up to 2 ms, then parks on
// the request's channel. A request whose routes have no pollable
// subdevice (a plugin without FlagPoll) parks at once. So a rank blocked
// in Recv with nothing arriving spends at most 2 ms of CPU per call and
// then none. Before it parks it calls [sdi.Idler.Idle] on the subdevices
// it polled that set [sdi.FlagIdle], so that their own goroutines take over
// at once instead of after a pause of their own. Where more polling
// threads may run on a rank's CPUs than there are (unbound ranks
// outnumbering the cores, several ranks bound to one, a polling plugin
// process beside each rank), the loop yields between polls from the
// start. Ranks publish the CPUs they may run on as they open, so a rank
// that mpiexec, Slurm or taskset bound to a core of its own, and whose
// runtime.NumCPU is therefore 1, does not count as crowded.
//
// What wakes it. Each subdevice keeps its own goroutines for the time
// nobody polls: shm's progress goroutine naps while Poll calls keep coming
// and otherwise spins briefly, then sleeps on a futex word in the shared
// segment that senders ring only when it sleeps (and not while another
// goroutine of the rank is ready to run, whose processor it would hold);
// tcp's readers wait on a goroutine that waits, in the netpoller, for
// the subdevice's own epoll set, and its writers in the netpoller, and
// both stand by while Poll calls keep coming (pollers then read and write
// the sockets themselves) until Idle; a plugin subdevice's ring goroutine
// polls the plugin's subdevice for as long as the rank polls the plugin
// (sdi/plugin). Those goroutines call the same handler, which completes the
// request and closes its channel; the outbox goroutine is woken when the
// last polling goroutine stops with frames still queued. A subdevice that
// delivers from both a poller and its own goroutine excludes the two
// (shm: one lock over its receive rings), so per-peer Deliver order holds.
//
// # Hot path
//
// A standard-mode eager message to a directly reached peer carries a
// 24-byte header (header.go), so that with shm an 8-byte message is a
// 52-byte record (an 8-byte stamp, the 12-byte wire header, the header
// and the payload), less than a cache line: shm pads records to 64
// bytes, each starting on a line, so the receiver reads one line per
// such message. A blocking Send of such a message that the subdevice
// completes at once (done=true) uses the
// peer's send lane (or, when another sender holds it, a pooled frame)
// and no request at all; an Isend completes its request in place
// with one store (none for a reused request, which stays done), and
// registers nothing. On arrival, an in-order eager message is matched
// against the posted receives, copied into the user's buffer and its
// request completed under one lock acquisition; the completion is one
// compare-and-swap, since nobody else can reach a request taken out of
// the posted queue, and Done's channel is made, and its lock taken, only
// if somebody selects on it. Requests of the blocking Recv (and of Send
// when it needs one) come from a pool and are reset when taken, off a
// ping-pong's path; unexpected messages reuse buffers from a short free
// list; and Changed's channel is replaced only if somebody holds it.
// Steady-state eager ping-pong over shm allocates nothing, and neither do
// nonblocking operations started in requests the caller reuses
// (IsendRequest, IrecvRequest; adi's IsendInto, IrecvInto): see adi's
// allocation tests. What is left per message is mostly locked
// instructions (in Go on amd64 every atomic write is one, atomic Store
// included): the send lane's take and release (lane.go: sequence number,
// frame and link counts in one), the matching lock, the completion and
// the request pool's take and give, besides the subdevice's own. A
// lock-free match would save none of them: besides the completion it
// would need one to claim the receive and, since a peer's frames may come
// through several subdevices at once, one to publish the next expected
// sequence number, the two the lock costs.
//
// # Indirect communication
//
// A peer that a connection table routes "via" another rank, or that no
// subdevice reaches (every Connect failed with sdi.ErrPeerUnreachable, as
// for two clusters on the same private range), is reached through gateways:
// ranks that reach both ends, found automatically from the reachability
// every rank publishes at Open. Frames to it travel as system messages in
// blocks of [ForwardOptions.BlockSize]; a credit window per (source,
// destination) pair bounds what gateways hold; several gateways are used
// together (trunking) and a dead one's blocks go through the others. A
// gateway is any rank, or a dedicated relay that takes no application rank
// ([Options.Relay], adi.RunRelay, cmd/mdrelay). forward.go, credit.go,
// trunk.go, reach.go and relay.go tell the details; [Device.Path] and
// [Device.ForwardStats] show what happens.
//
// # Failover
//
// A connection-table entry with "failover": true sends its peers' traffic
// the same way, with each route of the list, direct ones included, as a
// trunk whose first hop is the peer itself: blocks spread over the live
// routes by the rates the peer reports they deliver at (a slow route
// takes few), each is kept until the peer's credit covers it, and those a
// route carried when its subdevice lost the peer go again over the others;
// the peer drops the copies it had; a route on standby carries nothing
// while one that is not lives. So a network that fails loses no
// message and stops nothing while another route lives, at the price of a
// copy per message and the credits. A route that died is tried again in
// the background (ForwardOptions.Retry) and carries traffic again once
// its subdevice connects. Without the flag a direct route is used alone
// and losing it fails every request that depends on the peer
// (ErrPeerDown). tcp notices a dead link within its link_timeout. A lost
// rank stays lost: what it sent before is still received, but a receive
// or probe naming it that finds nothing from it, and a receive matching
// its ready-to-send (whose data will never come), fail with ErrPeerDown
// whenever they are posted. ANY_SOURCE receives keep waiting for the
// ranks that live.
package multidevice
