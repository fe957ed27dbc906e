// Package verbs is the InfiniBand and RoCE subdevice: it carries sdi frames
// between ranks over RDMA, through libibverbs for the data path and the
// RDMA connection manager (librdmacm) for addressing and connection setup.
//
// The SDI protocol itself (credits, eager receive slots, RDMA reads for
// large frames) is run by the engine in internal/rdma; this package is the
// engine's rdma.Provider for verbs devices: it opens a device port, connects
// reliable-connected (RC) queue pairs, registers memory, posts work
// requests and reports their completions.
//
// # Usage
//
// The package registers itself as "verbs" with [sdi.Register]; importing it
// is enough for the multidevice to find it. [New] makes an instance
// directly. A plugins.hcl block configures it:
//
//	subdevice "verbs" {
//	  config {
//	    device = "mlx5_0"
//	    port   = 1
//	  }
//	}
//
// # Building
//
// The provider uses cgo and is built only with the verbs tag:
//
//	apt-get install libibverbs-dev librdmacm-dev
//	go build -tags verbs ./...
//
// A binary built without the tag (or without cgo) still registers "verbs",
// but its Open fails with an error wrapping rdma.ErrNoDevice that says how
// to rebuild. A job that names the built-in stops with that message; one
// that names the plugin binary (cmd/sdi-verbs) skips it with a warning and
// routes over the other subdevices, which suits clusters where only some
// hosts have the hardware. Running
// needs the libibverbs1, librdmacm1 and ibverbs-providers packages, the
// rdma_ucm kernel module, and a locked-memory limit (ulimit -l) large
// enough for the registered buffers.
//
// # Configuration
//
// All keys are optional; an empty block means all defaults.
//
//	device       RDMA device name, e.g. "mlx5_0" (default: the first device,
//	             by name, with an ACTIVE port)
//	port         device port, 1-255 (default: the device's first ACTIVE port,
//	             which is 1 on a single-port adapter)
//	address      IP address to listen on, which must belong to the device
//	             port's network interface (default: the first IPv4 address of
//	             that interface, else its first IPv6 address that is not
//	             link-local; the interface is found in sysfs, from the port's
//	             GID table on RoCE or the adapter's IPoIB interfaces on
//	             InfiniBand)
//	eager_bytes  payload of one eager receive slot (default 8192)
//	recv_slots   receives each connection keeps posted (default 32)
//	exclusivity  routing priority (default 20: above tcp's 10, below shm's 50)
//
// Unknown keys are errors. With address set and device or port unset, the
// device and port are the ones the address belongs to.
//
// # Connections
//
// Open binds a connection manager listener to the address on an ephemeral
// port and publishes address and port as the business card (see card.go
// for the layout). Dial resolves the peer's card to a route from the
// listener's own address, so connections leave through the configured
// port, creates the queue pair on the provider's shared protection domain
// and completion queue, lets the engine post its receives, and sends the
// connection request with the engine's private data (at most 55 bytes).
// The peer's provider hands the request to its engine, which accepts or
// rejects it. A consumer reject makes Dial fail with rdma.ErrRejected; a
// request to a port nobody listens on fails without it. A send that finds
// no receive posted fails the connection at once (RNR retry count 0).
//
// One completion queue serves all connections, for sends and receives
// alike; Wait sleeps in the Go netpoller on its completion channel, and the
// connection manager's events and the device's asynchronous events are
// read the same way, so no OS thread is parked in a blocking verbs call.
//
// # Failures
//
// A connection fails when its work completes with an error, when the
// connection manager reports it ended, or when the device reports its
// queue pair broken with an asynchronous event (IBV_EVENT_QP_FATAL,
// QP_REQ_ERR, QP_ACCESS_ERR), which may come with no failed completion:
// the queue pair is moved to error so its work flushes, and the peer is
// disconnected, so both ends report each other down, this end giving the
// event as the reason. The other connections carry on.
//
// The provider fails as a whole when its completion queue is in error
// (IBV_EVENT_CQ_ERR, or ibv_poll_cq failing), the device dies
// (IBV_EVENT_DEVICE_FATAL) or is removed (RDMA_CM_EVENT_DEVICE_REMOVAL),
// or reading the connection manager's or the device's events fails for
// good. Every connection then fails (the peers are disconnected, and the
// work still posted is reported flushed by the provider itself, since the
// completion queue may never report it), every peer is reported down, and
// later connects fail with an error that names the device, the port and
// the event; so do sends to a peer whose connection this end saw fail
// first. Close still frees everything.
//
// A port going down (IBV_EVENT_PORT_ERR on the provider's port) is logged
// as a warning and fails nothing by itself: connections through the port
// fail with failed completions once their retries run out, and idle ones
// survive a port that comes back in time, which is logged at info
// (IBV_EVENT_PORT_ACTIVE). IBV_EVENT_COMM_EST is passed on to librdmacm
// (rdma_notify); the other events are logged at debug. Every event is
// acked, which destroying its queue pair or completion queue waits for.
//
// librdmacm opens a device once per process, so every provider on it, and
// every other librdmacm user in the process, shares one asynchronous event
// fd: one reader per device serves all the providers of the process. A
// library that reads the same fd for itself (DAPL's librdmacm provider, in
// the udapl subdevice on the same device) takes the events it reads.
//
// # Limitations
//
// This package was written against the libibverbs and librdmacm
// documentation and headers (rdma-core 44) and compiles, but it has not run
// against a device: the machine it was written on had none. The tests that
// need a device skip without one, or run against testdata/fakeverbs, an
// in-memory stand-in for the two libraries that keeps the rules of RC
// queue pairs and the connection manager (its header says how to build and
// use it, and what it does not model). Passing there shows the provider
// consistent with what its authors believe the libraries do, not with a
// device. iWARP is not supported (its private data and connection
// semantics differ).
//
// Known gaps, from a review against rdma-core and the mlx5 driver:
//   - Reject reason 28 (consumer reject) is taken as the peer's "not now";
//     the kernel also sends it when its own request handler fails, which
//     makes a dial retry until its context ends instead of failing at once.
//   - After the device fails, the failed connections' queue pairs and ids
//     are freed as the engine closes them, but the listener, protection
//     domain, completion queue and registered memory only at Close; the
//     librdmacm documentation asks for everything on a removed device to
//     be freed at once.
//   - The completion queue holds up to 65536 entries, about 4 MiB of
//     pinned memory on mlx5, and one queue pair per peer costs its rings
//     too: the locked-memory limit (ulimit -l) must allow for both.
package verbs
