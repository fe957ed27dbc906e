package tcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// striped opens two ranks that connect to each other over two connections.
func striped(t *testing.T) (a, b *node) {
	t.Helper()
	nodes := newJob(t, 2, jobOpts{config: `{"listen": "0.0.0.0:0"}`, twoLoopbacks: true})
	if l := Links(nodes[0].sd, 1); len(l) != 2 || l[0].PeerAddr == l[1].PeerAddr {
		t.Fatalf("links %+v, want two to different addresses", l)
	}
	return nodes[0], nodes[1]
}

// tokenFrame carries its token in the header and a payload derived from it,
// so the receiver can check every byte.
func tokenFrame(peer sdi.Rank, token uint64, size int) *sdi.Frame {
	h := binary.LittleEndian.AppendUint64(nil, token)
	return &sdi.Frame{Peer: peer, Header: h, Payload: pattern(size, byte(token)), Token: token}
}

// Small frames keep to the first connection; large ones are spread over
// both, and all arrive intact.
func TestStripeSpread(t *testing.T) {
	a, b := striped(t)
	const small, large = 200, 48
	for i := range small {
		send(t, a, tokenFrame(b.rank, uint64(i), 1000))
	}
	a.rec.waitFor(t, "small frames done", func() bool { return len(a.rec.done) == small })
	l := Links(a.sd, b.rank)
	if l[1].Bytes != 0 || l[0].Bytes == 0 {
		t.Fatalf("small frames: %d bytes on the first link, %d on the second; want all on the first", l[0].Bytes, l[1].Bytes)
	}
	before := l[0].Bytes
	for i := range large {
		send(t, a, tokenFrame(b.rank, uint64(small+i), maxFrame))
	}
	b.rec.waitFor(t, "all frames", func() bool { return len(b.rec.delivered[a.rank]) == small+large })
	// Links counts a write once it returned, which may be after the frame
	// arrived; SendDone comes after the count.
	a.rec.waitFor(t, "all SendDone", func() bool { return len(a.rec.done) == small+large })
	l = Links(a.sd, b.rank)
	first, second := l[0].Bytes-before, l[1].Bytes
	total := first + second
	if total < large*maxFrame || first < total/4 || second < total/4 {
		t.Errorf("large frames: %d bytes on the first link, %d on the second; want both to carry a fair share", first, second)
	}
	t.Logf("large frames: %d and %d bytes", first, second)
	seen := map[uint64]bool{}
	for _, d := range b.rec.frames(a.rank) {
		tok := binary.LittleEndian.Uint64(d.header)
		size := 1000
		if tok >= small {
			size = maxFrame
		}
		if seen[tok] || !bytes.Equal(d.payload, pattern(size, byte(tok))) {
			t.Fatalf("frame %d duplicated or corrupted", tok)
		}
		seen[tok] = true
	}
}

// Frames from one rank arrive on several connections at once, but the
// Handler sees one Deliver at a time per rank.
func TestStripeDeliverSerialized(t *testing.T) {
	a, b := striped(t)
	b.rec.mu.Lock()
	b.rec.hold = 200 * time.Microsecond // widen the window an overlap needs
	b.rec.mu.Unlock()
	const n = 32
	for i := range n {
		send(t, a, tokenFrame(b.rank, uint64(i), maxEager+1))
	}
	b.rec.waitFor(t, "all frames", func() bool { return len(b.rec.delivered[a.rank]) == n })
	l := Links(a.sd, b.rank)
	if l[0].Bytes == 0 || l[1].Bytes == 0 {
		t.Fatalf("links carried %d and %d bytes; the test needs both", l[0].Bytes, l[1].Bytes)
	}
	b.rec.mu.Lock()
	overlaps := b.rec.overlaps
	b.rec.mu.Unlock()
	if overlaps != 0 {
		t.Errorf("%d Deliver calls for one rank overlapped", overlaps)
	}
}

// Large frames follow link speeds where both ends report them: a lane of
// 3000 Mbit/s takes three times what a 1000 Mbit/s lane takes.
func TestStripeWeights(t *testing.T) {
	rec := newRecorder()
	p := newPeer(1, rec, hclog.NewNullLogger())
	var drains sync.WaitGroup
	lanes := make([]*lane, 2)
	for i, speed := range []uint32{1000, 3000} {
		ours, theirs := net.Pipe()
		drains.Go(func() { io.Copy(io.Discard, theirs) })
		t.Cleanup(func() { theirs.Close() })
		lanes[i] = newLane(p, ours, Link{Speed: speed}, 1<<30)
	}
	p.setLanes(lanes)
	var wg sync.WaitGroup
	p.start(&wg)
	const n = 80
	for i := range n {
		if _, err := p.send(tokenFrame(1, uint64(i), 256<<10)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	slow, fast := lanes[0].written.Load(), lanes[1].written.Load()
	if r := float64(fast) / float64(slow); r < 2.7 || r > 3.3 {
		t.Errorf("bytes %d on the 1000 Mbit/s lane, %d on the 3000 Mbit/s lane: ratio %.2f, want 3", slow, fast, r)
	}
	p.halt(errors.New("test over"))
	wg.Wait()
	drains.Wait()
}

// One lane failing takes the peer down once; a new Connect works again and
// its frames are delivered after the old session ended.
func TestStripeLaneDown(t *testing.T) {
	a, b := striped(t)
	p := a.sd.(*subDevice).peers[b.rank].Load()
	p.lanes[1].conn.Close()
	a.rec.waitFor(t, "PeerDown", func() bool { return a.rec.downCount[b.rank] > 0 })
	if _, err := a.sd.Send(tokenFrame(b.rank, 1, 10)); !errors.Is(err, sdi.ErrPeerUnreachable) {
		t.Fatalf("send after a lane failed: %v, want ErrPeerUnreachable", err)
	}
	if err := a.sd.Connect(context.Background(), b.rank, b.local.Addr); err != nil {
		t.Fatal(err)
	}
	if len(Links(a.sd, b.rank)) != 2 {
		t.Fatalf("reconnected with %d links, want 2", len(Links(a.sd, b.rank)))
	}
	for i := range 4 {
		send(t, a, tokenFrame(b.rank, uint64(10+i), maxFrame))
	}
	b.rec.waitFor(t, "frames after reconnecting", func() bool { return len(b.rec.delivered[a.rank]) == 4 })
	a.rec.mu.Lock()
	downs := a.rec.downCount[b.rank]
	a.rec.mu.Unlock()
	if downs != 1 {
		t.Errorf("PeerDown reported %d times, want once", downs)
	}
}
