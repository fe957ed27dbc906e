package sdi

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// APIVersion is the SDI version this package defines. Subdevices list the
// versions they speak in [Info.APIVersions]; the multidevice passes the one it
// chose back in [OpenParams.APIVersion].
const APIVersion = "v1.0"

// Rank is a peer's identity within the job (its rank in the world). A
// subdevice never sees communicators.
type Rank int32

// Info is a subdevice's static identity. Obtaining it has no side effects.
type Info struct {
	Name        string   // "tcp", "shm", ...; the name plugins.hcl and connection tables use
	Version     string   // the subdevice's own version, independent of the SDI version
	APIVersions []string // SDI versions it speaks, e.g. "v1.0"
}

// Reach says which peers a subdevice can possibly connect to.
type Reach uint8

const (
	// ReachHost: only peers on the same host ([OpenParams.Host] equal).
	ReachHost Reach = iota + 1
	// ReachNetwork: peers on any host the network connects.
	ReachNetwork
)

func (r Reach) String() string {
	switch r {
	case ReachHost:
		return "host"
	case ReachNetwork:
		return "network"
	}
	return fmt.Sprintf("Reach(%d)", uint8(r))
}

// Flag is a set of capability bits in [Caps.Flags].
type Flag uint32

const (
	// FlagReliable: every accepted frame arrives once, or the peer is
	// reported down.
	FlagReliable Flag = 1 << iota
	// FlagOrdered: frames to one peer are delivered in the order Send
	// accepted them.
	FlagOrdered
	// FlagMatching: the subdevice matches messages itself and implements
	// [Matcher]. The multidevice then runs ANY_SOURCE by duplicated requests.
	FlagMatching
	// FlagPoll: the subdevice implements [Poller]; a rank that waits may
	// drive its progress on the waiting goroutine.
	FlagPoll
	// FlagJobCards: the subdevice implements [JobCards] and wants every
	// rank's business card before it connects to any.
	FlagJobCards
	// FlagIdle: the subdevice, which also sets FlagPoll, implements [Idler]:
	// its own progress stands by while it is polled, and a waiter that
	// stops polling says so instead of leaving it to a timeout.
	FlagIdle
)

// Has reports whether all bits of g are set in f.
func (f Flag) Has(g Flag) bool { return f&g == g }

// MinHeader is the smallest [Caps.MaxHeader] the multidevice can use: its
// own header, which travels as the opaque header of every frame, takes up
// to 64 bytes (multidevice/header.go). A subdevice that publishes less
// passes [Caps.Validate], yet the multidevice refuses it at Open (a plugin
// is left out of the job, a built-in fails it), so it never carries a
// message; sdi/sditest fails it.
const MinHeader = 64

// Caps are the limits and hints a subdevice publishes from Open. Routing reads
// them; it never probes behaviour. A sender sizes frames by its own Caps, so
// every rank of a job that opens a subdevice with the same configuration must
// publish the same limits.
type Caps struct {
	MaxHeader   int           // largest opaque header per frame; at least MinHeader for the multidevice to use it
	MaxEager    int           // largest message the multidevice sends eagerly; <= MaxFrame
	MaxFrame    int           // largest payload of one frame
	Exclusivity uint32        // higher wins when several subdevices reach a peer
	Latency     time.Duration // nominal one-way latency, for routing
	Bandwidth   uint64        // nominal bytes/s, for routing and striping
	Reach       Reach
	Flags       Flag
}

// Validate reports caps that break the contract.
func (c Caps) Validate() error {
	switch {
	case c.MaxHeader <= 0:
		return fmt.Errorf("sdi: caps: MaxHeader %d must be > 0", c.MaxHeader)
	case c.MaxFrame <= 0:
		return fmt.Errorf("sdi: caps: MaxFrame %d must be > 0", c.MaxFrame)
	case c.MaxEager < 0 || c.MaxEager > c.MaxFrame:
		return fmt.Errorf("sdi: caps: MaxEager %d must be in [0, MaxFrame=%d]", c.MaxEager, c.MaxFrame)
	case c.Reach != ReachHost && c.Reach != ReachNetwork:
		return fmt.Errorf("sdi: caps: Reach %v is neither host nor network", c.Reach)
	}
	return nil
}

// Frame is one outbound active message.
//
// The subdevice may keep Header and Payload until it reports completion for
// Token through [Handler.SendDone]; the caller must not modify either before
// then.
type Frame struct {
	Peer    Rank
	Header  []byte // opaque to the subdevice; at most Caps.MaxHeader bytes
	Payload []byte // at most Caps.MaxFrame bytes
	Token   uint64 // echoed in Handler.SendDone
}

// Handler is implemented by the multidevice and passed to Open.
//
// Methods are called from goroutines the subdevice owns. They must not block
// and must not call back into the SubDevice synchronously. For one peer,
// Deliver calls are serialized, and in send order if Caps.Flags has
// FlagOrdered.
type Handler interface {
	// Deliver hands over one arriving frame. header and payload are valid
	// only during the call; the handler copies what it keeps.
	Deliver(from Rank, header, payload []byte)
	// SendDone reports that a frame Send accepted with done=false is
	// locally complete (its buffers may be reused), with err non-nil if it
	// was not sent. It is called exactly once per such frame.
	SendDone(token uint64, err error)
	// PeerDown reports that the subdevice lost its connection to peer.
	PeerDown(peer Rank, err error)
}

// OpenParams configure a subdevice.
//
// Site is the launcher's name for the cluster of hosts this rank's host
// belongs to, "" if none was given. Hosts of one site share their private
// networks: a subdevice may use a private range that another site numbers
// alike between hosts of one site. Between hosts of different sites a
// private network may be one network (a routed campus network, a VPN) or
// the same numbering on two, so a subdevice uses it only when nothing else
// reaches the peer, and never one that another site numbers alike.
type OpenParams struct {
	Rank       Rank
	Size       int          // ranks in the job
	Host       string       // the launcher's name for this rank's host
	Site       string       // the launcher's name for this host's cluster; "" if none given
	JobID      string       // unique per job; names shared resources
	Secret     []byte       // per-job secret; peers that cannot show it are refused
	APIVersion string       // the SDI version chosen from Info.APIVersions
	Config     []byte       // the subdevice's config block from plugins.hcl, as JSON; may be empty
	Handler    Handler      // receives frames and completions; never nil
	Logger     hclog.Logger // named for the subdevice; never nil
}

// Local is what Open returns.
type Local struct {
	Addr []byte // business card: published to peers, who pass it to Connect
	Caps Caps
}

// SubDevice is a transport under the multidevice.
//
// Implementations are safe for concurrent use by multiple goroutines: the
// multidevice calls Send from many goroutines at once and Connect while
// frames flow to other peers.
//
// Lifecycle: Info (any time), Open (once), then Connect, Send, Flush,
// Disconnect in any order and concurrently, then Close (idempotent).
type SubDevice interface {
	// Info returns the static identity. It does not block and has no side
	// effects; it may be called before Open.
	Info(ctx context.Context) (Info, error)

	// Open binds local resources (a listening socket, a shared segment) and
	// returns this rank's business card and the effective Caps. It may block
	// until ctx is done.
	Open(ctx context.Context, p OpenParams) (Local, error)

	// Connect makes peer reachable using its business card. It may connect at
	// once or on first use. It blocks at most until ctx is done, and returns
	// an error wrapping ErrPeerUnreachable when the card is not usable from
	// here (another host for a host-local subdevice, a foreign job, a
	// refused connection).
	Connect(ctx context.Context, peer Rank, addr []byte) error

	// Disconnect flushes and releases the connection to peer.
	Disconnect(ctx context.Context, peer Rank) error

	// Send hands over one frame. It never blocks.
	//
	// It returns done=true when the frame is already locally complete: the
	// caller may reuse f.Header and f.Payload at once and no SendDone
	// follows (a shm ring that copied the frame). It returns done=false when
	// the frame is accepted but still in flight: the subdevice owns
	// f.Header and f.Payload until SendDone(f.Token, …), which follows
	// exactly once, never from within Send itself, though possibly from
	// another goroutine before Send has returned.
	//
	// On error nothing was accepted and no SendDone follows: ErrWouldBlock
	// (retry after a SendDone or a short wait), ErrTooLarge,
	// ErrNotConnected, ErrPeerUnreachable, ErrClosed.
	//
	// A frame that fails, here with any error but ErrWouldBlock or later
	// through SendDone, is the subdevice's loss of that peer to the
	// multidevice, as if PeerDown came with it: its messages to a peer are
	// numbered, and none after a missing one could be matched.
	Send(f *Frame) (done bool, err error)

	// Flush blocks until every frame accepted for peer is locally complete
	// (SendDone was called), or ctx is done.
	Flush(ctx context.Context, peer Rank) error

	// Close releases everything. Frames still pending get SendDone with
	// ErrClosed. Close is idempotent; after it every call returns ErrClosed.
	// No Handler method is called after Close returns.
	Close(ctx context.Context) error
}

// Poller is implemented by subdevices that set [FlagPoll]. It lets a rank
// that waits for a message drive the subdevice itself, which saves the
// wake-up of a parked goroutine (tens of microseconds) on every message.
//
// The progress model: a waiting rank calls Poll in a loop for a bounded time
// (busy-polling), then parks. While nobody polls, the subdevice's own
// goroutines carry on (a futex, the netpoller) so that an idle rank burns no
// CPU and still receives. Either way the [Handler] rules hold: for one peer
// Deliver calls stay serialized and in order, so a subdevice that delivers
// from both a poller and its own goroutine must exclude the two per peer
// (or per receive queue).
type Poller interface {
	// Poll delivers frames that have arrived and reports sends that have
	// completed, calling the Handler on the calling goroutine. It never
	// blocks and returns how many frames and completions it handled. Calls
	// may come from several goroutines at once; a call that finds another
	// poller at work may return 0 at once. Handler methods called from Poll
	// follow the usual rules: they do not block and do not call back into
	// the SubDevice.
	Poll() int
}

// Idler is implemented by subdevices that set [FlagIdle]. A [Poller] whose
// own goroutines stand by while Poll calls keep coming (so that they do not
// take the CPU from the poller) must notice when polling stops; without a
// hint it can only guess from a pause, and a message that arrives in that
// gap waits for the guess.
type Idler interface {
	// Idle tells the subdevice that the calling goroutine stops polling
	// and is about to park: its own progress takes over at once. It does
	// not block. The next Poll call, from any goroutine, starts the
	// stand-by again. Other goroutines may still be polling when Idle is
	// called; the subdevice then merely stops standing by early.
	Idle()
}

// Placer may be implemented by a [Handler]. A subdevice that can write an
// arriving payload straight into its final place (a single copy from
// another process with process_vm_readv, an RDMA read) asks the handler
// where that place is before it moves the bytes, and so saves the copy out
// of a buffer of its own. A subdevice finds out whether its Handler
// implements Placer with a type assertion at Open.
type Placer interface {
	// Place returns the slice, exactly n bytes long, that the payload of
	// the arriving frame with this header goes into, or nil when the
	// handler has no place for it (the subdevice then delivers from a
	// buffer of its own as usual). header is valid only during the call.
	// If Place returns a slice, the subdevice fills all of it and then
	// calls Deliver(from, header, placed) with that same slice (the same
	// first element and length), or, if it cannot fill it, reports the
	// peer down; it does not deliver the frame another way. The handler
	// keeps the slice valid and untouched until that Deliver or that
	// report. A report of the peer down, for whatever reason, ends every
	// place given for the peer's frames: from then on the subdevice
	// writes nothing more into them and delivers none of those frames
	// (it reads the rest of such a frame elsewhere and drops it). A Close
	// that returns nil ends every place too; one that fails (its ctx
	// ended with a place still being filled) may leave such a place
	// being written, and the handler then never reuses it. The usual
	// Handler rules hold: Place does not block, it is called where Deliver
	// would be, and the Deliver that follows keeps its place in the order
	// of the peer's frames.
	Place(from Rank, header []byte, n int) []byte
}

// JobCards is implemented by subdevices that set [FlagJobCards]: they decide
// how to reach a peer from what the whole job published, not from the peer's
// card alone (a private IPv4 range that two sites both use is only found by
// comparing the cards of all hosts).
type JobCards interface {
	// SetJobCards hands over the card every rank published for this
	// subdevice, indexed by rank, nil where a rank did not open it. The
	// multidevice calls it once, after the exchange and before the first
	// Connect; the caller's own card is at its own rank. The subdevice
	// must not modify the slices.
	SetJobCards(ctx context.Context, cards [][]byte) error
}

// Factory makes an unopened subdevice.
type Factory func(logger hclog.Logger) SubDevice

// Matcher is implemented by subdevices that set [FlagMatching]: they carry
// the message envelope themselves and match arriving messages against
// receives the multidevice posts into them. The multidevice reaches it only
// after checking the flag.
//
// For an ANY_SOURCE receive the multidevice posts one copy of the receive
// into every matching subdevice and keeps one in its own queue; all copies
// share one [Claim]. A subdevice must win the claim (TryClaim) before it
// writes any byte into the buffer; when it loses, it treats the posted
// receive as gone and matches the message against the next one (or queues
// it as unexpected). A posted receive whose claim is already taken when it
// is posted or matched is dropped without calling Done.
type Matcher interface {
	// SendTagged hands over a message for peer with its envelope, with the
	// same non-blocking contract and completion rules as SubDevice.Send.
	SendTagged(m *TaggedMessage) (done bool, err error)
	// PostRecv posts a receive. Completion is reported through Done, called
	// once, from a subdevice goroutine, after the data is in Buf.
	PostRecv(r *PostedRecv) error
	// CancelRecv removes a posted receive that has not matched yet. It
	// reports whether the receive was removed; Done is not called for it.
	CancelRecv(id uint64) bool
	// Probe looks for an unexpected message matching the envelope without
	// receiving it.
	Probe(source Rank, tag int32, context uint64) (Envelope, bool)
}

// AnySource and AnyTag are the wildcards in envelopes passed to a Matcher.
const (
	AnySource Rank  = -1
	AnyTag    int32 = -1
)

// Envelope identifies a message for matching.
type Envelope struct {
	Source  Rank
	Tag     int32
	Context uint64
	Len     int // bytes of payload
}

// TaggedMessage is a message sent through a [Matcher].
type TaggedMessage struct {
	Peer    Rank
	Tag     int32
	Context uint64
	Payload []byte
	// Sync asks for synchronous-send completion: the subdevice reports
	// completion only after the receiver matched the message.
	Sync  bool
	Token uint64
}

// PostedRecv is a receive posted into a [Matcher].
type PostedRecv struct {
	ID      uint64
	Source  Rank  // or AnySource
	Tag     int32 // or AnyTag
	Context uint64
	Buf     []byte
	Claim   *Claim
	// Done is called once the message is in Buf (n bytes; truncated when the
	// message was longer than Buf) or the subdevice failed. env is the
	// matched message's envelope, or the zero Envelope when the subdevice
	// failed the receive before a message matched it.
	Done func(env Envelope, n int, err error)
}

// Claim is the one-shot token shared by the copies of a duplicated receive.
// The zero value is unclaimed. It is safe for concurrent use.
type Claim struct{ owner atomic.Int64 }

// TryClaim takes the claim for owner (any non-zero id) and reports whether it
// won. Exactly one caller ever wins.
func (c *Claim) TryClaim(owner int64) bool { return c.owner.CompareAndSwap(0, owner) }

// Owner returns the winner's id, or 0 while unclaimed.
func (c *Claim) Owner() int64 { return c.owner.Load() }
