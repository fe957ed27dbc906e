// Package tcp is the TCP subdevice: it carries sdi frames between ranks on
// any hosts an IP network connects, over IPv4 and IPv6.
//
// # Usage
//
// The package registers itself as "tcp" with [sdi.Register]; importing it is
// enough for the multidevice to find it. [New] makes an instance directly:
//
//	sd := tcp.New(logger)
//	local, err := sd.Open(ctx, sdi.OpenParams{Rank: r, Size: n, Host: host,
//		JobID: job, Secret: secret, Handler: h, Logger: logger})
//	// publish local.Addr; hand over every rank's card (Caps has FlagJobCards):
//	err = sd.(sdi.JobCards).SetJobCards(ctx, cards)
//	// then for every peer p:
//	err = sd.Connect(ctx, p, cards[p])
//	links := tcp.Links(sd, p) // the interface pairs in use
//	done, err := sd.Send(&sdi.Frame{Peer: p, Header: hdr, Payload: data, Token: tok})
//
// # Connections
//
// Each instance listens on one socket. A rank sends only on the connections
// it opened to a peer and receives only on the connections peers opened to
// it. Connect picks the interface pairs with package addrsel (see below)
// and opens one connection per pair, bound to the pair's local address, all
// at once, so a bad card, a closed port or a wrong secret is reported by
// Connect; pairs that fail are logged and left out as long as one connects.
// Reconnecting after Disconnect or after the peer went down opens a new
// session; the receiver delivers from it only after every connection of the
// old session from that rank has ended, which keeps a reconnect from
// overtaking the old stream. The receiver tells sessions apart by an id
// each Connect draws, not by arrival order: connections of two Connects
// that cross arrive interleaved, and each joins its own session, so a
// session only ever waits for sessions begun before it. A connection
// waiting for its turn is not read, but its socket is watched: one that
// ends before carrying a byte (the loser of two crossing Connects closes
// its connections as soon as the other installs its own) is closed at
// once, not when the session before it ends, and a session begun later
// still waits for every session begun before it. Deliver calls for one
// rank are serialized across its connections.
//
// # Address selection
//
// The business card lists every interface that is up, with its addresses
// and link speed, and the multidevice hands the subdevice every rank's card
// before it connects ([sdi.FlagJobCards], SetJobCards of
// [sdi.JobCards]). Connect weighs every pair of a local and a peer interface
// as Peiselt's thesis does (0 none; 1 private, same network, no collision;
// 2 public, same network; 3 public, routed) and takes a maximum-cardinality,
// maximum-weight matching: the most connections that share no interface at
// either end, then the best ones. Private ranges that several hosts of the
// job number alike (two clusters on 10.0.0.0/24, a docker0 bridge on every
// host) are found from all cards and not used between hosts that cannot be
// shown to share them: hosts that name one site ([sdi.OpenParams.Site]),
// or, where the launcher names none, hosts that share another network.
// Between hosts that name different sites a private network is only a
// fallback, even without a collision. IPv6 link-local addresses are used
// only on a link that another network on the same two interfaces shows to
// be shared, and are dialed with the local interface as zone. A connection
// whose address pair fails, or has not completed the handshake within
// 300 ms (less where connect_timeout is short), goes on to the other pairs
// of the same two interfaces that would do (IPv4 where a firewall drops
// IPv6, say), all within one connect_timeout. Loopback is
// used only between ranks with the same [sdi.OpenParams.Host], and then
// alone. When no pair qualifies, the fallbacks (private addresses on
// different networks, facing a public one, or across named sites) are
// tried in case they route; when nothing is left, Connect fails with an error
// wrapping [sdi.ErrPeerUnreachable] that lists every interface pair
// considered and why it was refused. The lower rank's interfaces are the
// left side of the matching at both ends, so both choose the same pairs.
// Package addrsel has the details. [Links] shows which pairs a rank uses,
// and the pairs, refusals and connections are logged at Debug.
//
// # Striping
//
// Frames to a peer with several connections are spread over them. Frames up
// to MaxEager go on the first connection; larger ones go to the connection
// furthest behind its share of the bytes, shares following link speed when
// every connection's interfaces report one (/sys/class/net/<if>/speed) and
// even otherwise; a connection whose queue is full is skipped, so a slower
// path takes less. Frames on different connections may arrive out of order,
// so [sdi.FlagOrdered] is set only with max_connections 1: the multidevice
// orders messages by its own per-peer sequence numbers and places
// rendezvous blocks by offset. Losing any connection of a peer reports the
// peer down once.
//
// # Business card
//
// [sdi.Local.Addr] is a versioned binary card (layout in card.go): the rank,
// a tag derived from the job id, the port, the host name from
// [sdi.OpenParams.Host], the site from [sdi.OpenParams.Site] when the
// launcher names one (hosts that name one site may use a private network
// that another site numbers alike), and the interfaces that are up (loopback
// included), each with its name, link speed in Mbit/s (0 where the system
// does not report one) and addresses with prefix lengths. An address's
// family and scope follow from the address. A listener bound to one address
// publishes only that address. A card with an empty host name is treated as
// a host of its own, identified by its addresses. Unknown extension records
// at the end of a card are skipped, so later versions can add data without
// breaking older readers; a card of another version is refused with an error
// that says so.
//
// # Handshake
//
// The acceptor sends a random nonce; the connector answers with its rank,
// its session and connection number, a nonce of its own and an HMAC-SHA256
// with the secret over the nonce, the job id and all of those; the
// acceptor checks the MAC in constant time and the rank against the job
// size, and answers with its own rank and an HMAC over the connector's nonce,
// which Connect checks so it never sends to the wrong process. A connection
// that fails any check, or stays silent past connect_timeout, is closed and
// the reason logged at Warn with the remote address. At most 64 handshakes
// run at once; further connections are dropped until a slot frees.
//
// # Framing and flow control
//
// Every frame is an [sdi.WireHeader] followed by the opaque header and the
// payload. When nothing is queued on the connection and nobody is writing
// to it, Send writes the frame itself: wire header, header and payload in
// one non-blocking writev straight from the caller's buffers. If the socket
// takes it all, Send returns done=true and no SendDone follows. If the
// socket fills up first, what is left (still the caller's buffers, never a
// copy) goes to the front of the connection's queue and Send returns
// done=false. Queued frames are written, up to 64 frames per writev, by
// whoever polls (see Progress) or, while nobody does, by a writer
// goroutine per connection that waits in Go's netpoller while the socket
// is full; whoever writes a frame reports its SendDone, one writer at a
// time, so completions come in send order. The queue is bounded by
// queue_bytes (counting wire header, header and payload of every frame
// accepted but not yet written), per connection: Send returns
// [sdi.ErrWouldBlock] while the queue holds queue_bytes or more, and
// otherwise accepts a frame of any size up to MaxFrame. Memory per peer is
// thus at most queue_bytes plus one frame, and a large frame is never
// starved by a stream of small ones.
// A write error fails the frame being written and every queued frame with
// an error wrapping [sdi.ErrPeerUnreachable] and reports
// [sdi.Handler.PeerDown]; so does the peer closing the connection, noticed
// even while nothing is being sent. PeerDown concerns the ranks this
// instance connected to: a peer's own connection to us ending is logged, not
// reported, since that peer may simply have disconnected. A failure belongs
// to the session (one Connect's connections) it happened on: once a
// Connect replaced a session whose connection failed before that was
// reported, the old session's connections still fail their frames, but
// the peer is not reported down for them and the new session is left
// alone; the same holds after Disconnect.
//
// Inbound frames are parsed with non-blocking reads (see Progress): small
// frames are batched through a 64 KiB read buffer and delivered from it;
// larger ones are read past it, straight into the place the handler names
// for the payload when it implements [sdi.Placer] (the receive buffer, so
// the payload is copied once, from the socket, and not again by the
// handler), and into one reusable frame buffer otherwise; after a large
// frame, the read for the next wire header asks only for the headers, so
// no part of a following large payload is copied twice. If a stream ends
// inside a frame being placed, the peer is reported down, and our own
// connection to it ends too unless it was made after the place was given
// (a newer session, which the failed frame does not concern). Each wire
// header is checked with [sdi.DecodeWireHeader] before the body is read,
// so a claimed length beyond the limits is never allocated. A malformed frame
// closes that connection only, with a Warn naming the peer, its address and
// what was wrong.
//
// Acknowledgements: a connection we only read from looks one-way to the
// kernel, which then sends a bare ACK from inside every read that empties
// the socket after a small segment; on loopback that is a whole transmit
// and its processing, on the message's path. So the read buffer is filled
// with peeks (MSG_PEEK with SO_PEEK_OFF, Linux 6.10 on; plain reads on
// older kernels) that leave the bytes in the socket, and the next drain
// of the connection, or its reader before it waits, discards them without
// a copy (MSG_TRUNC): the ACK goes out once the handler has the frames.
// Peeked bytes count against the receive buffer, so more than 16 KiB of
// them are discarded before the next peek. The inbound socket is also
// kept in the kernel's ping-pong mode (TCP_QUICKACK off, renewed every 64
// frames because the kernel leaves that mode after an idle gap), which
// halves the ACKs that remain.
//
// # Congestion control
//
// A connection over loopback sends with cubic (reno where cubic is not
// allowed) whatever the system's default, unless congestion_control says
// otherwise. Loopback has no bottleneck to estimate and no queue to keep
// short, so BBR, the default on many hosts, only costs there: its pacing
// spreads a large frame's segments over timers, and 1 MiB streams between
// two ranks of one host ran at 0.73-0.88 times the speed they reach with
// cubic (medians of paired ratios, three runs of 10-16 interleaved
// repetitions). Other networks keep the system's default, which their
// administrators chose.
//
// # Progress
//
// The subdevice sets [sdi.FlagPoll]: a rank that waits for a message calls
// Poll ([sdi.Poller]) in a loop, and Poll writes what is queued for its
// peers while their sockets take it, reads the inbound connections with
// non-blocking reads, and delivers the frames and completions, all on the
// calling goroutine, so no goroutine wakes up on a message's path and a
// large send progresses on the rank that waits for it. With up to four
// inbound connections Poll reads each; with more it first asks an epoll
// set of them (level-triggered, one epoll_wait with no timeout) which have
// something, and reads those, so an idle peer costs a polling rank nothing
// (pollset.go). Each connection has
// a lock over its parse state; Poll takes it with TryLock and skips a
// connection somebody else is reading, and it delivers at most 64 frames
// per connection per call. Deliver calls for one rank stay serialized
// across pollers, readers and connections.
//
// Each inbound connection also has a reader goroutine for the time nobody
// polls. After the handshake the subdevice takes the socket out of Go's
// netpoller (it keeps a duplicate of the descriptor and closes the
// net.Conn): the netpoller keeps one epoll set for the whole process with
// an idle thread blocked in it, and data arriving on any socket in that set
// wakes that thread, whether or not a goroutine waits for it; on a machine
// with few cores that wake-up took a polling rank's core on every message
// and doubled the latency. Instead a reader waits on a channel fed by one
// goroutine per instance that waits for the instance's own epoll set, where
// its socket is armed one-shot for each wait; that goroutine waits for the
// set in the netpoller (the set itself is pollable, and becomes readable
// only when an armed socket fires), never in a blocking epoll_wait, which
// would hold the processor of a rank bound to one CPU for up to 10 ms
// each time it went back to wait. Then the reader takes the lock and
// delivers what has arrived. While Poll calls keep coming, the readers
// stand by on another channel instead: a reader woken while pollers work
// leaves its socket unarmed, so at most one wake-up per connection marks
// the start of a polling phase, not every frame. The writer goroutines
// stand by too, leaving queued frames to the pollers. The subdevice sets
// [sdi.FlagIdle]: a poller about to park calls Idle ([sdi.Idler]), which
// ends stand-by at once. For pollers that never call Idle, a watcher
// goroutine ends it when a whole nap passes without a Poll call: 500 µs
// (shorter than the multidevice's 2 ms of polling before it parks) until
// some poller called Idle, 5 ms after, when the nap is only a safety net
// and a long one spares the watcher a wake-up every 500 µs of polling.
// The readers then drain what the pollers left in the read buffer and wait
// for their sockets again, and the writers write what is queued, so an
// idle rank burns no CPU and still receives and sends.
//
// Outbound connections stay in Go's netpoller (the writer waits there for
// a full socket, and nothing arrives on a send-only connection to wake
// it); the writes of Send and Poll go through [syscall.RawConn.Control],
// which pins the descriptor against a concurrent Close for the call and
// does not queue behind the writer parked on the same connection. Reads
// and writes of at most 64 KiB on the non-blocking sockets skip the Go
// scheduler's system-call bookkeeping (RawSyscall), which a poll loop would
// pay on every round. The package needs Linux (epoll).
//
// # Capabilities
//
//	MaxHeader   256 bytes
//	MaxEager    64 KiB
//	MaxFrame    1 MiB
//	Exclusivity 10 (below shm)
//	Latency     25µs, Bandwidth 1.25 GB/s (nominal 10 Gbit/s Ethernet)
//	Reach       network
//	Flags       reliable, job cards, poll, idle; ordered with max_connections 1
//
// # Configuration
//
// The config block from plugins.hcl arrives as JSON; unknown keys are errors.
//
//	listen           host:port to listen on. Default: every address of both
//	                 families ("[::]:0", dual-stack), or "0.0.0.0:0" where
//	                 the host has no IPv6. "127.0.0.1:0" or "[::1]:0" keep a
//	                 job on one host off the network.
//	connect_timeout  Go duration bounding each lane's dials plus handshake
//	                 in Connect, its alternate address pairs included, and a
//	                 stranger's handshake on the listener.
//	                 Default "10s". A shorter link_timeout bounds the dial
//	                 too: the kernel gives up the connection attempt then.
//	queue_bytes      send queue bound in bytes per connection, 1 to 1 GiB.
//	                 Default 4 MiB.
//	include          interfaces to publish: names, shell patterns ("eth*")
//	                 or CIDRs ("10.1.0.0/16", "2001:db8::/32"). When set,
//	                 only addresses on a named interface or inside a listed
//	                 CIDR go on the card; loopback stays unless excluded.
//	                 Default: every interface that is up.
//	exclude          the same forms; matching addresses never go on the
//	                 card, e.g. ["docker0", "virbr*", "172.16.0.0/12"].
//	max_connections  connections to one peer at most, 0 to 64; 0 (default)
//	                 opens one per matched interface pair, 1 keeps a single
//	                 ordered connection.
//	congestion_control
//	                 the TCP congestion control of the connections this
//	                 rank opens (the ones it sends on). "auto" (default):
//	                 cubic over loopback, or reno where cubic is not
//	                 allowed, and the system's default on every other
//	                 network. "system": the system's default everywhere.
//	                 An algorithm's name ("cubic", "bbr", ...): that one
//	                 everywhere; Open fails, saying what is available and
//	                 allowed, when the kernel refuses it. [Link] shows what
//	                 each connection got.
//	link_timeout     Go duration: a connection whose peer acknowledges
//	                 neither data nor keepalive probes for this long is
//	                 dead, and its peer reported down, so that a failover
//	                 route takes over (TCP_USER_TIMEOUT, and keepalive
//	                 probes from a third of it on, on every connection).
//	                 Default "30s"; "0s" leaves the system's limits, about
//	                 15 minutes of retransmissions and none for a
//	                 connection that only reads (see linktimeout.go).
//	                 TCP_USER_TIMEOUT also ends a connection whose peer,
//	                 though alive, reads nothing for this long while data
//	                 waits for it (its window stays shut): a rank stopped
//	                 in a debugger or by SIGSTOP for longer is reported
//	                 down by the ranks that had frames for it. Raise
//	                 link_timeout while debugging.
//
// # Close
//
// Close does not flush; it closes the listener and every connection, fails
// queued frames with [sdi.ErrClosed] and waits for all goroutines, so no
// Handler method runs after it returns. Frames already reported complete were
// handed to the kernel and still reach a live peer.
//
// # Logging
//
// Only through the injected go-hclog logger. Connection events are at Debug,
// dropped strangers, malformed frames and lost connections at Warn or Info,
// and per-frame events at Trace, checked with IsTrace first.
package tcp
