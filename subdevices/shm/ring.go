package shm

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Segment layout; see the package doc for the picture. Every offset of an
// atomic word is a multiple of 8, and the mapping is page-aligned, so the
// words are naturally aligned.
const (
	segMagic   = "MDSHMSG1"
	segVersion = 7

	hdrBytes      = 4096 // segment header, one page
	offMagic      = 0    // [8]byte
	offVersion    = 8    // uint32
	offNRings     = 12   // uint32: inbound rings, one per rank of the job
	offRingBytes  = 16   // uint64: data bytes per ring
	offRank       = 24   // int32: the owner's rank
	offPID        = 28   // int32: the owner's process id
	offJobHash    = 32   // [16]byte: sha256(JobID)[:16]
	offSecretHash = 48   // [16]byte: sha256(Secret)[:16]
	offProbeAddr  = 64   // uint64: address of the owner's probe word in its own memory
	offProbeVal   = 72   // uint64: the value of that word, for a peer's process_vm_readv probe
	// Words the owner and its senders touch at run time, each on its own
	// 128-byte block so that adjacent-line prefetching does not make them
	// share a line either.
	offState     = 128 // uint32: stateOpen while the owner receives
	offSleeping  = 256 // uint32: 1 while the owner is about to wait or waiting on the doorbell
	offDoorbell  = 384 // uint32: futex word senders bump to wake the owner
	offAttachGen = 512 // uint32: bumped by every sender that attaches to a ring

	// The attach table follows the header: one uint32 per ring, non-zero
	// once a sender attached; the receiver polls only those rings. It is
	// apart from the rings so that the receiver's look at every ring
	// touches a page per 1024 rings (see attachTableBytes), not a page of
	// every ring's.
	pageBytes = 4096

	ringCtlBytes = 2560 // per-ring control block ahead of the data
	offTail      = 0    // uint64: producer cursor, stored by the sender when it lets go of the ring
	offRevoked   = 16   // uint64: sender: descriptors in records before this cursor may no longer be read
	offFastSent  = 24   // uint64: fast frames sent, stored by the sender when it lets go of the ring
	offHead      = 128  // uint64: consumer cursor, written only by the receiver
	offCopyMode  = 136  // uint32: receiver: which payloads the sender sends by descriptor (choose.go)
	offOutRate   = 140  // uint32: receiver: MB/s of its copies out of this ring lately (choose.go)
	offDescRate  = 144  // uint32: receiver: MB/s of its reads of this sender's payloads lately
	// Sender-assisted copy of a descriptor's payload (assist.go).
	offAssistAt    = 256 // uint64: receiver: cursor of the descriptor record it asks help with
	offAssistDst   = 264 // uint64: receiver: where the payload goes in its memory
	offAssistLen   = 272 // uint64: receiver: the payload's length
	offAssistClaim = 384 // uint64: both: epoch<<32 | next chunk to copy
	offAssistDone  = 392 // uint64: sender: chunks it copied, plus failedChunk per failure
	// The two fast slots (fast.go), each a one-record ring of
	// fastSlotSize bytes, a power of two: a frame of up to 980 bytes with
	// the multidevice's short header.
	offFast      = 512
	fastStride   = 1024
	fastSlots    = 2
	fastSlotSize = 1024

	// recAlign starts every record on a cache line: a record of up to 64
	// bytes (an 8-byte message with the multidevice's short header) is
	// then one line for the receiving core to miss, where 16-byte
	// alignment split every other such record over two. It also keeps
	// the space left before the end of the ring zero or at least a
	// padding record long.
	recAlign = 64

	// stampBytes is the stamp that opens every record: the record's
	// cursor plus one, stored last, after the rest of the record. A
	// receiver learns that the record at its head is there by reading
	// that word, on the line it reads the record from anyway, instead of
	// the sender's cursor on a line of its own: one cache miss per small
	// message instead of two. Plus one, so that the zeroed ring holds no
	// valid stamp; a stamp left from an earlier lap is a cursor a ring's
	// length lower, so it never matches either. Any other word of an
	// earlier lap, payload included, could: the sender clears the word
	// where the next record starts before it stamps one (putParts).
	stampBytes = 8

	// flagPad in a wire header marks a padding record: the rest of the ring
	// up to the wrap is unused and the next record starts at offset 0.
	flagPad uint8 = 1
	// flagDesc in a wire header marks a descriptor record: its body is a
	// [descriptor] of a payload the receiver reads from the sender's
	// memory (see singlecopy.go) instead of the payload itself.
	flagDesc uint8 = 2
	// flagFirst and flagNext mark the fragments of a frame the sender
	// split into several records (see putFragments): the first carries
	// the header and, ahead of its part of the payload, the whole
	// payload's length (fragLenBytes); the others carry only payload.
	flagFirst uint8 = 4
	flagNext  uint8 = 8
	// fragLenBytes is the length field in a first fragment.
	fragLenBytes = 8
	// fastShift and fastMask place, in the wire-header flags of every
	// record but padding, how many fast frames the sender had sent
	// before the record, modulo 4 (fast.go).
	fastShift       = 4
	fastMask  uint8 = 3 << fastShift
)

// A slot is a ring (putParts, parseRecord), so its size is a power of two.
var _ [0]struct{} = [fastSlotSize & (fastSlotSize - 1)]struct{}{}

// Segment states in offState. Zero means not yet initialised.
const (
	stateOpen   = 1
	stateClosed = 2
)

// word32 and word64 view a naturally aligned word of a shared mapping as an
// atomic. Go's atomics are sequentially consistent, which the doorbell
// protocol in progress.go relies on.
func word32(mem []byte, off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&mem[off]))
}

func word64(mem []byte, off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&mem[off]))
}

// rawWord32 is the same word as word32 for the futex system call.
func rawWord32(mem []byte, off int) *uint32 {
	return (*uint32)(unsafe.Pointer(&mem[off]))
}

// segmentSize returns the bytes of a segment with nrings rings of ringBytes.
func segmentSize(nrings int, ringBytes uint64) (int, error) {
	stride := uint64(ringCtlBytes) + ringBytes
	// The attach table takes at most 4 bytes per ring and a page.
	if nrings <= 0 || ringBytes == 0 || uint64(nrings) > (maxSegmentBytes-hdrBytes-pageBytes)/(stride+4) {
		return 0, fmt.Errorf("shm: %d rings of %d bytes exceed the %d-byte segment limit", nrings, ringBytes, uint64(maxSegmentBytes))
	}
	return ringOffset(nrings, nrings, ringBytes), nil
}

// attachTableBytes is the size of the attach table of nrings rings, in
// whole pages.
func attachTableBytes(nrings int) int { return (4*nrings + pageBytes - 1) &^ (pageBytes - 1) }

// ringOffset is where ring i of a segment of nrings rings of ringBytes
// starts: its control block, then its data.
func ringOffset(nrings, i int, ringBytes uint64) int {
	return hdrBytes + attachTableBytes(nrings) + i*(ringCtlBytes+int(ringBytes))
}

// ringStride is the bytes of one ring: control block and data.
func ringStride(ringBytes uint64) int { return ringCtlBytes + int(ringBytes) }

// maxSegmentBytes bounds a segment's virtual size. tmpfs allocates pages
// only when touched, so this is about address space, not memory.
const maxSegmentBytes = 1 << 40

// ring is a view of one single-producer single-consumer ring in a mapping.
type ring struct {
	tail     *atomic.Uint64
	head     *atomic.Uint64
	attached *atomic.Uint32
	revoked  *atomic.Uint64
	copyMode *atomic.Uint32
	outRate  *atomic.Uint32
	descRate *atomic.Uint32
	assist   assistWords
	data     []byte // power-of-two length
	fastSent *atomic.Uint64
	fast     [fastSlots][]byte // each fastSlotSize bytes
}

// ringAt returns ring i of a segment of nrings rings mapped at mem.
func ringAt(mem []byte, nrings, i int, ringBytes uint64) ring {
	base := ringOffset(nrings, i, ringBytes)
	return ring{
		tail:     word64(mem, base+offTail),
		head:     word64(mem, base+offHead),
		attached: word32(mem, hdrBytes+4*i),
		revoked:  word64(mem, base+offRevoked),
		copyMode: word32(mem, base+offCopyMode),
		outRate:  word32(mem, base+offOutRate),
		descRate: word32(mem, base+offDescRate),
		assist: assistWords{
			at:    word64(mem, base+offAssistAt),
			dst:   word64(mem, base+offAssistDst),
			n:     word64(mem, base+offAssistLen),
			claim: word64(mem, base+offAssistClaim),
			done:  word64(mem, base+offAssistDone),
		},
		data:     mem[base+ringCtlBytes : base+ringCtlBytes+int(ringBytes) : base+ringCtlBytes+int(ringBytes)],
		fastSent: word64(mem, base+offFastSent),
		fast: [fastSlots][]byte{
			mem[base+offFast : base+offFast+fastSlotSize : base+offFast+fastSlotSize],
			mem[base+offFast+fastStride : base+offFast+fastStride+fastSlotSize : base+offFast+fastStride+fastSlotSize],
		},
	}
}

// recordLen returns the ring bytes a frame with hlen header and plen payload
// bytes occupies.
func recordLen(hlen, plen int) uint64 {
	n := stampBytes + uint64(sdi.WireHeaderSize) + uint64(hlen) + uint64(plen)
	return (n + recAlign - 1) &^ (recAlign - 1)
}

// spaceNeeded returns the ring bytes that writing an n-byte record at tail
// consumes: the record, plus a padding record when it would straddle the wrap.
func spaceNeeded(capacity, tail, n uint64) uint64 {
	if contig := capacity - tail&(capacity-1); n > contig {
		return contig + n
	}
	return n
}

// putRecord writes one frame at tail and returns the new tail. The caller
// has checked, with spaceNeeded, that the space is free, against the
// consumer cursor head, and passes limit = head + the ring's length (see
// putParts). The record becomes visible to the consumer when its stamp is
// stored, its last step.
func putRecord(data []byte, tail, limit uint64, hdr, payload []byte) uint64 {
	return putFlagged(data, tail, limit, 0, hdr, payload)
}

// putFlagged is putRecord for a record with wire-header flags: the body
// is a payload (flags 0) or a descriptor (flagDesc).
func putFlagged(data []byte, tail, limit uint64, flags uint8, hdr, payload []byte) uint64 {
	return putParts(data, tail, limit, flags, hdr, nil, payload)
}

// putParts writes a record whose body is pre followed by payload. limit
// is the consumer cursor the caller checked the space against plus the
// ring's length: the receiver's unread records start there, a lap on.
//
// A receiver done with a record reads the word where the next one starts
// as its stamp before the sender wrote there, and that word holds what an
// earlier lap left, which may be payload that reads as the stamp it
// waits for: it would take the bytes after it for a frame. So before a
// record (padding too) is stamped, the word where the next one starts is
// cleared, unless that is limit: the ring is then exactly full and the
// word is the stamp of the receiver's unread record at its head, a cursor
// a lap lower. A fast slot passes limit 0, clearing nothing: its receiver
// reads only the stamp at the slot's start (fast.go).
func putParts(data []byte, tail, limit uint64, flags uint8, hdr, pre, payload []byte) uint64 {
	capacity := uint64(len(data))
	off := tail & (capacity - 1)
	n := recordLen(len(hdr), len(pre)+len(payload))
	if contig := capacity - off; n > contig {
		sdi.WireHeader{Flags: flagPad}.Put(data[off+stampBytes:])
		clearStamp(data, tail+contig, limit)
		stamp(data, tail)
		tail += contig
		off = 0
	}
	sdi.WireHeader{Flags: flags, HeaderLen: uint16(len(hdr)), PayloadLen: uint32(len(pre) + len(payload))}.Put(data[off+stampBytes:])
	b := off + stampBytes + sdi.WireHeaderSize
	b += uint64(copy(data[b:], hdr))
	b += uint64(copy(data[b:], pre))
	copy(data[b:], payload)
	clearStamp(data, tail+n, limit)
	stamp(data, tail)
	return tail + n
}

// clearStamp zeroes the stamp word of the record to come at cursor when
// it lies before limit, in free space. A plain store: the stamp stored
// after it is the release that makes it visible to a receiver that gets
// as far as cursor, and none reads it before.
func clearStamp(data []byte, cursor, limit uint64) {
	if cursor < limit {
		binary.LittleEndian.PutUint64(data[cursor&uint64(len(data)-1):], 0)
	}
}

// stamp publishes the record written at cursor. Release: pairs with the
// load in published; every byte of the record is visible to a receiver
// that sees the stamp.
func stamp(data []byte, cursor uint64) {
	word64(data, int(cursor&uint64(len(data)-1))).Store(cursor + 1)
}

// published reports whether the record at cursor head is there to read.
// data must be a ring of at least recAlign bytes and head a multiple of
// recAlign, so that the stamp is an aligned word inside it.
func published(data []byte, head uint64) bool {
	return word64(data, int(head&uint64(len(data)-1))).Load() == head+1
}

// fragmentsSpace returns the ring bytes that writing a payload of plen
// bytes with hlen header bytes as fragments of at most chunk payload bytes
// consumes at tail, padding records included.
func fragmentsSpace(capacity, tail uint64, hlen, plen, chunk int) uint64 {
	t := tail
	for off, first := 0, true; off < plen; first = false {
		n := min(chunk, plen-off)
		rl := recordLen(0, n)
		if first {
			rl = recordLen(hlen, fragLenBytes+n)
		}
		t += spaceNeeded(capacity, t, rl)
		off += n
	}
	return t - tail
}

// putFragments writes a frame as fragments of at most chunk payload bytes
// at tail, fast (fastBits) in the flags of each, each visible to the
// receiver once written (its stamp), and calls wake after each, so that
// the receiver copies one out while the sender copies the next in. The
// caller has checked with fragmentsSpace that the space is free, against
// the consumer cursor limit less the ring's length (see putParts), and
// holds the ring's producer side.
func putFragments(data []byte, tail, limit uint64, fast uint8, hdr, payload []byte, chunk int, wake func()) uint64 {
	var lenField [fragLenBytes]byte
	binary.LittleEndian.PutUint64(lenField[:], uint64(len(payload)))
	for off, first := 0, true; off < len(payload); first = false {
		n := min(chunk, len(payload)-off)
		if first {
			tail = putParts(data, tail, limit, flagFirst|fast, hdr, lenField[:], payload[:n])
		} else {
			tail = putParts(data, tail, limit, flagNext|fast, nil, nil, payload[off:off+n])
		}
		off += n
		wake()
	}
	return tail
}

// record is one record parsed from a ring.
type record struct {
	pad     bool   // a padding record: no frame, skip to the wrap
	header  []byte // the frame's opaque header; aliases the ring
	payload []byte // the frame's payload; aliases the ring; nil for a descriptor
	// isDesc marks a descriptor record: the payload is in the sender's
	// memory, where desc says.
	isDesc bool
	desc   descriptor
	// frag is flagFirst or flagNext for a fragment of a frame, with payload
	// its part; total is the whole payload's length, set in a first one.
	frag  uint8
	total int
	next  uint64 // cursor of the following record
	// fastBefore is how many fast frames the sender had sent before
	// this record, modulo 4 (fast.go); 0 in padding.
	fastBefore uint8
}

// parseRecord reads the record at cursor head of a ring, which published
// reported there, into rec (filled in place: the record is a dozen words,
// and returning it by value cost a tenth of a small message's receive).
// Its slices alias data and have no spare capacity, so appending to them
// cannot scribble on the ring.
//
// data may hold anything (it is shared memory): every length and offset is
// checked against the ring before slicing, and a failure wraps
// [sdi.ErrBadFrame]. The sender's cursor is not consulted: a record that
// claims more bytes than the sender wrote yields stale bytes of the ring,
// never bytes outside it.
func parseRecord(rec *record, data []byte, head uint64, maxHeader, maxPayload int) error {
	capacity := uint64(len(data))
	if capacity < recAlign || capacity&(capacity-1) != 0 {
		return fmt.Errorf("%w: ring size %d is not a power of two >= %d", sdi.ErrBadFrame, capacity, recAlign)
	}
	if head%recAlign != 0 {
		return fmt.Errorf("%w: consumer cursor %d is not %d-byte aligned", sdi.ErrBadFrame, head, recAlign)
	}
	off := head & (capacity - 1)
	contig := capacity - off // >= recAlign > stampBytes+WireHeaderSize, a multiple of recAlign
	wh, err := sdi.DecodeWireHeader(data[off+stampBytes:], maxHeader, maxPayload)
	if err != nil {
		return fmt.Errorf("record at cursor %d: %w", head, err)
	}
	if wh.Flags == flagPad {
		if wh.HeaderLen != 0 || wh.PayloadLen != 0 {
			return fmt.Errorf("%w: padding record at cursor %d has lengths %d and %d", sdi.ErrBadFrame, head, wh.HeaderLen, wh.PayloadLen)
		}
		*rec = record{pad: true, next: head + contig}
		return nil
	}
	kind := wh.Flags &^ fastMask
	switch kind {
	case 0, flagDesc, flagFirst, flagNext:
	default:
		return fmt.Errorf("%w: record at cursor %d has unknown flags %#x", sdi.ErrBadFrame, head, wh.Flags)
	}
	n := recordLen(int(wh.HeaderLen), int(wh.PayloadLen))
	if n > contig {
		return fmt.Errorf("%w: %d-byte record at cursor %d overruns the wrap (%d bytes)", sdi.ErrBadFrame, n, head, contig)
	}
	h0 := off + stampBytes + sdi.WireHeaderSize
	p0 := h0 + uint64(wh.HeaderLen)
	p1 := p0 + uint64(wh.PayloadLen)
	// Field by field, not *rec = record{...}: the literal is built on the
	// stack and copied in wide moves that wait for the narrow stores
	// before them (a store-forwarding stall), a tenth of a small frame's
	// send and delivery on one goroutine.
	rec.pad, rec.isDesc, rec.desc = false, false, descriptor{}
	rec.header, rec.payload = data[h0:p0:p0], nil
	rec.frag, rec.total = 0, 0
	rec.next, rec.fastBefore = head+n, wh.Flags&fastMask>>fastShift
	if kind == flagDesc {
		d, err := decodeDescriptor(data[p0:p1], maxPayload)
		if err != nil {
			return fmt.Errorf("record at cursor %d: %w", head, err)
		}
		rec.isDesc, rec.desc = true, d
		return nil
	}
	switch kind {
	case flagFirst:
		if wh.PayloadLen <= fragLenBytes {
			return fmt.Errorf("%w: first fragment at cursor %d has %d body bytes, want more than %d", sdi.ErrBadFrame, head, wh.PayloadLen, fragLenBytes)
		}
		total := binary.LittleEndian.Uint64(data[p0:])
		part := uint64(wh.PayloadLen) - fragLenBytes
		if total <= part || total > uint64(maxPayload) {
			return fmt.Errorf("%w: first fragment at cursor %d of %d bytes announces a %d-byte payload, want more and at most %d",
				sdi.ErrBadFrame, head, part, total, maxPayload)
		}
		rec.frag, rec.total = flagFirst, int(total)
		p0 += fragLenBytes
	case flagNext:
		if wh.HeaderLen != 0 || wh.PayloadLen == 0 {
			return fmt.Errorf("%w: fragment at cursor %d has %d header and %d payload bytes, want none and some", sdi.ErrBadFrame, head, wh.HeaderLen, wh.PayloadLen)
		}
		rec.frag = flagNext
	}
	rec.payload = data[p0:p1:p1]
	return nil
}
