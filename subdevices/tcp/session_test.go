package tcp

import (
	"encoding/binary"
	"net"
	"testing"
)

// dialLanes opens one connection from a to b per lane of session, lane i
// over the i-th interface pair, each through the real handshake. dial
// returns only after b's acceptor registered the lane, so calls in a row
// fix the order in which b sees lanes, whatever the scheduler does.
func dialLanes(t *testing.T, a, b *node, session uint64, lanes ...int) []net.Conn {
	t.Helper()
	sd := a.sd.(*subDevice)
	c, err := decodeCard(b.local.Addr)
	if err != nil {
		t.Fatal(err)
	}
	pairs, _, err := sd.choose(b.rank, c)
	if err != nil || len(pairs) != 2 {
		t.Fatalf("pairs %v, %v; want two", pairs, err)
	}
	var conns []net.Conn
	for _, i := range lanes {
		conn, err := sd.dial(t.Context(), b.rank, pairs[i], c.Port, laneID{session: session, lane: uint16(i), lanes: 2})
		if err != nil {
			t.Fatalf("session %d lane %d: %v", session, i, err)
		}
		conns = append(conns, conn)
	}
	return conns
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
				conns[step.session] = append(conns[step.session], dialLanes(t, a, b, step.session, step.lane)...)
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
