// Package rdma is the engine under the RDMA subdevices (subdevices/verbs,
// subdevices/udapl): it runs the SDI over any [Provider], a small contract
// of reliable connections, registered memory, sends into posted receives,
// reads of remote memory and a completion queue. A provider wraps one
// RDMA API; the engine holds everything they share.
//
// # Protocol
//
// Each connection posts RecvSlots data receives plus a few control
// receives, each one slot of EagerBytes plus room for headers. A sender
// holds one credit per data slot the peer has posted and sends only with a
// credit, so a send never finds no receive (which would fail a reliable
// connection). Reposted slots travel back as counts in the header of every
// message; a rank that has nothing to send returns them in a credit
// message, sent into a control slot, once half the slots wait.
//
// A frame up to EagerBytes travels in one send. A larger one stays in the
// sender's memory, registered, and a request to send (rts) tells the
// receiver where: the receiver asks its handler for the frame's place
// ([sdi.Placer]), registers it, reads the payload straight into it in
// pieces of the provider's largest message, delivers the frame and answers
// with a fin, on which the sender reports the frame complete. Frames of a
// connection are delivered in order: while a read runs, later frames wait
// behind it, and a read starts only at the head, where its delivery would
// be, so places are asked for in order too.
//
// # Connections
//
// A rank's business card wraps its provider's with its rank and a tag
// keyed by the job's secret, so Connect turns away a card of another job
// or rank at once. Connect dials; the request carries both ranks and a MAC
// keyed by the secret, so a stranger that forged a card is refused too.
// When two ranks dial each other at once, the lower rank's connection
// wins: it refuses the higher rank's request, and the higher rank waits
// for the lower rank's. A refused rank waits a while and asks again until
// its context ends: between ranks of one job a refusal only means "not
// now" (a crossing request, or a connection the peer has yet to find dead).
//
// A peer has one connection at a time. A connection fails on any failed
// work; its endpoint is closed so all its work flushes, and only when the
// last of it has completed is the peer reported down, and only then may a
// new connection to the peer begin: no read writes into a place after the
// report, and no place of a new connection is ended by the old one's
// report. Frames the peer was still to read fail with their SendDone. A
// rank that dials while its peer still holds a connection tells the peer
// that connection is dead. Disconnect and Close say goodbye first, so the
// peer drops the connection without reporting a failure, unless a place
// was being filled. The goodbye follows the fins still owed for frames
// read and delivered, which may wait for the peer's credits: the peer fails
// every frame it has heard no fin for when the goodbye comes.
//
// # Progress
//
// A goroutine drains the completion queue and, when it is empty, arms it
// and sleeps in the provider's Wait, so an idle rank burns no CPU. A
// waiting rank drives the same work through Poll ([sdi.Poller]); whoever
// holds the progress lock handles completions, and Handler calls are made
// with no lock of a peer held.
package rdma
