package multidevice

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hpc-multidevice/multidevice/conntable"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// mixedTable sends messages up to 1 KiB over "fast" and larger ones over
// "slow", so one peer's messages travel on two subdevices at once.
func mixedTable() *conntable.Table {
	return &conntable.Table{
		Version: conntable.Version,
		Classes: []conntable.Class{{Name: "small", MaxBytes: 1024}, {Name: "large"}},
		Peers: []conntable.Entry{{To: conntable.SelectAll, Routes: map[string][]conntable.Route{
			"small": {{SubDevice: "fast"}},
			"large": {{SubDevice: "slow"}},
		}}},
	}
}

func mixedJob(t testing.TB, n int) []*Device {
	fast := sditest.NewFabric(sditest.LoopbackOptions{Name: "fast", Caps: sdi.Caps{MaxHeader: 128, MaxEager: 512, MaxFrame: 4096, Reach: sdi.ReachNetwork, Flags: sdi.FlagReliable | sdi.FlagOrdered, Exclusivity: 2}})
	slow := sditest.NewFabric(sditest.LoopbackOptions{Name: "slow", Caps: sdi.Caps{MaxHeader: 128, MaxEager: 2048, MaxFrame: 2048, Reach: sdi.ReachNetwork, Flags: sdi.FlagReliable | sdi.FlagOrdered, Exclusivity: 1}, QueueLimit: 8})
	return openJob(t, jobSpec{n: n, subs: []string{"fast", "slow"}, table: mixedTable(),
		factories: map[string]sdi.Factory{"fast": fast.New, "slow": slow.New}})
}

// TestOrderUnderMixedRoutes: several senders, random sizes (eager and
// rendezvous on both subdevices) and random tags; the receiver takes
// everything with ANY_SOURCE/ANY_TAG or per-source receives, and every
// message must arrive in its sender's order.
func TestOrderUnderMixedRoutes(t *testing.T) {
	const n, perSender = 4, 300
	for _, mode := range []string{"any-source", "per-source"} {
		t.Run(mode, func(t *testing.T) {
			devs := mixedJob(t, n)
			var wg sync.WaitGroup
			for s := 1; s < n; s++ {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(s), 42))
					var reqs []*Request
					for i := range perSender {
						size := 8 + rng.IntN(6000)
						msg := pattern(size, i)
						binary.LittleEndian.PutUint64(msg, uint64(i))
						r, err := devs[s].Isend(msg, 0, rng.IntN(4), 2, rng.IntN(10) == 0)
						if err != nil {
							t.Error(err)
							return
						}
						reqs = append(reqs, r)
					}
					waitAll(t, reqs)
				})
			}
			next := make([]uint64, n)
			check := func(st Status, err error, buf []byte) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
				seq := binary.LittleEndian.Uint64(buf)
				if seq != next[st.Source] {
					t.Fatalf("from rank %d got message %d, want %d: order broken", st.Source, seq, next[st.Source])
				}
				want := pattern(st.Count, int(seq))
				binary.LittleEndian.PutUint64(want, seq)
				if string(buf[:st.Count]) != string(want) {
					t.Fatalf("message %d from rank %d corrupted", seq, st.Source)
				}
				next[st.Source]++
			}
			buf := make([]byte, 8192)
			if mode == "any-source" {
				for range (n - 1) * perSender {
					st, err := wait(t, must(t)(devs[0].Irecv(buf, AnySource, AnyTag, 2)))
					check(st, err, buf)
				}
			} else {
				// Interleave sources; each receive names one.
				for i := range (n - 1) * perSender {
					src := 1 + i%(n-1)
					st, err := wait(t, must(t)(devs[0].Irecv(buf, src, AnyTag, 2)))
					check(st, err, buf)
				}
			}
			wg.Wait()
		})
	}
}

// TestBlockingSendBacksUp: blocking eager Sends, each after an Isend
// still in flight, to a receiver that is not receiving yet, over a
// subdevice that keeps frames until delivery and refuses a second one in
// flight (ErrWouldBlock); frames without payload it completes at once.
// Every Send returns, and the messages arrive complete and in order.
func TestBlockingSendBacksUp(t *testing.T) {
	const count = 200
	// Rank 0 delivers slowly, so one frame in flight fills the queue.
	devs, _ := openSites(t, siteJob{sites: []int{0, 0}, queueLimit: 1, slowRank: 0, slow: 50 * time.Microsecond})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	size := func(i int) int { return []int{0, 8, 300, 512}[i%4] }
	sent := make(chan error, 1)
	go func() {
		var reqs []*Request
		for i := range count {
			var err error
			if i%2 == 0 { // a frame in flight that the next Send finds
				var r *Request
				r, err = devs[1].Isend(pattern(size(i), i), 0, i%3, 5, false)
				reqs = append(reqs, r)
			} else {
				err = devs[1].Send(ctx, pattern(size(i), i), 0, i%3, 5, false)
			}
			if err != nil {
				sent <- fmt.Errorf("send %d: %w", i, err)
				return
			}
		}
		for _, r := range reqs {
			if _, err := r.Wait(ctx); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	time.Sleep(20 * time.Millisecond) // let the sender run into the queue limit
	buf := make([]byte, 1024)
	for i := range count {
		st, err := devs[0].Recv(ctx, buf, 1, AnyTag, 5)
		if err != nil {
			t.Fatalf("receive %d: %v", i, err)
		}
		if st.Tag != i%3 || st.Count != size(i) || string(buf[:st.Count]) != string(pattern(size(i), i)) {
			t.Fatalf("receive %d: status %+v, or the data differs: order or content broken", i, st)
		}
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
}

// seqWatch wraps a subdevice and checks that the matchable frames it
// accepts for each peer carry consecutive sequence numbers: no frame
// overtakes one that waits in the outbox.
type seqWatch struct {
	sdi.SubDevice
	t    testing.TB
	mu   sync.Mutex
	next map[sdi.Rank]uint64
}

func (w *seqWatch) Send(f *sdi.Frame) (bool, error) {
	done, err := w.SubDevice.Send(f)
	if err != nil {
		return done, err
	}
	var seq uint64
	switch {
	case len(f.Header) == shortHeaderSize:
		seq = binary.LittleEndian.Uint64(f.Header[16:])
	case len(f.Header) == headerSize && (kind(f.Header[1]) == kindEager || kind(f.Header[1]) == kindRTS):
		seq = binary.LittleEndian.Uint64(f.Header[24:])
	default:
		return done, err // unsequenced system message
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if want := w.next[f.Peer]; seq != want {
		w.t.Errorf("frame with sequence number %d accepted for rank %d, want %d: it overtook a queued one", seq, f.Peer, want)
	}
	w.next[f.Peer] = seq + 1
	return done, err
}

// TestQueuedFramesAreNotOvertaken: a burst of nonblocking and blocking
// sends to a peer whose link takes one frame at a time. Those the link
// refuses wait in the outbox; the sends after them must queue behind
// them rather than slip into the link when it frees up, or the receiver
// holds them out of order, copied, until the gap closes.
func TestQueuedFramesAreNotOvertaken(t *testing.T) {
	fab := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", QueueLimit: 1})
	watch := func(l hclog.Logger) sdi.SubDevice {
		return &seqWatch{SubDevice: fab.New(l), t: t, next: map[sdi.Rank]uint64{}}
	}
	devs := openJob(t, jobSpec{n: 2, subs: []string{"loop"}, factories: map[string]sdi.Factory{"loop": watch}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const count = 400
	size := func(i int) int { return []int{8, 100, 3000, 9000}[i%4] } // eager and rendezvous
	sent := make(chan error, 1)
	go func() {
		var reqs []*Request
		for i := range count {
			if i%5 == 4 {
				if err := devs[1].Send(ctx, pattern(size(i), i), 0, 1, 3, false); err != nil {
					sent <- err
					return
				}
				continue
			}
			r, err := devs[1].Isend(pattern(size(i), i), 0, 1, 3, false)
			if err != nil {
				sent <- err
				return
			}
			reqs = append(reqs, r)
		}
		for _, r := range reqs {
			if _, err := r.Wait(ctx); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	buf := make([]byte, 9000)
	for i := range count {
		st, err := devs[0].Recv(ctx, buf, 1, 1, 3)
		if err != nil {
			t.Fatalf("receive %d: %v", i, err)
		}
		if st.Count != size(i) || string(buf[:st.Count]) != string(pattern(size(i), i)) {
			t.Fatalf("receive %d: %d bytes, or the data differs", i, st.Count)
		}
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
}
