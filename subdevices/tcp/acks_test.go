package tcp

import (
	"fmt"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
	"golang.org/x/sys/unix"
)

// quickAck reads TCP_QUICKACK of in's socket: 1 when the kernel
// acknowledges small segments at once, 0 in its ping-pong mode, which
// delayAcks asks for.
func quickAck(t *testing.T, in *inbound) int {
	t.Helper()
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.rx == nil || in.rx.fd < 0 {
		t.Fatal("inbound connection has no socket")
	}
	v, err := unix.GetsockoptInt(in.rx.fd, unix.IPPROTO_TCP, unix.TCP_QUICKACK)
	if err != nil {
		t.Fatalf("getsockopt TCP_QUICKACK: %v", err)
	}
	return v
}

func setQuickAck(t *testing.T, in *inbound) {
	t.Helper()
	in.mu.Lock()
	defer in.mu.Unlock()
	if err := unix.SetsockoptInt(in.rx.fd, unix.IPPROTO_TCP, unix.TCP_QUICKACK, 1); err != nil {
		t.Fatalf("setsockopt TCP_QUICKACK: %v", err)
	}
}

// TestInboundDelaysAcks checks that an inbound connection keeps the
// kernel from acknowledging every small frame inside our read: after the
// kernel left its ping-pong mode (as it does when a delayed ACK's timer
// fires; the handshake's reply put the socket in it), ackEvery frames ask
// for it again. Such a timer can also fire between the delivery and the
// check, 40 ms after a lone unacknowledged segment, so a round is retried
// a few times; with the requests gone, every round fails.
func TestInboundDelaysAcks(t *testing.T) {
	nodes := newJob(t, 2, jobOpts{})
	a, b := nodes[0], nodes[1]
	in := inboundOf(t, b)
	sent, got := 0, -1
	for range 3 {
		setQuickAck(t, in)
		for range ackEvery {
			send(t, a, &sdi.Frame{Peer: 1, Header: []byte{1}, Payload: []byte("8 bytes!"), Token: uint64(sent)})
			sent++
		}
		b.rec.waitFor(t, fmt.Sprintf("%d frames", sent), func() bool { return len(b.rec.delivered[0]) >= sent })
		if got = quickAck(t, in); got == 0 {
			return
		}
	}
	t.Errorf("TCP_QUICKACK is %d after %d frames, want 0 (acknowledgements delayed)", got, ackEvery)
}

// unread returns the bytes in's socket holds that were not consumed
// (SIOCINQ): peeked bytes count until consume discards them.
func unread(t *testing.T, in *inbound) int {
	t.Helper()
	in.mu.Lock()
	defer in.mu.Unlock()
	n, err := unix.IoctlGetInt(in.rx.fd, unix.SIOCINQ)
	if err != nil {
		t.Fatalf("ioctl SIOCINQ: %v", err)
	}
	return n
}

// inboundOf waits until n reads a connection and returns it.
func inboundOf(t *testing.T, n *node) *inbound {
	t.Helper()
	sd := n.sd.(*subDevice)
	deadline := time.Now().Add(watchdog)
	for {
		if list := sd.pollList.Load(); list != nil && len(*list) > 0 {
			return (*list)[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("watchdog: rank %d reads no connection", n.rank)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSmallFramesConsumedLater checks that a small frame is taken from the
// socket without emptying it, so the kernel sends no ACK from inside the
// read that delivers it, and that the bytes are discarded afterwards: by
// the next Poll when ranks poll, and before the reader goroutine waits for
// its socket when nobody does (else the socket would stay readable and
// the reader spin).
func TestSmallFramesConsumedLater(t *testing.T) {
	frame := &sdi.Frame{Peer: 1, Header: []byte("hdr"), Payload: []byte("8 bytes!")}
	size := sdi.WireHeaderSize + len(frame.Header) + len(frame.Payload)
	tests := []struct {
		name string
		poll bool
	}{
		{"polled", true},
		{"reader goroutine", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Stand-by ends only through Idle, so no reader takes over
			// between two polls.
			nodes := newJob(t, 2, jobOpts{config: `{"listen": "127.0.0.1:0", "max_connections": 1}`, nap: time.Hour})
			a, b := nodes[0], nodes[1]
			in := inboundOf(t, b)
			if !in.rx.peekOff {
				t.Skip("the kernel lacks SO_PEEK_OFF for TCP (Linux 6.10 on): frames are read, not peeked")
			}
			pb := b.sd.(sdi.Poller)
			if tt.poll {
				pb.Poll()
			} else {
				awaitReaders(t, 2, "before sending") // one per rank
			}
			send(t, a, frame)
			for tt.poll && b.rec.count(a.rank) == 0 {
				pb.Poll()
			}
			b.rec.waitFor(t, "the frame", func() bool { return len(b.rec.delivered[a.rank]) == 1 })
			if tt.poll {
				if got := unread(t, in); got != size {
					t.Errorf("after the Poll that delivered the frame, the socket holds %d bytes, want the frame's %d", got, size)
				}
				pb.Poll()
			} else {
				awaitReaders(t, 2, "after the frame")
			}
			if got := unread(t, in); got != 0 {
				t.Errorf("the socket still holds %d bytes, want 0", got)
			}
		})
	}
}
