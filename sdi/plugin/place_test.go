package plugin

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/hpc-multidevice/multidevice/internal/shmem"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// recHandler records what the host's side of the plane delivers.
type recHandler struct {
	mu    sync.Mutex
	got   []delivery
	downs []sdi.Rank
	whys  []error // each down's reason
}

type delivery struct {
	from            sdi.Rank
	header, payload []byte
}

func (h *recHandler) Deliver(from sdi.Rank, header, payload []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.got = append(h.got, delivery{from, bytes.Clone(header), bytes.Clone(payload)})
}
func (h *recHandler) SendDone(uint64, error) {}
func (h *recHandler) PeerDown(peer sdi.Rank, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.downs = append(h.downs, peer)
	h.whys = append(h.whys, err)
}

func (h *recHandler) reasons() []error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]error(nil), h.whys...)
}

func (h *recHandler) snapshot() ([]delivery, []sdi.Rank) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]delivery(nil), h.got...), append([]sdi.Rank(nil), h.downs...)
}

// placePair is both sides of a ring plane with a place area, in one
// process, attached as Client.attach and server.Transfer do: the host's
// consumer drains on poll, the plugin's Handler is the server's.
type placePair struct {
	host *hostRing
	srv  *server
	h    *recHandler
}

func newPlacePair(t *testing.T, maxPayload int) *placePair {
	t.Helper()
	lim := limits{maxHeader: 64, maxPayload: maxPayload, size: 3}
	bytes, _ := planeBytes(sdi.Caps{MaxHeader: lim.maxHeader, MaxFrame: maxPayload})
	name := "mdsditest." + segmentName()
	hostSeg, err := shmem.Create(name, segmentSize(bytes, bytes))
	if err != nil {
		t.Skipf("no shared memory here: %v", err)
	}
	initSegment(hostSeg.Bytes(), bytes, bytes)
	cl := &Client{log: hclog.NewNullLogger()}
	aseg := cl.createPlaceArea(hostSeg, lim)
	if aseg == nil {
		hostSeg.Close()
		t.Fatal("no place area for payloads of", maxPayload)
	}
	srv := newServer(nil, hclog.NewNullLogger(), nil)
	srv.lim = lim
	srv.down = make([]atomic.Bool, lim.size)
	plugSeg, err := shmem.Open(name)
	if err == nil {
		err = checkSegment(plugSeg.Bytes(), uint64(bytes), uint64(bytes))
	}
	hostSeg.Unlink()
	if err != nil {
		hostSeg.Close()
		aseg.Close()
		t.Fatal(err)
	}
	plugArea := srv.openPlaceArea(plugSeg)
	aseg.Unlink()
	if plugArea == nil {
		t.Fatal("the plugin did not map the place area the host announced")
	}
	ring := newPluginRing(plugSeg, plugArea, srv, lim)
	srv.plane = ring
	close(srv.attached)
	srv.placer.Store(newPlacer(placeAreaAt(plugArea.Bytes()), ring, lim.maxPayload, plugArea.Reserve))
	h := &recHandler{}
	p := &placePair{host: newHostRing(hostSeg, aseg, h, lim, func(err error) { t.Errorf("data plane failed: %v", err) }), srv: srv, h: h}
	t.Cleanup(func() {
		p.host.stop()
		ring.stop()
	})
	return p
}

// handler is the Handler the plugin's subdevice sees, as a Placer.
func (p *placePair) handler() interface {
	sdi.Handler
	sdi.Placer
} {
	return (*serverHandler)(p.srv)
}

// await polls the host's side until it has n deliveries and has freed
// all but busy slots of the place area.
func (p *placePair) await(t *testing.T, n, busy int) []delivery {
	t.Helper()
	var got []delivery
	eventually(t, "deliveries reach the host", func() bool {
		got, _ = p.h.snapshot()
		free := 0
		for i := range p.host.area.slots {
			if p.host.area.word(i).Load() == slotFree {
				free++
			}
		}
		return len(got) >= n && free == p.host.area.slots-busy
	}, func() { p.host.poll() })
	return got
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

// A placed payload reaches the host intact and in order with the peer's
// other frames, slots are reused once the host has delivered them, and
// Place says no (the subdevice copies as before) when every slot is busy
// or the payload is too small to be worth one.
func TestPlacedFramesArriveIntact(t *testing.T) {
	const maxPayload = 256 << 10
	p := newPlacePair(t, maxPayload)
	h := p.handler()

	if got := h.Place(1, []byte("h"), placeMin-1); got != nil {
		t.Fatalf("placed a payload of %d bytes, below placeMin", placeMin-1)
	}
	if got := h.Place(1, []byte("h"), maxPayload+1); got != nil {
		t.Fatal("placed a payload beyond the limit")
	}
	var want []delivery
	for round := range 3 {
		var placed [][]byte
		for i := range placeSlots {
			n := maxPayload - 1000*i - round
			s := h.Place(1, []byte{byte(round), byte(i)}, n)
			if len(s) != n {
				t.Fatalf("round %d: Place %d = %d bytes, want %d", round, i, len(s), n)
			}
			copy(s, pattern(n, byte(round*16+i)))
			placed = append(placed, s)
		}
		if s := h.Place(1, []byte("h"), placeMin); s != nil {
			t.Fatalf("round %d: Place gave a slot while all %d are busy", round, placeSlots)
		}
		for i, s := range placed {
			hdr := []byte{byte(round), byte(i)}
			h.Deliver(1, hdr, s)
			want = append(want, delivery{1, hdr, bytes.Clone(s)})
			small := []byte{byte(round), byte(i), 's'}
			h.Deliver(1, small, small) // copied through the ring, in between
			want = append(want, delivery{1, small, small})
		}
		got := p.await(t, len(want), 0)
		for i := range want {
			if got[i].from != want[i].from || !bytes.Equal(got[i].header, want[i].header) || !bytes.Equal(got[i].payload, want[i].payload) {
				t.Fatalf("round %d: delivery %d: from %d header %x, %d bytes; want from %d header %x, %d bytes (payload equal: %v)",
					round, i, got[i].from, got[i].header, len(got[i].payload), want[i].from, want[i].header, len(want[i].payload),
					bytes.Equal(got[i].payload, want[i].payload))
			}
		}
	}
}

// A peer that goes down in the middle of a placed frame: the host gets the
// peer down and nothing of the frame. The report ends the peer's places
// (sdi.Placer: the subdevice writes no more into them), so their slots
// are handed out again, while another peer's place carries on. The
// plugin once kept them taken for good, and slots ran out.
func TestPeerDownMidPlacedFrame(t *testing.T) {
	const n = 64 << 10
	p := newPlacePair(t, n)
	h := p.handler()

	abandoned := h.Place(2, []byte("lost"), n)
	other := h.Place(1, []byte("other"), n)
	if abandoned == nil || other == nil {
		t.Fatal("no slots for the first frames")
	}
	copy(abandoned[:n/2], pattern(n/2, 9))
	copy(other, pattern(n, 8))
	h.PeerDown(2, errors.New("stream ended inside a placed frame"))
	h.Deliver(1, []byte("other"), other)
	want := []delivery{{1, []byte("other"), pattern(n, 8)}}
	p.await(t, len(want), 0)

	// Every slot serves further placed frames, the abandoned one too.
	reused := false
	for i := range 3 * placeSlots {
		from := sdi.Rank(i % 2)
		s := h.Place(from, []byte{byte(i)}, n)
		if s == nil {
			t.Fatalf("frame %d: no slot although none is busy", i)
		}
		reused = reused || &s[0] == &abandoned[0]
		copy(s, pattern(n, byte(i)))
		h.Deliver(from, []byte{byte(i)}, s)
		want = append(want, delivery{from, []byte{byte(i)}, pattern(n, byte(i))})
		p.await(t, len(want), 0)
	}
	if !reused {
		t.Fatal("the slot of the place the peer's report ended was never handed out again")
	}
	got, downs := p.h.snapshot()
	if len(downs) != 1 || downs[0] != 2 {
		t.Fatalf("peers down: %v, want [2]", downs)
	}
	if len(got) != len(want) {
		t.Fatalf("%d deliveries, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].from == 2 || !bytes.Equal(got[i].payload, want[i].payload) {
			t.Fatalf("delivery %d from %d corrupt or from the lost peer", i, got[i].from)
		}
	}
	// A Deliver of a slice that is no placed slot (any more) is copied as
	// an ordinary frame, not published as a slot.
	for j := range placeMin {
		abandoned[j] = 0xee
	}
	h.Deliver(1, []byte("x"), abandoned[:placeMin])
	got = p.await(t, len(want)+1, 0)
	if last := got[len(got)-1]; len(last.payload) != placeMin || last.payload[0] != 0xee {
		t.Fatalf("a frame delivered from a foreign slice arrived as %d bytes", len(last.payload))
	}
}

// The host checks every placed record against the area before it reads a
// slot: a broken or hostile plugin cannot make it read out of bounds or
// deliver a slot twice.
func TestPlacedRecordChecked(t *testing.T) {
	mem := make([]byte, placeAreaSize(2, 64<<10))
	initPlaceArea(mem, 2, 64<<10)
	a := placeAreaAt(mem)
	a.word(1).Store(slotTaken)
	for _, tc := range []struct {
		name string
		rec  record
		want string
	}{
		{"slot beyond the area", record{kind: kindPlaced, aux: 2, placed: 100}, "slot 2 of 2"},
		{"huge slot number", record{kind: kindPlaced, aux: ^uint32(0), placed: 100}, "of 2"},
		{"longer than a slot", record{kind: kindPlaced, aux: 1, placed: 64<<10 + 1}, "slots hold"},
		{"empty", record{kind: kindPlaced, aux: 1, placed: 0}, "0 bytes"},
		{"free slot", record{kind: kindPlaced, aux: 0, placed: 100}, "free"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := a.take(tc.rec)
			if !errors.Is(err, sdi.ErrBadFrame) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrBadFrame mentioning %q", err, tc.want)
			}
		})
	}
	b, err := a.take(record{kind: kindPlaced, aux: 1, placed: 100})
	if err != nil || len(b) != 100 || &b[0] != &mem[placeDataOffset+64<<10] {
		t.Fatalf("take of a good record = %d bytes, %v", len(b), err)
	}
}

func TestCheckPlaceArea(t *testing.T) {
	const slotBytes = 64 << 10
	good := func() []byte {
		mem := make([]byte, placeAreaSize(2, slotBytes))
		initPlaceArea(mem, 2, slotBytes)
		return mem
	}
	if err := checkPlaceArea(good(), 2, slotBytes, slotBytes); err != nil {
		t.Fatalf("a good area: %v", err)
	}
	for _, tc := range []struct {
		name       string
		mem        []byte
		slots      uint32
		slotBytes  uint64
		maxPayload int
		want       string
	}{
		{"short", good()[:100], 2, slotBytes, slotBytes, "smaller than its header"},
		{"magic", append([]byte{0}, good()[1:]...), 2, slotBytes, slotBytes, "magic"},
		{"announced otherwise", good(), 3, slotBytes, slotBytes, "disagrees"},
		{"slots smaller than a payload", good(), 2, slotBytes, slotBytes + 1, "multiple of 4096"},
		{"size of the file", good()[:placeAreaSize(2, slotBytes)-1], 2, slotBytes, slotBytes, "want"},
		{"no slots", func() []byte { m := good(); binary.LittleEndian.PutUint32(m[8:], 0); return m }(), 0, slotBytes, slotBytes, "0 slots"},
		{"unaligned slots", func() []byte { m := good(); binary.LittleEndian.PutUint64(m[16:], slotBytes+1); return m }(), 2, slotBytes + 1, slotBytes, "multiple of 4096"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkPlaceArea(tc.mem, tc.slots, tc.slotBytes, tc.maxPayload)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func FuzzCheckPlaceArea(f *testing.F) {
	mem := make([]byte, placeAreaSize(1, 16<<10))
	initPlaceArea(mem, 1, 16<<10)
	f.Add(mem[:placeDataOffset+64], uint32(1), uint64(16<<10))
	f.Add([]byte{}, uint32(0), uint64(0))
	f.Fuzz(func(t *testing.T, head []byte, slots uint32, slotBytes uint64) {
		// The header comes from the fuzzer, the slots are zeros; the
		// shape must check out before anything is indexed by it.
		area := make([]byte, max(len(head), placeAreaSize(1, 16<<10)))
		copy(area, head)
		if err := checkPlaceArea(area, slots, slotBytes, placeMin); err != nil {
			return
		}
		a := placeAreaAt(area)
		for i := range a.slots {
			a.word(i).Store(slotTaken)
			if b, err := a.take(record{kind: kindPlaced, aux: uint32(i), placed: a.slotBytes}); err != nil || len(b) != a.slotBytes {
				t.Fatalf("slot %d of an accepted area: %d bytes, %v", i, len(b), err)
			}
		}
	})
}

// The host makes the place area without its slots' memory; the plugin
// reserves each slot's, up to the largest frame it placed there, before
// handing it out, and a slot it cannot reserve (a full /dev/shm) is not
// handed out: that frame takes the copy through the ring.
func TestPlaceReservesSlots(t *testing.T) {
	const slotBytes = 64 << 10
	mem := make([]byte, placeAreaSize(2, slotBytes))
	initPlaceArea(mem, 2, slotBytes)
	var asked [][2]int
	full := false
	reserve := func(off, n int) error {
		if full {
			return errors.New("no space left on device")
		}
		asked = append(asked, [2]int{off, n})
		return nil
	}
	pl := newPlacer(placeAreaAt(mem), nil, slotBytes, reserve)
	release := func(i int) { pl.filling[i] = placing{}; pl.a.free(i) }

	for _, step := range []struct {
		n    int
		want [][2]int
	}{
		{placeMin + 100, [][2]int{{placeDataOffset, placeMin + 100}}},
		{placeMin, nil}, // slot 0 has its memory for that many
		{slotBytes, [][2]int{{placeDataOffset, slotBytes}}},
	} {
		asked = nil
		if s := pl.place(1, step.n); len(s) != step.n || &s[0] != &mem[placeDataOffset] {
			t.Fatalf("place(%d) = %d bytes, not slot 0's", step.n, len(s))
		}
		if !slices.Equal(asked, step.want) {
			t.Fatalf("place(%d) reserved %v, want %v", step.n, asked, step.want)
		}
		release(0)
	}
	full = true
	if s := pl.place(1, slotBytes); len(s) != slotBytes {
		t.Fatal("slot 0, already reserved, was not handed out while /dev/shm is full")
	}
	if s := pl.place(1, placeMin); s != nil {
		t.Fatal("slot 1, which could not be reserved, was handed out")
	}
	if pl.filling[1].on || pl.a.word(1).Load() != slotFree {
		t.Fatal("slot 1 is marked taken after its reservation failed")
	}
}

// With /dev/shm full, a frame still gets a free slot that has its memory,
// though a free slot without comes first.
func TestPlacePrefersReservedSlots(t *testing.T) {
	const slotBytes = 64 << 10
	mem := make([]byte, placeAreaSize(2, slotBytes))
	initPlaceArea(mem, 2, slotBytes)
	full := false
	pl := newPlacer(placeAreaAt(mem), nil, slotBytes, func(off, n int) error {
		if full {
			return unix.ENOSPC
		}
		return nil
	})
	small, large := pl.place(1, placeMin), pl.place(1, slotBytes)
	if small == nil || large == nil {
		t.Fatal("no slots while /dev/shm has room")
	}
	for i := range 2 {
		pl.filling[i] = placing{}
		pl.a.free(i)
	}
	full = true
	if s := pl.place(1, slotBytes); s == nil || &s[0] != &large[0] {
		t.Fatal("with /dev/shm full, Place did not hand out the free slot that has room for the frame")
	}
}

// A frame too large for the ring that no slot can carry takes its peer
// down with the reason: once every slot stayed held (by places the
// subdevice never ends, or by one the waiting goroutine itself would
// fill), carrying it once waited for good; and a full /dev/shm was
// reported as a frame beyond the configured limits.
func TestCarryFailureNamesItsCause(t *testing.T) {
	const slotBytes = 256 << 10
	fullShm := fmt.Errorf("shmem: reserve 100000 bytes of /dev/shm/x.p: %w (/dev/shm holds 64 MiB, 0 KiB of it free; give it more room, such as docker run --shm-size)", unix.ENOSPC)
	for _, tc := range []struct {
		name    string
		reserve func(off, n int) error // nil: the area's own
		hold    bool                   // the subdevice holds every slot
		want    string
	}{
		{"every slot held", nil, true, "no place-area slot came free"},
		{"/dev/shm full", func(int, int) error { return fullShm }, false, "give it more room"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPlacePair(t, slotBytes)
			pl := p.srv.placer.Load()
			if tc.reserve != nil {
				pl = newPlacer(pl.a, pl.ring, pl.max, tc.reserve)
				p.srv.placer.Store(pl)
			}
			pl.wait = 50 * time.Millisecond
			p.srv.lim.maxPayload = 64 << 10 // the ring's limit, below the slots'
			h := p.handler()
			if tc.hold {
				for i := range placeSlots {
					if h.Place(1, []byte{byte(i)}, placeMin) == nil {
						t.Fatalf("no slot for place %d", i)
					}
				}
			}
			delivered := make(chan struct{})
			go func() {
				h.Deliver(0, []byte("big"), pattern(100_000, 1))
				close(delivered)
			}()
			select {
			case <-delivered:
			case <-time.After(5 * time.Second):
				close(p.srv.closing) // lets the stuck Deliver go
				t.Fatal("Deliver of a frame no slot can carry still waits 5s later")
			}
			eventually(t, "the report of rank 0 down reaches the host", func() bool {
				_, downs := p.h.snapshot()
				return len(downs) > 0
			}, func() { p.host.poll() })
			got, downs := p.h.snapshot()
			whys := p.h.reasons()
			if len(got) != 0 || len(downs) != 1 || downs[0] != 0 {
				t.Fatalf("%d deliveries, peers down %v; want only rank 0 down", len(got), downs)
			}
			if why := whys[0].Error(); !strings.Contains(why, tc.want) || strings.Contains(why, "configure the subdevice's largest frame") {
				t.Fatalf("PeerDown(%q): want the reason (%q), not the configured limits", why, tc.want)
			}
			t.Log(whys[0])
		})
	}
}
