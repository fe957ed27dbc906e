// Package plugin runs subdevices out of process: a subdevice binary is
// started with hashicorp/go-plugin, and the host sees an sdi.SubDevice that
// the multidevice uses like a built-in one.
//
// # Writing a plugin
//
// Implement sdi.SubDevice and hand its factory to Serve from main:
//
//	func main() { plugin.Serve(myfabric.New) }
//
// Test it with the conformance suite (sdi/sditest), in process and as the
// built binary (sditest.Plugin, cmd/sdi-conformance). docs/writing-a-subdevice.md
// walks through examples/subdevice-plugin.
//
// # Loading a plugin
//
// Start launches the binary and returns a *Client, unopened; multidevice
// does this for every external subdevice block of plugins.hcl. Start
// checks the binary's SHA-256 before it runs it (go-plugin's SecureConfig),
// performs go-plugin's handshake (magic cookie, protocol version) and
// secures the connection with automatically generated mutual TLS. The
// plugin's log lines, JSON on its stderr, are re-logged through the host's
// logger; the plugin formats nothing below the host's level. Other text it
// writes to os.Stderr is logged at info; the last lines it wrote there
// before a failed handshake end Start's error. The plugin runs in a process
// group of its own, killed as a whole, so that a wrapper script that runs
// it without exec leaves nothing behind.
//
// # Versions
//
// ProtocolVersion is go-plugin's protocol version and the version of
// sdi/proto/sdiv1, which is frozen: a host offers every version it can load,
// a plugin serves the newest they share, and a plugin with none in common
// is refused at the handshake with both sides' versions in the error.
// Inside a version, capabilities travel as sdi.Flag bits; a host ignores
// bits it does not know. See docs/sdi-protocol.md.
//
// # Data plane
//
// Control calls (info, open, job cards, connect, disconnect, flush, close)
// are gRPC calls, each bounded by Config.Timeout. Frames never pay a call
// each: they travel as records through two single-producer rings in a
// shared-memory segment that the host creates when it attaches (ring.go),
// or, where the plugin cannot map it, batched on one long-lived gRPC
// stream with credit-based flow control (streamplane.go). A consumer that
// runs dry spins briefly, then parks on a futex in the segment. Large
// payloads skip the copy into the ring on the plugin's side: the plugin's
// Handler implements sdi.Placer with slots in a second shared segment
// (place.go), so a subdevice that places (tcp reads large frames straight
// from the socket) writes them where the host delivers them from.
//
// Polling crosses the plane. With the shared-memory plane the Client sets
// sdi.FlagPoll and sdi.FlagIdle: a rank that waits drains the plugin's
// ring on its own goroutine, and for as long as it does the plugin's ring
// goroutine polls the plugin's subdevice (if that sets FlagPoll) between
// looks at its ring, so a message crosses both processes with no thread
// woken on its way. The host says so through two words in the segment
// header, moved only at the start and end of a polling spell and every
// few dozen polls; the spell ends when the rank parks (Idle) or when 2
// ms pass without a Poll, and then both sides go back to sleeping
// consumers and the subdevice's own goroutines (its Idle is called). The
// price is one more spinning thread per rank while it waits; the
// multidevice counts it when it decides whether to yield the CPU between
// polls.
//
// Send copies a frame into the plane and completes it at once; the plugin
// hands it to its subdevice straight from the ring and gives the space
// back when that subdevice is done with it. Should the subdevice refuse a
// frame it already accepted here, the peer is reported down, as a reliable
// subdevice must.
//
// # Faults
//
// A plugin that exits, crashes, breaks the protocol or does not answer a
// call or the periodic liveness check within the timeout is taken out:
// the process is killed, every connected peer is reported down through the
// Handler, and every later call fails with an error wrapping
// ErrPluginExited (and sdi.ErrPeerUnreachable for sends). An error the
// subdevice returns, a deadline of its own included, fails that call only,
// and a frame it delivers from a rank outside the job is dropped with a
// warning, as the multidevice drops it from a built-in one. The plugin, for
// its part, closes its subdevice and exits when the host goes away: at
// once when its data stream breaks, and when a host that never opened it
// ends: at once through a pipe only the host holds open, which a wrapper
// script passes on, and within a second when its parent process ends.
//
// # Limitations
//
// Protocol 1 does not carry sdi.Matcher: a plugin whose subdevice declares
// sdi.FlagMatching is refused at Open. FlagPoll, FlagIdle and
// FlagJobCards are carried.
package plugin
