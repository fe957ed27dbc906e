package shm

import (
	"bytes"
	"errors"
	"testing"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// TestCorruptRing scribbles on the ring that carries rank 0's frames into
// rank 1's segment, as a buggy or hostile process could, and checks that
// rank 1 reports rank 0 down with ErrBadFrame instead of panicking or
// reading outside the ring, stops talking to rank 0, and still serves rank 2.
func TestCorruptRing(t *testing.T) {
	// Every record is stamped: the receiver reads it. The sender's cursor
	// is not part of the protocol (the stamps are), so it has no case.
	tests := []struct {
		name  string
		write func(data []byte, tail uint64) uint64
	}{
		{"garbage bytes", func(d []byte, t uint64) uint64 {
			off := t & uint64(len(d)-1)
			copy(d[off+stampBytes:], "\xde\xad\xbe\xef garbage!!\x00\x01\x02")
			stamp(d, t)
			return t + recAlign
		}},
		{"payload length beyond MaxFrame", func(d []byte, t uint64) uint64 {
			return rawRecord(d, t, sdi.WireHeader{PayloadLen: 1<<32 - 1}, nil)
		}},
		{"header length beyond the limit", func(d []byte, t uint64) uint64 {
			return rawRecord(d, t, sdi.WireHeader{HeaderLen: maxHeader + 1}, nil)
		}},
		{"padding record with lengths", func(d []byte, t uint64) uint64 {
			return rawRecord(d, t, sdi.WireHeader{Flags: flagPad, PayloadLen: 4}, nil)
		}},
		{"unknown flags", func(d []byte, t uint64) uint64 {
			return rawRecord(d, t, sdi.WireHeader{Flags: 0x40}, nil)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := openJob(t, 3, jobOpts{config: []byte(`{"ring_bytes": 65536}`)})
			// Some honest traffic first, so the cursors are not at zero:
			// too large for a fast slot, so that it goes through the ring
			// and the records below follow no fast frame (fast.go).
			hello := pattern(1, 2*fastSlotSize)
			mustSend(t, j.sds[0], &sdi.Frame{Peer: 1, Payload: hello})
			if m := j.hs[1].next(t); !bytes.Equal(m.payload, hello) {
				t.Fatalf("got %q", m.payload)
			}
			scribble(t, j, 0, 1, tt.write)

			d := j.hs[1].nextDown(t)
			if d.peer != 0 || !errors.Is(d.err, sdi.ErrBadFrame) {
				t.Fatalf("PeerDown(%d, %v), want rank 0 with ErrBadFrame", d.peer, d.err)
			}
			t.Log(d.err)
			if _, err := j.sds[1].Send(&sdi.Frame{Peer: 0}); !errors.Is(err, sdi.ErrBadFrame) {
				t.Errorf("Send to the corrupt peer = %v, want ErrBadFrame", err)
			}
			mustSend(t, j.sds[2], &sdi.Frame{Peer: 1, Payload: []byte("still here")})
			if m := j.hs[1].next(t); m.from != 2 || string(m.payload) != "still here" {
				t.Fatalf("after corruption: got %q from %d", m.payload, m.from)
			}
		})
	}
}

// TestCorruptConsumerCursor breaks the cursor the sender reads back: the
// sender must refuse to write instead of overrunning unread data.
func TestCorruptConsumerCursor(t *testing.T) {
	j := openJob(t, 2, jobOpts{config: []byte(`{"ring_bytes": 65536}`)})
	rx := j.sds[1].(*device)
	j.hs[1].gate.Lock() // keep the receiver from moving head itself
	defer j.hs[1].gate.Unlock()
	payload := make([]byte, 8000)
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		_, err = j.sds[0].Send(&sdi.Frame{Peer: 1, Payload: payload})
	}
	if !errors.Is(err, sdi.ErrWouldBlock) {
		t.Fatalf("filling the ring ended with %v, want ErrWouldBlock", err)
	}
	scribble(t, j, 0, 1, func(_ []byte, tail uint64) uint64 {
		rx.inbound[0].head.Store(tail + 1<<20) // head beyond anything sent
		return tail
	})
	if _, err := j.sds[0].Send(&sdi.Frame{Peer: 1, Payload: payload}); !errors.Is(err, sdi.ErrPeerUnreachable) {
		t.Fatalf("Send with a corrupt consumer cursor = %v, want ErrPeerUnreachable", err)
	}
}
