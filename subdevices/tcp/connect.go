package tcp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/subdevices/tcp/addrsel"
)

// Connect connects to rank at once, so a bad card, a refused port or a wrong
// secret is reported here rather than by the first Send. It chooses the
// interface pairs with package addrsel from both cards and the job's cards
// (see SetJobCards), opens one connection per pair, each bound to the
// chosen local address and bounded by connect_timeout and ctx, and keeps
// those that complete the handshake. The card is checked even for a rank
// that is already connected; beyond that, connecting such a rank again does
// nothing. A rank that went down is connected afresh.
func (sd *subDevice) Connect(ctx context.Context, rank sdi.Rank, addr []byte) error {
	if sd.closed.Load() {
		return fmt.Errorf("tcp: connect to rank %d: %w", rank, sdi.ErrClosed)
	}
	if len(sd.peers) == 0 {
		return fmt.Errorf("tcp: connect to rank %d: not open", rank)
	}
	if rank < 0 || int(rank) >= len(sd.peers) {
		return fmt.Errorf("tcp: connect to rank %d: %w: rank out of range [0,%d)", rank, sdi.ErrPeerUnreachable, len(sd.peers))
	}
	c, err := decodeCard(addr)
	if err != nil {
		return fmt.Errorf("tcp: connect to rank %d: %w: %w", rank, sdi.ErrPeerUnreachable, err)
	}
	if c.Rank != rank {
		return fmt.Errorf("tcp: connect to rank %d: %w: the card belongs to rank %d", rank, sdi.ErrPeerUnreachable, c.Rank)
	}
	if c.JobTag != jobTag(sd.auth.jobID) {
		return fmt.Errorf("tcp: connect to rank %d: %w: the card is from another job", rank, sdi.ErrPeerUnreachable)
	}
	if p := sd.peers[rank].Load(); p != nil && p.alive() {
		return nil
	}
	if c.numAddrs() == 0 {
		return fmt.Errorf("tcp: connect to rank %d: %w: its card lists no address", rank, sdi.ErrPeerUnreachable)
	}
	pairs, fallback, err := sd.choose(rank, c)
	if err != nil {
		return err
	}

	// Close cancels a Connect in progress.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(sd.life, cancel)()

	// Dial every pair at once: a pair that does not route costs one
	// connect_timeout, not one per pair.
	id := laneID{session: rand.Uint64(), lanes: uint16(len(pairs))}
	conns := make([]net.Conn, len(pairs))
	used := make([]addrsel.Pair, len(pairs))
	failed := make([][]string, len(pairs))
	var wg sync.WaitGroup
	for i, pr := range pairs {
		lid := id
		lid.lane = uint16(i)
		wg.Go(func() { used[i], conns[i], failed[i] = sd.dialLane(ctx, rank, pr, c.Port, lid) })
	}
	wg.Wait()

	var reasons []string
	var links []Link
	var ok []net.Conn
	for i, pr := range used {
		if conns[i] == nil {
			reasons = append(reasons, failed[i]...)
			continue
		}
		if len(failed[i]) > 0 {
			sd.log.Debug("connected over an alternate address pair", "peer", rank, "local_addr", pr.LocalAddr, "addr", pr.PeerAddr, "failed", strings.Join(failed[i], "; "))
		}
		la, _ := netip.ParseAddrPort(conns[i].LocalAddr().String())
		ra, _ := netip.ParseAddrPort(conns[i].RemoteAddr().String())
		links = append(links, Link{LocalIface: pr.LocalName, PeerIface: pr.PeerName, LocalAddr: la, PeerAddr: ra,
			Weight: int(pr.Weight), Speed: pr.Speed, Congestion: congestionOf(conns[i])})
		ok = append(ok, conns[i])
	}
	if sd.closed.Load() {
		closeAll(ok)
		return fmt.Errorf("tcp: connect to rank %d: %w", rank, sdi.ErrClosed)
	}
	if len(ok) == 0 {
		msg := strings.Join(reasons, "; ")
		if fallback {
			msg = "no interface pair qualified, so pairs that may still route were tried (private addresses on different networks, or a private network two sites share): " + msg
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("tcp: connect to rank %d: %w: %w after trying %s", rank, sdi.ErrPeerUnreachable, err, msg)
		}
		return fmt.Errorf("tcp: connect to rank %d: %w: %s", rank, sdi.ErrPeerUnreachable, msg)
	}
	if len(reasons) > 0 {
		sd.log.Warn("some interface pairs did not connect; using the rest", "peer", rank, "connected", len(ok), "chosen", len(pairs), "failed", strings.Join(reasons, "; "))
	}
	return sd.install(rank, ok, links)
}

// choose returns the interface pairs to rank, at most max_connections of
// them, or an error that lists every pair considered and why it was refused.
func (sd *subDevice) choose(rank sdi.Rank, c card) ([]addrsel.Pair, bool, error) {
	peerEP := c.endpoint()
	job := sd.job.Load()
	if job == nil || !job.Knows(peerEP.Host) {
		// No job cards (a subdevice driven without them), or a card the
		// job did not list: judge collisions from the two cards alone.
		job = addrsel.NewJob([]addrsel.Endpoint{sd.ep, peerEP})
	}
	// The lower rank's interfaces are the left side at both ends, so both
	// solve the same problem and agree on the pairs.
	res := addrsel.Select(job, sd.ep, peerEP, sd.auth.rank <= rank)
	sd.mu.Lock()
	sd.chosen[rank] = res
	sd.mu.Unlock()
	switch {
	case len(sd.ep.Ifaces) == 0:
		return nil, false, fmt.Errorf("tcp: connect to rank %d: %w: this rank publishes no interface (check include and exclude in the tcp config)",
			rank, sdi.ErrPeerUnreachable)
	case len(res.Pairs) == 0:
		return nil, false, fmt.Errorf("tcp: connect to rank %d: %w: no usable interface pair between host %q and host %q: %s",
			rank, sdi.ErrPeerUnreachable, sd.host, c.Host, res.Explain())
	}
	pairs := res.Pairs
	if m := sd.cfg.maxConns; m > 0 && len(pairs) > m {
		// Keep the heaviest; the sort is stable over the left side's
		// order, which both ends share.
		slices.SortStableFunc(pairs, func(a, b addrsel.Pair) int {
			if a.Weight != b.Weight {
				return int(b.Weight) - int(a.Weight)
			}
			return cmp.Compare(b.Speed, a.Speed)
		})
		pairs = pairs[:m]
	}
	if sd.log.IsDebug() {
		chosen := make([]string, len(pairs))
		for i, p := range pairs {
			chosen[i] = p.String()
		}
		sd.log.Debug("interface pairs chosen", "peer", rank, "peer_host", c.Host, "pairs", chosen, "fallback", res.Fallback, "refused", res.Explain())
	}
	return pairs, res.Fallback, nil
}

// alternateDelay is how long a lane's address pair has to connect and
// complete the handshake before the next of its alternates is dialed beside
// it; a pair that fails outright hands over at once. It is Go's dialer's
// FallbackDelay between IPv6 and IPv4: a pair that a firewall drops costs
// each lane this much, not connect_timeout, while one that answers, even
// from across a loaded cluster, almost never starts a second dial.
const alternateDelay = 300 * time.Millisecond

// errConnectTimeout is the cause of a lane's context when connect_timeout
// ran out, which the handshake names apart from a cancelled Connect.
var errConnectTimeout = errors.New("connect_timeout ran out")

// dialLane opens lane id to rank over pair or, where that fails, over its
// alternates (see [addrsel.Pair]): the next is dialed as soon as the one
// before failed, or once it has taken its head start (alternateDelay, or
// less where connect_timeout is short: the last starts within its first
// half), and the first to
// complete the handshake is the lane; any later one is closed, and as it
// carried nothing its acceptor lets it go. connect_timeout bounds the
// whole lane, not each pair. It returns the pair used and its connection,
// or a nil connection, and why each pair tried failed.
func (sd *subDevice) dialLane(parent context.Context, rank sdi.Rank, pair addrsel.Pair, port uint16, id laneID) (addrsel.Pair, net.Conn, []string) {
	ctx, cancel := context.WithTimeoutCause(parent, sd.cfg.connectTimeout, errConnectTimeout)
	defer cancel()
	cands := append([]addrsel.Pair{pair}, pair.Alternates...)
	type attempt struct {
		k    int
		conn net.Conn
		err  error
	}
	done := make(chan attempt, len(cands))
	next, running := 0, 0
	var failed []string
	var won *attempt
	start := func() {
		k := next
		next++
		running++
		go func() {
			conn, err := sd.dial(ctx, rank, cands[k], port, id)
			done <- attempt{k, conn, err}
		}()
	}
	start()
	more := func() bool { return next < len(cands) && won == nil && ctx.Err() == nil }
	// The last pair starts within connect_timeout's first half, and has
	// its second at least: one below alternateDelay once went to the
	// first pair whole, and a share of it per pair left the sixth of six
	// pairs too little to answer in.
	delay := min(alternateDelay, sd.cfg.connectTimeout/time.Duration(2*len(cands)))
	head := time.NewTimer(delay)
	defer head.Stop()
	for running > 0 {
		select {
		case a := <-done:
			running--
			switch {
			case a.err == nil && won == nil:
				won = &a
				cancel() // the rest are no longer needed
				continue
			case a.err == nil:
				a.conn.Close()
				continue
			case won != nil:
				continue // cancelled for the winner: not a failure
			}
			pr := cands[a.k]
			sd.log.Debug("connect attempt failed", "peer", rank, "local_addr", pr.LocalAddr, "addr", pr.PeerAddr, "alternates_left", len(cands)-next, "error", a.err)
			failed = append(failed, fmt.Sprintf("%s %v -> %s %v: %v", pr.LocalName, pr.LocalAddr, pr.PeerName, netip.AddrPortFrom(pr.PeerAddr, port), a.err))
			if more() {
				start()
				head.Reset(delay)
			}
		case <-head.C:
			if more() {
				start()
				head.Reset(delay)
			}
		}
	}
	if won == nil {
		return pair, nil, failed
	}
	return cands[won.k], won.conn, failed
}

// dial connects from pair's local address to its peer address and runs the
// connector's handshake, within connect_timeout and ctx.
func (sd *subDevice) dial(parent context.Context, rank sdi.Rank, pair addrsel.Pair, port uint16, id laneID) (net.Conn, error) {
	ctx, cancel := context.WithTimeoutCause(parent, sd.cfg.connectTimeout, errConnectTimeout)
	defer cancel()
	d := net.Dialer{
		LocalAddr: &net.TCPAddr{IP: pair.LocalAddr.AsSlice(), Zone: pair.LocalAddr.Zone()},
		Control:   sd.cfg.dialControl(pair.PeerAddr),
		// Go's default keepalive (15 s) where link_timeout is 0.
		KeepAliveConfig: keepAlive(sd.cfg.linkTimeout),
	}
	conn, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(pair.PeerAddr, port).String())
	if err != nil {
		return nil, trimDialErr(err)
	}
	// Latency matters more than packet count for small frames, and the
	// writer already batches what is queued into one writev.
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	deadline, _ := ctx.Deadline()
	conn.SetDeadline(deadline)
	// A cancelled ctx has no deadline to hit; a deadline in the past wakes
	// the handshake's blocked read.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	err = sd.auth.connect(conn, rank, id)
	if !stop() {
		conn.Close()
		if err == nil {
			err = errors.New("handshake completed as the connect was abandoned")
		}
		if errors.Is(context.Cause(ctx), errConnectTimeout) {
			return nil, fmt.Errorf("handshake: no answer within connect_timeout %v: %w", sd.cfg.connectTimeout, err)
		}
		return nil, fmt.Errorf("handshake: %w (%w)", ctx.Err(), err)
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("handshake: %w", err)
	}
	conn.SetDeadline(time.Time{})
	return conn, nil
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		c.Close()
	}
}

// trimDialErr drops the "dial tcp <addr>:" prefix, since the caller already
// names the address.
func trimDialErr(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err
	}
	return err
}

// install makes conns the outbound lanes to rank, a new session, and
// starts their goroutines, unless Close started or another Connect won the
// race. A session it replaces (one whose connection failed) is retired
// first: it is reported down before the new one is installed if its report
// was under way, and never after.
func (sd *subDevice) install(rank sdi.Rank, conns []net.Conn, links []Link) error {
	sd.mu.Lock()
	defer sd.mu.Unlock()
	for {
		if sd.closed.Load() {
			closeAll(conns)
			return fmt.Errorf("tcp: connect to rank %d: %w", rank, sdi.ErrClosed)
		}
		old := sd.peers[rank].Load()
		if old != nil && old.alive() {
			closeAll(conns)
			return nil
		}
		if old == nil || old.isEnded() {
			break
		}
		// A report takes sd.mu.
		sd.mu.Unlock()
		old.retire()
		sd.mu.Lock()
	}
	sd.gens++
	p := newPeer(rank, sd.h, sd.log)
	p.gen = sd.gens
	p.report = func(err error, except *inbound) bool {
		if sd.peers[rank].Load() != p {
			sd.log.Debug("a replaced connection failed; the peer is not reported down", "peer", rank, "session", p.gen, "error", err)
			return false
		}
		sd.reportDown(rank, err, except)
		return true
	}
	p.standby, p.backlog = sd.standby, &sd.backlog
	lanes := make([]*lane, len(conns))
	for i, c := range conns {
		lanes[i] = newLane(p, c, links[i], sd.cfg.queueBytes)
	}
	p.setLanes(lanes)
	sd.peers[rank].Store(p)
	sd.listLanes()
	p.start(&sd.wg)
	if sd.log.IsDebug() {
		desc := make([]string, len(links))
		for i, l := range links {
			desc[i] = fmt.Sprintf("%s %v -> %s %v (%s)", l.LocalIface, l.LocalAddr, l.PeerIface, l.PeerAddr, l.Congestion)
		}
		sd.log.Debug("connected", "peer", rank, "links", desc)
	}
	return nil
}
