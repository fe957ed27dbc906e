package rdma

import (
	"context"
	"errors"
)

// A Provider is one opened RDMA interface: a verbs device reached through
// the RDMA connection manager, a uDAPL interface adapter, or the software
// fabric the tests use. The engine in this package runs the SDI protocol
// (credits, eager slots, reads for large frames) over it; a provider only
// moves bytes and reports completions, the way the hardware does.
//
// One provider serves one rank. Its methods are safe for concurrent use,
// except where a method says otherwise.
type Provider interface {
	// Card is the address a peer passes to Dial: what the rank publishes
	// in its business card. It is valid from Open until Close.
	Card() []byte

	// Limits are the provider's bounds; the engine sizes its queues and
	// messages by them.
	Limits() Limits

	// Register makes buf usable as the local or the remote side of work
	// requests, and returns its region. The provider keeps buf in place
	// (it pins Go memory with runtime.Pinner) until the region is closed.
	// buf must not be empty.
	Register(buf []byte) (Region, error)

	// Dial connects to the listener behind card. The provider makes a new
	// endpoint, calls setup with it before the connection can carry
	// anything (the engine posts its receives there), then sends the
	// connection request with private (at most Limits.MaxPrivate bytes)
	// and waits until the peer accepts, rejects (ErrRejected) or ctx is
	// done. On any error the endpoint is closed and its posted work
	// completes, flushed, like that of any closed endpoint.
	Dial(ctx context.Context, card, private []byte, id uint32, setup func(Endpoint) error) (Endpoint, error)

	// Requests delivers the connection requests peers send with Dial.
	// Every request must be accepted or rejected. The channel is closed
	// when the provider closes.
	Requests() <-chan Request

	// Poll moves up to len(cs) completions into cs without blocking and
	// returns how many it moved. An error means the provider itself failed
	// (its completion queue overran); endpoints' failures come as
	// completions with Err set. Poll is called by one goroutine at a time.
	Poll(cs []Completion) (int, error)

	// Arm asks for the next completion to wake Wait. The engine arms, polls
	// once more (a completion that came before Arm does not wake Wait), and
	// only then waits.
	Arm() error

	// Wait blocks until a completion may have come since the last Arm, or
	// ctx is done. It may return early; the engine polls after it either
	// way. Wait is called by one goroutine at a time.
	Wait(ctx context.Context) error

	// Close closes every endpoint and region and stops the listener.
	// Completions of flushed work may still be polled until Close returns;
	// after it none are. Close is idempotent.
	Close() error
}

// Limits bound what a provider's queues and messages take.
type Limits struct {
	MaxSendWR  int // work requests an endpoint may have posted for sending and reading at once
	MaxRecvWR  int // receives an endpoint may have posted at once
	MaxMsg     int // largest send, receive or read of one work request
	MaxPrivate int // largest private data of a connection request
	CQSize     int // completions the shared completion queue holds; the engine keeps fewer outstanding
}

// Request is a peer's connection request, as Requests delivers it.
type Request interface {
	// Private is the data the peer passed to Dial.
	Private() []byte
	// Accept makes a new endpoint, calls setup with it before the
	// connection can carry anything, then accepts. id tags the endpoint's
	// completions (Completion.Endpoint).
	Accept(id uint32, setup func(Endpoint) error) (Endpoint, error)
	// Reject refuses the request; the peer's Dial returns ErrRejected.
	Reject() error
}

// Endpoint is one reliable, connected, ordered queue pair. Work posted on it
// completes in the shared completion queue of its provider, tagged with the
// endpoint's id and the work request's own id.
//
// Sends are delivered in the order posted, each into the receive posted
// first among those still open at the peer, as one message; a send that
// finds no receive posted fails the endpoint (the engine's credits prevent
// that). When an endpoint fails or closes, every work request still posted
// on it completes with Err set (flushed), the peer's too, and no byte is
// written into a region by that endpoint after its flushed completion.
type Endpoint interface {
	// PostRecv posts a receive of at most n bytes into r at off.
	PostRecv(wr uint64, r Region, off, n int) error
	// PostSend sends n bytes from r at off as one message; the completion
	// means the buffer may be reused.
	PostSend(wr uint64, r Region, off, n int) error
	// PostRead reads n bytes from the peer's region (raddr, rkey) into r
	// at off.
	PostRead(wr uint64, r Region, off, n int, raddr uint64, rkey uint32) error
	// Close disconnects. Posted work completes, flushed. Idempotent.
	Close() error
}

// Region is registered memory.
type Region interface {
	// Addr and RKey are what a peer passes to PostRead to read the region
	// from its start: Addr is the address of the region's first byte.
	Addr() uint64
	RKey() uint32
	// Close deregisters the region and unpins its memory. Work that uses
	// the region must have completed.
	Close() error
}

// Op is the kind of work a completion finishes.
type Op uint8

// The work kinds.
const (
	OpRecv Op = iota + 1
	OpSend
	OpRead
)

func (o Op) String() string {
	switch o {
	case OpRecv:
		return "recv"
	case OpSend:
		return "send"
	case OpRead:
		return "read"
	}
	return "op?"
}

// Completion reports finished work.
type Completion struct {
	Endpoint uint32 // the id given to Dial or Accept
	WR       uint64 // the work request's id
	Op       Op
	Len      int   // bytes received, for OpRecv
	Err      error // nil on success; wraps ErrFlushed for work an endpoint's end cut off
}

// Errors providers return or put in completions.
var (
	// ErrRejected: the peer refused the connection request.
	ErrRejected = errors.New("rdma: connection rejected")
	// ErrFlushed: the work was cut off because its endpoint failed or
	// closed.
	ErrFlushed = errors.New("rdma: work flushed")
	// ErrNoDevice: the machine has no usable RDMA device.
	ErrNoDevice = errors.New("rdma: no usable device")
)
