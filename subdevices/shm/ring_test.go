package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// TestRingModel drives a producer and a consumer over one small ring in a
// random interleaving, as Send and the progress goroutine do, and checks
// that every frame comes out whole, once and in order, across many wraps.
func TestRingModel(t *testing.T) {
	const capacity, maxPayload = 1024, 200
	data := make([]byte, capacity)
	rng := rand.New(rand.NewPCG(1, 2))
	var tail, head uint64 // producer cursor, consumer cursor
	var sent, got uint64
	pads := 0
	for step := 0; step < 200000 && got < 20000; step++ {
		if rng.IntN(2) == 0 {
			hdr := u64(sent)
			payload := pattern(sent, int(sent*13%maxPayload))
			need := spaceNeeded(capacity, tail, recordLen(len(hdr), len(payload)))
			if tail-head+need > capacity {
				continue // the ring is full: Send would return ErrWouldBlock
			}
			tail = putRecord(data, tail, head+capacity, hdr, payload)
			sent++
			continue
		}
		if !published(data, head) {
			if head != tail {
				t.Fatalf("record at %d (tail %d) is not stamped", head, tail)
			}
			continue
		}
		if head == tail {
			t.Fatalf("stamp found at the producer's cursor %d", tail)
		}
		var rec record
		err := parseRecord(&rec, data, head, 8, maxPayload)
		if err != nil {
			t.Fatalf("parse at %d (tail %d): %v", head, tail, err)
		}
		head = rec.next
		if rec.pad {
			pads++
			continue
		}
		if i := binary.LittleEndian.Uint64(rec.header); i != got || !bytes.Equal(rec.payload, pattern(i, int(i*13%maxPayload))) {
			t.Fatalf("record %d: got frame %d or a corrupt payload", got, i)
		}
		got++
	}
	if got < 1000 || pads == 0 {
		t.Fatalf("model exercised too little: %d frames, %d padding records", got, pads)
	}
}

// TestNextStampCleared guards the stamp protocol against stale bytes. A
// receiver that finished the record before cursor c reads the word at c
// as the next record's stamp before the sender wrote anything there, so
// what an earlier lap left in that word, payload included, must never
// read as c+1: the sender clears the word before it stamps the record
// ending at c, unless the ring is then exactly full, where the word is
// the stamp of the receiver's unread record at its head, which must stay.
// Every ring offset is planted with a phantom record, stamped for the
// cursor the receiver would reach it at, and after every record the
// receiver must stop at the sender's cursor, having read no phantom.
func TestNextStampCleared(t *testing.T) {
	const capacity = 1024
	hdr, phantom := []byte("realhdr!"), []byte("PHANTOM!")
	tests := []struct {
		name  string
		head  uint64 // consumer cursor, where the first record goes
		sizes []int  // payload bytes of the frames written in turn, none read
		chunk int    // when non-zero, sizes[0] goes in fragments of chunk bytes
	}{
		{"record", capacity + 128, []int{150}, 0},
		{"record after padding at the wrap", 2*capacity - 64, []int{150}, 0},
		{"fragments", capacity, []int{600}, 200},
		{"ring exactly full", capacity + 128, []int{150, 676, 100}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := make([]byte, capacity)
			for off := uint64(0); off < capacity; off += recAlign {
				c := tt.head + (off-tt.head)&(capacity-1) // the cursor the receiver reads this offset at
				rawRecord(data, c, sdi.WireHeader{HeaderLen: uint16(len(phantom))}, phantom)
			}
			// read walks the records from head as the receiver does and
			// returns the cursor where it finds none.
			read := func() uint64 {
				t.Helper()
				h := tt.head
				for range capacity / recAlign {
					if !published(data, h) {
						return h
					}
					var rec record
					if err := parseRecord(&rec, data, h, maxHeader, capacity); err != nil {
						t.Fatalf("record at cursor %d: %v", h, err)
					}
					if bytes.Equal(rec.header, phantom) {
						t.Fatalf("stale bytes at cursor %d read as a record the sender never wrote", h)
					}
					h = rec.next
				}
				t.Fatalf("receiver never stops: the ring holds more than a lap of records")
				return 0
			}
			tail := tt.head
			for _, n := range tt.sizes {
				if tt.chunk != 0 {
					tail = putFragments(data, tail, tt.head+capacity, 0, hdr, pattern(1, n), tt.chunk, func() { read() })
				} else {
					tail = putRecord(data, tail, tt.head+capacity, hdr, pattern(1, n))
				}
				if got := read(); got != tail {
					t.Fatalf("receiver stops at cursor %d, want the sender's %d", got, tail)
				}
			}
			if tail-tt.head > capacity {
				t.Fatalf("test writes %d bytes into a %d-byte ring", tail-tt.head, capacity)
			}
		})
	}
}

// TestStalePayloadNeverAStamp is TestNextStampCleared through the
// subdevice: a payload holding, at the ring offset where a later lap
// puts a record boundary, the stamp of that cursor and a wire header was
// delivered as a frame nobody sent, and the receiver's cursor then ran
// past the sender's, so that later frames were lost although Send had
// returned done=true.
func TestStalePayloadNeverAStamp(t *testing.T) {
	const ringBytes = 1 << 16
	const at = 2048 // ring offset of the phantom; a record boundary on lap 1
	j := openJob(t, 2, jobOpts{config: []byte(`{"ring_bytes": 65536, "single_copy": false}`)})
	// Frame A at cursor 0: payload byte i lies at ring offset
	// stampBytes+WireHeaderSize+8 (the header) + i.
	const body = stampBytes + sdi.WireHeaderSize + 8
	const size = 4000
	pa := make([]byte, size)
	binary.LittleEndian.PutUint64(pa[at-body:], ringBytes+at+1)
	sdi.WireHeader{HeaderLen: 8, PayloadLen: 5}.Put(pa[at-body+stampBytes:])
	copy(pa[at-body+stampBytes+sdi.WireHeaderSize:], "PHANTOM!hello")
	mustSend(t, j.sds[0], &sdi.Frame{Peer: 1, Header: u64(0), Payload: pa})
	j.hs[1].next(t)
	// Fill the rest of lap 0, then send one record that ends at lap-1
	// offset at, where the receiver then reads frame A's payload.
	i := uint64(1)
	for tail := recordLen(8, size); tail+recordLen(8, size) <= ringBytes; tail += recordLen(8, size) {
		mustSend(t, j.sds[0], &sdi.Frame{Peer: 1, Header: u64(i), Payload: make([]byte, size)})
		j.hs[1].next(t)
		i++
	}
	last := at - recAlign - body + 8 // fills lap 0 up to the wrap's padding, then [0, at)
	if recordLen(8, last) != at {
		t.Fatalf("setup: a %d-byte payload takes %d ring bytes, want %d", last, recordLen(8, last), at)
	}
	mustSend(t, j.sds[0], &sdi.Frame{Peer: 1, Header: u64(i), Payload: make([]byte, last)})
	j.hs[1].next(t)
	// The next real frame must be the next delivered.
	mustSend(t, j.sds[0], &sdi.Frame{Peer: 1, Header: u64(777), Payload: make([]byte, 2000)})
	select {
	case m := <-j.hs[1].msgs:
		if got := binary.LittleEndian.Uint64(m.header); got != 777 {
			t.Fatalf("rank 1 got a frame rank 0 never sent: header %q payload %q", m.header, m.payload)
		}
	case d := <-j.hs[1].down:
		t.Fatalf("rank 1 reported live rank 0 down: %v", d.err)
	case <-time.After(2 * time.Second):
		t.Fatal("rank 0's frame never arrives at rank 1")
	}
}

// TestEmptyRingAcceptsMaxFrame guards the MaxFrame choice: wherever the
// cursors stand, an empty ring has room for the largest record.
func TestEmptyRingAcceptsMaxFrame(t *testing.T) {
	for _, ringBytes := range []uint64{minRingBytes, defaultRingBytes} {
		n := recordLen(maxHeader, maxFrame(ringBytes))
		for tail := uint64(0); tail < ringBytes; tail += recAlign {
			if need := spaceNeeded(ringBytes, tail, n); need > ringBytes {
				t.Fatalf("ring %d at cursor %d needs %d bytes for a max frame", ringBytes, tail, need)
			}
		}
	}
}

func TestParseRecordRejects(t *testing.T) {
	const capacity = 256
	withHeader := func(wh sdi.WireHeader) []byte {
		d := make([]byte, capacity)
		rawRecord(d, 0, wh, nil)
		return d
	}
	tests := []struct {
		name string
		data []byte
		head uint64
	}{
		{"misaligned head", withHeader(sdi.WireHeader{}), 3},
		{"bad magic", make([]byte, capacity), 0},
		{"payload over limit", withHeader(sdi.WireHeader{PayloadLen: 1 << 31}), 0},
		{"header over limit", withHeader(sdi.WireHeader{HeaderLen: maxHeader + 1}), 0},
		{"record beyond wrap", withHeader(sdi.WireHeader{PayloadLen: capacity}), 0},
		{"unknown flags", withHeader(sdi.WireHeader{Flags: 0x80}), 0},
		{"padding with lengths", withHeader(sdi.WireHeader{Flags: flagPad, PayloadLen: 1}), 0},
		{"ring not a power of two", make([]byte, 100), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := parseRecord(new(record), tt.data, tt.head, maxHeader, capacity)
			if !errors.Is(err, sdi.ErrBadFrame) {
				t.Fatalf("parseRecord = %v, want ErrBadFrame", err)
			}
		})
	}
}

// FuzzParseRecord feeds arbitrary ring contents and cursors to the parser,
// as a corrupt or hostile sender could. It must never panic, and what it
// accepts must lie inside the ring, before the wrap.
func FuzzParseRecord(f *testing.F) {
	seed := make([]byte, 128)
	putRecord(seed, 0, 0, []byte("hdr"), []byte("payload"))
	f.Add(seed, uint64(0))
	pad := make([]byte, 128)
	rawRecord(pad, 64, sdi.WireHeader{Flags: flagPad}, nil)
	f.Add(pad, uint64(64))
	f.Add(append(make([]byte, stampBytes), 0x4d, 0x44, 1, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff), uint64(0))
	f.Add([]byte{}, uint64(0))
	desc := make([]byte, 128)
	body := make([]byte, descBytes)
	descriptor{addr: 4096, n: 1000}.put(body)
	putFlagged(desc, 0, 0, flagDesc, []byte("hdr"), body)
	f.Add(desc, uint64(0))
	frag := make([]byte, 256)
	next := putParts(frag, 0, 0, flagFirst, []byte("h"), binary.LittleEndian.AppendUint64(nil, 40), make([]byte, 20))
	putParts(frag, next, 0, flagNext, nil, nil, make([]byte, 20))
	f.Add(frag, next)
	f.Fuzz(func(t *testing.T, data []byte, head uint64) {
		// Rings are powers of two; shrink the input to one, keeping short
		// inputs to exercise the size check too.
		if n := len(data); n > recAlign {
			p := 1
			for p*2 <= n {
				p *= 2
			}
			data = data[:p]
		}
		var rec record
		err := parseRecord(&rec, data, head, maxHeader, 1<<20)
		if err != nil {
			if !errors.Is(err, sdi.ErrBadFrame) {
				t.Fatalf("error does not wrap ErrBadFrame: %v", err)
			}
			return
		}
		used, contig := rec.next-head, uint64(len(data))-head&uint64(len(data)-1)
		if used == 0 || used > contig || used%recAlign != 0 {
			t.Fatalf("record advances the cursor by %d with %d bytes before the wrap", used, contig)
		}
		if rec.isDesc && (rec.payload != nil || rec.desc.n <= 0 || rec.desc.n > 1<<20) {
			t.Fatalf("descriptor record %+v", rec)
		}
		switch rec.frag {
		case flagFirst:
			if rec.total <= len(rec.payload) || rec.total > 1<<20 {
				t.Fatalf("first fragment of %d bytes announces %d", len(rec.payload), rec.total)
			}
		case flagNext:
			if len(rec.header) != 0 || len(rec.payload) == 0 {
				t.Fatalf("later fragment with %d header and %d payload bytes", len(rec.header), len(rec.payload))
			}
		}
		if !rec.pad && !rec.isDesc && used < recordLen(len(rec.header), len(rec.payload)) {
			t.Fatalf("record of %d+%d bytes advances only %d", len(rec.header), len(rec.payload), used)
		}
	})
}
