package tcp

import (
	"bytes"
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// waitUntil polls cond until it holds; the watchdog only catches a hang.
func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(watchdog)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("watchdog: still waiting for %s", what)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// streamsFrom returns the inbound connections sd holds from rank, and the
// sessions they belong to.
func streamsFrom(sd *subDevice, rank sdi.Rank) (ins []*inbound, sessions map[*session]bool) {
	sd.mu.Lock()
	defer sd.mu.Unlock()
	sessions = map[*session]bool{}
	for in := range sd.inbound {
		if in.rank == rank {
			ins = append(ins, in)
			sessions[in.sess] = true
		}
	}
	return ins, sessions
}

// sessionState returns the rank's newest inbound session and how many
// sessions sd keeps for it.
func sessionState(sd *subDevice, rank sdi.Rank) (latest *session, n int) {
	sd.mu.Lock()
	defer sd.mu.Unlock()
	for k := range sd.sessions {
		if k.rank == rank {
			n++
		}
	}
	return sd.latest[rank], n
}

// openSockets counts the sockets the process holds.
func openSockets(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count descriptors: %v", err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// Two Connects to one rank that cross both dial; one installs its
// connections and the other closes its own. When the loser's connections
// reach the acceptor after the winner's, their session waits for the
// winner's to end before it reads, and a connection that is not read
// never notices the connector closing it: the acceptor used to keep the
// loser's sockets, and a goroutine each, until the winner's session ended,
// which may be the end of the job. They must go at once, and leave the
// winner's session the one a reconnect waits for.
func TestCrossingLoserClosedPromptly(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  jobOpts
		lanes int
	}{
		{"one lane", jobOpts{size: 2, config: `{"listen": "127.0.0.1:0"}`}, 1},
		{"two lanes", jobOpts{size: 2, config: `{"listen": "0.0.0.0:0"}`, twoLoopbacks: true}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := openNode(t, 0, tc.opts), openNode(t, 1, tc.opts)
			bsd := b.sd.(*subDevice)
			if err := a.sd.Connect(t.Context(), b.rank, b.local.Addr); err != nil {
				t.Fatal(err)
			}
			if n := len(Links(a.sd, b.rank)); n != tc.lanes {
				t.Fatalf("%d links, want %d", n, tc.lanes)
			}
			winner, _ := sessionState(bsd, a.rank)
			if winner == nil {
				t.Fatal("no session from the peer")
			}

			// The losing Connect's lanes, registered after the winner's,
			// then closed by the connector as install does.
			var loser []net.Conn
			for i := range tc.lanes {
				loser = append(loser, dialLane(t, a, b, laneID{session: 99, lane: uint16(i), lanes: uint16(tc.lanes)}))
			}
			closeAll(loser)
			waitUntil(t, "the loser's connections to close at the acceptor", func() bool {
				ins, _ := streamsFrom(bsd, a.rank)
				return len(ins) == tc.lanes
			})
			if latest, n := sessionState(bsd, a.rank); latest != winner || n != 1 {
				t.Fatalf("after the loser left: newest session %p (want the winner's %p), %d sessions (want 1)", latest, winner, n)
			}

			// The winner still delivers, and a reconnect after it works.
			send(t, a, &sdi.Frame{Peer: b.rank, Payload: []byte("winner"), Token: 1})
			b.rec.waitFor(t, "the winner's frame", func() bool { return len(b.rec.delivered[a.rank]) == 1 })
			if err := a.sd.Disconnect(t.Context(), b.rank); err != nil {
				t.Fatal(err)
			}
			if err := a.sd.Connect(t.Context(), b.rank, b.local.Addr); err != nil {
				t.Fatal(err)
			}
			send(t, a, &sdi.Frame{Peer: b.rank, Payload: []byte("reconnected"), Token: 2})
			b.rec.waitFor(t, "the frame after the reconnect", func() bool { return len(b.rec.delivered[a.rank]) == 2 })
			if got := string(b.rec.frames(a.rank)[1].payload); got != "reconnected" {
				t.Fatalf("second frame %q", got)
			}
		})
	}
}

// Sessions that end before their turn carried nothing, but a session
// begun after them must still wait for everything begun before them. Here
// the winner W is followed by two losers L1 and L2, each with one lane,
// which end in either order, and, in the last case, W ends while L1 (ended
// already) still waits for it and L2 (open) waits for L1: L2 must then get
// its turn.
func TestEmptySessionsKeepOrder(t *testing.T) {
	for _, tc := range []struct {
		name  string
		close []int // 1: L1's lane, 2: L2's lane, 0: W (Disconnect)
	}{
		{"first loser first", []int{1, 2}},
		{"second loser first", []int{2, 1}},
		{"winner ends between", []int{1, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := jobOpts{size: 2, config: `{"listen": "127.0.0.1:0"}`}
			a, b := openNode(t, 0, o), openNode(t, 1, o)
			bsd := b.sd.(*subDevice)
			if err := a.sd.Connect(t.Context(), b.rank, b.local.Addr); err != nil {
				t.Fatal(err)
			}
			winner, _ := sessionState(bsd, a.rank)
			l := map[int]net.Conn{
				1: dialLane(t, a, b, laneID{session: 101, lanes: 1}),
				2: dialLane(t, a, b, laneID{session: 102, lanes: 1}),
			}
			defer l[2].Close()
			open := 3 // W, L1, L2
			for _, c := range tc.close {
				if c == 0 {
					if err := a.sd.Disconnect(t.Context(), b.rank); err != nil {
						t.Fatal(err)
					}
				} else {
					l[c].Close()
				}
				open--
				waitUntil(t, "the closed connection to go", func() bool {
					ins, _ := streamsFrom(bsd, a.rank)
					return len(ins) == open
				})
			}
			latest, n := sessionState(bsd, a.rank)
			switch tc.close[1] {
			case 0:
				// Only L2 is left, and it has its turn: it is read.
				ins, _ := streamsFrom(bsd, a.rank)
				in := ins[0]
				waitUntil(t, "the last session's turn", func() bool {
					in.mu.Lock()
					defer in.mu.Unlock()
					return in.fr != nil
				})
				if latest != in.sess || n != 1 {
					t.Fatalf("newest session %p (want L2's %p), %d sessions (want 1)", latest, in.sess, n)
				}
			default:
				if latest != winner || n != 1 {
					t.Fatalf("newest session %p (want the winner's %p), %d sessions (want 1)", latest, winner, n)
				}
			}
		})
	}
}

// Crossing Connects, for real: after every Disconnect two Connects race,
// and whichever loses, the acceptor ends up holding only the winner's
// connections, and the process no more sockets than after the first round.
func TestCrossingConnectsHoldNoSockets(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts jobOpts
	}{
		{"one lane", jobOpts{size: 2, config: `{"listen": "127.0.0.1:0"}`}},
		{"two lanes", jobOpts{size: 2, config: `{"listen": "0.0.0.0:0"}`, twoLoopbacks: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := openNode(t, 0, tc.opts), openNode(t, 1, tc.opts)
			bsd := b.sd.(*subDevice)
			ctx := t.Context()
			const rounds = 20
			base := -1
			for r := range rounds {
				if r > 0 {
					if err := a.sd.Disconnect(ctx, b.rank); err != nil {
						t.Fatal(err)
					}
				}
				var wg sync.WaitGroup
				errs := make([]error, 2)
				for i := range errs {
					wg.Go(func() { errs[i] = a.sd.Connect(ctx, b.rank, b.local.Addr) })
				}
				wg.Wait()
				for _, err := range errs {
					if err != nil {
						t.Fatal(err)
					}
				}
				lanes := len(Links(a.sd, b.rank))
				waitUntil(t, "the acceptor to hold only the winner's connections", func() bool {
					ins, _ := streamsFrom(bsd, a.rank)
					return len(ins) == lanes
				})
				if base < 0 {
					base = openSockets(t)
				}
				waitUntil(t, "the process's sockets to go back to what the first round left", func() bool {
					return openSockets(t) == base
				})
				send(t, a, &sdi.Frame{Peer: b.rank, Payload: []byte{byte(r)}, Token: uint64(r)})
				b.rec.waitFor(t, "the round's frame", func() bool { return len(b.rec.delivered[a.rank]) == r+1 })
			}
			for i, d := range b.rec.frames(a.rank) {
				if d.payload[0] != byte(i) {
					t.Fatalf("frame %d carries round %d", i, d.payload[0])
				}
			}
		})
	}
}

// A session that waits for its turn while its frames arrive is watched
// for its end with a peek of one byte. The frames must stay where they
// are until the session before has ended, and then arrive intact: the
// peek takes nothing from the stream (with SO_PEEK_OFF, a peek would also
// move the offset the frame reader's peeks start from). The session
// before is a connection of the test's, which delivers a frame before
// the new session's frames are sent and more after, and then ends.
func TestWaitingSessionKeepsItsFrames(t *testing.T) {
	o := jobOpts{size: 2, config: `{"listen": "127.0.0.1:0"}`}
	a, b := openNode(t, 0, o), openNode(t, 1, o)
	before := dialLane(t, a, b, laneID{session: 7, lanes: 1})
	defer before.Close()
	// Frames of the session before carry tokens from 100 on.
	writeFrame := func(token uint64) {
		t.Helper()
		f := tokenFrame(b.rank, token, 100)
		w := make([]byte, sdi.WireHeaderSize)
		sdi.WireHeader{HeaderLen: uint16(len(f.Header)), PayloadLen: uint32(len(f.Payload))}.Put(w)
		if _, err := before.Write(append(append(w, f.Header...), f.Payload...)); err != nil {
			t.Fatal(err)
		}
	}
	writeFrame(100)
	b.rec.waitFor(t, "the first frame of the session before", func() bool { return len(b.rec.delivered[a.rank]) == 1 })

	if err := a.sd.Connect(t.Context(), b.rank, b.local.Addr); err != nil {
		t.Fatal(err)
	}
	const n = 4
	for i := range n {
		send(t, a, tokenFrame(b.rank, uint64(i), 100))
	}
	a.rec.waitFor(t, "the new session's frames written", func() bool { return len(a.rec.done) == n })
	// The new session's frames are in b's socket. Frames of the session
	// before, one at a time, give a reader that took them out of turn
	// every chance to show it.
	const later = 50
	for i := range later {
		writeFrame(101 + uint64(i))
		b.rec.waitFor(t, "a frame of the session before", func() bool {
			ds := b.rec.delivered[a.rank]
			return len(ds) > 0 && binary.LittleEndian.Uint64(ds[len(ds)-1].header) == 101+uint64(i)
		})
	}
	if got := b.rec.count(a.rank); got != 1+later {
		t.Fatalf("%d frames delivered while the session before was open, want its %d", got, 1+later)
	}

	before.Close()
	b.rec.waitFor(t, "the new session's frames", func() bool { return len(b.rec.delivered[a.rank]) == 1+later+n })
	var want []uint64
	for i := range 1 + later {
		want = append(want, 100+uint64(i))
	}
	for i := range n {
		want = append(want, uint64(i))
	}
	for i, d := range b.rec.frames(a.rank) {
		token := binary.LittleEndian.Uint64(d.header)
		if token != want[i] || !bytes.Equal(d.payload, pattern(100, byte(token))) {
			t.Fatalf("frame %d: token %d (want %d), payload intact %v", i, token, want[i], bytes.Equal(d.payload, pattern(100, byte(token))))
		}
	}
}
