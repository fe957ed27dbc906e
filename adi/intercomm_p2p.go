package adi

import "context"

// Point-to-point calls on an Intercomm: each is Comm's, on the
// communicator of the remote group's ranks, so that dest and source are
// ranks of the remote group (or ProcNull, or AnySource and AnyTag where a
// receive allows them) and statuses name remote ranks. The Requests and
// Messages they return are Comm's; so are the buffer rules and errors.

// Isend starts a standard-mode send of buf to remote rank dest; see
// [Comm.Isend].
func (ic *Intercomm) Isend(buf []byte, dest, tag int) (*Request, error) {
	return ic.remote.Isend(buf, dest, tag)
}

// Issend starts a synchronous-mode send to remote rank dest; see
// [Comm.Issend].
func (ic *Intercomm) Issend(buf []byte, dest, tag int) (*Request, error) {
	return ic.remote.Issend(buf, dest, tag)
}

// IsendInto is Isend into q, a Request the caller owns; see
// [Comm.IsendInto].
func (ic *Intercomm) IsendInto(q *Request, buf []byte, dest, tag int) error {
	return ic.remote.IsendInto(q, buf, dest, tag)
}

// IssendInto is Issend into q; see [Comm.IsendInto].
func (ic *Intercomm) IssendInto(q *Request, buf []byte, dest, tag int) error {
	return ic.remote.IssendInto(q, buf, dest, tag)
}

// Send sends buf to remote rank dest; see [Comm.Send].
func (ic *Intercomm) Send(ctx context.Context, buf []byte, dest, tag int) error {
	return ic.remote.Send(ctx, buf, dest, tag)
}

// Ssend sends buf to remote rank dest and returns once it was matched;
// see [Comm.Ssend].
func (ic *Intercomm) Ssend(ctx context.Context, buf []byte, dest, tag int) error {
	return ic.remote.Ssend(ctx, buf, dest, tag)
}

// Irecv posts a receive from remote rank source (or AnySource: any rank
// of the remote group); see [Comm.Irecv].
func (ic *Intercomm) Irecv(buf []byte, source, tag int) (*Request, error) {
	return ic.remote.Irecv(buf, source, tag)
}

// IrecvInto is Irecv into q, a Request the caller owns; see
// [Comm.IsendInto].
func (ic *Intercomm) IrecvInto(q *Request, buf []byte, source, tag int) error {
	return ic.remote.IrecvInto(q, buf, source, tag)
}

// Recv receives one message from remote rank source (or AnySource); its
// Status.Source is a remote rank. See [Comm.Recv].
func (ic *Intercomm) Recv(ctx context.Context, buf []byte, source, tag int) (Status, error) {
	return ic.remote.Recv(ctx, buf, source, tag)
}

// Iprobe reports whether a message from remote rank source is waiting;
// see [Comm.Iprobe].
func (ic *Intercomm) Iprobe(source, tag int) (Status, bool, error) {
	return ic.remote.Iprobe(source, tag)
}

// Probe blocks until a message from remote rank source is waiting; see
// [Comm.Probe].
func (ic *Intercomm) Probe(ctx context.Context, source, tag int) (Status, error) {
	return ic.remote.Probe(ctx, source, tag)
}

// Improbe is Iprobe that takes the message it finds out of matching; see
// [Comm.Improbe].
func (ic *Intercomm) Improbe(source, tag int) (*Message, Status, bool, error) {
	return ic.remote.Improbe(source, tag)
}

// Mprobe blocks until a message from remote rank source is waiting and
// takes it; see [Comm.Mprobe].
func (ic *Intercomm) Mprobe(ctx context.Context, source, tag int) (*Message, Status, error) {
	return ic.remote.Mprobe(ctx, source, tag)
}

// Sendrecv sends send to remote rank dest and receives into recv from
// remote rank source, both at once; see [Comm.Sendrecv].
func (ic *Intercomm) Sendrecv(ctx context.Context, send []byte, dest, sendTag int, recv []byte, source, recvTag int) (Status, error) {
	return ic.remote.Sendrecv(ctx, send, dest, sendTag, recv, source, recvTag)
}

// SendrecvReplace is Sendrecv with one buffer; see [Comm.SendrecvReplace].
func (ic *Intercomm) SendrecvReplace(ctx context.Context, buf []byte, dest, sendTag, source, recvTag int) (Status, error) {
	return ic.remote.SendrecvReplace(ctx, buf, dest, sendTag, source, recvTag)
}
