package shm

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// fuzzRecord is one record FuzzCorruptRing writes: a wire header, a body
// that may disagree with it, and whether the cursor moves on by the
// lengths the header claims (else by the body's).
type fuzzRecord struct {
	wh      sdi.WireHeader
	body    []byte
	claimed bool
}

// encodeFuzzRecords lays records out as decodeFuzzRecords reads them: per
// record a flags byte (bit 7: the cursor moves by the claimed lengths), a
// 16-bit header length, a 32-bit payload length, a 16-bit body length,
// then the body.
func encodeFuzzRecords(recs ...fuzzRecord) []byte {
	var b []byte
	for _, r := range recs {
		fl := r.wh.Flags &^ 0x80
		if r.claimed {
			fl |= 0x80
		}
		b = append(b, fl)
		b = binary.LittleEndian.AppendUint16(b, r.wh.HeaderLen)
		b = binary.LittleEndian.AppendUint32(b, r.wh.PayloadLen)
		b = binary.LittleEndian.AppendUint16(b, uint16(len(r.body)))
		b = append(b, r.body...)
	}
	return b
}

func decodeFuzzRecords(b []byte, max int) []fuzzRecord {
	var recs []fuzzRecord
	for len(recs) < max && len(b) >= 9 {
		r := fuzzRecord{wh: sdi.WireHeader{Flags: b[0] &^ 0x80, HeaderLen: binary.LittleEndian.Uint16(b[1:]),
			PayloadLen: binary.LittleEndian.Uint32(b[3:])}, claimed: b[0]&0x80 != 0}
		n := int(binary.LittleEndian.Uint16(b[7:]))
		b = b[9:]
		if len(b) < n {
			break
		}
		r.body, b = b[:n], b[n:]
		recs = append(recs, r)
	}
	return recs
}

// FuzzCorruptRing writes arbitrary stamped records into the ring that
// carries rank 0's frames into rank 1's segment, after some honest
// traffic, as a buggy or hostile process sharing the host could. Rank 1
// may deliver them or report rank 0 down; it must not panic or read
// outside its memory, must keep serving rank 2, and every rank must
// close. TestCorruptRing has the cases by name.
func FuzzCorruptRing(f *testing.F) {
	hdr := []byte("hdr")
	withHeader := func(flags uint8, body ...[]byte) fuzzRecord {
		var b []byte
		for _, p := range body {
			b = append(b, p...)
		}
		plen := len(b) - len(hdr)
		return fuzzRecord{wh: sdi.WireHeader{Flags: flags, HeaderLen: uint16(len(hdr)), PayloadLen: uint32(plen)}, body: b, claimed: true}
	}
	desc := make([]byte, descBytes)
	descriptor{addr: 4096, n: 1000}.put(desc)
	for _, recs := range [][]fuzzRecord{
		{withHeader(0, hdr, []byte("payload"))},
		{withHeader(0, hdr, make([]byte, 200)), withHeader(0, hdr, []byte("second"))},
		{withHeader(flagDesc, hdr, desc)},
		{withHeader(flagFirst, hdr, binary.LittleEndian.AppendUint64(nil, 40), make([]byte, 20)),
			{wh: sdi.WireHeader{Flags: flagNext, PayloadLen: 20}, body: make([]byte, 20), claimed: true}},
		{{wh: sdi.WireHeader{Flags: flagPad}, claimed: false}, withHeader(0, hdr)},
		{withHeader(1<<fastShift, hdr, []byte("after a fast frame"))},
		{{wh: sdi.WireHeader{PayloadLen: 1<<32 - 1}, body: []byte("short"), claimed: false}},
	} {
		for _, lead := range []uint8{1, 15} {
			f.Add(encodeFuzzRecords(recs...), lead)
		}
	}
	f.Fuzz(func(t *testing.T, in []byte, lead uint8) {
		recs := decodeFuzzRecords(in, 16)
		if len(recs) == 0 {
			return
		}
		j := openJob(t, 3, jobOpts{config: []byte(`{"ring_bytes": 65536}`)})
		// Honest traffic first, through the ring (too large for a fast
		// slot): lead frames of 4 KiB put the records below anywhere in
		// the 64 KiB ring, up to its wrap.
		for i := range int(lead%16) + 1 {
			mustSend(t, j.sds[0], &sdi.Frame{Peer: 1, Payload: pattern(uint64(i), 4000)})
			j.hs[1].next(t)
		}
		scribble(t, j, 0, 1, func(d []byte, tail uint64) uint64 {
			for _, r := range recs {
				// Records start on recAlign boundaries, so a wire header
				// always fits before the ring's end; a body may not, and
				// rawRecord cuts it there.
				rawRecord(d, tail, r.wh, r.body)
				n := recordLen(0, len(r.body)) // rounded to recAlign
				if r.claimed {
					n = recordLen(int(r.wh.HeaderLen), int(r.wh.PayloadLen))
				}
				tail += n
			}
			return tail
		})
		mustSend(t, j.sds[2], &sdi.Frame{Peer: 1, Payload: []byte("still here")})
		watchdog := time.After(20 * time.Second)
		for {
			select {
			case m := <-j.hs[1].msgs:
				if m.from == 2 {
					if string(m.payload) != "still here" {
						t.Fatalf("from rank 2: %q", m.payload)
					}
					return
				}
			case <-watchdog:
				t.Fatal("rank 1 stopped serving rank 2 after rank 0 scribbled on its ring")
			}
		}
	})
}
