package shm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// TestParkedReadLetsOtherRingsGo has rank 0 send rank 2 large payloads by
// descriptor while a stand-in for rank 0's helping side takes a chunk of
// the read and sits on it, as a sender stopped mid-chunk (SIGSTOP, a
// debugger) would. The receiver must not wait for it with its rings held:
// a frame from rank 1 arrives meanwhile. Rank 0's frames, the large one
// and a small one sent after it, must wait: nothing of rank 0's is
// delivered, nor rank 0 reported down, while its process runs. Once the
// chunk is written the large frame arrives whole, then the small one.
// If the sender's process exits instead, rank 0 is reported down and its
// frames are never delivered.
func TestParkedReadLetsOtherRingsGo(t *testing.T) {
	const n = 64 * assistChunk // 4 MiB, MaxFrame: the stand-in has time to take a chunk
	tests := []struct {
		name  string
		exit  bool // the sender's process exits holding the chunk
		close bool // the receiver closes while the sender holds it
	}{
		{name: "sender resumes"},
		{name: "sender exits", exit: true},
		{name: "receiver closes", close: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			requireSingleCopy(t)
			if runtime.GOMAXPROCS(0) == 1 {
				// The stand-in would run only once the receiver let go
				// of the one processor, after its reading is done.
				t.Skip("the stand-in cannot take a chunk beside the receiver on one processor")
			}
			// Placed payloads, as the multidevice places rendezvous data:
			// a fresh place for each also slows the receiver's reads
			// (page faults), which gives the stand-in its chance.
			j := openJob(t, 3, jobOpts{config: []byte(`{"ring_bytes": 16777216}`),
				handler: func(_ int, rec *recorder) sdi.Handler { return &placeLog{recorder: rec} }})
			rx := j.sds[2].(*device)
			// Well past the patience the sender's process still runs:
			// that is no reason to give its place up.
			rx.assistPatience = 50 * time.Millisecond
			tx := j.sds[0].(*device)
			toRx := tx.peers[2].Load()
			// Rank 0's own device must not help: its receive owner,
			// which does, never gets the lock.
			tx.rxMu.Lock()
			defer tx.rxMu.Unlock()
			die := func() {}
			if tt.exit {
				// The receiver watches a process that runs until die,
				// standing for rank 0's (which is this one).
				var pr *peerProc
				pr, die = liveProc(t)
				pr.refs++ // the receiver's reference, which teardown releases
				old := rx.srcProc[0].Swap(pr)
				t.Cleanup(func() { _ = old.release() })
			}

			// Send large frames until the stand-in takes a chunk of one
			// (the receiver may take them all first).
			aw := toRx.ring.assist
			payload := pattern(1, n)
			k := -1
			for i := uint64(0); k < 0; i++ {
				if i == 100 {
					t.Fatal("the stand-in never got a chunk in 100 attempts")
				}
				epoch := aw.claim.Load() >> 32
				if _, err := j.sds[0].Send(&sdi.Frame{Peer: 2, Header: append([]byte("place"), u64(i)...), Payload: payload}); err != nil {
					t.Fatal(err)
				}
				for aw.claim.Load()>>32 == epoch {
				}
				for {
					w := aw.claim.Load()
					if uint32(w) >= uint32(chunks(n)) {
						break
					}
					if aw.claim.CompareAndSwap(w, w+1) {
						k = int(uint32(w))
						break
					}
				}
				if k < 0 {
					m := j.hs[2].next(t)
					if binary.LittleEndian.Uint64(m.header[5:]) != i || !bytes.Equal(m.payload, payload) {
						t.Fatalf("frame %d arrived as %x with %d bytes", i, m.header, len(m.payload))
					}
				}
			}
			// The sender goes on: it writes its chunk, counts it and
			// rings, as assistOne does. A test that fails before it
			// does so at cleanup, so that Close, which waits for the
			// chunk, does not hang it.
			var once sync.Once
			resume := func() {
				once.Do(func() {
					off := k * assistChunk
					if err := toRx.writeChunk(payload[off:off+assistChunk], aw.dst.Load()+uint64(off)); err != nil {
						t.Error(err)
					}
					aw.done.Add(1)
					toRx.mu.Lock()
					toRx.wake()
					toRx.mu.Unlock()
				})
			}
			if !tt.exit {
				t.Cleanup(resume)
			}
			mustSend(t, j.sds[0], &sdi.Frame{Peer: 2, Header: []byte("after")})

			// Meanwhile rank 1's frames go through.
			for i := range 3 {
				mustSend(t, j.sds[1], &sdi.Frame{Peer: 2, Header: []byte{byte(i)}})
				if m := j.hs[2].next(t); m.from != 1 || !bytes.Equal(m.header, []byte{byte(i)}) {
					t.Fatalf("while rank 0's read waits: got frame %x from rank %d, want %x from rank 1", m.header, m.from, []byte{byte(i)})
				}
			}
			// Long enough for the receiver to have checked on rank 0
			// (checkPeers, every sleep timeout).
			time.Sleep(2 * sleepTimeout)
			select {
			case m := <-j.hs[2].msgs:
				t.Fatalf("frame %x from rank %d delivered while rank 0's read waits", m.header, m.from)
			case d := <-j.hs[2].down:
				t.Fatalf("rank %d reported down while its process runs: %v", d.peer, d.err)
			default:
			}

			if tt.exit {
				die()
				if d := j.hs[2].nextDown(t); d.peer != 0 || !errors.Is(d.err, sdi.ErrPeerUnreachable) {
					t.Fatalf("PeerDown(%d, %v), want rank 0 unreachable", d.peer, d.err)
				}
				select {
				case m := <-j.hs[2].msgs:
					t.Fatalf("frame %x from rank %d delivered after its process exited holding a chunk", m.header, m.from)
				default:
				}
				return
			}
			if tt.close {
				// The multidevice hands places back once Close returned
				// nil: it must not before the chunk is in.
				ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
				defer cancel()
				if err := rx.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Close while the sender holds a chunk of a place: %v, want it to wait past its context", err)
				}
				resume()
				if err := rx.Close(t.Context()); err != nil {
					t.Fatalf("Close once the chunk is in: %v", err)
				}
				select {
				case m := <-j.hs[2].msgs:
					t.Fatalf("frame %x from rank %d delivered at Close", m.header, m.from)
				default:
				}
				return
			}
			resume()
			if m := j.hs[2].next(t); m.from != 0 || !bytes.Equal(m.payload, payload) {
				t.Fatalf("got frame %x of %d bytes from rank %d, want the large frame from rank 0 intact", m.header, len(m.payload), m.from)
			}
			if m := j.hs[2].next(t); m.from != 0 || string(m.header) != "after" {
				t.Fatalf("got frame %x from rank %d, want rank 0's small frame", m.header, m.from)
			}
		})
	}
}
