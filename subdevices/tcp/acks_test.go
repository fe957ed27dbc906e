package tcp

import (
	"fmt"
	"testing"

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
	sd := b.sd.(*subDevice)
	var in *inbound
	b.rec.waitFor(t, "rank 1 reading rank 0's connection", func() bool {
		if list := sd.pollList.Load(); list != nil && len(*list) > 0 {
			in = (*list)[0]
		}
		return in != nil
	})
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
