package adi

import (
	"context"
	"fmt"

	"github.com/hpc-multidevice/multidevice/multidevice"
)

// Nonblocking Sendrecv (MPI 4.1's MPI_Isendrecv and
// MPI_Isendrecv_replace). The receive is posted and the send started
// before the call returns, as Sendrecv does, so ranks exchanging in
// pairs or around a ring never wait for each other. The request holds
// both halves' device requests, allocated with it: its Test looks at
// both, and its Wait drives both on the caller's goroutine, as blocking
// Sendrecv does. No goroutine works for it: a worker per call cost a
// dozen allocations and a hand-over per exchange, and goroutines that
// stayed, one per call in flight, until Finalize.

// sendrecvOp is an Isendrecv's part of its Request, whose r is the
// receive (so Cancel and reuse reach it as an Irecv's): the send, and
// what reports the result.
type sendrecvOp struct {
	send multidevice.Request
	// startErr is the send's failure to start after the receive was
	// posted: the request reports it, with the receive's status, instead
	// of the send's result.
	startErr error
	// hasRecv is false for a ProcNull source: r holds nothing.
	hasRecv      bool
	name         string
	dest, source int // as the caller named them, for errors
}

// sendrecvReq is a Request and its Isendrecv in one allocation.
type sendrecvReq struct {
	q  Request
	op sendrecvOp
}

// Isendrecv starts a Sendrecv (MPI_Isendrecv): it sends send to rank
// dest with sendTag and receives into recv from source (or AnySource)
// with recvTag, and returns a request that completes when both are
// done, with the receive's status. It does not block. send and recv
// belong to the operation until the request completes and must not
// overlap (IsendrecvReplace exchanges in place).
//
// Once the receive is posted the call returns the request, even if the
// send then fails to start: a receive may have matched a message
// already, which only the request can hand over. A send that fails
// cancels the receive (at the call, or, for one that fails later, when
// the request is next tested or waited for: no goroutine watches it),
// and the request completes with the send's error and the receive's
// status: cancelled, or the message it had matched, all in recv by
// then (the error is then the send's and, for a cancelled receive,
// ErrCanceled too).
//
// Cancel cancels the receive half only, if it has not matched yet; a
// started send cannot be revoked. The send half still completes (and
// may have been delivered: a program must not send it again because of
// the cancel), and Wait waits for it. The request counts as cancelled,
// with Status.Cancelled set and an error that is ErrCanceled, exactly
// when its receive was cancelled; the error names the send's failure
// too if the send failed.
//
// ProcNull as dest sends nothing; as source it receives nothing, and
// the status is {Source: ProcNull, Tag: AnyTag}. A message longer than
// recv is ErrTruncated, as for Irecv. Ranks and tags are checked before
// anything starts.
func (c *Comm) Isendrecv(send []byte, dest, sendTag int, recv []byte, source, recvTag int) (*Request, error) {
	return c.isendrecv("isendrecv", send, dest, sendTag, recv, source, recvTag)
}

// IsendrecvReplace is Isendrecv with one buffer
// (MPI_Isendrecv_replace): buf is sent, then overwritten by the message
// received. Unless source or dest is ProcNull, buf is copied before the
// call returns and the copy is what goes out, so the receive never
// overwrites bytes the send still reads; buf belongs to the operation
// until the request completes.
func (c *Comm) IsendrecvReplace(buf []byte, dest, sendTag, source, recvTag int) (*Request, error) {
	send := buf
	if dest != ProcNull && source != ProcNull {
		send = append([]byte(nil), buf...)
	}
	return c.isendrecv("isendrecv_replace", send, dest, sendTag, buf, source, recvTag)
}

func (c *Comm) isendrecv(name string, send []byte, dest, sendTag int, recv []byte, source, recvTag int) (*Request, error) {
	if checkTag(sendTag, false) != nil {
		return nil, fmt.Errorf("adi: %s: send tag %d: %w (tags are 0..%d)", name, sendTag, ErrTag, MaxTag)
	}
	if checkTag(recvTag, true) != nil {
		return nil, fmt.Errorf("adi: %s: receive tag %d: %w (tags are 0..%d, or AnyTag)", name, recvTag, ErrTag, MaxTag)
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
		return c.Irecv(recv, source, recvTag)
	}
	x := &sendrecvReq{op: sendrecvOp{hasRecv: source != ProcNull, name: name, dest: dest, source: source}}
	q, p, dev := &x.q, &x.op, c.w.dev
	if p.hasRecv {
		if err := dev.IrecvRequest(&q.r, recv, s, recvTag, c.context); err != nil {
			return nil, fmt.Errorf("adi: %s: receive from %s: %w", name, c.rankName(source), err)
		}
	}
	if err := dev.IsendRequest(&p.send, send, d, sendTag, c.context, false); err != nil {
		if !p.hasRecv { // nothing started
			return nil, fmt.Errorf("adi: %s: send to %s: %w", name, c.rankName(dest), err)
		}
		p.startErr = err
		dev.Cancel(&q.r) // unless it matched: then the request hands it over
	}
	q.c, q.sr = c, p
	return q, nil
}

// sendDone reports whether p's send is over, and its error if so.
func (p *sendrecvOp) sendDone() (bool, error) {
	if p.startErr != nil {
		return true, p.startErr
	}
	_, done, err := p.send.Test()
	return done, err
}

// test is Test of q, which holds p: done once the send is, and then
// the receive, which a failed send cancels (nothing else might end it).
func (p *sendrecvOp) test(q *Request) (Status, bool, error) {
	sdone, serr := p.sendDone()
	if !sdone {
		return Status{}, false, nil
	}
	if !p.hasRecv {
		return nullStatus, true, p.result(q.c, multidevice.Status{}, serr, nil)
	}
	if serr != nil {
		q.c.w.dev.Cancel(&q.r)
	}
	st, rdone, rerr := q.r.Test()
	if !rdone {
		return Status{}, false, nil
	}
	return q.c.status(st), true, p.result(q.c, st, serr, rerr)
}

// wait is Wait of q, which holds p: it drives the send, then the
// receive, on the calling goroutine, as blocking Sendrecv does. On
// ctx's end the request stays pending.
func (p *sendrecvOp) wait(ctx context.Context, q *Request) (Status, error) {
	if p.startErr == nil {
		p.send.Wait(ctx)
	}
	sdone, serr := p.sendDone()
	if !sdone {
		return Status{}, fmt.Errorf("adi: wait: %w", ctx.Err())
	}
	if !p.hasRecv {
		return nullStatus, p.result(q.c, multidevice.Status{}, serr, nil)
	}
	if serr != nil {
		q.c.w.dev.Cancel(&q.r)
	}
	st, rerr := q.r.Wait(ctx)
	if _, done, _ := q.r.Test(); !done {
		return Status{}, fmt.Errorf("adi: wait: %w", ctx.Err())
	}
	return q.c.status(st), p.result(q.c, st, serr, rerr)
}

// result is the request's error from its halves': both when both
// failed (a failed send cancels the receive, and ErrCanceled must show
// then too), else the one that did. The ranks are named as c numbers
// them, the source as st, the receive's device status, gives it.
func (p *sendrecvOp) result(c *Comm, st multidevice.Status, serr, rerr error) error {
	if serr == nil && rerr == nil {
		return nil
	}
	with := fmt.Sprintf("adi: %s to %s and from %s", p.name, c.rankName(p.dest), c.fromName(p.source, st))
	switch {
	case serr != nil && rerr != nil:
		return fmt.Errorf("%s: send: %w; receive: %w", with, serr, rerr)
	case serr != nil:
		return fmt.Errorf("%s: send: %w", with, serr)
	}
	return fmt.Errorf("%s: receive: %w", with, rerr)
}
