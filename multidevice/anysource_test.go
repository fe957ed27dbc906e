package multidevice

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/conntable"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// anyJob: ranks 0..2 talk over the matching subdevice "tm"; rank 3 reaches
// everybody over the loopback "loop". Rank 0's ANY_SOURCE receives are
// therefore duplicated into tm and its own queue.
func anyJob(t testing.TB) []*Device {
	tm := sditest.NewMatchFabric()
	loop := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: smallCaps})
	return openJob(t, jobSpec{n: 4, subs: []string{"tm", "loop"}, tableOf: anyTables,
		factories: map[string]sdi.Factory{"tm": tm.New, "loop": loop.New}})
}

// anyTables is anyJob's connection table of rank r.
func anyTables(r int) *conntable.Table {
	route := func(sd string) []conntable.Route { return []conntable.Route{{SubDevice: sd}} }
	t := &conntable.Table{Version: conntable.Version}
	if r == 3 {
		t.Peers = []conntable.Entry{{To: "*", Routes: map[string][]conntable.Route{"*": route("loop")}}}
	} else {
		t.Peers = []conntable.Entry{
			{To: "rank:3", Routes: map[string][]conntable.Route{"*": route("loop")}},
			{To: "*", Routes: map[string][]conntable.Route{"*": route("tm")}},
		}
	}
	return t
}

func sendNumbered(t *testing.T, d *Device, dst, count int, wg *sync.WaitGroup) {
	wg.Go(func() {
		var reqs []*Request
		for i := range count {
			msg := make([]byte, 8+i%300)
			binary.LittleEndian.PutUint64(msg, uint64(i))
			r, err := d.Isend(msg, dst, i%3, 2, i%7 == 0)
			if err != nil {
				t.Error(err)
				return
			}
			reqs = append(reqs, r)
		}
		waitAll(t, reqs)
	})
}

// TestAnySourceDuplicated: ANY_SOURCE receives across a matching subdevice
// and the multidevice's own queue get every message exactly once, in each
// sender's order.
func TestAnySourceDuplicated(t *testing.T) {
	devs := anyJob(t)
	const per = 400
	var wg sync.WaitGroup
	for s := 1; s <= 3; s++ {
		sendNumbered(t, devs[s], 0, per, &wg)
	}
	next := map[int]uint64{}
	buf := make([]byte, 512)
	for range 3 * per {
		st, err := wait(t, must(t)(devs[0].Irecv(buf, AnySource, AnyTag, 2)))
		if err != nil {
			t.Fatal(err)
		}
		if seq := binary.LittleEndian.Uint64(buf); seq != next[st.Source] {
			t.Fatalf("rank %d: got message %d, want %d", st.Source, seq, next[st.Source])
		}
		next[st.Source]++
	}
	wg.Wait()
	for s := 1; s <= 3; s++ {
		if next[s] != per {
			t.Errorf("rank %d: received %d of %d", s, next[s], per)
		}
	}
	if devs[0].subs[devs[0].matchSub[1]].name != "tm" {
		t.Fatal("rank 1 is not routed over the matching subdevice; the test proves nothing")
	}
}

// TestAnySourceCancelRace cancels half the ANY_SOURCE receives while
// messages arrive on both paths. Every message must land exactly once, in
// a receive that was not cancelled or in a later drain, and no cancelled
// receive's buffer may be written.
func TestAnySourceCancelRace(t *testing.T) {
	devs := anyJob(t)
	const per = 300
	var wg sync.WaitGroup
	for s := 1; s <= 3; s++ {
		sendNumbered(t, devs[s], 0, per, &wg)
	}
	type posted struct {
		r   *Request
		buf []byte
	}
	toCancel := make(chan *Request, 64)
	var cwg sync.WaitGroup
	cwg.Go(func() {
		for r := range toCancel {
			devs[0].Cancel(r)
		}
	})
	got := map[[2]uint64]bool{}
	record := func(p posted) {
		t.Helper()
		st, err := wait(t, p.r)
		if st.Cancelled {
			if !errors.Is(err, ErrCanceled) {
				t.Fatalf("cancelled receive returned %v", err)
			}
			for _, b := range p.buf {
				if b != 0 {
					t.Fatal("a cancelled receive's buffer was written: the claim did not hold")
				}
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		key := [2]uint64{uint64(st.Source), binary.LittleEndian.Uint64(p.buf)}
		if got[key] {
			t.Fatalf("message %v delivered twice", key)
		}
		got[key] = true
	}
	post := func() posted {
		p := posted{buf: make([]byte, 512)}
		p.r = must(t)(devs[0].Irecv(p.buf, AnySource, AnyTag, 2))
		return p
	}
	// Each round posts a receive that is cancelled concurrently and one that
	// is kept. The kept one is waited for only while some message is still
	// unaccounted for, so the test never waits for a message a racing
	// receive already took.
	for round := 0; len(got) < 3*per; round++ {
		if round > 10*per {
			t.Fatalf("received %d of %d messages after %d rounds", len(got), 3*per, round)
		}
		c := post()
		toCancel <- c.r
		k := post()
		record(c)
		if len(got) == 3*per {
			devs[0].Cancel(k.r)
		}
		record(k)
	}
	close(toCancel)
	cwg.Wait()
	wg.Wait()
	if len(got) != 3*per {
		t.Fatalf("received %d distinct messages, want %d", len(got), 3*per)
	}
}

// TestSpecificSourceOverMatcher: a named-source receive goes to the
// subdevice carrying that peer, and Iprobe finds messages queued there.
func TestSpecificSourceOverMatcher(t *testing.T) {
	devs := anyJob(t)
	must(t)(devs[1].Isend([]byte("hello"), 0, 4, 2, false))
	var st Status
	for {
		var ok bool
		st, ok, _ = devs[0].Iprobe(1, 4, 2)
		if ok {
			break
		}
	}
	if st.Source != 1 || st.Count != 5 {
		t.Fatalf("probe: %+v", st)
	}
	buf := make([]byte, 5)
	if st, err := wait(t, must(t)(devs[0].Irecv(buf, 1, 4, 2))); err != nil || string(buf) != "hello" || st.Source != 1 {
		t.Fatalf("receive: %+v %v %q", st, err, buf)
	}
	r := must(t)(devs[0].Irecv(buf, 2, 4, 2))
	devs[0].Cancel(r)
	if st, err := wait(t, r); !st.Cancelled || !errors.Is(err, ErrCanceled) {
		t.Fatalf("cancel at the matching subdevice: %+v %v", st, err)
	}
}

// TestImprobeMatchingSubDevice: a matched probe takes messages from the
// multidevice's own queue, and says plainly that it cannot take one a
// matching subdevice holds.
func TestImprobeMatchingSubDevice(t *testing.T) {
	devs := anyJob(t)
	must(t)(devs[3].Isend([]byte("loop"), 0, 1, 0, false)) // over loop: queued here
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(time.Millisecond) {
		m, st, ok, err := devs[0].Improbe(AnySource, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			buf := make([]byte, 4)
			if st.Source != 3 || devs[0].MrecvRequest(new(Request), m, buf) != nil {
				t.Fatalf("matched probe of rank 3's message: %+v", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("rank 3's message never arrived")
		}
	}
	must(t)(devs[1].Isend([]byte("tm"), 0, 2, 0, false)) // held by tm
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(time.Millisecond) {
		_, _, ok, err := devs[0].Improbe(1, 2, 0)
		if errors.Is(err, errors.ErrUnsupported) && strings.Contains(err.Error(), `"tm"`) {
			break
		}
		if ok || err != nil || time.Now().After(deadline) {
			t.Fatalf("matched probe of a message tm holds: %v %v, want errors.ErrUnsupported naming tm", ok, err)
		}
	}
	// The message is still there for a plain receive.
	buf := make([]byte, 2)
	if _, err := wait(t, must(t)(devs[0].Irecv(buf, 1, 2, 0))); err != nil || string(buf) != "tm" {
		t.Fatalf("receive of the message tm holds: %q %v", buf, err)
	}
}

// TestReuseRecvOverMatching: a receive the caller owns, from one source
// over a matching subdevice, may be reused once it completed, as over any
// other: rounds after the first were refused as still in use.
func TestReuseRecvOverMatching(t *testing.T) {
	devs := anyJob(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var r Request
	buf := make([]byte, 8)
	for round := range 3 {
		if err := devs[0].IrecvRequest(&r, buf, 1, 5, 2); err != nil {
			t.Fatalf("round %d: IrecvRequest: %v", round, err)
		}
		s, err := devs[1].Isend([]byte{byte(round), 2, 3, 4, 5, 6, 7, 8}, 0, 5, 2, false)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if buf[0] != byte(round) {
			t.Fatalf("round %d: got %v", round, buf)
		}
		if _, err := s.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
