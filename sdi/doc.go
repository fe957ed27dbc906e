// Package sdi defines the SubDevice Interface: the contract between the
// multidevice and the transports ("subdevices") that move its frames.
//
// A subdevice is an active-message mover, not an MPI engine. It carries
// frames, each an opaque header plus a payload, from one rank to another and
// hands arriving frames to the multidevice through a [Handler]. Tag matching,
// ANY_SOURCE, requests, rendezvous, ordering across subdevices, forwarding and
// striping all live in the multidevice. A subdevice that matches messages on
// its own (hardware tag matching, a plugin that keeps its own queues) declares
// [FlagMatching] and implements [Matcher] as well.
//
// # Layers
//
//	application
//	    |  adi: Comm, Request, Status
//	multidevice          matching, protocols, routing by conntable
//	    |  sdi: SubDevice, Handler, Frame      <- this package
//	+---------+---------+---------+---------+
//	|  shm    |  tcp    |  verbs  | plugin  |  subdevices
//	+---------+---------+---------+---------+
//
// # Glossary
//
//   - frame: one active message: an opaque header (at most [Caps.MaxHeader]
//     bytes) and a payload (at most [Caps.MaxFrame] bytes).
//   - eager / rendezvous: a message small enough ([Caps.MaxEager]) travels
//     in one frame; a larger one is announced first and its data sent only
//     once the receiver has matched it. The multidevice runs both protocols.
//   - business card: the address blob a subdevice returns from Open
//     ([Local.Addr]); the launcher publishes it and peers pass it to Connect.
//   - exclusivity: when several subdevices reach a peer, the higher
//     [Caps.Exclusivity] wins unless a connection table says otherwise.
//   - flush: wait until every frame accepted for a peer is locally complete.
//   - peer down: a subdevice lost a peer; reported through [Handler.PeerDown].
//
// # Implementing a subdevice
//
// Implement [SubDevice]. Open receives the rank, the job size, the job secret
// and a [Handler]; it binds local resources and returns a business card and
// the subdevice's [Caps]. Connect is given a peer's business card. Send must
// not block: when resources are exhausted it returns [ErrWouldBlock] and the
// multidevice retries later. Every accepted frame is reported exactly once
// through [Handler.SendDone]. Arriving frames are handed to
// [Handler.Deliver]; per peer those calls are serialized, and in send order
// when [FlagOrdered] is set.
//
// Subdevices that move bytes over a stream or a ring put a [WireHeader] in
// front of every frame, so every transport rejects malformed input the same
// way; [DecodeWireHeader] checks magic, version and lengths against limits
// and never panics.
//
// Built-in subdevices register a [Factory] with [Register] in an init
// function; the multidevice finds them by name with [Lookup].
package sdi
