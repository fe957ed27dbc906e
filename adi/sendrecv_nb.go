package adi

import (
	"context"
	"fmt"

	"github.com/hpc-multidevice/multidevice/multidevice"
)

// Nonblocking Sendrecv (MPI 4.1's MPI_Isendrecv and
// MPI_Isendrecv_replace). The receive is posted and the send started
// before the call returns, as Sendrecv does, so ranks exchanging in
// pairs or around a ring never wait for each other; a worker of the
// world's (the nonblocking collectives', nbcoll.go) waits for both and
// completes the request, which Wait, Test, WaitAny, WaitSome, WaitAll and
// TestAll take like any other.

// sendrecvOp is what an Isendrecv keeps in flight: its receive and its
// send, which the multidevice carries.
type sendrecvOp struct {
	recv, send multidevice.Request
}

// Isendrecv starts a Sendrecv (MPI_Isendrecv): it sends send to rank
// dest with sendTag and receives into recv from source (or AnySource)
// with recvTag, and returns a request that completes when both are
// done, with the receive's status. It does not block. send and recv
// belong to the operation until the request completes and must not
// overlap (IsendrecvReplace exchanges in place).
//
// Cancel cancels the receive, if it has not matched yet: the request
// then completes, once the send is done, with ErrCanceled and
// Status.Cancelled. A send that fails cancels the receive too, and the
// request completes with the send's error. ProcNull as dest sends
// nothing; as source it receives nothing, and the status is
// {Source: ProcNull, Tag: AnyTag}. A message longer than recv is
// ErrTruncated, as for Irecv. Ranks and tags are checked before
// anything starts.
func (c *Comm) Isendrecv(send []byte, dest, sendTag int, recv []byte, source, recvTag int) (*Request, error) {
	return c.isendrecv("isendrecv", send, dest, sendTag, recv, source, recvTag)
}

// IsendrecvReplace is Isendrecv with one buffer
// (MPI_Isendrecv_replace): buf is sent, then overwritten by the message
// received. buf is copied before the call returns and the copy is what
// goes out, so the receive never overwrites bytes the send still reads;
// buf belongs to the operation until the request completes.
func (c *Comm) IsendrecvReplace(buf []byte, dest, sendTag, source, recvTag int) (*Request, error) {
	send := buf
	if dest != ProcNull && source != ProcNull {
		send = append([]byte(nil), buf...)
	}
	return c.isendrecv("isendrecv_replace", send, dest, sendTag, buf, source, recvTag)
}

func (c *Comm) isendrecv(name string, send []byte, dest, sendTag int, recv []byte, source, recvTag int) (*Request, error) {
	if err := checkTag(sendTag, false); err != nil {
		return nil, fmt.Errorf("adi: %s: send tag: %w", name, err)
	}
	if err := checkTag(recvTag, true); err != nil {
		return nil, fmt.Errorf("adi: %s: receive tag: %w", name, err)
	}
	var d, s int
	var err error
	if dest != ProcNull {
		if d, err = c.WorldRank(dest); err != nil {
			return nil, fmt.Errorf("adi: %s: destination: %w", name, err)
		}
	}
	switch source {
	case ProcNull:
	case AnySource:
		s = AnySource
	default:
		if s, err = c.WorldRank(source); err != nil {
			return nil, fmt.Errorf("adi: %s: source: %w", name, err)
		}
	}
	switch {
	case dest == ProcNull && source == ProcNull:
		return &Request{c: c, local: nullRecv}, nil
	case dest == ProcNull: // a receive alone: Irecv's request is the one
		q, err := c.Irecv(recv, source, recvTag)
		if err != nil {
			return nil, fmt.Errorf("adi: %s: %w", name, err)
		}
		return q, nil
	}
	p := new(sendrecvOp)
	dev := c.w.dev
	if source != ProcNull {
		if err := dev.IrecvRequest(&p.recv, recv, s, recvTag, c.context); err != nil {
			return nil, fmt.Errorf("adi: %s: receive from rank %d: %w", name, source, err)
		}
	}
	// abandon ends the posted receive after a failed start; one that
	// matched meanwhile is left to complete on its own.
	abandon := func() {
		if source != ProcNull {
			dev.Cancel(&p.recv)
		}
	}
	if err := dev.IsendRequest(&p.send, send, d, sendTag, c.context, false); err != nil {
		abandon()
		return nil, fmt.Errorf("adi: %s: send to rank %d: %w", name, dest, err)
	}
	op := &localOp{done: make(chan struct{})}
	if source != ProcNull {
		op.cancel = func() { dev.Cancel(&p.recv) }
	}
	q, err := c.w.bg.launchOp(c, name, func() {}, op, func(ctx context.Context) error {
		return c.completeSendrecv(ctx, name, p, op, dest, source)
	})
	if err != nil {
		abandon() // the send ends with the device, which Finalize closes
		return nil, err
	}
	return q, nil
}

// completeSendrecv waits for p's send, then its receive, sets op's
// status to the receive's and returns the operation's error: the
// send's, after which the receive is cancelled, or else the receive's.
func (c *Comm) completeSendrecv(ctx context.Context, name string, p *sendrecvOp, op *localOp, dest, source int) error {
	_, serr := p.send.Wait(ctx)
	if source == ProcNull {
		op.st = nullStatus
	} else {
		if serr != nil {
			c.w.dev.Cancel(&p.recv)
		}
		st, rerr := p.recv.Wait(ctx)
		op.st = c.status(st)
		if serr == nil && rerr != nil {
			return fmt.Errorf("adi: %s with ranks %d and %d: receive: %w", name, dest, source, rerr)
		}
	}
	if serr != nil {
		return fmt.Errorf("adi: %s with ranks %d and %d: send: %w", name, dest, source, serr)
	}
	return nil
}
