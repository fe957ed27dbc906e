package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// peerOf returns rank from's connection to rank to.
func peerOf(t *testing.T, j *job, from, to sdi.Rank) *peer {
	t.Helper()
	p := j.sds[from].(*device).peers[to].Load()
	if p == nil {
		t.Fatalf("rank %d is not connected to rank %d", from, to)
	}
	return p
}

// counts returns how many frames p sent through the fast slots and how
// many ring bytes it wrote.
func counts(p *peer) (fast, ring uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fastSent, p.tail
}

// small is a frame the size of the multidevice's eager message of 8
// bytes: a 24-byte header and the payload, one fast slot's record.
func small(peer sdi.Rank, i uint64) *sdi.Frame {
	return &sdi.Frame{Peer: peer, Header: append(u64(i), make([]byte, 16)...), Payload: u64(i)}
}

// released waits until the receiver has let go of every ring record p
// wrote. A rank answers only after that, but expectFrame returns as soon
// as Deliver has the frame, before the receiver stores its cursor: a
// sender that checks the cursor in between (slowed down by -race) found
// the ring still in use twice in a row once in 25 runs.
func released(t *testing.T, p *peer) {
	t.Helper()
	_, tail := counts(p)
	deadline := time.Now().Add(20 * time.Second)
	for p.ring.head.Load() != tail {
		if time.Now().After(deadline) {
			t.Fatalf("the receiver did not release the ring up to cursor %d within the watchdog", tail)
		}
		runtime.Gosched()
	}
}

func expectFrame(t *testing.T, h *recorder, from sdi.Rank, i uint64, payload []byte) {
	t.Helper()
	m := h.next(t)
	if m.from != from || len(m.header) < 8 || binary.LittleEndian.Uint64(m.header) != i || !bytes.Equal(m.payload, payload) {
		t.Fatalf("got frame from %d with header %x and %d payload bytes, want frame %d from %d with %d", m.from, m.header, len(m.payload), i, from, len(payload))
	}
}

// TestFastSlotsCarryAConversation: frames sent back and forth go through
// the fast slots, never the ring, up to the largest record a slot holds;
// one byte more goes through the ring.
func TestFastSlotsCarryAConversation(t *testing.T) {
	const hdr = 24 // the multidevice's short header
	largest := fastSlotSize - stampBytes - sdi.WireHeaderSize - hdr
	for _, tt := range []struct {
		payload int
		fast    bool
	}{{0, true}, {8, true}, {largest, true}, {largest + 1, false}} {
		t.Run(fmt.Sprintf("%dB", tt.payload), func(t *testing.T) {
			j := openJob(t, 2, jobOpts{})
			const rounds = 100
			for i := range uint64(rounds) {
				for _, d := range [][2]sdi.Rank{{0, 1}, {1, 0}} {
					mustSend(t, j.sds[d[0]], &sdi.Frame{Peer: d[1], Header: append(u64(i), make([]byte, hdr-8)...), Payload: pattern(i, tt.payload)})
					expectFrame(t, j.hs[d[1]], d[0], i, pattern(i, tt.payload))
				}
			}
			for _, d := range [][2]sdi.Rank{{0, 1}, {1, 0}} {
				fast, ring := counts(peerOf(t, j, d[0], d[1]))
				if tt.fast && (fast != rounds || ring != 0) || !tt.fast && (fast != 0 || ring == 0) {
					t.Errorf("%d -> %d: %d frames through the fast slots and %d ring bytes, want them all through the %s",
						d[0], d[1], fast, ring, map[bool]string{true: "slots", false: "ring"}[tt.fast])
				}
			}
		})
	}
}

// TestFastSlotsKeepOrderBehindARing: while the receiver holds the first
// fast frame, later frames go through the ring, large and small; they are
// delivered after the fast ones, in order, and once the conversation is a
// back and forth again the fast slots carry it.
func TestFastSlotsKeepOrderBehindARing(t *testing.T) {
	j := openJob(t, 2, jobOpts{})
	payload := func(i uint64) []byte {
		if i%5 == 4 {
			return pattern(i, 3000) // too large for a slot
		}
		return u64(i)
	}
	frame := func(i uint64) *sdi.Frame {
		return &sdi.Frame{Peer: 1, Header: append(u64(i), make([]byte, 16)...), Payload: payload(i)}
	}
	j.hs[1].gate.Lock() // the receiver blocks in its first Deliver
	const burst = 40
	for i := range uint64(burst) {
		mustSend(t, j.sds[0], frame(i))
	}
	fast, ring := counts(peerOf(t, j, 0, 1))
	j.hs[1].gate.Unlock()
	if fast != 2 || ring == 0 {
		t.Fatalf("a burst behind a held receiver: %d fast frames and %d ring bytes, want 2 and some", fast, ring)
	}
	for i := range uint64(burst) {
		expectFrame(t, j.hs[1], 0, i, payload(i))
	}
	// A conversation of small frames again: within fastRecheck sends the
	// sender sees the ring empty and goes back to the slots.
	for i := uint64(burst); i < burst+3*fastRecheck; i++ {
		mustSend(t, j.sds[0], small(1, i))
		expectFrame(t, j.hs[1], 0, i, u64(i))
		released(t, peerOf(t, j, 0, 1))
	}
	if again, _ := counts(peerOf(t, j, 0, 1)); again <= fast+fastRecheck {
		t.Fatalf("after the burst only %d more frames went through the fast slots", again-fast)
	}
}

// TestCorruptFastSlot writes into the fast slots and the ring what a buggy
// or hostile sender could: rank 1 reports rank 0 down with ErrBadFrame and
// delivers nothing of it.
func TestCorruptFastSlot(t *testing.T) {
	tests := []struct {
		name  string
		write func(p *peer)
	}{
		{"a descriptor in a slot", func(p *peer) {
			k := p.fastSent
			putFlagged(p.ring.fast[k%fastSlots], k*fastSlotSize, 0, flagDesc, []byte("h"), make([]byte, descBytes))
		}},
		{"garbage in a slot", func(p *peer) {
			k := p.fastSent
			slot := p.ring.fast[k%fastSlots]
			copy(slot[stampBytes:], "\xde\xad\xbe\xef garbage")
			stamp(slot, k*fastSlotSize)
		}},
		{"a fast count in a slot", func(p *peer) {
			k := p.fastSent
			putFlagged(p.ring.fast[k%fastSlots], k*fastSlotSize, 0, fastBits(1), []byte("h"), []byte("x"))
		}},
		{"a ring record after fast frames never sent", func(p *peer) {
			p.tail = putFlagged(p.ring.data, p.tail, 0, fastBits(p.fastSent+1), []byte("h"), []byte("x"))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := openJob(t, 2, jobOpts{})
			for i := range uint64(3) { // some fast frames first
				mustSend(t, j.sds[0], small(1, i))
				expectFrame(t, j.hs[1], 0, i, u64(i))
			}
			p := peerOf(t, j, 0, 1)
			p.mu.Lock()
			tt.write(p)
			p.wake()
			p.mu.Unlock()
			expectRejected(t, j, tt.name)
			if _, err := j.sds[1].Send(&sdi.Frame{Peer: 0}); !errors.Is(err, sdi.ErrBadFrame) {
				t.Errorf("Send to the corrupt peer = %v, want ErrBadFrame", err)
			}
		})
	}
}
