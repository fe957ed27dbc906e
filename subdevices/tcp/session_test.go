package tcp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// dialLane opens the connection from a to b that lane id.lane of session
// id.session would be, over the id.lane-th interface pair, through the real
// handshake. It returns only after b's acceptor registered the lane, so
// calls in a row fix the order in which b sees lanes, whatever the
// scheduler does.
func dialLane(t *testing.T, a, b *node, id laneID) net.Conn {
	t.Helper()
	sd := a.sd.(*subDevice)
	c, err := decodeCard(b.local.Addr)
	if err != nil {
		t.Fatal(err)
	}
	pairs, _, err := sd.choose(b.rank, c)
	if err != nil || len(pairs) != int(id.lanes) {
		t.Fatalf("pairs %v, %v; want %d", pairs, err, id.lanes)
	}
	conn, err := sd.dial(t.Context(), b.rank, pairs[id.lane], c.Port, id)
	if err != nil {
		t.Fatalf("session %d lane %d: %v", id.session, id.lane, err)
	}
	return conn
}

// Two Connects to one rank that cross (the multidevice reviving a route
// while the application connects, say) dial their lanes side by side, so
// the acceptor may see them interleaved: lane 0 of session 1, lane 0 of
// session 2, lane 1 of session 1, lane 1 of session 2. Only one session is
// installed; the other's connections are closed. Every lane of the winner
// must deliver. The acceptor used to start a new session whenever a lane's
// session was not the newest, so lane 1 of session 1 waited behind session
// 2, and lane 1 of session 2 behind that: whichever won, its lane 1 never
// delivered and a striped stream stalled for good.
func TestInterleavedSessionsDeliver(t *testing.T) {
	for _, tc := range []struct {
		name   string
		winner uint64
	}{{"first wins", 1}, {"second wins", 2}} {
		t.Run(tc.name, func(t *testing.T) {
			o := jobOpts{size: 2, config: `{"listen": "0.0.0.0:0"}`, twoLoopbacks: true}
			a, b := openNode(t, 0, o), openNode(t, 1, o)
			conns := map[uint64][]net.Conn{1: nil, 2: nil}
			for _, step := range []struct {
				session uint64
				lane    int
			}{{1, 0}, {2, 0}, {1, 1}, {2, 1}} {
				id := laneID{session: step.session, lane: uint16(step.lane), lanes: 2}
				conns[step.session] = append(conns[step.session], dialLane(t, a, b, id))
			}
			loser := 3 - tc.winner
			closeAll(conns[loser])
			if err := a.sd.(*subDevice).install(b.rank, conns[tc.winner], []Link{{}, {}}); err != nil {
				t.Fatal(err)
			}
			// Frames above MaxEager alternate between the two lanes.
			const n = 8
			for i := range n {
				send(t, a, tokenFrame(b.rank, uint64(i), maxEager+1))
			}
			b.rec.waitFor(t, "every frame, on both lanes of the winner", func() bool { return len(b.rec.delivered[a.rank]) == n })
			if l := Links(a.sd, b.rank); l[0].Bytes == 0 || l[1].Bytes == 0 {
				t.Fatalf("lanes carried %d and %d bytes; the test needs both", l[0].Bytes, l[1].Bytes)
			}
			seen := map[uint64]bool{}
			for _, d := range b.rec.frames(a.rank) {
				seen[binary.LittleEndian.Uint64(d.header)] = true
			}
			if len(seen) != n {
				t.Fatalf("delivered tokens %v, want %d distinct", seen, n)
			}
		})
	}
}

// A connection of ours that fails is reported by its lane's writer once it
// has failed the lane's frames, and that may come late: here a poller
// holds the lane's write turn when the connection fails. A Connect in
// between finds the peer not alive and replaces it with a new session. The
// old session's failure must then stay its own: no PeerDown (the
// multidevice would take the working new connection for dead, fail over
// and revive it), and the new session keeps working.
func TestReplacedSessionFailsQuietly(t *testing.T) {
	nodes := newJob(t, 2, jobOpts{})
	a, b := nodes[0], nodes[1]
	sd := a.sd.(*subDevice)
	old := sd.peers[b.rank].Load()
	l := old.lanes[0]
	l.mu.Lock()
	l.busy = true // a poller pushing the queue, say
	l.mu.Unlock()
	l.conn.Close() // the watcher's read fails and halts the lane
	<-l.halted

	if err := a.sd.Connect(t.Context(), b.rank, b.local.Addr); err != nil {
		t.Fatal(err)
	}
	p := sd.peers[b.rank].Load()
	if p == old {
		t.Fatal("Connect kept the session that failed")
	}
	l.mu.Lock()
	l.release() // the poller gives the turn up; the writer fails the lane
	l.mu.Unlock()
	<-l.done // the old lane's writer returned: whatever it reports, it has

	a.rec.mu.Lock()
	downs, why := a.rec.downCount[b.rank], a.rec.downs[b.rank]
	a.rec.mu.Unlock()
	if downs != 0 {
		t.Errorf("the replaced session's failure reported the peer down %d times: %v", downs, why)
	}
	if !p.alive() {
		t.Fatal("the replaced session's failure halted the new session")
	}
	send(t, a, &sdi.Frame{Peer: b.rank, Payload: []byte("on the new session"), Token: 1})
	b.rec.waitFor(t, "the frame sent on the new session", func() bool { return len(b.rec.delivered[a.rank]) == 1 })
}

// placer is a recorder that is also an sdi.Placer: it gives a fresh
// place to every frame asked about, and tells the test on placed.
type placer struct {
	*recorder
	placed chan struct{}
}

func (p *placer) Place(from sdi.Rank, header []byte, n int) []byte {
	select {
	case p.placed <- struct{}{}:
	default:
	}
	return make([]byte, n)
}

// A stream from a peer that ends inside a frame it was placing must report
// the peer down (the Placer contract), but a connection of ours to that
// peer made after the place was given is a new session the failure does
// not belong to: it must keep working. It used to be halted with the
// report, so the report cost the new session its queued frames, and the
// multidevice's revival Connect a second new session.
func TestStalePlaceFailureSparesNewSession(t *testing.T) {
	pl := &placer{placed: make(chan struct{}, 1)}
	o := jobOpts{size: 2, handler: func(r *recorder) sdi.Handler { pl.recorder = r; return pl }}
	a, b := openNode(t, 0, o), openNode(t, 1, jobOpts{size: 2})
	ctx := t.Context()
	if err := a.sd.Connect(ctx, b.rank, b.local.Addr); err != nil {
		t.Fatal(err)
	}
	// b's side of the stream, played by the test: the start of a frame
	// too large to batch, so a places it, and no more.
	in := dialLane(t, b, a, laneID{session: 7, lanes: 1})
	var w [sdi.WireHeaderSize]byte
	sdi.WireHeader{HeaderLen: 8, PayloadLen: 256 << 10}.Put(w[:])
	if _, err := in.Write(append(append(w[:], make([]byte, 8)...), make([]byte, 1000)...)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-pl.placed:
	case <-time.After(watchdog):
		t.Fatal("watchdog: the frame was never placed")
	}

	// Our connection is replaced by a new session meanwhile.
	if err := a.sd.Disconnect(ctx, b.rank); err != nil {
		t.Fatal(err)
	}
	if err := a.sd.Connect(ctx, b.rank, b.local.Addr); err != nil {
		t.Fatal(err)
	}
	p := a.sd.(*subDevice).peers[b.rank].Load()

	in.Close()
	a.rec.waitFor(t, "PeerDown for the abandoned place", func() bool { return a.rec.downCount[b.rank] == 1 })
	if !p.alive() {
		t.Fatal("a place given before the session was connected took the session down when it failed")
	}
	send(t, a, &sdi.Frame{Peer: b.rank, Payload: []byte("on the new session"), Token: 1})
	b.rec.waitFor(t, "the frame sent on the new session", func() bool { return len(b.rec.delivered[a.rank]) == 1 })
}

// A link that dies takes both directions: our lane's failure is reported
// while the peer's stream to us ends inside a frame it was placing. The
// lane's report makes every stream of the peer give its place up, so it
// waits for each stream's lock; the stream's end is reported under that
// lock. It used to wait, under the lock, for the lane's report to finish:
// neither ever did. Here the test holds the stream's lock, as its reader
// would, while the lane's report is under way.
func TestPlaceFailedDuringLaneReport(t *testing.T) {
	a, b := striped(t)
	sd := a.sd.(*subDevice)
	p := sd.peers[b.rank].Load()
	var x *inbound
	sd.mu.Lock()
	for in := range sd.inbound {
		if in.rank == b.rank {
			x = in
			break
		}
	}
	sd.mu.Unlock()
	if x == nil {
		t.Fatal("no stream from the peer")
	}
	x.mu.Lock()
	x.placeGen = p.gen // the place was given while this session was current
	p.lanes[0].conn.Close()
	// Only the report halts the other lane: it is under way, and it will
	// wait for x's lock.
	<-p.lanes[1].halted

	returned := make(chan struct{})
	go func() {
		defer close(returned)
		sd.placeFailed(x, io.ErrUnexpectedEOF)
	}()
	select {
	case <-returned:
	case <-time.After(watchdog):
		t.Error("watchdog: the stream's end waited for the lane's report, which waits for the stream")
	}
	x.mu.Unlock()
	<-returned
	// Both are reported: the place needs its own report, the lane's
	// report ends what the stream may place later.
	a.rec.waitFor(t, "both reports", func() bool { return a.rec.downCount[b.rank] == 2 })
}

// A striped peer that dies while a large frame is being placed on each of
// its two lanes ends both our streams inside their frames at once. Each
// reader reports the end of its place under its own stream's lock, and a
// report gives up the places of the peer's other streams, under their
// locks: the two readers once waited for each other's lock for good, the
// peer was reported down once instead of twice and Close hung. Here the
// test plays both readers at the moment both hold their locks.
func TestPlacedStreamsEndTogether(t *testing.T) {
	pl := &placer{placed: make(chan struct{}, 2)}
	o := jobOpts{size: 2, config: `{"listen": "0.0.0.0:0"}`, twoLoopbacks: true}
	a := openNode(t, 0, jobOpts{size: 2, config: o.config, twoLoopbacks: true, handler: func(r *recorder) sdi.Handler { pl.recorder = r; return pl }})
	b := openNode(t, 1, o)
	var w [sdi.WireHeaderSize]byte
	sdi.WireHeader{HeaderLen: 8, PayloadLen: 512 << 10}.Put(w[:])
	for lane := range 2 {
		c := dialLane(t, b, a, laneID{session: 9, lane: uint16(lane), lanes: 2})
		defer c.Close()
		if _, err := c.Write(append(append(w[:], make([]byte, 8)...), make([]byte, 1000)...)); err != nil {
			t.Fatal(err)
		}
	}
	sd := a.sd.(*subDevice)
	var streams []*inbound
	for range 2 {
		select {
		case <-pl.placed:
		case <-time.After(watchdog):
			t.Fatal("watchdog: a frame was never placed")
		}
	}
	sd.mu.Lock()
	for in := range sd.inbound {
		streams = append(streams, in)
	}
	sd.mu.Unlock()
	if len(streams) != 2 {
		t.Fatalf("%d streams from the peer, want 2", len(streams))
	}
	var locked, done sync.WaitGroup
	locked.Add(2)
	for _, in := range streams {
		done.Go(func() {
			in.mu.Lock()
			defer in.mu.Unlock()
			if !in.fr.placing() {
				t.Error("the stream is not placing a frame")
			}
			locked.Done()
			locked.Wait()
			sd.streamEnded(in, io.ErrUnexpectedEOF)
		})
	}
	// Not t.Fatal: the test's cleanup, Close, would wait for the two.
	dog := time.AfterFunc(watchdog, func() { panic("watchdog: the two readers wait for each other's lock") })
	done.Wait()
	dog.Stop()
	a.rec.waitFor(t, "a report per place", func() bool { return a.rec.downCount[b.rank] == 2 })
}

// endingPlacer is a recorder that is also an sdi.Placer and keeps the
// Placer contract the way the plugin host's placer does: a place lives
// until its Deliver, and a report of the peer down ends every place still
// live, after which another message owns its bytes (played by 0xEE).
type endingPlacer struct {
	*recorder
	mu    sync.Mutex
	live  map[*byte][]byte
	ended [][]byte
	late  int // Delivers of a place that PeerDown had ended
}

func (p *endingPlacer) Place(from sdi.Rank, header []byte, n int) []byte {
	b := make([]byte, n)
	p.mu.Lock()
	p.live[&b[0]] = b
	p.mu.Unlock()
	return b
}

func (p *endingPlacer) PeerDown(peer sdi.Rank, err error) {
	p.mu.Lock()
	for k, b := range p.live {
		for i := range b {
			b[i] = 0xEE
		}
		p.ended = append(p.ended, b)
		delete(p.live, k)
	}
	p.mu.Unlock()
	p.recorder.PeerDown(peer, err)
}

func (p *endingPlacer) Deliver(from sdi.Rank, header, payload []byte) {
	p.mu.Lock()
	if len(payload) > 0 {
		delete(p.live, &payload[0])
		for _, b := range p.ended {
			if &payload[0] == &b[0] {
				p.late++
			}
		}
	}
	p.mu.Unlock()
	p.recorder.Deliver(from, header, payload)
}

// A report of a peer down ends every place given for its frames, up to
// the report's very end, while the peer's streams to us go on reading. A
// stream must therefore get no place from the moment the report looks for
// the peer's streams until the handler has it: neither a lane of the peer
// that registers after the report listed the streams ("late lane"), nor
// one whose place the report already gave up before it went on to wait
// for another stream's lock ("abandoned lane"). Both used to place their
// next frame in that window and, after PeerDown had freed the place, went
// on reading into it and delivered it: a write into a receive buffer that
// another message owned by then. The test holds the lock of the peer's
// other stream, Y, as a long drain would, to keep the report open.
func TestPlaceNotGivenDuringPeerDownReport(t *testing.T) {
	for _, tc := range []struct {
		name string
		// late: X is dialled once the report is under way; otherwise
		// both lanes are open and busy when it starts, and X is let go
		// first.
		late bool
		// tries: the report visits the streams in map order, and an
		// abandoned X shows the race only when it comes before Y.
		tries int
	}{
		{"late lane", true, 1},
		{"abandoned lane", false, 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for try := range tc.tries {
				t.Run(fmt.Sprintf("try %d", try), func(t *testing.T) {
					placeDuringReport(t, tc.late)
				})
				if t.Failed() {
					return
				}
			}
		})
	}
}

// placeDuringReport plays one round of TestPlaceNotGivenDuringPeerDownReport.
func placeDuringReport(t *testing.T, late bool) {
	pl := &endingPlacer{live: map[*byte][]byte{}}
	o := jobOpts{size: 2, config: `{"listen": "0.0.0.0:0"}`, twoLoopbacks: true}
	b := openNode(t, 1, o)
	o.handler = func(r *recorder) sdi.Handler { pl.recorder = r; return pl }
	a := openNode(t, 0, o)
	if err := a.sd.Connect(t.Context(), b.rank, b.local.Addr); err != nil {
		t.Fatal(err)
	}
	sd := a.sd.(*subDevice)
	stream := func(c net.Conn) *inbound {
		sd.mu.Lock()
		defer sd.mu.Unlock()
		for in := range sd.inbound {
			if in.conn.LocalAddr().String() == c.RemoteAddr().String() {
				return in
			}
		}
		t.Fatalf("no stream from %v", c.LocalAddr())
		return nil
	}
	y := dialLane(t, b, a, laneID{session: 9, lane: 1, lanes: 2})
	defer y.Close()
	ys := stream(y)
	var x net.Conn
	if !late {
		x = dialLane(t, b, a, laneID{session: 9, lane: 0, lanes: 2})
		defer x.Close()
		stream(x).mu.Lock()
	}
	ys.mu.Lock()
	p := sd.peers[b.rank].Load()
	go p.laneDown(errors.New("test: our connection to b broke"), nil)
	for _, l := range p.lanes {
		<-l.halted // the report comes next
	}
	// Time for the report to list the streams and reach a lock it waits
	// for; without it the round proves less, never fails wrongly.
	time.Sleep(50 * time.Millisecond)
	var xs *inbound
	if late {
		x = dialLane(t, b, a, laneID{session: 9, lane: 0, lanes: 2})
		defer x.Close()
		xs = stream(x)
	} else {
		xs = stream(x)
		xs.mu.Unlock()
		time.Sleep(50 * time.Millisecond) // the report may give up X's place now
	}

	// A frame too large to batch, in two writes: the first has X decide
	// where the payload goes during the report, the second comes after it.
	const n = 256 << 10
	payload := pattern(n, 3)
	var w [sdi.WireHeaderSize]byte
	sdi.WireHeader{HeaderLen: 8, PayloadLen: n}.Put(w[:])
	head := slices.Concat(w[:], binary.LittleEndian.AppendUint64(nil, 1), payload[:1000])
	if _, err := x.Write(head); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(watchdog); ; time.Sleep(time.Millisecond) {
		xs.mu.Lock()
		decided := xs.fr != nil && xs.fr.dst != nil
		xs.mu.Unlock()
		if decided {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("watchdog: X never started reading the frame's payload")
		}
	}
	ys.mu.Unlock()
	a.rec.waitFor(t, "PeerDown", func() bool { return a.rec.downCount[b.rank] == 1 })

	// The rest, then a small frame whose Deliver says X read it all.
	sdi.WireHeader{HeaderLen: 8}.Put(w[:])
	rest := slices.Concat(payload[1000:], w[:], binary.LittleEndian.AppendUint64(nil, 2))
	if _, err := x.Write(rest); err != nil {
		t.Fatal(err)
	}
	a.rec.waitFor(t, "the frame after the large one", func() bool {
		d := a.rec.delivered[b.rank]
		return len(d) > 0 && binary.LittleEndian.Uint64(d[len(d)-1].header) == 2
	})

	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.late > 0 {
		t.Errorf("a place PeerDown had ended was delivered %d time(s)", pl.late)
	}
	for _, e := range pl.ended {
		if i := slices.IndexFunc(e, func(c byte) bool { return c != 0xEE }); i >= 0 {
			t.Errorf("a place PeerDown had ended was written into after it (byte %d of %d)", i, len(e))
		}
	}
	for _, d := range a.rec.frames(b.rank) {
		if binary.LittleEndian.Uint64(d.header) == 1 && !bytes.Equal(d.payload, payload) {
			t.Errorf("the large frame was delivered with a payload not the one sent")
		}
	}
}
