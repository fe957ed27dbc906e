package multidevice

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/hpc-multidevice/multidevice/sdi"
	"time"
)

// TestPlace checks which arriving frames get a place in a receive buffer:
// only rendezvous data blocks for a receive that waits for them, and only
// within the part of the buffer the receive asked for.
func TestPlace(t *testing.T) {
	devs := loopJob(t, 3, smallCaps)
	d := devs[1]
	h := &handler{d: d}
	const id = 77
	full := &Request{d: d, id: id, buf: make([]byte, 1000), rndvLen: 1000, status: Status{Source: 0}}
	// A receive whose buffer (300 bytes) is shorter than the message: it
	// asked for 300 and completes with ErrTruncated.
	trunc := &Request{d: d, id: id + 1, buf: make([]byte, 300), rndvLen: 300, status: Status{Source: 0}, truncErr: ErrTruncated}
	d.mu.Lock()
	d.rndvRecv[full.id], d.rndvRecv[trunc.id] = full, trunc
	d.mu.Unlock()
	t.Cleanup(func() {
		d.mu.Lock()
		delete(d.rndvRecv, full.id)
		delete(d.rndvRecv, trunc.id)
		d.filling = nil // the places handed out are never filled
		d.mu.Unlock()
	})
	data := func(rreq, off uint64) header {
		return header{kind: kindSys, tag: sysData, src: 0, dst: 1, rreq: rreq, offset: off, length: 1000}
	}
	short := make([]byte, shortHeaderSize)
	putShort(short, 3, 2, 0)
	tests := []struct {
		name    string
		from    int
		hdr     []byte
		n       int
		want    *Request // nil: no place
		wantOff int
	}{
		{name: "data block", from: 0, hdr: longHeader(data(id, 200)), n: 300, want: full, wantOff: 200},
		{name: "last block", from: 0, hdr: longHeader(data(id, 900)), n: 100, want: full, wantOff: 900},
		{name: "truncated receive, block within what it asked for", from: 0, hdr: longHeader(data(id+1, 0)), n: 300, want: trunc},
		{name: "truncated receive, block past its buffer", from: 0, hdr: longHeader(data(id+1, 200)), n: 200},
		{name: "block past the message", from: 0, hdr: longHeader(data(id, 900)), n: 101},
		{name: "offset wraps", from: 0, hdr: longHeader(data(id, 1<<64-10)), n: 20},
		{name: "unknown request", from: 0, hdr: longHeader(data(id+5, 0)), n: 10},
		{name: "other source than matched", from: 2, hdr: longHeader(header{kind: kindSys, tag: sysData, src: 2, dst: 1, rreq: id}), n: 10},
		{name: "source differs from sender", from: 2, hdr: longHeader(data(id, 0)), n: 10},
		{name: "for another rank", from: 0, hdr: longHeader(header{kind: kindSys, tag: sysData, src: 0, dst: 2, rreq: id}), n: 10},
		{name: "eager short header", from: 0, hdr: short, n: 10},
		{name: "eager long header", from: 0, hdr: longHeader(header{kind: kindEager, tag: 1, src: 0, dst: 1, length: 10}), n: 10},
		{name: "ready to send", from: 0, hdr: longHeader(header{kind: kindRTS, tag: 1, src: 0, dst: 1, length: 5000}), n: 10},
		{name: "forwarded block", from: 0, hdr: longHeader(header{kind: kindSys, tag: sysFwd, src: 0, dst: 1, rreq: id, length: 10}), n: 10},
		{name: "clear to send", from: 0, hdr: longHeader(header{kind: kindSys, tag: sysCTS, src: 0, dst: 1, rreq: id}), n: 10},
		{name: "empty payload", from: 0, hdr: longHeader(data(id, 0)), n: 0},
		{name: "malformed header", from: 0, hdr: []byte("not a header"), n: 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := h.Place(sdi.Rank(tt.from), tt.hdr, tt.n)
			if tt.want == nil {
				if got != nil {
					t.Fatalf("placed %d bytes, want no place", len(got))
				}
				return
			}
			if len(got) != tt.n || cap(got) != tt.n || &got[0] != &tt.want.buf[tt.wantOff] {
				t.Fatalf("place of %d bytes (cap %d), want buffer[%d:%d]", len(got), cap(got), tt.wantOff, tt.wantOff+tt.n)
			}
		})
	}
}

// TestPlacedDeliver fills placed blocks and delivers them: the receive
// completes with the bytes, truncation still reported; a placed block
// delivered from another buffer after all, and a block never placed, are
// copied.
func TestPlacedDeliver(t *testing.T) {
	devs := loopJob(t, 2, smallCaps)
	d := devs[1]
	h := &handler{d: d}
	msg := pattern(1000, 9)
	tests := []struct {
		name      string
		bufLen    int
		placed    bool
		elsewhere bool // placed, but delivered from a buffer of the subdevice's own
		wantErr   error
	}{
		{name: "placed", bufLen: 1000, placed: true},
		{name: "placed, truncated", bufLen: 600, placed: true, wantErr: ErrTruncated},
		{name: "placed, delivered from elsewhere", bufLen: 1000, placed: true, elsewhere: true},
		{name: "copied", bufLen: 1000},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := uint64(500 + i)
			r := &Request{d: d, id: id, buf: make([]byte, tt.bufLen), rndvLen: uint64(tt.bufLen), status: Status{Source: 0, Count: tt.bufLen}}
			if tt.bufLen < len(msg) {
				r.truncErr = ErrTruncated
			}
			d.mu.Lock()
			d.rndvRecv[id] = r
			d.mu.Unlock()
			for off := 0; off < tt.bufLen; off += 250 {
				n := min(250, tt.bufLen-off)
				hb := longHeader(header{kind: kindSys, tag: sysData, src: 0, dst: 1, rreq: id, offset: uint64(off), length: uint64(len(msg))})
				payload := append([]byte(nil), msg[off:off+n]...)
				if tt.placed {
					dst := h.Place(0, hb, n)
					if dst == nil {
						t.Fatalf("block at %d got no place", off)
					}
					if !tt.elsewhere {
						copy(dst, payload)
						payload = dst
					}
				}
				h.Deliver(0, hb, payload)
			}
			st, err := wait(t, r)
			if !errors.Is(err, tt.wantErr) && !(err == nil && tt.wantErr == nil) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if st.Count != tt.bufLen || !bytes.Equal(r.buf, msg[:tt.bufLen]) {
				t.Fatalf("count %d, content equal %v", st.Count, bytes.Equal(r.buf, msg[:tt.bufLen]))
			}
			d.mu.Lock()
			_, left := d.rndvRecv[id]
			filling := len(d.filling)
			d.mu.Unlock()
			if left || filling != 0 {
				t.Fatalf("completed receive still waits for data (%v) or has blocks filling (%d)", left, filling)
			}
		})
	}
}

// TestPlacedBlockOutlivesFailure checks that a rendezvous receive whose
// source is lost while a subdevice fills a block placed in its buffer
// completes with the failure only once that block is delivered: until
// then the subdevice may write into the buffer, which the receive's
// owner reuses once it completes. If the subdevice that placed the block
// reports the source down instead, the receive fails at once; if it
// closes cleanly instead (Close ends its places), the receive fails at
// the Device's Close, which fails what is outstanding: it waited for the
// block for ever, and a Wait on it hung. Either way it reports the source
// and tag of the message it matched, and no bytes.
func TestPlacedBlockOutlivesFailure(t *testing.T) {
	tests := []struct {
		name       string
		placingSub bool // the subdevice that placed the block reports the loss
		closes     bool // the Device closes before the block is delivered
	}{
		{name: "another subdevice loses the source"},
		{name: "the placing subdevice loses the source", placingSub: true},
		{name: "the placing subdevice closes", closes: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			devs := loopJob(t, 2, smallCaps)
			d := devs[1]
			h := &handler{d: d, sub: 1}
			const id = 900
			r := &Request{d: d, id: id, buf: make([]byte, 500), rndvLen: 500, status: Status{Source: 0, Tag: 5, Count: 500}}
			d.mu.Lock()
			d.rndvRecv[id] = r
			d.mu.Unlock()
			hb := longHeader(header{kind: kindSys, tag: sysData, src: 0, dst: 1, rreq: id, length: 500})
			dst := h.Place(0, hb, 250)
			if dst == nil {
				t.Fatal("block got no place")
			}
			lost := errors.New("link lost")
			if tt.placingSub {
				h.PeerDown(0, lost)
				if !r.isDone() {
					t.Fatal("receive still waits for a block its subdevice will not deliver")
				}
			} else {
				d.failPeer(0, lost, fmt.Errorf("%w: %v", ErrPeerDown, lost))
				if r.isDone() {
					t.Fatal("receive completed while a subdevice still fills its buffer")
				}
				if tt.closes {
					closeJob(t, devs) // every subdevice closes cleanly
				} else {
					copy(dst, pattern(250, 3))
					h.Deliver(0, hb, dst)
				}
			}
			if st, err := wait(t, r); !errors.Is(err, ErrPeerDown) || st != (Status{Source: 0, Tag: 5}) {
				t.Fatalf("receive ended with %+v, %v; want source 0, tag 5, ErrPeerDown", st, err)
			}
			d.mu.Lock()
			_, left := d.rndvRecv[id]
			filling := len(d.filling)
			d.mu.Unlock()
			if left || filling != 0 {
				t.Fatalf("failed receive still waits for data (%v) or has blocks filling (%d)", left, filling)
			}
		})
	}
}

// TestPlaceEager checks that an eager message that is next in its
// sequence and matches a posted receive holding it whole is placed in
// that receive's buffer and completes it in the Deliver that follows, and
// that every other eager message takes the ordinary path.
func TestPlaceEager(t *testing.T) {
	const tag = 3
	msg := pattern(200, 4)
	short := func(seq uint64) []byte {
		b := make([]byte, shortHeaderSize)
		putShort(b, tag, 0, seq)
		return b
	}
	syncLong := func(seq uint64) []byte {
		return longHeader(header{kind: kindEager, flags: flagSync, tag: tag, src: 0, dst: 1, seq: seq, length: uint64(len(msg)), sreq: 9})
	}
	tests := []struct {
		name    string
		bufLen  int // 0: no receive posted
		hdr     []byte
		placed  bool // Place gives the receive's buffer
		fill    bool // the subdevice fills a buffer of its own instead
		waits   bool // the receive stays posted: the message is early
		wantErr error
	}{
		{name: "posted receive", bufLen: 300, hdr: short(0), placed: true},
		{name: "exactly as long", bufLen: len(msg), hdr: short(0), placed: true},
		{name: "synchronous send", bufLen: 300, hdr: syncLong(0), placed: true},
		{name: "delivered from another buffer", bufLen: 300, hdr: short(0), placed: true, fill: true},
		{name: "buffer too short", bufLen: 100, hdr: short(0), wantErr: ErrTruncated},
		{name: "no receive posted", hdr: short(0)},
		{name: "out of sequence", bufLen: 300, hdr: short(1), waits: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := loopJob(t, 2, smallCaps)[1]
			h := &handler{d: d, sub: 1}
			var r *Request
			if tt.bufLen > 0 {
				var err error
				if r, err = d.Irecv(make([]byte, tt.bufLen), 0, tag, 0); err != nil {
					t.Fatal(err)
				}
			}
			dst := h.Place(0, tt.hdr, len(msg))
			if tt.placed != (dst != nil) {
				t.Fatalf("placed = %v, want %v", dst != nil, tt.placed)
			}
			payload := append([]byte(nil), msg...)
			if dst != nil {
				if len(dst) != len(msg) || cap(dst) != len(msg) || &dst[0] != &r.buf[0] {
					t.Fatalf("place of %d bytes (cap %d), not the start of the receive buffer", len(dst), cap(dst))
				}
				if !tt.fill {
					copy(dst, msg)
					payload = dst
				}
			}
			if r != nil && r.isDone() {
				t.Fatal("receive completed before its Deliver")
			}
			h.Deliver(0, tt.hdr, payload)
			if r == nil {
				// Unexpected or early: a receive posted now finds it
				// (an out-of-sequence one waits for its predecessor).
				return
			}
			if tt.waits {
				if r.isDone() {
					t.Fatal("a message out of sequence matched")
				}
				return
			}
			st, err := wait(t, r)
			if !errors.Is(err, tt.wantErr) && !(err == nil && tt.wantErr == nil) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			n := min(tt.bufLen, len(msg))
			if st.Source != 0 || st.Tag != tag || st.Count != n || !bytes.Equal(r.buf[:n], msg[:n]) {
				t.Fatalf("status %+v, content equal %v", st, bytes.Equal(r.buf[:n], msg[:n]))
			}
			d.mu.Lock()
			left, next := len(d.placing), d.recvSeq[0]
			d.mu.Unlock()
			if left != 0 || next != 1 {
				t.Fatalf("%d placed messages left, next sequence number %d, want none and 1", left, next)
			}
		})
	}
}

// TestPlacedEagerPeerDown reports the source down after Place gave an
// eager message a place: the subdevice that placed it will not deliver
// it, so the receive fails; another subdevice losing the peer leaves the
// fill to the one that placed it.
func TestPlacedEagerPeerDown(t *testing.T) {
	for _, sameSub := range []bool{true, false} {
		d, h, r, hb, dst := placeEagerJob(t)
		if sameSub {
			h.PeerDown(0, errors.New("read failed"))
			if _, err := wait(t, r); !errors.Is(err, ErrPeerDown) {
				t.Fatalf("receive ended with %v, want ErrPeerDown", err)
			}
			continue
		}
		d.failPlaced(0, 0, ErrPeerDown) // the self path, which placed nothing
		copy(dst, pattern(200, 1))
		h.Deliver(0, hb, dst)
		if _, err := wait(t, r); err != nil {
			t.Fatalf("receive placed on another subdevice ended with %v", err)
		}
	}
}

// placeEagerJob starts a job of two with small eager frames and, on rank 1,
// posts a receive from rank 0 with tag 3 and has subdevice 1 place the
// 200-byte eager message that matches it: the device, that subdevice's
// handler, the receive, the message's header and its place.
func placeEagerJob(t *testing.T) (*Device, *handler, *Request, []byte, []byte) {
	t.Helper()
	d := loopJob(t, 2, smallCaps)[1]
	h := &handler{d: d, sub: 1}
	r, err := d.Irecv(make([]byte, 300), 0, 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	hb := make([]byte, shortHeaderSize)
	putShort(hb, 3, 0, 0)
	dst := h.Place(0, hb, 200)
	if dst == nil {
		t.Fatal("no place for a message a posted receive takes")
	}
	return d, h, r, hb, dst
}

// fwdData is the header of a forwarded block sent split: block seq of the
// line from rank 0 to rank 1, wrapping n bytes of rendezvous data for
// receive rreq at off.
func fwdData(seq, rreq, off uint64, n int) []byte {
	hb := make([]byte, 2*headerSize)
	(&header{kind: kindSys, tag: sysFwd, src: 0, dst: 1, seq: seq, length: uint64(headerSize + n), offset: 1000}).put(hb)
	(&header{kind: kindSys, tag: sysData, src: 0, dst: 1, rreq: rreq, offset: off, length: 1000}).put(hb[headerSize:])
	return hb
}

// TestPlaceForwarded: a forwarded block sent split gets a place when it
// wraps a data block for a waiting receive and has not arrived before.
func TestPlaceForwarded(t *testing.T) {
	devs := loopJob(t, 3, smallCaps)
	d := devs[1]
	h := &handler{d: d, sub: 1}
	const id = 88
	r := &Request{d: d, id: id, buf: make([]byte, 1000), rndvLen: 1000, status: Status{Source: 0}}
	d.mu.Lock()
	d.rndvRecv[id] = r
	d.mu.Unlock()
	d.fwd.rxMu.Lock()
	d.fwd.rx[0].cum = 5 // blocks 0 to 4 of the line arrived, and 7
	d.fwd.rx[0].above = map[uint64]struct{}{7: {}}
	d.fwd.rxMu.Unlock()
	t.Cleanup(func() {
		d.mu.Lock()
		delete(d.rndvRecv, id)
		d.filling = nil
		d.mu.Unlock()
	})
	edit := func(hb []byte, at int, h header) []byte {
		h.put(hb[at:])
		return hb
	}
	tests := []struct {
		name string
		hb   []byte
		n    int
		want bool
	}{
		{"new block", fwdData(5, id, 100, 200), 200, true},
		{"block beyond a gap", fwdData(9, id, 300, 200), 200, true},
		{"arrived before", fwdData(4, id, 100, 200), 200, false},
		{"arrived before, beyond a gap", fwdData(7, id, 100, 200), 200, false},
		{"length disagrees", fwdData(5, id, 100, 200), 199, false},
		{"unknown receive", fwdData(5, id+1, 100, 200), 200, false},
		{"past the buffer", fwdData(5, id, 900, 200), 200, false},
		{"for another rank", edit(fwdData(5, id, 0, 10), 0, header{kind: kindSys, tag: sysFwd, src: 0, dst: 2, seq: 5, length: headerSize + 10}), 10, false},
		{"not a forwarded block", edit(fwdData(5, id, 0, 10), 0, header{kind: kindSys, tag: sysData, src: 0, dst: 1, length: headerSize + 10}), 10, false},
		{"wraps no data", edit(fwdData(5, id, 0, 10), headerSize, header{kind: kindEager, tag: 1, src: 0, dst: 1, length: 10}), 10, false},
		{"inner from another source", edit(fwdData(5, id, 0, 10), headerSize, header{kind: kindSys, tag: sysData, src: 2, dst: 1, rreq: id}), 10, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := h.Place(0, tt.hb, tt.n)
			if !tt.want {
				if got != nil {
					t.Fatalf("placed %d bytes, want no place", len(got))
				}
				return
			}
			off := binary.LittleEndian.Uint64(tt.hb[headerSize+56:])
			if len(got) != tt.n || &got[0] != &r.buf[off] {
				t.Fatalf("place of %d bytes, want buffer[%d:%d]", len(got), off, int(off)+tt.n)
			}
		})
	}
}

// TestPlacedForwardCopies: two copies of a forwarded block (sent again
// after a trunk died) may arrive on two subdevices. One is placed at a
// time: a copy that arrives while another is being placed is kept aside,
// never written into the buffer the placing subdevice writes; the placed
// copy counts when delivered, and the one kept aside if the placing
// subdevice loses the peer instead. A placed copy lost with nothing kept
// aside is dropped without failing the receive: the block comes again.
func TestPlacedForwardCopies(t *testing.T) {
	devs := loopJob(t, 2, smallCaps)
	d := devs[1]
	a, b := &handler{d: d, sub: 1}, &handler{d: d, sub: 0}
	msg := pattern(1000, 3)
	lost := errors.New("link down")
	place := func(t *testing.T, h *handler, hb []byte) []byte {
		t.Helper()
		dst := h.Place(0, hb, 1000)
		if dst == nil {
			t.Fatal("no place")
		}
		return dst
	}
	tests := []struct {
		name    string
		dropped uint64 // copies counted as duplicates
		run     func(t *testing.T, r *Request, hb []byte)
	}{
		{"placed copy, then the other", 1, func(t *testing.T, r *Request, hb []byte) {
			copy(place(t, a, hb), msg)
			a.Deliver(0, hb, r.buf)
			if !r.isDone() {
				t.Fatal("the placed copy did not complete the receive")
			}
			if b.Place(0, hb, 1000) != nil {
				t.Fatal("a copy of a block that arrived was placed")
			}
			b.Deliver(0, hb, msg)
		}},
		{"other copy while one is placed", 1, func(t *testing.T, r *Request, hb []byte) {
			dst := place(t, a, hb)
			if b.Place(0, hb, 1000) != nil {
				t.Fatal("a second copy was placed while the first was")
			}
			other := append([]byte(nil), msg...)
			other[0] ^= 0xff // tells whose bytes the buffer got
			b.Deliver(0, hb, other)
			if r.isDone() || r.buf[0] != 0 {
				t.Fatal("a copy arriving during a placement was written or completed the receive")
			}
			copy(dst, msg)
			a.Deliver(0, hb, dst)
		}},
		{"placed copy lost after the other came", 0, func(t *testing.T, r *Request, hb []byte) {
			place(t, a, hb)
			b.Deliver(0, hb, append([]byte(nil), msg...))
			d.failPlaced(a.sub, 0, lost)
		}},
		{"placed copy lost alone", 0, func(t *testing.T, r *Request, hb []byte) {
			place(t, a, hb)
			d.failPlaced(a.sub, 0, lost)
			if r.isDone() {
				t.Fatal("losing a placed copy ended the receive")
			}
			b.Deliver(0, hb, append([]byte(nil), msg...)) // sent again
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := uint64(600 + i)
			r := &Request{d: d, id: id, buf: make([]byte, 1000), rndvLen: 1000, status: Status{Source: 0, Count: 1000}}
			d.mu.Lock()
			d.rndvRecv[id] = r
			d.mu.Unlock()
			d.fwd.rxMu.Lock()
			seq := d.fwd.rx[0].cum
			d.fwd.rxMu.Unlock()
			dropped := d.ForwardStats().Dropped
			tt.run(t, r, fwdData(seq, r.id, 0, 1000))
			st, err := wait(t, r)
			if err != nil || st.Count != 1000 || !bytes.Equal(r.buf, msg) {
				t.Fatalf("receive: %+v %v, content equal %v", st, err, bytes.Equal(r.buf, msg))
			}
			if got := d.ForwardStats().Dropped - dropped; got != tt.dropped {
				t.Errorf("%d copies dropped as duplicates, want %d", got, tt.dropped)
			}
			d.mu.Lock()
			left := len(d.filling)
			d.mu.Unlock()
			if left != 0 {
				t.Errorf("%d placed blocks still counted as being filled", left)
			}
		})
	}
}

// TestPlacedCopyRace: block 0 of a two-block rendezvous receive is placed
// by subdevice A while its copy arrives over B and is counted in the line;
// A delivers between B's count and B's decision about the copy. Exactly
// one copy counts, and the receive completes only once block 1, still
// being placed, is in: counted twice, block 0 completed the receive with
// block 1 never written, and block 1's open placement later counted into
// the request's next use.
func TestPlacedCopyRace(t *testing.T) {
	devs := loopJob(t, 2, smallCaps)
	d := devs[1]
	a, b := &handler{d: d, sub: 1}, &handler{d: d, sub: 0}
	const id = 700
	buf := bytes.Repeat([]byte{0xEE}, 2000) // the previous message's bytes
	r := &Request{d: d, id: id, buf: buf, rndvLen: 2000, status: Status{Source: 0, Count: 2000}, atSub: -1}
	d.mu.Lock()
	d.rndvRecv[id] = r
	d.mu.Unlock()
	d.fwd.rxMu.Lock()
	seq := d.fwd.rx[0].cum
	d.fwd.rxMu.Unlock()
	// B's copy carries a credit for the line the other way: holding that
	// line's lock stops B in onCredit, after it counted the block.
	l := d.fwd.tx[0]
	if l == nil {
		l = &txLine{}
		d.fwd.tx[0] = l
		t.Cleanup(func() { d.fwd.tx[0] = nil })
	}
	msg := pattern(2000, 9)
	hb0 := fwdData(seq, id, 0, 1000)
	hb0B := append([]byte(nil), hb0...)
	outer, _ := decodeHeader(hb0B[:headerSize], d.size)
	outer.flags |= flagCredit
	outer.put(hb0B[:headerSize])
	hb1 := fwdData(seq+1, id, 1000, 1000)
	dst0, dst1 := a.Place(0, hb0, 1000), a.Place(0, hb1, 1000)
	if dst0 == nil || dst1 == nil || b.Place(0, hb0B, 1000) != nil {
		t.Fatal("A should place both blocks, B neither")
	}
	l.mu.Lock()
	done := make(chan struct{})
	go func() { b.Deliver(0, hb0B, append([]byte(nil), msg[:1000]...)); close(done) }()
	for {
		d.fwd.rxMu.Lock()
		c := d.fwd.rx[0].cum
		d.fwd.rxMu.Unlock()
		if c > seq {
			break
		}
		time.Sleep(time.Millisecond)
	}
	copy(dst0, msg[:1000])
	a.Deliver(0, hb0, dst0)
	l.mu.Unlock()
	<-done
	d.mu.Lock()
	received, busy := r.received, r.rndvBusy
	d.mu.Unlock()
	if r.isDone() || received != 1000 || busy != 1 {
		t.Fatalf("after both copies of block 0: done %v, %d bytes counted, %d blocks being written; want not done, 1000, 1", r.isDone(), received, busy)
	}
	copy(dst1, msg[1000:])
	a.Deliver(0, hb1, dst1)
	if !r.isDone() {
		t.Fatal("block 1 delivered, the receive not complete")
	}
	if st, err := r.Result(); err != nil || st.Count != 2000 || !bytes.Equal(buf, msg) {
		t.Fatalf("receive: %+v, %v; buffer right: %v", st, err, bytes.Equal(buf, msg))
	}
}
