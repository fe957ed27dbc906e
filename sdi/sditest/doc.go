// Package sditest is the conformance suite for [sdi.SubDevice]
// implementations, and an in-memory loopback subdevice ([Fabric]) for tests
// of code that sits on top of subdevices.
//
// # Running the suite against your subdevice
//
// Write one test that tells [Run] how to make an unopened instance:
//
//	func TestConformance(t *testing.T) {
//		sditest.Run(t, sditest.Harness{
//			New:   func(t testing.TB) sdi.SubDevice { return myfabric.New(hclog.NewNullLogger()) },
//			Peers: 3,
//			Skip:  map[string]string{"PeerDown/OnPeerClose": "peers are never reported down (issue 12)"},
//		})
//	}
//
// and run it with the race detector: go test -race -run TestConformance.
// Each subtest opens Harness.Peers fresh instances as ranks 0..Peers-1 of
// one job on one host ([Host]), with a JobID and Secret unique to the
// subtest, passes each a recording [sdi.Handler], connects every pair with
// the published business cards, runs one check and closes everything. The
// handlers check every call against the contract as it happens: frame
// contents byte for byte, SendDone exactly once and never from within Send,
// serialized Deliver per peer, no call after Close returned.
//
// Send is retried on [sdi.ErrWouldBlock] with a short backoff, as the
// contract asks of callers. Every wait is bounded, and a watchdog fails a
// subtest that runs longer than 30 s, so a broken subdevice fails instead of
// hanging. -short shrinks frame counts tenfold. MP_TEST_LOG_LEVEL (trace,
// debug, ...) routes the subdevice's hclog output into t.Log.
//
// Checks that depend on a capability skip with the reason when it is absent
// (Ordering/PerPeerFIFO needs [sdi.FlagOrdered]); Harness.Skip skips others
// by name, visibly. Close/NoLeakedGoroutines counts the process's
// goroutines, so do not run Run in parallel with other tests.
//
// # Running the suite against a plugin binary
//
// [Plugin] makes Harness.New start a plugin binary (sdi/plugin) per
// instance, so the same catalogue checks the subdevice out of process,
// through the glue the multidevice uses:
//
//	sditest.Run(t, sditest.Harness{New: sditest.Plugin(plugin.Config{Path: bin}), Peers: 3})
//
// Without writing Go: cmd/sdi-conformance -plugin ./sdi-myfabric, or
// SDI_CONFORMANCE_PLUGIN=$PWD/sdi-myfabric go test ./sdi/sditest -run ExternalPlugin.
//
// # The catalogue
//
//	Info/NoSideEffects               Info is static and callable before Open
//	Open/CapsSane                    valid caps, one card per rank, same limits on every rank
//	Connect/BadAddr                  garbage or foreign cards: ErrPeerUnreachable; no harm done;
//	                                 an instance without the job's Secret gets no frame through;
//	                                 another rank's card given for rank 1 sends it nothing
//	Send/Sizes                       0, 1, MaxEager, MaxFrame bytes intact; one more: ErrTooLarge
//	Send/CompletionExactlyOnce       done=true or exactly one SendDone, never both
//	Send/BufferReuseAfterDone        a buffer reused after completion does not alter the frame
//	Backpressure/WouldBlockThenDrains flooding a peer blocks, then everything arrives
//	PingPong/1000                    strict alternation: no frame waits for more traffic
//	Ordering/PerPeerFIFO             send order per peer (FlagOrdered)
//	ManyToOne                        every rank sends to rank 0 at once
//	Concurrent/Sends                 8 goroutines per rank to every peer; each frame once
//	Poll/Caps                        FlagPoll comes with sdi.Poller, FlagIdle with sdi.Idler
//	Poll/Concurrent                  (FlagPoll) 2 goroutines per rank poll while all send to
//	                                 all: each frame once, Deliver serialized per peer, no
//	                                 Poll call blocks
//	Poll/HandsBack                   (FlagPoll) a rank that stops polling, with Idle
//	                                 (FlagIdle) and without, still receives
//	Flush/CompletesAll               Flush returns after SendDone for every frame, also with
//	                                 MaxFrame frames from 4 goroutines in flight
//	Close/FailsPendingOrCompletes    Close completes every frame, also ones queued when it is
//	                                 called; then the Handler is silent
//	Close/Idempotent                 Close again, and concurrently
//	Close/NoLeakedGoroutines         closing every instance ends every goroutine, refused
//	                                 Connects' too
//	Close/SendAfterClose             calls after Close return ErrClosed
//	PeerDown/OnPeerClose             PeerDown names the closed peer; sends to it never hang;
//	                                 with FlagReliable, frames to it that complete without
//	                                 an error come with its PeerDown
//
// Every check also fails a frame delivered twice, when it arrives, and a
// SendDone with an error while every rank is open and connected: to the
// multidevice a failed frame is the loss of its peer.
//
// The suite needs Caps.MaxHeader of at least 16 bytes: it puts its own
// header (destination, stream, sequence number, length) in every frame.
package sditest
