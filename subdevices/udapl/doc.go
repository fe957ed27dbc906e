// Package udapl is the uDAPL subdevice: it carries sdi frames between ranks
// over an RDMA interface adapter reached through the DAT 2.0 API (uDAPL,
// libdat2), on InfiniBand, iWARP or RoCE, wherever /etc/dat.conf lists a
// provider for the adapter.
//
// The subdevice is the RDMA engine of package internal/rdma (credits,
// eager receive slots, RDMA reads for large frames) over a provider that
// maps the engine's primitives onto DAT: dat_ia_open, one protection zone,
// one DTO EVD for the completions of every endpoint, a public service point
// for connection requests, an RC endpoint per connection, dat_lmr_create
// for registered memory, and dat_ep_post_send, _recv and _rdma_read for the
// work.
//
// # Usage
//
// The package registers itself as "udapl" with [sdi.Register]; import it
// for its side effect, or call [New]. In plugins.hcl:
//
//	subdevice "udapl" {
//	  config { ia = "ofa-v2-ib0" }
//	}
//
// # Building
//
// The DAT code needs cgo and the uDAPL headers and library, so it is behind
// a build tag:
//
//	apt-get install libdapl-dev   # /usr/include/dat2, libdat2; libdapl2 brings /etc/dat.conf
//	go build -tags udapl ./...
//
// Without the tag (the default, which needs nothing installed) the
// subdevice is still registered, but its Open fails with an error wrapping
// [rdma.ErrNoDevice] that says to rebuild with -tags udapl. A job that
// names the built-in stops with that message; one that names the plugin
// binary (cmd/sdi-udapl) skips it with a warning and routes over the other
// subdevices. With the tag, an adapter that
// cannot be opened (no /etc/dat.conf entry of that name, no device, the
// interface down) gives such an error too, naming the IA and the DAT
// return code. The DAT library itself may also print a line to stderr then.
//
// # Configuration
//
// The plugins.hcl block, as JSON; every key is optional and unknown keys
// are refused:
//
//   - ia: the interface adapter, by its name in /etc/dat.conf (or in the
//     file $DAT_OVERRIDE names). Default: the registry's first entry, or
//     "ofa-v2-ib0" when the registry is empty. Use a cma ("ofa-v2-ib0") or
//     scm ("ofa-v2-mlx4_0-1") entry: the ucm and mcm providers address
//     endpoints by InfiniBand LID and queue pair, which the card does not
//     carry, and Open refuses them.
//   - port: the connection qualifier to listen on, 1 to 65535 (the cma and
//     scm providers use it as an RDMA CM or TCP port). Default: the first
//     free one from 47000 up, so that the ranks of a host take 47000,
//     47001, ...
//   - eager_bytes, recv_slots: the engine's eager slot size and receive
//     slots per connection ([rdma.Settings]; defaults 8 KiB and 32).
//   - exclusivity: routing preference when several subdevices reach a peer.
//     Default 15: above tcp (10), below verbs (20), which drives the same
//     hardware without the DAT layer.
//
// # Business card
//
// The card is 0xDA, a version byte (1), then the IA address that
// dat_ia_query reports and the connection qualifier, in the binary form of
// [net/netip.AddrPort]: 8 bytes for IPv4, 20 for IPv6.
//
// # Limits
//
// Each endpoint has send and receive queues of twice recv_slots, at least
// 128, at most the adapter's max_dto_per_ep, and up to 16 RDMA reads in
// flight each way. The shared completion EVD holds 65536 events or the
// adapter's max_evd_qlen, which bounds the connections a rank can have
// (about 800 at the default recv_slots). A message is at most the adapter's
// max_message_size and max_rdma_size, and 1 GiB. Connection requests carry
// 55 bytes of the engine's private data: the 56 every provider delivers,
// less a length byte, since InfiniBand pads the data to 56 bytes.
//
// # Concurrency and waiting
//
// DAT cannot wake a thread waiting on an EVD from another thread, so the
// provider waits in slices: its listener and connection goroutines in
// 20 ms slices (Close takes up to that long), and Wait in 5 ms slices, which
// is also how soon it notices completions the provider makes itself.
// dapl refuses to dequeue an EVD another thread is waiting on, so Poll
// returns only completions the provider holds while Wait is waiting; the
// event Wait takes is kept and polled first. Closing an endpoint
// disconnects it and frees it shortly after on the connection goroutine;
// its remaining work completes, flushed, then.
//
// # Asynchronous errors
//
// What no completion reports arrives on the IA's async EVD, which the
// connection goroutine drains every slice (DAT has no acknowledgement;
// an event dequeued is an event dealt with):
//
//   - DAT_ASYNC_ERROR_EP_BROKEN and _TIMED_OUT fail that connection only:
//     the endpoint is disconnected, its work completes at once, flushed,
//     with the event as the reason (the engine reports the peer down with
//     it), and the peer is told when the endpoint is freed. dapl names
//     the IA in these events, not the endpoint, so where the event names
//     no endpoint the connected ones that dat_ep_get_status reports in
//     DAT_EP_STATE_ERROR are taken for broken.
//   - DAT_ASYNC_ERROR_IA_CATASTROPHIC, _PROVIDER_INTERNAL_ERROR and
//     _EVD_OVERFLOW (of any EVD of the IA: completions or connection
//     events were lost) fail the whole subdevice, as do a completion EVD
//     that cannot be dequeued or waited on, and a connection, connection
//     request or async EVD that keeps failing (three waits in a row). The
//     completion EVD is not read again; every connection is disconnected
//     and its work flushed; Connect, Send and Register return an error
//     naming the IA and the event. Close still closes.
//   - A connection EVD's DAT_CONNECTION_EVENT_BROKEN and _TIMED_OUT end
//     that connection as a disconnect does.
//
// dapl maps a port going down (IBV_EVENT_PORT_ERR), and in some versions
// a LID, P_Key or SM change, to DAT_ASYNC_ERROR_IA_CATASTROPHIC: there a
// port flap fails the subdevice, and the multidevice routes around it.
//
// # Not verified here
//
// This package was written from the DAT 2.0 headers and the OFED dapl
// sources, on a machine without RDMA hardware. What runs in its tests there
// is the configuration, the card and its fuzzing, the DAT return code
// decoding, the work request bookkeeping, and the refusal to open without
// a device. The tests that move data (TestLoopback and the others that
// open an adapter) skip unless an IA opens: run them with -tags udapl on a
// host with a configured adapter before relying on the subdevice. Without
// one they run against testdata/fakedat, an in-memory libdat2 that follows
// dapl where the provider depends on it (its header says how to build and
// use it); that checks the provider against what its authors believe DAT
// does, not against a device. Unverified on hardware in particular: what
// real providers do on disconnect (whether dat_ep_free drops completions;
// the provider makes its own flushes so that it does not matter), the
// private data sizes they deliver, IPv6 IA addresses, which the cma
// provider of OFED dapl 2.1 does not dial, and the asynchronous errors:
// the fake injects them as dapl 2.1's source says it reports them, but
// which events a device raises when, whether a broken endpoint's peer
// hears of it when dat_ep_free destroys the connected CM id (the fake
// assumes so), and whether dat_ep_disconnect and dat_ep_free still work
// on an IA that reported itself dead, only hardware can tell.
//
// Known gaps, from a review against dapl 2.1's source:
//   - The default IA is the registry's first entry; Debian's stock
//     /etc/dat.conf starts with an mlx4 scm entry, which fails on newer
//     (mlx5) adapters. Name the IA with the ia key there.
//   - dapl cma's abrupt disconnect polls for the peer's reply up to 25
//     times 10 ms apart, inside Endpoint.Close and inside dat_evd_dequeue
//     when a completion has an error status: a Poll can stall up to
//     ~240 ms for each endpoint that fails.
//   - dapl cma connects with rnr_retry_count 7 (retry for ever), which DAT
//     cannot change: a send that found no receive posted would hang rather
//     than fail the connection. The engine's credits prevent such a send.
//   - An idle provider wakes every 5 ms (Wait's slice) and its listener
//     and connection goroutines every 20 ms: DAT has no pollable fd. An
//     asynchronous error is therefore acted on up to 20 ms after it came.
//   - An asynchronous endpoint error that names the IA (dapl's way) when
//     no connected endpoint is in DAT_EP_STATE_ERROR is only logged: the
//     endpoint it concerns was still connecting (its Dial or Accept fails
//     on its own) or its connection had ended already.
//   - A flush the device reports before the asynchronous error that
//     caused it fails the connection with a plain flush as the reason,
//     not the event.
package udapl
