package shm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// placeLog is a Handler that places every payload whose header starts
// with "place" in a fresh buffer and logs, in order, the places it gave,
// the frames delivered in them or elsewhere, and the peers reported down,
// keeping a copy of the last place as it was at the report.
type placeLog struct {
	*recorder
	mu     sync.Mutex
	events []string
	place  []byte
	atDown []byte
}

func (h *placeLog) Place(_ sdi.Rank, header []byte, n int) []byte {
	if !bytes.HasPrefix(header, []byte("place")) {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.place = make([]byte, n)
	h.events = append(h.events, "place")
	return h.place
}

func (h *placeLog) Deliver(from sdi.Rank, header, payload []byte) {
	h.mu.Lock()
	ev := "deliver"
	if len(h.place) > 0 && len(payload) == len(h.place) && &payload[0] == &h.place[0] {
		ev = "deliver placed"
	}
	h.events = append(h.events, ev)
	h.mu.Unlock()
	h.recorder.Deliver(from, header, payload)
}

func (h *placeLog) PeerDown(peer sdi.Rank, err error) {
	h.mu.Lock()
	h.events = append(h.events, "down")
	h.atDown = bytes.Clone(h.place)
	h.mu.Unlock()
	h.recorder.PeerDown(peer, err)
}

// afterDown returns the events logged after the first PeerDown, and
// whether the place changed since.
func (h *placeLog) afterDown() (events []string, changed bool, reported bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	i := slices.Index(h.events, "down")
	if i < 0 {
		return nil, false, false
	}
	return h.events[i+1:], !bytes.Equal(h.place, h.atDown), true
}

// TestPeerDownEndsPlace: once the receiver reports a sender down because
// it closed its segment, it writes nothing more into the place it was
// filling from that sender's ring and delivers no frame of that sender's
// after the report (sdi.Placer). A Send that was writing the fragments of
// a large frame when its rank's Close marked the segment closed goes on
// writing them ("cut short"), and a frame larger than a drain pass was
// whole in the ring but only partly read when the closed segment was
// noticed ("beyond one drain pass"): either way the receiver's later
// polls went on filling the place and delivered the frame after the
// PeerDown, into a buffer the multidevice had already handed back.
func TestPeerDownEndsPlace(t *testing.T) {
	const ringBytes = 16 << 20
	chunk := fragmentBytes(ringBytes) // 1 MiB, the drain budget
	payload := pattern(3, 4*chunk)
	hdr := []byte("place me")
	for _, tt := range []struct {
		name string
		// send writes the frame from rank 0 to rank 1 and returns a
		// function that writes what follows the report, if anything.
		send func(t *testing.T, j *job) func()
		// whole: the frame lies whole in the ring before the report, so
		// it may be delivered, but only before the report.
		whole bool
	}{
		{name: "cut short", send: func(t *testing.T, j *job) func() {
			var lenField [fragLenBytes]byte
			binary.LittleEndian.PutUint64(lenField[:], uint64(len(payload)))
			scribble(t, j, 0, 1, func(d []byte, tail uint64) uint64 {
				return putParts(d, tail, 0, flagFirst, hdr, lenField[:], payload[:chunk])
			})
			return func() {
				scribble(t, j, 0, 1, func(d []byte, tail uint64) uint64 {
					for off := chunk; off < len(payload); off += chunk {
						tail = putParts(d, tail, 0, flagNext, nil, nil, payload[off:off+chunk])
					}
					return tail
				})
			}
		}},
		{name: "beyond one drain pass", whole: true, send: func(t *testing.T, j *job) func() {
			mustSend(t, j.sds[0], &sdi.Frame{Peer: 1, Header: hdr, Payload: payload})
			return func() {}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var log *placeLog
			j := openJob(t, 2, jobOpts{
				config: []byte(`{"ring_bytes": 16777216, "single_copy": false}`),
				handler: func(r int, rec *recorder) sdi.Handler {
					if r != 1 {
						return rec
					}
					log = &placeLog{recorder: rec}
					return log
				},
			})
			rx := j.sds[1].(*device)
			// The test is rank 1's receiver: nothing is read but what
			// it reads.
			rx.rxMu.Lock()
			defer rx.rxMu.Unlock()
			rest := tt.send(t, j)
			rx.rx.drain(0) // the first fragment: the place is given and partly filled
			if got := rx.rx.parts[0]; !got.active || got.got != chunk {
				t.Fatalf("after one pass the frame has %d bytes in (active %v), want %d", got.got, got.active, chunk)
			}
			// Rank 0's Close marks its segment closed first thing.
			word32(j.sds[0].(*device).seg.Bytes(), offState).Store(stateClosed)
			rx.rx.checkPeers()
			rest()
			for range 8 {
				rx.rx.poll()
			}
			after, changed, reported := log.afterDown()
			switch {
			case !reported:
				t.Fatal("rank 0 closed its segment and was not reported down")
			case len(after) > 0:
				t.Fatalf("after the PeerDown: %s; want nothing (all events: %s)", strings.Join(after, ", "), strings.Join(log.events, ", "))
			case changed:
				t.Fatal("bytes were written into the place after the PeerDown")
			}
			if delivered := slices.Contains(log.events, "deliver placed"); delivered != tt.whole {
				t.Fatalf("placed frame delivered: %v, want %v (events: %s)", delivered, tt.whole, strings.Join(log.events, ", "))
			}
		})
	}
}

// TestDisconnectedSenderDiesMidFrame: a rank disconnected from a sender
// while it places a frame of the sender's, whose fragments stop coming
// because the sender's process died, reports the sender down, which ends
// the place. It used to look after connected senders only, so the
// Handler kept the place for a Deliver that never came.
func TestDisconnectedSenderDiesMidFrame(t *testing.T) {
	const ringBytes = 16 << 20
	chunk := fragmentBytes(ringBytes)
	payload := pattern(4, 4*chunk)
	var log *placeLog
	j := openJob(t, 2, jobOpts{
		config:   []byte(`{"ring_bytes": 16777216, "single_copy": false}`),
		sleepFor: 20 * time.Millisecond,
		handler: func(r int, rec *recorder) sdi.Handler {
			if r != 1 {
				return rec
			}
			log = &placeLog{recorder: rec}
			return log
		},
	})
	rx := j.sds[1].(*device)
	// Rank 0's process, as rank 1 knows it, is one the test can end.
	proc, die := liveProc(t)
	p := rx.peers[0].Load()
	p.mu.Lock()
	old := p.proc
	p.proc = proc
	p.mu.Unlock()
	if err := old.release(); err != nil {
		t.Fatal(err)
	}
	var lenField [fragLenBytes]byte
	binary.LittleEndian.PutUint64(lenField[:], uint64(len(payload)))
	scribble(t, j, 0, 1, func(d []byte, tail uint64) uint64 {
		return putParts(d, tail, 0, flagFirst, []byte("place me"), lenField[:], payload[:chunk])
	})
	for deadline := time.Now().Add(20 * time.Second); ; {
		log.mu.Lock()
		placed := slices.Contains(log.events, "place")
		log.mu.Unlock()
		if placed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first fragment was not placed within the watchdog")
		}
		time.Sleep(time.Millisecond)
	}
	if err := j.sds[1].Disconnect(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	die()
	if d := j.hs[1].nextDown(t); d.peer != 0 || !errors.Is(d.err, sdi.ErrPeerUnreachable) {
		t.Fatalf("PeerDown(%d, %v), want rank 0 and ErrPeerUnreachable", d.peer, d.err)
	}
	// What a sender writes after its report goes nowhere.
	scribble(t, j, 0, 1, func(d []byte, tail uint64) uint64 {
		for off := chunk; off < len(payload); off += chunk {
			tail = putParts(d, tail, 0, flagNext, nil, nil, payload[off:off+chunk])
		}
		return tail
	})
	rx.rxMu.Lock()
	for range 8 {
		rx.rx.poll()
	}
	rx.rxMu.Unlock()
	if after, changed, _ := log.afterDown(); len(after) > 0 || changed {
		t.Fatalf("after the PeerDown: %s, place changed: %v", strings.Join(after, ", "), changed)
	}
}

// TestDisconnectDuringClose: a Disconnect waiting for a descriptor to be
// read when Close comes must not touch this rank's segment after Close
// unmapped it. It stored the ring's copy mode there, a fault that killed
// the process, once Close had failed the descriptor and its Flush
// returned.
func TestDisconnectDuringClose(t *testing.T) {
	j := openJob(t, 2, jobOpts{})
	sd := j.sds[0].(*device)
	inFlight(t, sd.peers[1].Load(), make([]byte, 1)) // never read: rank 1 has no record of it
	errc := make(chan error, 1)
	go func() { errc <- sd.Disconnect(context.Background(), 1) }()
	for !strings.Contains(stacks(), ".(*device).Flush(") {
		time.Sleep(time.Millisecond)
	}
	if err := sd.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, sdi.ErrClosed) {
		t.Fatalf("Disconnect during Close = %v, want ErrClosed", err)
	}
}

// stacks returns every goroutine's stack.
func stacks() string {
	b := make([]byte, 1<<20)
	return string(b[:runtime.Stack(b, true)])
}
