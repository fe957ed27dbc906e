package multidevice

import (
	"context"
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// fuzzFrame is one frame of a FuzzDeliver input: the rank it claims to
// come from, its header and its payload.
type fuzzFrame struct {
	from    byte
	hdr     []byte
	payload []byte
}

// encodeFuzzFrames lays frames out as FuzzDeliver reads them: per frame a
// byte of source rank, a byte of header length, two of payload length,
// then the header and the payload.
func encodeFuzzFrames(frames ...fuzzFrame) []byte {
	var b []byte
	for _, f := range frames {
		b = append(b, f.from, byte(len(f.hdr)))
		b = binary.LittleEndian.AppendUint16(b, uint16(len(f.payload)))
		b = append(b, f.hdr...)
		b = append(b, f.payload...)
	}
	return b
}

// decodeFuzzFrames reads what encodeFuzzFrames writes, up to max frames;
// a truncated frame ends the list.
func decodeFuzzFrames(b []byte, max int) []fuzzFrame {
	var frames []fuzzFrame
	for len(frames) < max && len(b) >= 4 {
		f := fuzzFrame{from: b[0]}
		hl, pl := int(b[1]), int(binary.LittleEndian.Uint16(b[2:]))
		b = b[4:]
		if len(b) < hl+pl {
			break
		}
		f.hdr, f.payload = b[:hl], b[hl:hl+pl]
		b = b[hl+pl:]
		frames = append(frames, f)
	}
	return frames
}

// FuzzDeliver hands arbitrary frames to a rank's subdevice handler, as a
// faulty or hostile peer could send them, while the rank has receives, a
// rendezvous receive, a rendezvous and a synchronous send, and a virtual
// line in progress: through an application rank as gateway (job 0, the
// frames to rank 1), a dedicated relay (job 1, the frames to the relay),
// or over a failover route of two subdevices (job 2, the frames to rank
// 1). Nothing may panic, and every rank's Close must return by its
// deadline. Close may fail: a frame that passes for one of a line's own
// blocks (its source forged) shifts the line's numbering, and the line
// then never drains. Without authentication no rank can tell such a
// frame from a real one; what can be told is dropped (see
// TestForwardDropsOwnBlock). One frame comes as fields, which mutate more readily than the
// bytes they encode to, the others as raw bytes (encodeFuzzFrames).
func FuzzDeliver(f *testing.F) {
	short := make([]byte, shortHeaderSize)
	putShort(short, 5, 0, 0)
	inner := longHeader(header{kind: kindEager, tag: 5, src: 0, dst: 1, length: 4})
	block := longHeader(header{kind: kindSys, tag: sysFwd, src: 0, dst: 1, seq: 0, length: headerSize + 4, offset: 4, flags: flagCredit, rreq: 1})
	type seed struct {
		h       header
		from    uint8
		split   bool // the payload's first 64 bytes go with the header
		payload []byte
		raw     []fuzzFrame
	}
	for _, sd := range []seed{
		{h: header{kind: kindEager, tag: 5, src: 2, dst: 1, length: 4}, from: 2, payload: []byte("abcd")},
		{h: header{kind: kindEager, flags: flagSync, tag: 3, src: 2, dst: 1, seq: 1, length: 0, sreq: 4}, from: 2},
		{h: header{kind: kindRTS, tag: 5, src: 2, dst: 1, seq: 1, length: 5000, sreq: 8}, from: 2},
		// The rendezvous receive of the fixture below has request id 2.
		{h: header{kind: kindSys, tag: sysData, src: 0, dst: 1, length: 16, sreq: 7, rreq: 2, offset: 8}, from: 0, payload: make([]byte, 8)},
		{h: header{kind: kindSys, tag: sysCTS, src: 0, dst: 1, sreq: 1, rreq: 9, offset: 1 << 20}, from: 0},
		{h: header{kind: kindSys, tag: sysAck, src: 0, dst: 1, sreq: 3}, from: 0},
		{h: header{kind: kindSys, tag: sysFwd, src: 0, dst: 1, seq: 0, length: headerSize + 4, offset: 4, flags: flagCredit, rreq: 1}, from: 2,
			payload: append(inner[:headerSize:headerSize], "abcd"...)},
		{h: header{kind: kindSys, tag: sysFwd, src: 0, dst: 1, seq: 0, length: headerSize + 4, offset: 4}, from: 2, split: true,
			payload: append(inner[:headerSize:headerSize], "abcd"...)},
		{h: header{kind: kindSys, tag: sysCredit, src: 0, dst: 1, seq: 1}, from: 2},
		{h: header{kind: kindSys, tag: sysCredit, src: 0, dst: 1, seq: 1, length: 16}, from: 2, payload: appendReport(nil, []uint64{100, 1 << 20})},
		{h: header{kind: kindSys, tag: sysFwd, src: 1, dst: 0, seq: 3, length: headerSize}, from: 2, payload: make([]byte, headerSize)},
		{raw: []fuzzFrame{{from: 0, hdr: short, payload: []byte("abcd")}, {from: 2, hdr: append(block[:headerSize:headerSize], inner...), payload: []byte("abcd")}}},
	} {
		h := sd.h
		for job := range uint8(3) {
			f.Add(uint8(h.kind), h.flags, h.tag, h.src, h.dst, h.context, h.seq, h.length, h.sreq, h.rreq, h.offset, sd.from, sd.split, sd.payload, encodeFuzzFrames(sd.raw...), job, uint8(0))
		}
	}
	f.Fuzz(func(t *testing.T, k, flags uint8, tag, src, dst int32, ctxID, seq, length, sreq, rreq, offset uint64, from uint8, split bool, payload, raw []byte, job, sub uint8) {
		var devs []*Device
		to := 1 // the rank the frames go to
		switch job % 3 {
		case 0: // rank 1 reaches rank 0 only through rank 2
			devs, _ = openSites(t, siteJob{sites: []int{0, 1, -1}})
		case 1: // the same through a dedicated relay
			devs, _ = openSites(t, siteJob{sites: []int{0, 1, -1}, relays: 1})
			to = 2
		case 2:
			devs, _, _ = failoverJob(t, 3, true, false)
		}
		d := devs[1]
		h := &handler{d: devs[to], sub: 1 + int(sub)%(len(devs[to].subs)-1)}
		// What the frames may meet: a receive from anyone, a rendezvous
		// receive from rank 0 that has asked for its data (request id
		// 2), a rendezvous send to rank 0 (id 1) waiting for its
		// clear-to-send and a synchronous send to rank 0 (id 3) waiting
		// for its acknowledgement.
		if _, err := d.Irecv(make([]byte, 16), AnySource, AnyTag, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Isend(make([]byte, 3000), 0, 9, 0, false); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Irecv(make([]byte, 2000), 0, 6, 0); err != nil {
			t.Fatal(err)
		}
		fixture := &handler{d: d, sub: 1}
		fixture.Deliver(0, longHeader(header{kind: kindRTS, tag: 6, src: 0, dst: 1, length: 1000, sreq: 7}), nil)
		if _, err := d.Isend(make([]byte, 8), 0, 10, 0, true); err != nil {
			t.Fatal(err)
		}

		hb := longHeader(header{kind: kind(k), flags: flags, tag: tag, src: src, dst: dst, context: ctxID,
			seq: seq, length: length, sreq: sreq, rreq: rreq, offset: offset})
		if split {
			n := min(len(payload), headerSize)
			hb, payload = append(hb, payload[:n]...), payload[n:]
		}
		h.Deliver(sdi.Rank(int(from)%len(devs)), hb, payload)
		for _, fr := range decodeFuzzFrames(raw, 8) {
			h.Deliver(sdi.Rank(int(fr.from)%len(devs)), fr.hdr, fr.payload)
		}
		// Closed here with a short deadline, errors allowed (see above);
		// the cleanup's closeJob then finds them closed.
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		var wg sync.WaitGroup
		for _, d := range devs {
			wg.Go(func() { _ = d.Close(ctx) })
		}
		wg.Wait()
	})
}

// TestForwardDropsOwnBlock: a forwarded block that claims to come from the
// rank it reaches (a routing loop, or a forgery) is not passed on. Passed
// on, it would arrive as a block of this rank's own line that this rank
// never sent, and the line would never drain (FuzzDeliver found it).
func TestForwardDropsOwnBlock(t *testing.T) {
	devs, _ := openSites(t, siteJob{sites: []int{0, 1, -1}})
	inner := longHeader(header{kind: kindEager, tag: 5, src: 1, dst: 0, length: 0})
	h := &handler{d: devs[1], sub: 1}
	h.Deliver(2, longHeader(header{kind: kindSys, tag: sysFwd, src: 1, dst: 0, seq: 5, length: headerSize}), inner)
	if st := devs[1].ForwardStats(); st.Forwarded != 0 {
		t.Fatalf("passed on %d frames, want none", st.Forwarded)
	}
	// The line still works, and drains at Close (closeJob).
	if _, err := wait(t, must(t)(devs[1].Isend([]byte("hi"), 0, 5, 0, false))); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if _, err := wait(t, must(t)(devs[0].Irecv(buf, 1, 5, 0))); err != nil || string(buf) != "hi" {
		t.Fatalf("receive: %v %q", err, buf)
	}
}
