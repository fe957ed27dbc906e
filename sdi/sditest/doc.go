// Package sditest is the conformance suite for [sdi.SubDevice]
// implementations, and in-memory fakes for tests of code that sits on top
// of subdevices: a loopback subdevice ([Fabric]) and one that matches on
// its own ([MatchFabric]).
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
// serialized Deliver per peer, no call after Close returned. In the Place
// checks the handler also implements [sdi.Placer], as the multidevice's
// does, and holds a subdevice that asks it for places to the Place rules.
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
// Without writing Go, cmd/sdi-conformance does the same (go install
// github.com/hpc-multidevice/multidevice/cmd/sdi-conformance@latest):
//
//	sdi-conformance -plugin ./sdi-myfabric -config '{"port": 0}'
//
// or, from a module that requires this one, TestExternalPlugin of this
// package, named by its full import path:
//
//	SDI_CONFORMANCE_PLUGIN=$PWD/sdi-myfabric SDI_CONFORMANCE_CONFIG='{"port": 0}' \
//		go test github.com/hpc-multidevice/multidevice/sdi/sditest -run ExternalPlugin
//
// SDI_CONFORMANCE_PLUGIN is the binary's absolute path (go test runs in
// this package's directory), SDI_CONFORMANCE_CONFIG the JSON every
// instance's Open gets as OpenParams.Config (plugins.hcl's config block),
// SDI_CONFORMANCE_ARGS the binary's arguments, separated by spaces. Without
// SDI_CONFORMANCE_PLUGIN the test skips.
//
// # The catalogue
//
//	Info/NoSideEffects               Info is static and callable before Open
//	Open/CapsSane                    valid caps, one card per rank, same limits on every rank,
//	                                 MaxHeader at least sdi.MinHeader
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
//	Place/Delivers                   with a Handler that is an sdi.Placer, frames of all
//	                                 sizes from all to all arrive once, intact, in order
//	                                 (FlagOrdered); Place asks for the frame's payload
//	                                 length, never during a Deliver from the same peer; a
//	                                 placed frame is filled, then delivered in its place,
//	                                 which is not written into afterwards
//	Place/EndedByPeerDown            a place given for a frame of a peer that closes is
//	                                 filled and delivered or ended by PeerDown; after
//	                                 PeerDown, or a Close that returned nil, the subdevice
//	                                 neither delivers such a frame nor writes into its place
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
// A subdevice whose Caps.MaxHeader is below [sdi.MinHeader] fails
// Open/CapsSane: the multidevice would refuse it. The other checks run
// with headers of 16 bytes (destination, stream, sequence number, length)
// and need at least that many.
//
// A subdevice that never calls Place passes the Place checks (the frames
// must still arrive); it is told so in the log. Whether Place is called at
// all, and for which frames, is the subdevice's choice, so the Place
// checks catch what a subdevice does wrong with places, not a subdevice
// that could place and does not.
package sditest
