package tcp

import (
	"net"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Dead links. A connection whose cable, switch or NIC dies reports
// nothing by itself: the sender's kernel retransmits for about fifteen
// minutes (tcp_retries2) before the write fails, and a connection that
// only reads, as an inbound one does, waits forever. Until then its peer
// is not reported down, so a failover route (the multidevice's) does not
// take over, and whatever waits for the peer waits that long. link_timeout
// bounds it: TCP_USER_TIMEOUT fails a connection whose data stays
// unacknowledged that long, and keepalive probes, which the kernel also
// gives up on after that long, catch a connection with nothing to send.
// Every connection gets both, the ones this rank dials and the ones it
// accepts.
//
// The kernel counts a shut window against TCP_USER_TIMEOUT too: a peer
// that stops reading (stopped in a debugger, or by SIGSTOP) while data
// waits for it is taken for dead after link_timeout, though its kernel
// answers every window probe. Telling the two apart needs a timer of our
// own on the time since the last ACK (TCP_INFO), left for later; the doc
// of link_timeout says so.

// maxLinkTimeout is the most TCP_USER_TIMEOUT takes (an int of
// milliseconds), rounded down to a day.
const maxLinkTimeout = 24 * time.Hour

// keepAlive is the keepalive schedule for link timeout t: the first probe
// after a third of it without traffic, then every sixth; the user timeout
// ends the connection once probes go unanswered for t. Zero t leaves Go's
// defaults.
func keepAlive(t time.Duration) net.KeepAliveConfig {
	if t == 0 {
		return net.KeepAliveConfig{}
	}
	return net.KeepAliveConfig{Enable: true, Idle: max(t/3, time.Second), Interval: max(t/6, time.Second), Count: 3}
}

// setLinkTimeout sets TCP_USER_TIMEOUT on fd to t (nothing for 0).
func setLinkTimeout(fd int, t time.Duration) error {
	if t == 0 {
		return nil
	}
	return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(t/time.Millisecond))
}

// limitLink gives an accepted connection the link timeout and keepalive
// schedule of t, as dialed ones get through the Dialer.
func limitLink(c net.Conn, t time.Duration) error {
	tc, ok := c.(*net.TCPConn)
	if !ok || t == 0 {
		return nil
	}
	if err := tc.SetKeepAliveConfig(keepAlive(t)); err != nil {
		return err
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = setLinkTimeout(int(fd), t) }); err != nil {
		return err
	}
	return serr
}

// dialControl prepares a socket this rank dials to peer before its SYN
// goes out: the congestion control it asks for and the link timeout.
func (c config) dialControl(peer netip.Addr) func(network, address string, raw syscall.RawConn) error {
	names, strict := c.congestionFor(peer)
	return func(_, _ string, raw syscall.RawConn) error {
		var err error
		cerr := raw.Control(func(fd uintptr) {
			if err = setLinkTimeout(int(fd), c.linkTimeout); err == nil && len(names) > 0 {
				err = setCongestion(int(fd), names, strict)
			}
		})
		if cerr != nil {
			return cerr
		}
		return err
	}
}
