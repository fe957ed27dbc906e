package adi

import (
	"context"
	"errors"
	"fmt"

	"github.com/hpc-multidevice/multidevice/multidevice"
)

// Message is a message taken by a matched probe (Improbe, Mprobe): no
// receive can match it any more, and it is received only through its
// Recv, Irecv or IrecvInto, once (MPI_Mprobe and MPI_Mrecv). Probe and then
// Recv is racy when several goroutines receive from the same sources: the
// message Probe saw may go to another goroutine's receive. A matched probe
// is not: the message it returns is the caller's.
type Message struct {
	m *multidevice.Message // nil for a message from ProcNull
	c *Comm
}

// Improbe is Iprobe that also takes the message it finds, if any, out of
// matching and returns it. A message held by a subdevice that matches on
// its own (sdi.FlagMatching; none of the built-in ones does) cannot be
// taken: finding one yields an error wrapping errors.ErrUnsupported.
func (c *Comm) Improbe(source, tag int) (*Message, Status, bool, error) {
	if source == ProcNull { // MPI_MESSAGE_NO_PROC
		if err := checkTag(tag, true); err != nil {
			return nil, Status{}, false, err
		}
		return &Message{c: c}, nullStatus, true, nil
	}
	s, err := c.source(source)
	if err != nil {
		return nil, Status{}, false, err
	}
	m, st, ok, err := c.w.dev.Improbe(s, tag, c.context)
	if err != nil {
		return nil, Status{}, false, fmt.Errorf("adi: matched probe of %s: %w", c.rankName(source), err)
	}
	if !ok {
		return nil, Status{}, false, nil
	}
	return &Message{m: m, c: c}, c.status(st), true, nil
}

// Mprobe blocks until a message from source with tag is waiting and takes
// it, as Improbe. When ctx ends first it returns no message and, as
// Probe, a status that says Cancelled.
func (c *Comm) Mprobe(ctx context.Context, source, tag int) (*Message, Status, error) {
	var m *Message
	var st Status
	err := c.awaitProbe(ctx, func() (ok bool, err error) {
		m, st, ok, err = c.Improbe(source, tag)
		return ok, err
	})
	if err != nil && errors.Is(err, ctx.Err()) {
		st = probeEnded
	}
	return m, st, err
}

// Recv receives the message into buf. A longer message fills buf and
// returns ErrTruncated, as a receive would. When ctx ends before a large
// message's data came, the receive is given up, as Comm.Recv's: Recv
// returns an error wrapping ctx.Err() and the message is lost.
func (m *Message) Recv(ctx context.Context, buf []byte) (Status, error) {
	if m == nil || m.c == nil {
		return Status{}, fmt.Errorf("adi: receive of a nil message")
	}
	if m.m == nil {
		return nullStatus, nil
	}
	st, err := m.c.w.dev.Mrecv(ctx, m.m, buf)
	if err != nil {
		return m.c.status(st), fmt.Errorf("adi: receive of a probed message from %s: %w", m.c.fromName(AnySource, st), err)
	}
	return m.c.status(st), nil
}

// Irecv starts receiving the message into buf.
func (m *Message) Irecv(buf []byte) (*Request, error) {
	q := new(Request)
	if err := m.IrecvInto(q, buf); err != nil {
		return nil, err
	}
	return q, nil
}

// IrecvInto is Irecv into q, a Request the caller owns; see
// Comm.IsendInto. Receiving a message twice is an error.
func (m *Message) IrecvInto(q *Request, buf []byte) error {
	if m == nil || m.c == nil {
		return fmt.Errorf("adi: receive of a nil message")
	}
	if err := q.reusable(); err != nil {
		return err
	}
	if m.m == nil {
		return q.startLocal(m.c, nullRecv)
	}
	if err := q.start(); err != nil {
		return err
	}
	if err := m.c.w.dev.MrecvRequest(&q.r, m.m, buf); err != nil {
		q.failedStart(err)
		return fmt.Errorf("adi: receive of a probed message: %w", err)
	}
	q.c, q.peer, q.recv = m.c, AnySource, true
	return nil
}
