package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

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
			tail = putRecord(data, tail, hdr, payload)
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
	putRecord(seed, 0, []byte("hdr"), []byte("payload"))
	f.Add(seed, uint64(0))
	pad := make([]byte, 128)
	rawRecord(pad, 64, sdi.WireHeader{Flags: flagPad}, nil)
	f.Add(pad, uint64(64))
	f.Add(append(make([]byte, stampBytes), 0x4d, 0x44, 1, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff), uint64(0))
	f.Add([]byte{}, uint64(0))
	desc := make([]byte, 128)
	body := make([]byte, descBytes)
	descriptor{addr: 4096, n: 1000}.put(body)
	putFlagged(desc, 0, flagDesc, []byte("hdr"), body)
	f.Add(desc, uint64(0))
	frag := make([]byte, 256)
	next := putParts(frag, 0, flagFirst, []byte("h"), binary.LittleEndian.AppendUint64(nil, 40), make([]byte, 20))
	putParts(frag, next, flagNext, nil, nil, make([]byte, 20))
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
