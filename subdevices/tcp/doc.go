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
//	// publish local.Addr; for every peer p with card c:
//	err = sd.Connect(ctx, p, c)
//	done, err := sd.Send(&sdi.Frame{Peer: p, Header: hdr, Payload: data, Token: tok})
//
// # Connections
//
// Each instance listens on one socket. A rank sends only on the connection it
// opened to a peer and receives only on the connections peers opened to it,
// so every direction of every pair is one ordered byte stream and per-peer
// FIFO order ([sdi.FlagOrdered]) needs no sequence numbers. Connect dials at
// once (not on first use), so a bad card, a closed port or a wrong secret is
// reported by Connect. Reconnecting after Disconnect or after the peer went
// down opens a new stream; the receiver delivers from it only after the old
// stream from that rank has ended, which keeps delivery ordered and
// serialized.
//
// # Business card
//
// [sdi.Local.Addr] is a versioned binary card (layout in card.go): the rank,
// a tag derived from the job id, the port, the host name from
// [sdi.OpenParams.Host], and the addresses to try, each with its interface's
// prefix length: 127.0.0.1 and ::1 (where present), then the addresses of
// every interface that is up, except link-local ones. A listener bound to one
// address publishes only that address. A peer whose Host equals ours tries
// loopback first; a peer on another host skips loopback. Unknown extension
// records at the end of a card are skipped, so later versions can add data
// (for smarter multi-NIC address selection) without breaking older readers.
//
// # Handshake
//
// The acceptor sends a random nonce; the connector answers with its rank, a
// nonce of its own and HMAC-SHA256(secret, nonce || job id || rank); the
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
// payload. A writer goroutine per peer writes everything queued with one
// writev and then reports SendDone for each frame, so Send always returns
// done=false. The queue is bounded by queue_bytes (counting wire header,
// header and payload of every frame accepted but not yet written): Send
// returns [sdi.ErrWouldBlock] while the queue holds queue_bytes or more, and
// otherwise accepts a frame of any size up to MaxFrame. Memory per peer is
// thus at most queue_bytes plus one frame, and a large frame is never
// starved by a stream of small ones.
// A write error fails the frame being written and every queued frame with
// an error wrapping [sdi.ErrPeerUnreachable] and reports
// [sdi.Handler.PeerDown]; so does the peer closing the connection, noticed
// even while nothing is being sent. PeerDown concerns the ranks this
// instance connected to: a peer's own connection to us ending is logged, not
// reported, since that peer may simply have disconnected.
//
// A reader goroutine per accepted connection checks each wire header with
// [sdi.DecodeWireHeader] before reading the body into one reusable buffer,
// so a claimed length beyond the limits is never allocated. A malformed
// frame closes that connection only, with a Warn naming the peer, its
// address and what was wrong.
//
// # Capabilities
//
//	MaxHeader   256 bytes
//	MaxEager    64 KiB
//	MaxFrame    1 MiB
//	Exclusivity 10 (below shm)
//	Latency     25µs, Bandwidth 1.25 GB/s (nominal 10 Gbit/s Ethernet)
//	Reach       network
//	Flags       reliable, ordered
//
// # Configuration
//
// The config block from plugins.hcl arrives as JSON; unknown keys are errors.
//
//	listen           host:port to listen on. Default: every address of both
//	                 families ("[::]:0", dual-stack), or "0.0.0.0:0" where
//	                 the host has no IPv6. "127.0.0.1:0" or "[::1]:0" keep a
//	                 job on one host off the network.
//	connect_timeout  Go duration bounding each address's dial plus handshake
//	                 in Connect, and a stranger's handshake on the listener.
//	                 Default "10s".
//	queue_bytes      per-peer send queue bound in bytes, 1 to 1 GiB.
//	                 Default 4 MiB.
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
