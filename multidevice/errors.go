package multidevice

import "errors"

// Sentinel errors. The adi package re-exports them for applications.
var (
	// ErrTruncated: the message was longer than the receive buffer. The
	// buffer holds the first len(buf) bytes and Status.Count says how many.
	ErrTruncated = errors.New("multidevice: message truncated")
	// ErrCanceled: the request was cancelled before it matched.
	ErrCanceled = errors.New("multidevice: request canceled")
	// ErrRank: a rank outside the job.
	ErrRank = errors.New("multidevice: rank out of range")
	// ErrTag: a negative tag; negative tags are reserved for system messages.
	ErrTag = errors.New("multidevice: invalid tag")
	// ErrClosed: the device was closed.
	ErrClosed = errors.New("multidevice: closed")
	// ErrNoRoute: the connection table has no usable route to a peer.
	ErrNoRoute = errors.New("multidevice: no route to peer")
	// ErrPeerDown: a subdevice lost the peer a request depends on.
	ErrPeerDown = errors.New("multidevice: peer down")
	// ErrRequestBusy: a request handed in for reuse has not completed, or
	// a frame of it or a copy in a matching subdevice is still out.
	ErrRequestBusy = errors.New("multidevice: request still in use")
)
