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
// it until the subdevice delivers it, and a placed frame the subdevice
// gives up on leaves a hole there until its report of the peer down;
// slots of their own keep both out of the ring.
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
// slot. A placed frame the subdevice gives up on ends with its report of
// the peer down (sdi.Placer: it writes no more into the place), and the
// plugin frees its slot then. With no free slot, Place returns nil and the
// subdevice delivers from its own buffer as usual, so that costs speed,
// never correctness.
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
	// carryWait bounds how long carry waits for a free slot. The host
	// frees one within milliseconds of its record, and the subdevice's
	// places end when their frames arrive or their peer goes down; every
	// slot held that long is held for good (a place the subdevice never
	// ends, or one the waiting goroutine itself would have to fill), and
	// waiting on would stall the peer's receive path for good.
	carryWait = 10 * time.Second

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
	wait    time.Duration // carryWait; shorter in tests

	mu       sync.Mutex
	filling  []placing // per slot; guarded by mu
	reserved []int     // per slot, its first bytes known allocated; guarded by mu
}

// placing is a slot being filled for a frame from peer: by the subdevice,
// in a place it was given, or by carry.
type placing struct {
	on      bool
	carried bool // by carry, which no report of the peer down ends
	peer    sdi.Rank
	n       int
}

func newPlacer(a *placeArea, ring *pluginRing, maxPayload int, reserve func(off, n int) error) *placer {
	return &placer{a: a, ring: ring, max: maxPayload, reserve: reserve, wait: carryWait,
		filling: make([]placing, a.slots), reserved: make([]int, a.slots)}
}

// errSlotsBusy says that every slot is held, by the host or by frames
// being filled.
var errSlotsBusy = errors.New("every place-area slot is in use")

// place returns a free slot's first n bytes for a frame from peer, or nil.
func (pl *placer) place(from sdi.Rank, n int) []byte {
	if n < placeMin || !pl.carries(n) {
		return nil
	}
	// Without a slot, or without its memory, the frame takes the copy
	// through the ring, which has its memory.
	i, err := pl.take(from, n, false)
	if err != nil {
		return nil
	}
	return pl.a.slot(i, n)
}

// carries reports whether a payload of n bytes fits a slot.
func (pl *placer) carries(n int) bool { return n <= pl.max && n <= pl.a.slotBytes }

// carry copies payload, a frame from peer too large for the ring that
// fits a slot, into a free slot and returns the slot, waiting up to
// pl.wait while every slot is held. It fails when no slot came free, the
// slot's memory cannot be had, or quit is closed.
func (pl *placer) carry(from sdi.Rank, payload []byte, quit <-chan struct{}) (int, error) {
	// The host frees slots without a signal; frames this large are rare
	// and take milliseconds to copy anyway.
	deadline := time.Now().Add(pl.wait)
	for pause := 20 * time.Microsecond; ; pause = min(2*pause, 5*time.Millisecond) {
		i, err := pl.take(from, len(payload), true)
		if err == nil {
			copy(pl.a.slot(i, len(payload)), payload)
			pl.mu.Lock()
			pl.filling[i] = placing{}
			pl.mu.Unlock()
			return i, nil
		}
		if !errors.Is(err, errSlotsBusy) {
			return 0, err
		}
		if time.Now().After(deadline) {
			filling, host := pl.holders()
			return 0, fmt.Errorf("no place-area slot came free in %v (frames being placed hold %d of the %d, the host %d)", pl.wait, filling, pl.a.slots, host)
		}
		select {
		case <-quit:
			return 0, sdi.ErrClosed
		case <-time.After(pause):
		}
	}
}

// holders counts the slots held by frames being filled and by the host.
func (pl *placer) holders() (filling, host int) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for i, f := range pl.filling {
		switch {
		case f.on:
			filling++
		case pl.a.word(i).Load() != slotFree:
			host++
		}
	}
	return filling, host
}

// take takes a free slot for a frame of n bytes from peer and returns it.
// Of the free slots it takes the one with the most memory reserved, so
// that a full /dev/shm fails only frames that no slot has room for, with
// the reservation's error; errSlotsBusy says that no slot was free.
func (pl *placer) take(from sdi.Rank, n int, carried bool) (int, error) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	best := -1
	for i := range pl.filling {
		if pl.filling[i].on || pl.a.word(i).Load() != slotFree {
			continue
		}
		if best < 0 || pl.reserved[i] > pl.reserved[best] {
			best = i
		}
	}
	if best < 0 {
		return 0, errSlotsBusy
	}
	if n > pl.reserved[best] {
		if err := pl.reserve(placeDataOffset+best*pl.a.slotBytes, n); err != nil {
			return 0, err
		}
		pl.reserved[best] = n
	}
	pl.a.word(best).Store(slotTaken)
	pl.filling[best] = placing{on: true, carried: carried, peer: from, n: n}
	return best, nil
}

// end ends the places handed out for frames from peer that the subdevice
// has not delivered, once it reported the peer down: sdi.Placer promises
// that it writes no more into them, so their slots are free again. The
// host never saw a record for them.
func (pl *placer) end(peer sdi.Rank) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for i, f := range pl.filling {
		if f.on && !f.carried && f.peer == peer {
			pl.filling[i] = placing{}
			pl.a.free(i)
		}
	}
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
		if f.on && !f.carried && f.peer == from && f.n == len(payload) && p == unsafe.Pointer(&pl.a.mem[placeDataOffset+i*pl.a.slotBytes]) {
			pl.filling[i].on = false
			return i, true
		}
	}
	return 0, false
}
