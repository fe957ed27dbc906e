package adi

import "github.com/hpc-multidevice/multidevice/multidevice"

// Sentinel errors; test them with errors.Is.
var (
	// ErrTruncated: a message was longer than the receive buffer. The buffer
	// holds its first bytes and Status.Count says how many. Never silent.
	ErrTruncated = multidevice.ErrTruncated
	// ErrCanceled: the receive was cancelled before it matched; its Status
	// has Cancelled set.
	ErrCanceled = multidevice.ErrCanceled
	// ErrRank: a rank outside the communicator.
	ErrRank = multidevice.ErrRank
	// ErrTag: a tag outside 0..MaxTag (and not AnyTag where allowed).
	ErrTag = multidevice.ErrTag
	// ErrFinalized: the world was finalized.
	ErrFinalized = multidevice.ErrClosed
	// ErrPeerDown: the transport lost a rank a request depends on. A
	// receive or probe naming a lost rank fails with it once nothing that
	// rank sent before its loss is left to match.
	ErrPeerDown = multidevice.ErrPeerDown
	// ErrRequestBusy: IsendInto or IrecvInto got a request whose earlier
	// operation has not completed (or still has a frame out).
	ErrRequestBusy = multidevice.ErrRequestBusy
)
