package multidevice

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/subdevices/shm"
)

// shmDevices opens n devices of this process over the shm subdevice.
func shmDevices(tb testing.TB, n int) []*Device {
	tb.Helper()
	return openJob(tb, jobSpec{n: n, subs: []string{"shm"}, factories: map[string]sdi.Factory{"shm": shm.New}})
}

// BenchmarkSendRecvOneGoroutine sends an 8-byte eager message from rank 0
// to rank 1 over shm and receives it, both on the calling goroutine, with
// the blocking Send and Recv: ns/op is what the multidevice and shm spend
// per message on both ends, without waiting for another core. shm's
// BenchmarkSendPollOneGoroutine is the subdevice alone.
func BenchmarkSendRecvOneGoroutine(b *testing.B) {
	ds := shmDevices(b, 2)
	ctx := context.Background()
	msg, buf := make([]byte, 8), make([]byte, 64)
	b.ReportAllocs()
	for b.Loop() {
		if err := ds[0].Send(ctx, msg, 1, 0, 0, false); err != nil {
			b.Fatal(err)
		}
		if _, err := ds[1].Recv(ctx, buf, 0, 0, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRecvPostedFirst posts the receive on rank 1 before rank 0
// sends, as a ping-pong's receiver does (its receive is posted while the
// message is on its way), and waits for it: the match happens at
// delivery, on the waiting goroutine.
func BenchmarkRecvPostedFirst(b *testing.B) {
	ds := shmDevices(b, 2)
	ctx := context.Background()
	msg, buf := make([]byte, 8), make([]byte, 64)
	var r Request
	b.ReportAllocs()
	for b.Loop() {
		if err := ds[1].IrecvRequest(&r, buf, 0, 0, 0); err != nil {
			b.Fatal(err)
		}
		if err := ds[0].Send(ctx, msg, 1, 0, 0, false); err != nil {
			b.Fatal(err)
		}
		if _, err := r.Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// TestLaneSends sends small messages to one peer from several goroutines
// at once, which take the peer's lane in turn (finding it held only when
// they meet: TestLaneHeld makes sure of that case), while Stats reads its
// counts: every message arrives, each goroutine's in order, and Stats
// counts each frame once. Run with -race, it checks that the lane's
// frame and counts pass from holder to holder.
func TestLaneSends(t *testing.T) {
	const senders, msgs, size = 4, 300, 8
	ds := shmDevices(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for g := range senders {
		wg.Go(func() {
			buf := make([]byte, size)
			for i := range msgs {
				binary.LittleEndian.PutUint32(buf, uint32(i))
				if err := ds[0].Send(ctx, buf, 1, g, 0, false); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	stop := make(chan struct{})
	statsDone := make(chan struct{})
	go func() { // Stats waits for a lane's holder and must not miss or double a frame
		defer close(statsDone)
		var last uint64
		for {
			select {
			case <-stop:
				return
			default:
			}
			f, _ := shmSent(ds[0], 1)
			if f < last {
				t.Errorf("Stats went back from %d frames to %d", last, f)
				return
			}
			last = f
		}
	}()
	next := make([]uint32, senders)
	buf := make([]byte, size)
	for range senders * msgs {
		st, err := ds[1].Recv(ctx, buf, 0, AnyTag, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := binary.LittleEndian.Uint32(buf); got != next[st.Tag] {
			t.Fatalf("sender %d: message %d arrived when %d was due", st.Tag, got, next[st.Tag])
		}
		next[st.Tag]++
	}
	wg.Wait()
	close(stop)
	<-statsDone
	if f, b := shmSent(ds[0], 1); f != senders*msgs || b != senders*msgs*size {
		t.Errorf("Stats: %d frames, %d bytes to rank 1; want %d, %d", f, b, senders*msgs, senders*msgs*size)
	}
}

// shmSent returns what d's Stats says shm carried to peer.
func shmSent(d *Device, peer int) (frames, bytes uint64) {
	for _, s := range d.Stats() {
		if s.Peer == peer && s.SubDevice == "shm" {
			return s.Frames, s.Bytes
		}
	}
	return 0, 0
}

// TestLaneHeld sends while the peer's lane is held, as by a concurrent
// sender, and again once it is free: the messages sent without the lane
// take their sequence numbers in turn with those sent with it, and Stats
// counts both kinds.
func TestLaneHeld(t *testing.T) {
	ds := shmDevices(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l := &ds[0].lanes[1]
	send := func(i int) {
		t.Helper()
		if err := ds[0].Send(ctx, []byte{byte(i)}, 1, 0, 0, false); err != nil {
			t.Fatal(err)
		}
	}
	send(0) // through the lane
	if _, ok := l.hold(0); !ok {
		t.Fatal("lane held with no sender")
	}
	send(1) // without
	send(2)
	l.release()
	send(3)
	buf := make([]byte, 8)
	for i := range 4 {
		st, err := ds[1].Recv(ctx, buf, 0, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if st.Count != 1 || buf[0] != byte(i) {
			t.Fatalf("message %d: got %d bytes, first %d", i, st.Count, buf[0])
		}
	}
	if f, b := shmSent(ds[0], 1); f != 4 || b != 4 {
		t.Errorf("Stats: %d frames, %d bytes to rank 1; want 4, 4", f, b)
	}
}

// TestLaneFrameOwnedByHolder: a sender that finds a peer's lane held
// touches nothing of the lane but its word: the holder may be setting
// the lane's frame meanwhile (as when the subdevice keeps the frame).
// Under -race a read of the frame by the other sender is reported.
func TestLaneFrameOwnedByHolder(t *testing.T) {
	ds := shmDevices(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l := &ds[0].lanes[1]
	if err := ds[0].Send(ctx, []byte{0}, 1, 0, 0, false); err != nil { // the lane now has a frame
		t.Fatal(err)
	}
	held, release, gone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() { // a holder, as sendNow is between hold and release
		defer close(gone)
		if _, ok := l.hold(0); !ok {
			t.Error("the lane is held already")
			close(held)
			return
		}
		close(held)
		l.of = nil // as sendNow does when the subdevice keeps the frame
		<-release
		l.release()
	}()
	<-held
	time.Sleep(20 * time.Millisecond) // no happens-before edge from the holder's write
	if err := ds[0].Send(ctx, []byte{1}, 1, 0, 0, false); err != nil {
		t.Fatal(err)
	}
	close(release)
	<-gone
	buf := make([]byte, 8)
	for i := range 2 {
		if _, err := ds[1].Recv(ctx, buf, 0, 0, 0); err != nil || buf[0] != byte(i) {
			t.Fatalf("message %d: %v, got %d", i, err, buf[0])
		}
	}
}

// TestArriveShort hands short-header eager messages to arriveShort as a
// subdevice would, with receives posted before: its common case takes a
// message for the oldest posted receive only if the receive matches it,
// holds it whole and the message is the next from its source; every
// other message takes the ordinary path (unexpected, truncated, out of
// order) and is received there, in sequence and by the right receive.
func TestArriveShort(t *testing.T) {
	type frame struct {
		from int32
		seq  uint64
		tag  int32
		cid  uint64
		data string
	}
	type recv struct {
		src, tag, n int
		cid         uint64
	}
	// got is what a receive completes with; later is what a receive posted
	// after the frames gets (unexpected messages), in that order.
	type got struct {
		data     string
		src, tag int
		trunc    bool
	}
	cases := []struct {
		name   string
		posted []recv
		frames []frame
		got    []got
		later  []recv
		lgot   []got
	}{
		{name: "match", posted: []recv{{0, 1, 8, 5}}, frames: []frame{{0, 0, 1, 5, "a"}}, got: []got{{"a", 0, 1, false}}},
		{name: "any source and tag", posted: []recv{{AnySource, AnyTag, 8, 5}}, frames: []frame{{2, 0, 3, 5, "z"}}, got: []got{{"z", 2, 3, false}}},
		{name: "other tag first", posted: []recv{{0, 1, 8, 5}}, frames: []frame{{0, 0, 2, 5, "x"}, {0, 1, 1, 5, "y"}},
			got: []got{{"y", 0, 1, false}}, later: []recv{{0, 2, 8, 5}}, lgot: []got{{"x", 0, 2, false}}},
		{name: "other context first", posted: []recv{{0, 1, 8, 5}}, frames: []frame{{0, 0, 1, 6, "x"}, {0, 1, 1, 5, "y"}},
			got: []got{{"y", 0, 1, false}}, later: []recv{{0, 1, 8, 6}}, lgot: []got{{"x", 0, 1, false}}},
		{name: "other source first", posted: []recv{{0, 1, 8, 5}}, frames: []frame{{2, 0, 1, 5, "x"}, {0, 0, 1, 5, "y"}},
			got: []got{{"y", 0, 1, false}}, later: []recv{{2, 1, 8, 5}}, lgot: []got{{"x", 2, 1, false}}},
		{name: "too long", posted: []recv{{0, 1, 1, 5}}, frames: []frame{{0, 0, 1, 5, "xy"}}, got: []got{{"x", 0, 1, true}}},
		{name: "out of order", posted: []recv{{0, AnyTag, 8, 5}, {0, AnyTag, 8, 5}}, frames: []frame{{0, 1, 1, 5, "b"}, {0, 0, 1, 5, "a"}},
			got: []got{{"a", 0, 1, false}, {"b", 0, 1, false}}},
		{name: "next in order", posted: []recv{{0, 1, 8, 5}, {0, 1, 8, 5}}, frames: []frame{{0, 0, 1, 5, "a"}, {0, 1, 1, 5, "b"}},
			got: []got{{"a", 0, 1, false}, {"b", 0, 1, false}}},
		{name: "posted after", frames: []frame{{0, 0, 4, 5, "u"}}, later: []recv{{0, 4, 8, 5}}, lgot: []got{{"u", 0, 4, false}}},
	}
	check := func(t *testing.T, i int, r *Request, buf []byte, want got) {
		t.Helper()
		st, done, err := r.Test()
		if !done {
			t.Fatalf("receive %d still pending, want %q", i, want.data)
		}
		if errors.Is(err, ErrTruncated) != want.trunc || (err != nil && !want.trunc) {
			t.Fatalf("receive %d: err %v, truncated want %v", i, err, want.trunc)
		}
		if string(buf[:st.Count]) != want.data || st.Source != want.src || st.Tag != want.tag {
			t.Fatalf("receive %d: %q from %d tag %d, want %q from %d tag %d", i, buf[:st.Count], st.Source, st.Tag, want.data, want.src, want.tag)
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := shmDevices(t, 3)[1]
			bufs := make([][]byte, len(tc.posted))
			reqs := make([]*Request, len(tc.posted))
			for i, p := range tc.posted {
				bufs[i] = make([]byte, p.n)
				reqs[i] = must(t)(d.Irecv(bufs[i], p.src, p.tag, p.cid))
			}
			for _, f := range tc.frames {
				hb := make([]byte, shortHeaderSize)
				putShort(hb, f.tag, f.cid, f.seq)
				if err := d.arriveShort(f.from, hb, []byte(f.data)); err != nil {
					t.Fatal(err)
				}
			}
			for i, r := range reqs {
				check(t, i, r, bufs[i], tc.got[i])
			}
			for i, p := range tc.later {
				buf := make([]byte, p.n)
				check(t, i, must(t)(d.Irecv(buf, p.src, p.tag, p.cid)), buf, tc.lgot[i])
			}
		})
	}
}

// TestPlaceAfterEarlyArrival: once a message that came early from a
// source has been matched, the next message in order from it is placed
// again (its out-of-order map stays, empty).
func TestPlaceAfterEarlyArrival(t *testing.T) {
	d := shmDevices(t, 3)[1]
	for _, seq := range []uint64{1, 0} { // 1 early, then 0 drains it
		hb := make([]byte, shortHeaderSize)
		putShort(hb, 1, 5, seq)
		if err := d.arriveShort(0, hb, []byte("a")); err != nil {
			t.Fatal(err)
		}
	}
	must(t)(d.Irecv(make([]byte, 8), 0, 2, 5))
	hb := make([]byte, shortHeaderSize)
	putShort(hb, 2, 5, 2)
	if d.placeEager(0, 0, hb, 1) == nil {
		t.Fatal("the next message in order, nothing early left, was not placed")
	}
}
