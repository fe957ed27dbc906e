package tcp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/subdevices/tcp/addrsel"
)

// Link describes one connection a rank opened to a peer: the interface pair
// address selection chose and how much went over it. It is for diagnostics
// and tests; see [Links].
type Link struct {
	LocalIface, PeerIface string
	LocalAddr, PeerAddr   netip.AddrPort // as connected; link-local with its zone
	Weight                int            // the pair's weight (package addrsel); 0 for a fallback pair
	Speed                 uint32         // Mbit/s both ends report, 0 when either does not
	Bytes                 uint64         // bytes written so far, wire headers included
	Congestion            string         // the TCP congestion control it sends with (congestion_control)
}

// Links returns the connections sd (a tcp subdevice) holds to peer, in the
// order frames use them (small frames go on the first), or nil when sd is
// not a tcp subdevice or not connected to peer.
func Links(sd sdi.SubDevice, peer sdi.Rank) []Link {
	t, ok := sd.(*subDevice)
	if !ok || peer < 0 || int(peer) >= len(t.peers) {
		return nil
	}
	p := t.peers[peer].Load()
	if p == nil {
		return nil
	}
	out := make([]Link, len(p.lanes))
	for i, l := range p.lanes {
		out[i] = l.link
		out[i].Bytes = l.written.Load()
	}
	return out
}

// Chosen returns what the last Connect of sd (a tcp subdevice) to peer
// chose: the interface pairs, before any failed to connect and before
// max_connections, and every pair it refused with the reason. ok is false
// when sd is not a tcp subdevice or never chose for peer.
func Chosen(sd sdi.SubDevice, peer sdi.Rank) (res addrsel.Result, ok bool) {
	t, isTCP := sd.(*subDevice)
	if !isTCP {
		return addrsel.Result{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	res, ok = t.chosen[peer]
	return res, ok
}

// peer is the outbound side of the link to one rank: one lane per interface
// pair. Frames up to MaxEager go on the first lane; larger ones are spread
// over the lanes in proportion to their link speeds (evenly where a speed is
// unknown), each to the lane that is furthest behind its share and has room.
// A full lane is skipped, so a slower path takes less without measuring it.
// Order across lanes is not kept: the multidevice reorders by its sequence
// numbers and places rendezvous blocks by offset, which is why Caps lack
// FlagOrdered unless max_connections is 1.
//
// It is safe for concurrent use.
type peer struct {
	rank sdi.Rank
	// gen tells this session (one Connect's lanes) from the rank's others:
	// install numbers sessions from 1, in the order they are installed.
	gen   uint64
	h     sdi.Handler
	log   hclog.Logger
	lanes []*lane
	// standby and backlog are the subdevice's (see lane); nil in tests
	// that make a peer without one.
	standby *standby
	backlog *atomic.Int32

	mu     sync.Mutex
	weight []float64 // share of each lane; sums to 1
	sent   []float64 // bytes each lane accepted, divided by its share

	// The session ends once: reported down by the first lane that fails
	// (laneDown), or retired without a report when a newer session
	// replaces it (retire). Whoever sets ending (under endMu) ends it,
	// and closes ended once the lanes are halted and the report, if
	// any, has returned.
	endMu  sync.Mutex
	ending bool
	ended  chan struct{}
	// report reports the peer down to the handler, unless this session
	// is no longer the rank's (it then returns false); nil (tests)
	// reports straight to h. except is an inbound stream of the peer
	// whose lock the caller holds.
	report func(err error, except *inbound) bool
}

func newPeer(rank sdi.Rank, h sdi.Handler, log hclog.Logger) *peer {
	return &peer{rank: rank, h: h, log: log, ended: make(chan struct{})}
}

// setLanes installs the connected lanes; weights follow link speeds when
// every lane reports one, and are equal otherwise.
func (p *peer) setLanes(lanes []*lane) {
	p.lanes = lanes
	p.weight = make([]float64, len(lanes))
	p.sent = make([]float64, len(lanes))
	total := 0.0
	for _, l := range lanes {
		if l.link.Speed == 0 {
			total = 0
			break
		}
		total += float64(l.link.Speed)
	}
	for i, l := range lanes {
		if total > 0 {
			p.weight[i] = float64(l.link.Speed) / total
		} else {
			p.weight[i] = 1 / float64(len(lanes))
		}
	}
}

// start runs every lane's goroutines, counted in wg.
func (p *peer) start(wg *sync.WaitGroup) {
	for _, l := range p.lanes {
		l.start(wg)
	}
}

// send writes or queues f on a lane, or refuses it; it returns done=true
// when the frame was written at once. It never blocks and never calls the
// handler.
func (p *peer) send(f *sdi.Frame) (bool, error) {
	if len(p.lanes) == 1 || len(f.Payload) <= maxEager {
		// Small frames keep to one stream: they are latency-bound, and one
		// stream keeps them in order, which spares the receiver reordering.
		return p.lanes[0].send(f)
	}
	cost := float64(sdi.WireHeaderSize + len(f.Header) + len(f.Payload))
	p.mu.Lock()
	order := make([]int, len(p.lanes))
	for i := range order {
		order[i] = i
	}
	// Furthest behind its share first, counting this frame; ties by lane
	// order so the choice is reproducible.
	slices.SortStableFunc(order, func(a, b int) int {
		sa, sb := p.sent[a]+cost/p.weight[a], p.sent[b]+cost/p.weight[b]
		switch {
		case sa < sb:
			return -1
		case sa > sb:
			return 1
		}
		return 0
	})
	var err error
	for _, i := range order {
		var done bool
		if done, err = p.lanes[i].send(f); err == nil {
			p.sent[i] += cost / p.weight[i]
			p.rebase()
			p.mu.Unlock()
			return done, nil
		}
		if !errors.Is(err, sdi.ErrWouldBlock) {
			break
		}
	}
	p.mu.Unlock()
	return false, err
}

// rebase keeps the counters small, so a long job loses no float precision;
// only their differences matter.
func (p *peer) rebase() {
	low := slices.Min(p.sent)
	if low < 1<<40 {
		return
	}
	for i := range p.sent {
		p.sent[i] -= low
	}
}

// alive reports whether every lane still works.
func (p *peer) alive() bool {
	for _, l := range p.lanes {
		if !l.alive() {
			return false
		}
	}
	return true
}

// halt stops every lane for reason err without reporting the peer down.
func (p *peer) halt(err error) {
	for _, l := range p.lanes {
		l.halt(err, false)
	}
}

// laneDown is called by a lane whose connection failed, after it failed its
// frames. Losing one lane loses the peer: the frames on it are gone, and
// resending them elsewhere is the multidevice's failover, not ours. The
// peer is reported down once, whichever lanes fail, and only while this
// session is the rank's: a session that Disconnect dropped or a newer
// session replaced fails on its own, and a report of it would take the
// peer for lost while its new connection works. laneDown reports whether
// this call made the report; it returns false at once when the session
// is being ended already. It must not wait for that: the report takes the
// lock of every inbound stream of the peer, and placeFailed calls laneDown
// holding one.
func (p *peer) laneDown(err error, except *inbound) bool {
	if !p.claimEnd() {
		return false
	}
	defer close(p.ended)
	p.halt(err)
	if p.report == nil {
		p.h.PeerDown(p.rank, err)
		return true
	}
	return p.report(err, except)
}

// retire ends a session that a newer one replaces, without reporting it
// down: it halts the lanes that still work, and a lane that fails later
// reports nothing. A report already under way is waited for, so that it
// reaches the handler before the new session is installed, never after.
// The caller holds no lock a report takes (subDevice.mu, a stream's mu).
func (p *peer) retire() {
	if !p.claimEnd() {
		<-p.ended
		return
	}
	defer close(p.ended)
	err := fmt.Errorf("tcp: rank %d: %w: its connection failed and a new one replaced it", p.rank, sdi.ErrPeerUnreachable)
	for _, l := range p.lanes {
		l.mu.Lock()
		lerr := l.err
		l.mu.Unlock()
		if lerr != nil {
			err = lerr // the failure that made the session not alive
			break
		}
	}
	p.halt(err)
}

// claimEnd reports whether the caller is the one to end the session.
func (p *peer) claimEnd() bool {
	p.endMu.Lock()
	defer p.endMu.Unlock()
	if p.ending {
		return false
	}
	p.ending = true
	return true
}

// isEnded reports whether the session's end (report or retirement) is
// complete.
func (p *peer) isEnded() bool {
	select {
	case <-p.ended:
		return true
	default:
		return false
	}
}

// flush waits until every frame accepted before the call, on every lane,
// has had its SendDone. Frames sent while it waits do not delay it.
func (p *peer) flush(ctx context.Context) error {
	targets := make([]uint64, len(p.lanes))
	for i, l := range p.lanes {
		targets[i] = l.flushTarget()
	}
	for i, l := range p.lanes {
		if err := l.waitFinished(ctx, targets[i]); err != nil {
			return err
		}
	}
	return nil
}

// wait returns once every lane's goroutines have returned.
func (p *peer) wait() {
	for _, l := range p.lanes {
		<-l.done
	}
}
