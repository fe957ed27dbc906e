package tcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Connect connects to rank at once, so a bad card, a refused port or a wrong
// secret is reported here rather than by the first Send. It tries the card's
// addresses in dial order (loopback first on the same host), each bounded by
// connect_timeout and ctx, and keeps the first that completes the handshake.
// The card is checked even for a rank that is already connected; beyond
// that, connecting such a rank again does nothing. A rank that went down is
// connected afresh.
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
	order := c.dialOrder(sd.host)
	if len(c.Addrs) == 0 {
		return fmt.Errorf("tcp: connect to rank %d: %w: its card lists no address", rank, sdi.ErrPeerUnreachable)
	}
	if len(order) == 0 {
		return fmt.Errorf("tcp: connect to rank %d: %w: its card lists only loopback addresses of host %q, and this is host %q",
			rank, sdi.ErrPeerUnreachable, c.Host, sd.host)
	}

	// Close cancels a Connect in progress.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(sd.life, cancel)()

	var reasons []string
	for _, ap := range order {
		conn, err := sd.dial(ctx, rank, ap)
		if err == nil {
			return sd.install(rank, conn)
		}
		sd.log.Debug("connect attempt failed", "peer", rank, "addr", ap, "error", err)
		reasons = append(reasons, fmt.Sprintf("%v: %v", ap, err))
		if ctx.Err() != nil {
			break
		}
	}
	if sd.closed.Load() {
		return fmt.Errorf("tcp: connect to rank %d: %w", rank, sdi.ErrClosed)
	}
	msg := strings.Join(reasons, "; ")
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("tcp: connect to rank %d: %w: %w after trying %s", rank, sdi.ErrPeerUnreachable, err, msg)
	}
	return fmt.Errorf("tcp: connect to rank %d: %w: %s", rank, sdi.ErrPeerUnreachable, msg)
}

// dial connects to ap and runs the connector's handshake, within
// connect_timeout and ctx.
func (sd *subDevice) dial(parent context.Context, rank sdi.Rank, ap netip.AddrPort) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(parent, sd.cfg.connectTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", ap.String())
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
	err = sd.auth.connect(conn, rank)
	if !stop() {
		conn.Close()
		if err == nil {
			err = errors.New("handshake completed as the connect was abandoned")
		}
		if parent.Err() == nil {
			return nil, fmt.Errorf("handshake: no answer within connect_timeout %v: %w", sd.cfg.connectTimeout, err)
		}
		return nil, fmt.Errorf("handshake: %w (%w)", parent.Err(), err)
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("handshake: %w", err)
	}
	conn.SetDeadline(time.Time{})
	return conn, nil
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

// install makes conn the outbound connection to rank and starts its
// goroutines, unless Close started or another Connect won the race.
func (sd *subDevice) install(rank sdi.Rank, conn net.Conn) error {
	sd.mu.Lock()
	defer sd.mu.Unlock()
	if sd.closed.Load() {
		conn.Close()
		return fmt.Errorf("tcp: connect to rank %d: %w", rank, sdi.ErrClosed)
	}
	if old := sd.peers[rank].Load(); old != nil && old.alive() {
		conn.Close()
		return nil
	}
	p := newPeer(rank, conn, sd.h, sd.log, sd.cfg.queueBytes)
	sd.peers[rank].Store(p)
	p.start(&sd.wg)
	sd.log.Debug("connected", "peer", rank, "remote_addr", conn.RemoteAddr())
	return nil
}
