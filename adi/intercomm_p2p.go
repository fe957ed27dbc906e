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

// Isendrecv starts a Sendrecv with remote ranks dest and source; see
// [Comm.Isendrecv].
func (ic *Intercomm) Isendrecv(send []byte, dest, sendTag int, recv []byte, source, recvTag int) (*Request, error) {
	return ic.remote.Isendrecv(send, dest, sendTag, recv, source, recvTag)
}

// IsendrecvReplace starts a SendrecvReplace with remote ranks dest and
// source; see [Comm.IsendrecvReplace].
func (ic *Intercomm) IsendrecvReplace(buf []byte, dest, sendTag, source, recvTag int) (*Request, error) {
	return ic.remote.IsendrecvReplace(buf, dest, sendTag, source, recvTag)
}

// Idup is Dup started nonblockingly (MPI_Comm_idup on an
// intercommunicator), as [Comm.Idup]: Dup sends nothing, so the request
// has completed already. Every rank of both groups calls it in the same
// order as its Dup, Split, Create and Merge calls and its persistent
// collectives' Inits on ic, as for Dup.
func (ic *Intercomm) Idup() (*Intercomm, *Request, error) {
	d, err := ic.Dup(context.Background())
	if err != nil {
		return nil, nil, err
	}
	return d, &Request{c: ic.remote, local: doneOp(Status{})}, nil
}
