package tcp

import (
	"errors"
	"io"
	"net"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// inbound is a connection a peer opened to us; we only read from it.
type inbound struct {
	conn net.Conn
	rank sdi.Rank      // valid after the handshake
	done chan struct{} // closed when its reader has returned
}

// acceptLoop accepts connections until the listener closes and hands each to
// its own reader goroutine.
func (sd *subDevice) acceptLoop() {
	defer sd.wg.Done()
	var backoff time.Duration
	for {
		c, err := sd.ln.Accept()
		if err != nil {
			if sd.closed.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: back off rather than
			// spin, and keep serving the connections we have.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			sd.log.Warn("accept failed, retrying", "error", err, "retry_in", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-sd.life.Done():
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		backoff = 0
		select {
		case sd.handshakes <- struct{}{}:
		default:
			sd.log.Warn("dropping connection: too many handshakes in progress", "remote_addr", c.RemoteAddr(), "limit", maxHandshakes)
			c.Close()
			continue
		}
		in := &inbound{conn: c, rank: -1, done: make(chan struct{})}
		if !sd.track(in) {
			<-sd.handshakes
			c.Close()
			return
		}
		sd.wg.Add(1)
		go sd.serveInbound(in)
	}
}

// track registers in so Close can close it; it fails once Close started.
func (sd *subDevice) track(in *inbound) bool {
	sd.mu.Lock()
	defer sd.mu.Unlock()
	if sd.closed.Load() {
		return false
	}
	sd.inbound[in] = struct{}{}
	return true
}

func (sd *subDevice) untrack(in *inbound) {
	sd.mu.Lock()
	delete(sd.inbound, in)
	if sd.latest[in.rank] == in {
		delete(sd.latest, in.rank)
	}
	sd.mu.Unlock()
	in.conn.Close()
	close(in.done)
}

// serveInbound authenticates one accepted connection and delivers its
// frames until it ends. Whatever goes wrong is confined to this connection.
func (sd *subDevice) serveInbound(in *inbound) {
	defer sd.wg.Done()
	defer sd.untrack(in)
	remote := in.conn.RemoteAddr().String()

	// The deadline is what stops a silent stranger from holding this
	// goroutine and a handshake slot.
	in.conn.SetDeadline(time.Now().Add(sd.cfg.connectTimeout))
	rank, err := sd.auth.accept(in.conn)
	<-sd.handshakes
	if err != nil {
		if !sd.closed.Load() {
			sd.log.Warn("dropping connection: handshake failed", "remote_addr", remote, "error", err)
		}
		return
	}
	in.conn.SetDeadline(time.Time{})

	// A rank that reconnects (after Disconnect, or after its old connection
	// failed on its side) gets a new stream. Delivering from it only after
	// the old stream has ended keeps Deliver calls for that rank serialized
	// and in order.
	sd.mu.Lock()
	in.rank = rank
	prev := sd.latest[rank]
	sd.latest[rank] = in
	sd.mu.Unlock()
	sd.log.Debug("accepted connection", "peer", rank, "remote_addr", remote)
	if prev != nil {
		select {
		case <-prev.done:
		case <-sd.life.Done():
			return
		}
	}

	fr := newFrameReader(in.conn, maxHeader, maxFrame)
	for {
		hdr, payload, err := fr.next()
		if err != nil {
			sd.inboundEnded(rank, remote, err)
			return
		}
		if sd.closed.Load() {
			return
		}
		if sd.log.IsTrace() {
			sd.log.Trace("delivering frame", "peer", rank, "header_bytes", len(hdr), "payload_bytes", len(payload))
		}
		sd.h.Deliver(rank, hdr, payload)
	}
}

func (sd *subDevice) inboundEnded(rank sdi.Rank, remote string, err error) {
	switch {
	case sd.closed.Load():
	case errors.Is(err, io.EOF):
		sd.log.Debug("peer closed its connection", "peer", rank, "remote_addr", remote)
	case errors.Is(err, sdi.ErrBadFrame):
		sd.log.Warn("dropping connection: malformed frame", "peer", rank, "remote_addr", remote, "error", err)
	default:
		sd.log.Warn("inbound connection lost", "peer", rank, "remote_addr", remote, "error", err)
	}
}
