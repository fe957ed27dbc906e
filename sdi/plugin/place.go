package plugin

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// The place area: where the plugin's subdevice writes a large arriving
// payload itself. The plugin's Handler implements sdi.Placer with it, so a
// subdevice that reads payloads into a placed slice (tcp reads frames
// beyond its read buffer straight from the socket) fills shared memory
// directly, and the payload reaches the host with no copy in the plugin.
// A payload placed in the in ring itself would hold up every record behind
// it until the subdevice delivers it, and a subdevice that gives up on a
// placed frame (its peer went down) gives no sign of when it stops
// writing; slots of their own keep both out of the ring.
//
// The host creates the area next to the ring segment, in a segment named
// like it with ".p" appended, and announces it in the ring segment's
// header (placeSlots, slotBytes; ring.go). A plugin that does not know the
// area ignores both and never places. Layout:
//
//	0      magic      uint64  "MDSDIPA1"
//	8      slots      uint32
//	16     slotBytes  uint64
//	64*(1+i)  word i  uint32  slotFree or slotTaken; one cache line each
//	4096 + i*slotBytes        slot i
//
// A slot is free (the plugin may hand it out), or taken: from Place until
// the host has delivered it. The plugin takes a free slot in Place, and
// once the subdevice delivers the placed slice, writes a kindPlaced record
// naming the slot into the in ring, in order with the peer's other
// deliveries. The host delivers the slot's bytes from there and frees the
// slot. A placed frame the subdevice never delivers (its peer went down)
// keeps its slot taken for good; with no free slot left, Place returns nil
// and the subdevice delivers from its own buffer as usual, so that costs
// speed, never correctness.
const (
	placeMagic      = 0x314150494453444d // "MDSDIPA1" little-endian
	placeDataOffset = 4096
	// placeSlots is how many payloads may be on their way at once: one
	// the subdevice fills while the host copies out others. In mdbench's
	// 1 MiB bandwidth test through the tcp plugin, 4 slots left a quarter
	// of the frames to the copying path (the host lagged by more), 8 about
	// one in twenty.
	placeSlots    = 8
	maxPlaceSlots = placeDataOffset/64 - 1
	// placeMin is the smallest payload worth a slot; smaller ones are
	// copied through the ring as before.
	placeMin = 16 << 10

	slotFree  uint32 = 0
	slotTaken uint32 = 1
)

// placeName is the name of the place area next to ring segment name.
func placeName(ring string) string { return ring + ".p" }

// placeSlotBytes is the slot size for payloads of up to maxPayload bytes,
// or 0 when they are too small to be worth placing.
func placeSlotBytes(maxPayload int) int {
	if maxPayload < placeMin {
		return 0
	}
	return (maxPayload + 4095) &^ 4095
}

// placeAreaSize is the size of an area of slots slots of slotBytes each.
func placeAreaSize(slots, slotBytes int) int { return placeDataOffset + slots*slotBytes }

// initPlaceArea writes the header of a fresh, zeroed area.
func initPlaceArea(mem []byte, slots, slotBytes int) {
	binary.LittleEndian.PutUint64(mem[0:], placeMagic)
	binary.LittleEndian.PutUint32(mem[8:], uint32(slots))
	binary.LittleEndian.PutUint64(mem[16:], uint64(slotBytes))
}

// announcePlace records the area's shape in the ring segment's header, and
// the largest payload the host takes placed.
func announcePlace(ringMem []byte, slots, slotBytes, maxPlaced int) {
	binary.LittleEndian.PutUint32(ringMem[offPlaceSlots:], uint32(slots))
	binary.LittleEndian.PutUint64(ringMem[offSlotBytes:], uint64(slotBytes))
	binary.LittleEndian.PutUint32(ringMem[offPlaceMax:], uint32(maxPlaced))
}

// announcedPlace reads the area's shape from the ring segment's header.
func announcedPlace(ringMem []byte) (slots uint32, slotBytes uint64) {
	return binary.LittleEndian.Uint32(ringMem[offPlaceSlots:]), binary.LittleEndian.Uint64(ringMem[offSlotBytes:])
}

// placedMax is the largest payload the plugin may place: what the host
// announced, within the slots, or else the ring's own limit, maxPayload,
// which is all a host that announces nothing takes.
func placedMax(ringMem []byte, slotBytes, maxPayload int) int {
	m := int(binary.LittleEndian.Uint32(ringMem[offPlaceMax:]))
	if m > maxPayload && m <= slotBytes {
		return m
	}
	return maxPayload
}

// checkPlaceArea validates an area the host created against the shape it
// announced and the largest payload a record may claim.
func checkPlaceArea(mem []byte, slots uint32, slotBytes uint64, maxPayload int) error {
	switch {
	case len(mem) < placeDataOffset:
		return fmt.Errorf("place area of %d bytes is smaller than its header", len(mem))
	case binary.LittleEndian.Uint64(mem[0:]) != placeMagic:
		return errors.New("place area has a wrong magic number")
	case binary.LittleEndian.Uint32(mem[8:]) != slots || binary.LittleEndian.Uint64(mem[16:]) != slotBytes:
		return errors.New("place area's shape disagrees with the ring segment's header")
	case slots == 0 || slots > maxPlaceSlots:
		return fmt.Errorf("place area has %d slots, want 1 to %d", slots, maxPlaceSlots)
	case slotBytes%4096 != 0 || slotBytes < uint64(maxPayload) || slotBytes > maxPlaneBytes:
		return fmt.Errorf("place area slots of %d bytes: want a multiple of 4096 in [%d, %d]", slotBytes, maxPayload, maxPlaneBytes)
	case uint64(len(mem)) != placeDataOffset+uint64(slots)*slotBytes:
		return fmt.Errorf("place area is %d bytes, want %d", len(mem), placeDataOffset+uint64(slots)*slotBytes)
	}
	return nil
}

// placeArea is a checked area, mapped.
type placeArea struct {
	mem       []byte
	slots     int
	slotBytes int
}

func placeAreaAt(mem []byte) *placeArea {
	return &placeArea{mem: mem, slots: int(binary.LittleEndian.Uint32(mem[8:])), slotBytes: int(binary.LittleEndian.Uint64(mem[16:]))}
}

func (a *placeArea) word(i int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&a.mem[64*(1+i)]))
}

// slot returns slot i's first n bytes, capped there.
func (a *placeArea) slot(i, n int) []byte {
	off := placeDataOffset + i*a.slotBytes
	return a.mem[off : off+n : off+n]
}

// take hands the host a kindPlaced record's payload: the slot's bytes, once
// the record checks out against the area. The host frees the slot with
// free after delivering them.
func (a *placeArea) take(rec record) ([]byte, error) {
	slot := int(rec.aux)
	switch {
	case rec.aux >= uint32(a.slots):
		return nil, fmt.Errorf("%w: placed record names slot %d of %d", sdi.ErrBadFrame, rec.aux, a.slots)
	case rec.placed <= 0 || rec.placed > a.slotBytes:
		return nil, fmt.Errorf("%w: placed record of %d bytes, slots hold %d", sdi.ErrBadFrame, rec.placed, a.slotBytes)
	case a.word(slot).Load() != slotTaken:
		return nil, fmt.Errorf("%w: placed record names slot %d, which is free", sdi.ErrBadFrame, slot)
	}
	return a.slot(slot, rec.placed), nil
}

func (a *placeArea) free(slot int) { a.word(slot).Store(slotFree) }

// placer is the plugin's side of the area: it hands out slots in Place and
// recognizes them in Deliver. Safe for concurrent use.
type placer struct {
	a    *placeArea
	ring *pluginRing
	max  int // largest payload a record may claim

	// reserve allocates the area's bytes [off, off+n) before they are
	// first written: the host created the area without its slots'
	// memory, which a full /dev/shm would turn into SIGBUS at the first
	// touch (shmem.Segment.Reserve).
	reserve func(off, n int) error

	mu       sync.Mutex
	filling  []placing // per slot; guarded by mu
	reserved []int     // per slot, its first bytes known allocated; guarded by mu
}

// placing is a slot the subdevice fills for a frame from peer.
type placing struct {
	on   bool
	peer sdi.Rank
	n    int
}

func newPlacer(a *placeArea, ring *pluginRing, maxPayload int, reserve func(off, n int) error) *placer {
	return &placer{a: a, ring: ring, max: maxPayload, reserve: reserve,
		filling: make([]placing, a.slots), reserved: make([]int, a.slots)}
}

// place returns a free slot's first n bytes for a frame from peer, or nil.
func (pl *placer) place(from sdi.Rank, n int) []byte {
	if n < placeMin || n > pl.max || n > pl.a.slotBytes {
		return nil
	}
	b, _ := pl.take(from, n)
	return b
}

// carry copies payload, a frame from peer too large for the ring, into a
// free slot and returns the slot, waiting while the host holds every slot.
// It gives up when the payload is larger than a slot, the slot's memory
// cannot be had, or quit is closed.
func (pl *placer) carry(from sdi.Rank, payload []byte, quit <-chan struct{}) (int, bool) {
	n := len(payload)
	if n < placeMin || n > pl.max || n > pl.a.slotBytes {
		return 0, false
	}
	// The host frees slots without a signal; frames this large are rare
	// and take milliseconds to copy anyway.
	for pause := 20 * time.Microsecond; ; pause = min(2*pause, 5*time.Millisecond) {
		b, busy := pl.take(from, n)
		if b != nil {
			copy(b, payload)
			return pl.claim(from, b)
		}
		if !busy {
			return 0, false
		}
		select {
		case <-quit:
			return 0, false
		case <-time.After(pause):
		}
	}
}

// take hands out a free slot's first n bytes for a frame from peer; busy
// says that no slot was free.
func (pl *placer) take(from sdi.Rank, n int) (b []byte, busy bool) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for i := range pl.filling {
		if pl.filling[i].on || pl.a.word(i).Load() != slotFree {
			continue
		}
		if n > pl.reserved[i] {
			// No room: the frame takes the copy through the ring,
			// which has its memory.
			if pl.reserve(placeDataOffset+i*pl.a.slotBytes, n) != nil {
				return nil, false
			}
			pl.reserved[i] = n
		}
		pl.a.word(i).Store(slotTaken)
		pl.filling[i] = placing{on: true, peer: from, n: n}
		return pl.a.slot(i, n), false
	}
	return nil, true
}

// claim reports which slot payload is, if it is one place handed out for
// a frame from peer, and ends that slot's filling.
func (pl *placer) claim(from sdi.Rank, payload []byte) (int, bool) {
	if len(payload) < placeMin {
		return 0, false
	}
	p := unsafe.Pointer(unsafe.SliceData(payload))
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for i, f := range pl.filling {
		if f.on && f.peer == from && f.n == len(payload) && p == unsafe.Pointer(&pl.a.mem[placeDataOffset+i*pl.a.slotBytes]) {
			pl.filling[i].on = false
			return i, true
		}
	}
	return 0, false
}
