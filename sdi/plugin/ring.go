package plugin

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hpc-multidevice/multidevice/internal/futex"
	"github.com/hpc-multidevice/multidevice/internal/sched"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// The shared-memory data plane: one segment per host-plugin pair, created
// by the host, opened by the plugin, unlinked by the host once both have it
// mapped. It holds two single-producer single-consumer byte rings, "out"
// (host to plugin) and "in" (plugin to host):
//
//	0                64               384              704     4096
//	+----------------+----------------+----------------+-------+--------------+-------------+
//	| segment header | out: control   | in: control    |  0    | out: data    | in: data    |
//	| magic, version,| (5 cache lines)| (5 cache lines)|       | (outBytes)   | (inBytes)   |
//	| outBytes,      |                |                |       |              |             |
//	| inBytes        |                |                |       |              |             |
//	+----------------+----------------+----------------+-------+--------------+-------------+
//
// A ring's control block keeps each word on its own cache line, so the
// producer and the consumer never write the same line:
//
//	+0    head      uint64  bytes ever written; stored by the producer
//	+64   tail      uint64  bytes ever released; stored by the consumer
//	+128  dataBell  uint32  bumped by the producer to wake a sleeping consumer
//	+132  dataWait  uint32  1 while the consumer sleeps or is about to
//	+192  roomBell  uint32  bumped by the consumer to wake a producer waiting for room
//	+196  roomWait  uint32  1 while the producer waits for room
//
// The segment header also carries two words the host stores and the plugin
// only reads, telling the plugin whether a rank is polling the plane:
//
//	+32   hostPolls   uint32  the host's Poll count, stored every pollsPerTick polls
//	+36   hostParked  uint32  1 once the polling rank parked (sdi.Idler.Idle)
//	+40   placeSlots  uint32  slots of the place area (place.go); 0: there is none
//	+44   placeMax    uint32  the largest payload the host takes placed; 0 (older
//	                          hosts): the ring's payload limit
//	+48   slotBytes   uint64  bytes per slot of the place area
//
// While hostPolls moves and hostParked is 0, the plugin polls its subdevice
// on its ring goroutine, as the rank would poll a built-in one; otherwise
// it leaves the subdevice to its own goroutines and sleeps (ringplane.go).
// A plugin that ignores the words is correct, only slower.
//
// Cursors grow without bound and are masked by the power-of-two capacity.
// Records (record.go) are 16-byte aligned and never wrap: a record that does
// not fit before the end is preceded by a pad record covering the rest.
//
// Happens-before: the producer writes a record's bytes, then stores head;
// the consumer loads head, then reads the bytes (release/acquire through
// Go's sequentially consistent atomics, which are also what makes this work
// across processes on one machine). The consumer stores tail only after it
// is done with the bytes; the producer loads tail before reusing them.
//
// Sleeping: a consumer that finds the ring empty reads dataBell, sets
// dataWait, checks the ring again and only then waits on dataBell. A
// producer stores head, then reads dataWait and, if set, bumps dataBell and
// wakes. With sequentially consistent atomics either the producer sees
// dataWait or the consumer's second check sees the new head, so no wake-up
// is lost. Waits are bounded anyway, so a dead peer cannot hold a sleeper.
const (
	segMagic      = 0x31504944534d44 // "MDSDIP1\x00" little-endian
	segVersion    = 1
	segHeaderSize = 64
	ctlSize       = 320
	segDataOffset = 4096

	offHead     = 0
	offTail     = 64
	offDataBell = 128
	offDataWait = 132
	offRoomBell = 192
	offRoomWait = 196

	offHostPolls  = 32
	offHostParked = 36
	offPlaceSlots = 40
	offPlaceMax   = 44
	offSlotBytes  = 48

	minRingBytes = 1 << 16
	maxRingBytes = 1 << 28
)

// segmentSize is the size of a segment holding rings of these capacities.
func segmentSize(out, in int) int { return segDataOffset + out + in }

// initSegment writes the header of a fresh, zeroed segment.
func initSegment(mem []byte, out, in int) {
	binary.LittleEndian.PutUint64(mem[0:], segMagic)
	binary.LittleEndian.PutUint32(mem[8:], segVersion)
	binary.LittleEndian.PutUint64(mem[16:], uint64(out))
	binary.LittleEndian.PutUint64(mem[24:], uint64(in))
}

// checkSegment validates a segment the host created against the sizes it
// announced in Attach.
func checkSegment(mem []byte, out, in uint64) error {
	switch {
	case len(mem) < segDataOffset:
		return fmt.Errorf("segment of %d bytes is smaller than its header", len(mem))
	case binary.LittleEndian.Uint64(mem[0:]) != segMagic:
		return errors.New("segment has a wrong magic number")
	case binary.LittleEndian.Uint32(mem[8:]) != segVersion:
		return fmt.Errorf("segment version %d, this plugin speaks %d", binary.LittleEndian.Uint32(mem[8:]), segVersion)
	case binary.LittleEndian.Uint64(mem[16:]) != out || binary.LittleEndian.Uint64(mem[24:]) != in:
		return errors.New("segment ring sizes disagree with Attach")
	case !validRingBytes(out) || !validRingBytes(in):
		return fmt.Errorf("ring sizes %d and %d must be powers of two in [%d, %d]", out, in, minRingBytes, maxRingBytes)
	case uint64(len(mem)) != uint64(segDataOffset)+out+in:
		return fmt.Errorf("segment is %d bytes, want %d", len(mem), uint64(segDataOffset)+out+in)
	}
	return nil
}

func validRingBytes(n uint64) bool {
	return n >= minRingBytes && n <= maxRingBytes && n&(n-1) == 0
}

// ring is one direction of a segment. Its producer side and its consumer
// side are each meant for one owner at a time; the callers serialize.
type ring struct {
	head, tail         *atomic.Uint64
	dataBell, dataWait *atomic.Uint32
	roomBell, roomWait *atomic.Uint32
	data               []byte
	size               uint64
	mask               uint64

	// Producer-local.
	wtail uint64 // cached tail, refreshed when the ring looks full
}

// ringAt maps the ring whose control block is at ctl and data at data.
func ringAt(mem []byte, ctl int, data []byte) *ring {
	word := func(off int) unsafe.Pointer { return unsafe.Pointer(&mem[ctl+off]) }
	return &ring{
		head:     (*atomic.Uint64)(word(offHead)),
		tail:     (*atomic.Uint64)(word(offTail)),
		dataBell: (*atomic.Uint32)(word(offDataBell)),
		dataWait: (*atomic.Uint32)(word(offDataWait)),
		roomBell: (*atomic.Uint32)(word(offRoomBell)),
		roomWait: (*atomic.Uint32)(word(offRoomWait)),
		data:     data,
		size:     uint64(len(data)),
		mask:     uint64(len(data)) - 1,
	}
}

// activity is the pair of host-activity words in a segment's header.
type activity struct {
	polls, parked *atomic.Uint32
}

func activityAt(mem []byte) activity {
	return activity{
		polls:  (*atomic.Uint32)(unsafe.Pointer(&mem[offHostPolls])),
		parked: (*atomic.Uint32)(unsafe.Pointer(&mem[offHostParked])),
	}
}

// rings returns the out and in rings of a checked segment.
func rings(mem []byte) (out, in *ring) {
	o := binary.LittleEndian.Uint64(mem[16:])
	i := binary.LittleEndian.Uint64(mem[24:])
	out = ringAt(mem, segHeaderSize, mem[segDataOffset:segDataOffset+o:segDataOffset+o])
	in = ringAt(mem, segHeaderSize+ctlSize, mem[segDataOffset+o:segDataOffset+o+i:segDataOffset+o+i])
	return out, in
}

// maxRecord is the largest record a ring of this capacity accepts: half of
// it, so a record always fits after at most one pad.
func (r *ring) maxRecord() int { return int(r.size / 2) }

// tryWrite appends one record without blocking. It reports false when the
// ring has no room. Producer side only.
func (r *ring) tryWrite(kind uint8, peer sdi.Rank, aux uint32, header, payload []byte) bool {
	b, head, ok := r.reserve(recordLen(len(header), len(payload)))
	if ok {
		putRecord(b, kind, peer, aux, header, payload)
		r.publish(head)
	}
	return ok
}

// tryWritePlaced appends a kindPlaced record, like tryWrite.
func (r *ring) tryWritePlaced(peer sdi.Rank, slot uint32, header []byte, n int) bool {
	b, head, ok := r.reserve(recordLen(len(header), 0))
	if ok {
		putPlacedRecord(b, peer, slot, header, n)
		r.publish(head)
	}
	return ok
}

// reserve finds room for a record of n bytes, padding to the end of the
// ring first if it does not fit there. It returns where the record goes and
// the head that publishes it, or false when the ring has no room.
func (r *ring) reserve(n int) ([]byte, uint64, bool) {
	head := r.head.Load()
	off := head & r.mask
	need := uint64(n)
	if rest := r.size - off; uint64(n) > rest {
		need = rest + uint64(n) // pad to the end, then the record at the start
	}
	if head+need-r.wtail > r.size {
		r.wtail = r.tail.Load()
		if head+need-r.wtail > r.size {
			return nil, 0, false
		}
	}
	if need != uint64(n) {
		rest := r.size - off
		putRecord(r.data[off:], kindPad, 0, 0, nil, nil)
		binary.LittleEndian.PutUint32(r.data[off+4:], uint32(rest-recordPrefix))
		head += rest
		off = 0
	}
	return r.data[off : off+uint64(n)], head + uint64(n), true
}

// publish makes what reserve returned visible to the consumer.
func (r *ring) publish(head uint64) {
	r.head.Store(head)
	if r.dataWait.Load() != 0 {
		r.dataBell.Add(1)
		futex.Wake((*uint32)(unsafe.Pointer(r.dataBell)), 1)
	}
}

// waitRoom blocks until a record of n bytes may fit, or for at most d.
// Producer side only.
func (r *ring) waitRoom(n int, d time.Duration) {
	need := uint64(n) * 2 // a pad may precede it
	if sched.Runnable() {
		napBeside(d)
		return
	}
	bell := r.roomBell.Load()
	r.roomWait.Store(1)
	if r.head.Load()+need-r.tail.Load() > r.size {
		futex.Wait((*uint32)(unsafe.Pointer(r.roomBell)), bell, d)
	}
	r.roomWait.Store(0)
}

// napBeside stands in for a futex wait of at most d (d <= 0: no limit)
// while another goroutine is ready to run (sched.Runnable): it parks in
// the Go scheduler, which hands the processor over at once, for a
// millisecond at most. Callers re-check their ring either way.
func napBeside(d time.Duration) {
	if d <= 0 || d > time.Millisecond {
		d = time.Millisecond
	}
	time.Sleep(d)
}

// reader is the consumer side of a ring. It reads records ahead of what it
// has released, so a record's bytes can stay in place until the plugin's
// subdevice is done with them; release order is the read order.
type reader struct {
	r   *ring
	lim limits
	// read is the cursor of the next record to read. Only the consumer
	// moves it, but a goroutine about to sleep checks it (empty) while
	// another consumes (the host's poller), hence atomic.
	read atomic.Uint64
}

// next returns the next record, if one is there, and the cursor just past
// it, which release takes. Consumer side only.
func (rd *reader) next() (record, uint64, bool, error) {
	r := rd.r
	read := rd.read.Load()
	for {
		head := r.head.Load()
		if read == head {
			rd.read.Store(read)
			return record{}, 0, false, nil
		}
		if head-read > r.size || head < read {
			return record{}, 0, false, fmt.Errorf("%w: ring head %d is not within %d bytes after %d", sdi.ErrBadFrame, head, r.size, read)
		}
		off := read & r.mask
		avail := min(head-read, r.size-off)
		b := r.data[off : off+avail]
		if len(b) >= recordPrefix && b[0] == kindPad {
			skip := uint64(binary.LittleEndian.Uint32(b[4:])) + recordPrefix
			if skip != r.size-off || skip > avail {
				return record{}, 0, false, fmt.Errorf("%w: pad record at %d covers %d bytes, the ring has %d left", sdi.ErrBadFrame, read, skip, r.size-off)
			}
			read += skip
			continue
		}
		rec, n, err := decodeRecord(b, rd.lim)
		if err != nil {
			return record{}, 0, false, fmt.Errorf("ring at %d: %w", read, err)
		}
		read += uint64(n)
		rd.read.Store(read)
		return rec, read, true, nil
	}
}

// empty reports whether nothing is left to read.
func (rd *reader) empty() bool { return rd.r.head.Load() == rd.read.Load() }

// release hands the bytes before cursor back to the producer.
func (r *ring) release(cursor uint64) {
	r.tail.Store(cursor)
	if r.roomWait.Load() != 0 {
		r.roomBell.Add(1)
		futex.Wake((*uint32)(unsafe.Pointer(r.roomBell)), 1)
	}
}

// sleep waits for the producer, for at most d, unless something is there
// or awake reports true. spin bounds a busy-wait before that; the caller
// re-checks either way. awake may be nil; whoever makes it true calls
// nudge afterwards, and the order of the checks below means that either
// awake sees the change or the nudge ends the wait.
func (rd *reader) sleep(spin time.Duration, d time.Duration, awake func() bool) {
	r := rd.r
	ready := func() bool { return !rd.empty() || (awake != nil && awake()) }
	if spin > 0 {
		deadline := time.Now().Add(spin)
		for i := 0; !ready(); i++ {
			if i%64 == 63 && time.Now().After(deadline) {
				break
			}
			// Yield the CPU to any thread, not just this process's
			// goroutines: on a busy machine the spinner must not keep the
			// thread it waits for off the CPU.
			if i%8 == 7 {
				sched.Yield()
			} else {
				runtime.Gosched()
			}
		}
		if ready() {
			return
		}
	}
	if sched.Runnable() {
		napBeside(d)
		return
	}
	bell := r.dataBell.Load()
	r.dataWait.Store(1)
	if !ready() {
		futex.Wait((*uint32)(unsafe.Pointer(r.dataBell)), bell, d)
	}
	r.dataWait.Store(0)
}

// nudge wakes the ring's consumer if it sleeps, so that it looks again at
// something other than the ring (the host's activity words, a stand-by).
func (r *ring) nudge() {
	if r.dataWait.Load() != 0 {
		r.dataBell.Add(1)
		futex.Wake((*uint32)(unsafe.Pointer(r.dataBell)), 1)
	}
}

// wake wakes this ring's consumer, from this process, so that it notices a
// local change such as Close.
func (r *ring) wake() {
	r.dataBell.Add(1)
	futex.Wake((*uint32)(unsafe.Pointer(r.dataBell)), 1)
	r.roomBell.Add(1)
	futex.Wake((*uint32)(unsafe.Pointer(r.roomBell)), 1)
}
