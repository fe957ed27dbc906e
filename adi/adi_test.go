package adi_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/bootstrap"
	"github.com/hpc-multidevice/multidevice/conntable"
	"github.com/hpc-multidevice/multidevice/multidevice"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
	_ "github.com/hpc-multidevice/multidevice/subdevices/shm"
	_ "github.com/hpc-multidevice/multidevice/subdevices/tcp"
)

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// job starts n ranks in this process; each gets opts plus its bootstrap.
func job(t testing.TB, n int, opts ...adi.Option) []*adi.World {
	t.Helper()
	return jobOn(t, n, nil, opts...)
}

// jobOn is job with the ranks on the hosts hostOf names (nil: one host).
func jobOn(t testing.TB, n int, hostOf func(int) string, opts ...adi.Option) []*adi.World {
	t.Helper()
	return jobEach(t, n, hostOf, func(int) []adi.Option { return opts })
}

// jobEach is jobOn with options of each rank's own.
func jobEach(t testing.TB, n int, hostOf func(int) string, optsOf func(r int) []adi.Option) []*adi.World {
	t.Helper()
	boots, err := bootstrap.InProcess(n, hostOf)
	if err != nil {
		t.Fatal(err)
	}
	ws := make([]*adi.World, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			ws[r], errs[r] = adi.Init(ctxT(t), append([]adi.Option{adi.WithBootstrap(boots[r])}, optsOf(r)...)...)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("init rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for r, w := range ws {
			wg.Go(func() {
				if err := w.Finalize(context.Background()); err != nil {
					t.Errorf("finalize rank %d: %v", r, err)
				}
			})
		}
		wg.Wait()
	})
	return ws
}

// loopJob runs over an in-memory subdevice with a small eager limit, so
// rendezvous is exercised by modest sizes.
func loopJob(t testing.TB, n int) []*adi.Comm {
	ws, _ := loopWorlds(t, n)
	cs := make([]*adi.Comm, n)
	for i, w := range ws {
		cs[i] = w.Comm()
	}
	return cs
}

// loopWorlds is loopJob's job, with its fabric for tests that cut links.
func loopWorlds(t testing.TB, n int) ([]*adi.World, *sditest.Fabric) {
	return loopWorldsOn(t, n, nil)
}

// loopWorldsOn is loopWorlds with the ranks on the hosts hostOf names,
// all reaching each other over the loopback fabric, and opts.
func loopWorldsOn(t testing.TB, n int, hostOf func(int) string, opts ...adi.Option) ([]*adi.World, *sditest.Fabric) {
	return loopWorldsEach(t, n, hostOf, func(int) []adi.Option { return opts })
}

// loopWorldsEach is loopWorldsOn with options of each rank's own.
func loopWorldsEach(t testing.TB, n int, hostOf func(int) string, optsOf func(r int) []adi.Option) ([]*adi.World, *sditest.Fabric) {
	f := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: sdi.Caps{MaxHeader: 128, MaxEager: 512, MaxFrame: 4096, Reach: sdi.ReachNetwork, Flags: sdi.FlagReliable | sdi.FlagOrdered}})
	ws := jobEach(t, n, hostOf, func(r int) []adi.Option {
		return append([]adi.Option{adi.WithSubDevice("loop", f.New),
			adi.WithPlugins(&multidevice.PluginsConfig{SubDevices: []multidevice.SubDeviceSpec{{Name: "loop", Enabled: true}}}),
			adi.WithConnTable(&conntable.Table{Version: conntable.Version, Peers: []conntable.Entry{{To: conntable.SelectAll, Routes: map[string][]conntable.Route{conntable.AllClasses: {{SubDevice: "loop"}}}}}})}, optsOf(r)...)
	})
	return ws, f
}

func TestPointToPoint(t *testing.T) {
	cs := loopJob(t, 3)
	ctx := ctxT(t)
	for _, tc := range []struct {
		name     string
		size     int
		src, tag int // receive's source and tag (may be wildcards)
		bufLen   int
		wantErr  error
	}{
		{"eager exact", 100, 0, 5, 100, nil},
		{"rendezvous", 10000, 0, 5, 10000, nil},
		{"any source", 10, adi.AnySource, 5, 64, nil},
		{"any tag", 10, 0, adi.AnyTag, 64, nil},
		{"both wildcards rendezvous", 5000, adi.AnySource, adi.AnyTag, 8000, nil},
		{"truncated eager", 100, 0, 5, 10, adi.ErrTruncated},
		{"truncated rendezvous", 9000, 0, 5, 700, adi.ErrTruncated},
		{"zero bytes", 0, 0, 5, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := make([]byte, tc.size)
			for i := range msg {
				msg[i] = byte(i)
			}
			errc := make(chan error, 1)
			go func() { errc <- cs[0].Send(ctx, msg, 2, 5) }()
			buf := make([]byte, tc.bufLen)
			st, err := cs[2].Recv(ctx, buf, tc.src, tc.tag)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("recv error %v, want %v", err, tc.wantErr)
			}
			if err := <-errc; err != nil {
				t.Fatalf("send: %v", err)
			}
			want := min(tc.size, tc.bufLen)
			if st.Source != 0 || st.Tag != 5 || st.Count != want || !bytes.Equal(buf[:want], msg[:want]) {
				t.Fatalf("status %+v; payload ok=%v", st, bytes.Equal(buf[:want], msg[:want]))
			}
		})
	}
}

func TestNonblockingAndWaitAny(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	bufs := [][]byte{make([]byte, 8), make([]byte, 8)}
	r0 := must(cs[1].Irecv(bufs[0], 0, 1))
	r1 := must(cs[1].Irecv(bufs[1], 0, 2))
	if _, _, ok, _ := adi.TestAny(r0, r1); ok {
		t.Fatal("TestAny reported completion before anything was sent")
	}
	if err := cs[0].Send(ctx, []byte("two"), 1, 2); err != nil {
		t.Fatal(err)
	}
	i, st, err := adi.WaitAny(ctx, r0, r1)
	if err != nil || i != 1 || st.Tag != 2 || string(bufs[1][:st.Count]) != "two" {
		t.Fatalf("WaitAny: %d %+v %v", i, st, err)
	}
	s := must(cs[0].Isend([]byte("one"), 1, 1))
	sts, err := adi.WaitAll(ctx, r0, s)
	if err != nil || sts[0].Count != 3 {
		t.Fatalf("WaitAll: %+v %v", sts, err)
	}
	if i, _, _ := adi.WaitAny(ctx, nil, nil); i != -1 {
		t.Fatalf("WaitAny of nothing = %d", i)
	}
	// Nil entries (MPI_REQUEST_NULL) are skipped by WaitAll too.
	s = must(cs[0].Isend([]byte("three"), 1, 3))
	r3 := must(cs[1].Irecv(bufs[0], 0, 3))
	if sts, err := adi.WaitAll(ctx, nil, s, nil, r3); err != nil || sts[3].Count != 5 || sts[0] != (adi.Status{}) {
		t.Fatalf("WaitAll with nil entries: %+v %v", sts, err)
	}
	if _, err := adi.WaitAll(ctx, nil); err != nil {
		t.Fatalf("WaitAll of nil: %v", err)
	}
}

// TestWaitSomeTestAll: a loop over WaitSome that sets what it dealt with
// to nil receives every message once; TestAll reports completion only once
// all are done, and then every status.
func TestWaitSomeTestAll(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	const n = 6
	reqs := make([]*adi.Request, n)
	bufs := make([][]byte, n)
	for i := range reqs {
		bufs[i] = make([]byte, 2000) // past the eager limit for some
		reqs[i] = must(cs[1].Irecv(bufs[i], 0, i))
	}
	if idx, _, err := adi.TestSome(reqs...); len(idx) != 0 || err != nil {
		t.Fatalf("TestSome before anything was sent: %v %v", idx, err)
	}
	sts := make([]adi.Status, n)
	if ok, err := adi.TestAll(sts, reqs...); ok || err != nil {
		t.Fatalf("TestAll before anything was sent: %v %v", ok, err)
	}
	sent := make(chan struct{})
	defer func() { <-sent }()
	go func() {
		defer close(sent)
		for _, i := range []int{3, 0, 5, 1, 4, 2} {
			if err := cs[0].Send(ctx, pattern(0, i, 100*(i+1)), 1, i); err != nil {
				t.Error(err)
			}
		}
	}()
	left := append([]*adi.Request(nil), reqs...)
	seen := 0
	for seen < n {
		idx, got, err := adi.WaitSome(ctx, left...)
		if err != nil || len(idx) == 0 || len(got) != len(idx) {
			t.Fatalf("WaitSome: %v %v %v", idx, got, err)
		}
		for k, i := range idx {
			if got[k].Tag != i || !bytes.Equal(bufs[i][:got[k].Count], pattern(0, i, 100*(i+1))) {
				t.Errorf("request %d: status %+v or data wrong", i, got[k])
			}
			left[i] = nil
			seen++
		}
	}
	if idx, _, err := adi.WaitSome(ctx, left...); idx != nil || err != nil {
		t.Errorf("WaitSome of nothing: %v %v", idx, err)
	}
	if ok, err := adi.TestAll(sts, reqs...); !ok || err != nil {
		t.Fatalf("TestAll after all came: %v %v", ok, err)
	}
	for i, st := range sts {
		if st.Tag != i || st.Count != 100*(i+1) {
			t.Errorf("TestAll status %d: %+v", i, st)
		}
	}
	if _, err := adi.TestAll(make([]adi.Status, 1), reqs...); err == nil {
		t.Error("TestAll took one status for six requests")
	}
}

func must(r *adi.Request, err error) *adi.Request {
	if err != nil {
		panic(err)
	}
	return r
}

func TestProbeAndCancel(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	if _, ok, err := cs[1].Iprobe(adi.AnySource, adi.AnyTag); ok || err != nil {
		t.Fatalf("Iprobe on nothing: %v %v", ok, err)
	}
	pending := must(cs[1].Irecv(make([]byte, 4), 0, 99))
	pending.Cancel()
	if st, err := pending.Wait(ctx); !errors.Is(err, adi.ErrCanceled) || !st.Cancelled {
		t.Fatalf("cancelled receive: %+v %v", st, err)
	}
	// 3000 bytes go by rendezvous: a blocking Send would wait for the match.
	sr := must(cs[0].Isend(make([]byte, 3000), 1, 99))
	st, err := cs[1].Probe(ctx, adi.AnySource, 99)
	if err != nil || st.Source != 0 || st.Count != 3000 {
		t.Fatalf("Probe: %+v %v", st, err)
	}
	if st, err := cs[1].Recv(ctx, make([]byte, st.Count), st.Source, st.Tag); err != nil || st.Count != 3000 {
		t.Fatalf("receive after probe (the cancelled receive must not have taken it): %+v %v", st, err)
	}
	if _, err := sr.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := cs[1].Probe(short, 0, 98); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Probe past its deadline: %v", err)
	}
}

func TestSsendBlocksUntilMatched(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	for _, size := range []int{4, 5000} {
		r := must(cs[0].Issend(make([]byte, size), 1, 3))
		for {
			if _, ok, _ := cs[1].Iprobe(0, 3); ok {
				break
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(10 * time.Millisecond)
		if _, done, _ := r.Test(); done {
			t.Fatalf("size %d: Ssend completed before the receive was posted", size)
		}
		if _, err := cs[1].Recv(ctx, make([]byte, size), 0, 3); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestArgumentErrors(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"send to rank 2 of 2", cs[0].Send(ctx, nil, 2, 0), adi.ErrRank},
		{"send to -1", cs[0].Send(ctx, nil, -1, 0), adi.ErrRank},
		{"negative tag", cs[0].Send(ctx, nil, 1, -3), adi.ErrTag},
		{"AnyTag on send", cs[0].Send(ctx, nil, 1, adi.AnyTag), adi.ErrTag},
		{"receive from 7", func() error { _, err := cs[0].Irecv(nil, 7, 0); return err }(), adi.ErrRank},
		{"receive tag -5", func() error { _, err := cs[0].Irecv(nil, 1, -5); return err }(), adi.ErrTag},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
		}
	}
}

// TestDupSplitIsolation: messages on one communicator never match receives
// on another, even with identical ranks and tags; Split groups and orders
// ranks by color and key.
func TestDupSplitIsolation(t *testing.T) {
	const n = 4
	cs := loopJob(t, n)
	ctx := ctxT(t)
	dups := make([]*adi.Comm, n)
	splits := make([]*adi.Comm, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			var err error
			if dups[r], err = cs[r].Dup(ctx); err != nil {
				t.Error(err)
			}
			// Even ranks form one group, odd the other, in reverse order.
			color := r % 2
			if r == 3 {
				color = adi.Undefined
			}
			if splits[r], err = cs[r].Split(ctx, color, -r); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if splits[3] != nil {
		t.Fatal("a rank passing Undefined got a communicator")
	}
	if s := splits[0]; s.Size() != 2 || s.Rank() != 1 || splits[2].Rank() != 0 {
		t.Fatalf("split of even ranks: size %d, rank 0 -> %d, rank 2 -> %d", s.Size(), s.Rank(), splits[2].Rank())
	}
	if splits[1].Size() != 1 {
		t.Fatalf("split of odd ranks without 3: size %d", splits[1].Size())
	}
	// The same (rank, tag) on world, dup and split: each lands on its own
	// communicator even when the receives are posted in the other order.
	rw := must(cs[2].Irecv(make([]byte, 8), 0, 7))
	rd := must(dups[2].Irecv(make([]byte, 8), 0, 7))
	rs := must(splits[2].Irecv(make([]byte, 8), adi.AnySource, 7)) // split rank 1 is world rank 0
	for _, step := range []struct {
		c   *adi.Comm
		to  int
		msg string
	}{{splits[0], 0, "split"}, {dups[0], 2, "dup"}, {cs[0], 2, "world"}} {
		if err := step.c.Send(ctx, []byte(step.msg), step.to, 7); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []struct {
		r   *adi.Request
		msg string
		src int
	}{{rw, "world", 0}, {rd, "dup", 0}, {rs, "split", 1}} {
		st, err := want.r.Wait(ctx)
		if err != nil || st.Source != want.src || st.Count != len(want.msg) {
			t.Fatalf("%s: %+v %v", want.msg, st, err)
		}
	}
}

// TestOrderShmSmallTCPLarge: one peer's small messages go over shm and large
// ones over tcp; several senders with random sizes and tags; every receive
// is checked against its sender's order.
func TestOrderShmSmallTCPLarge(t *testing.T) {
	const n, per = 4, 200
	table := &conntable.Table{
		Version: conntable.Version,
		Classes: []conntable.Class{{Name: "small", MaxBytes: 4096}, {Name: "large"}},
		Peers: []conntable.Entry{{To: conntable.SelectAll, Routes: map[string][]conntable.Route{
			"small": {{SubDevice: "shm"}}, "large": {{SubDevice: "tcp"}}}}},
	}
	ws := job(t, n, adi.WithConnTable(table))
	ctx := ctxT(t)
	var wg sync.WaitGroup
	for s := 1; s < n; s++ {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(s), 7))
			c := ws[s].Comm()
			var reqs []*adi.Request
			for i := range per {
				size := 8 + rng.IntN(3*4096)
				if rng.IntN(4) == 0 {
					size = 8 + rng.IntN(300<<10)
				}
				msg := make([]byte, size)
				binary.LittleEndian.PutUint64(msg, uint64(i))
				msg[size-1] = byte(i)
				r, err := c.Isend(msg, 0, rng.IntN(5))
				if err != nil {
					t.Error(err)
					return
				}
				reqs = append(reqs, r)
			}
			if _, err := adi.WaitAll(ctx, reqs...); err != nil {
				t.Error(err)
			}
		})
	}
	next := make([]uint64, n)
	buf := make([]byte, 310<<10)
	for range (n - 1) * per {
		st, err := ws[0].Comm().Recv(ctx, buf, adi.AnySource, adi.AnyTag)
		if err != nil {
			t.Fatal(err)
		}
		seq := binary.LittleEndian.Uint64(buf)
		if seq != next[st.Source] || buf[st.Count-1] != byte(seq) {
			t.Fatalf("from rank %d: message %d, want %d", st.Source, seq, next[st.Source])
		}
		next[st.Source]++
	}
	wg.Wait()
	used := map[string]bool{}
	for _, w := range ws[1:] {
		for _, l := range w.Stats() {
			if l.Peer == 0 {
				used[l.SubDevice] = true
			}
		}
	}
	if !used["shm"] || !used["tcp"] {
		t.Fatalf("subdevices used toward rank 0: %v; the test needs both", used)
	}
}

func TestSingletonWorld(t *testing.T) {
	ctx := ctxT(t)
	w, err := adi.Init(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Finalize(ctx)
	c := w.Comm()
	if c.Rank() != 0 || c.Size() != 1 {
		t.Fatalf("singleton: rank %d size %d", c.Rank(), c.Size())
	}
	if err := c.Send(ctx, []byte("me"), 0, 1); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if st, err := c.Recv(ctx, buf, 0, 1); err != nil || string(buf) != "me" || st.Source != 0 {
		t.Fatalf("self message: %+v %v", st, err)
	}
}

func Example() {
	ctx := context.Background()
	w, err := adi.Init(ctx) // a world of one rank when not started by mdrun
	if err != nil {
		fmt.Println(err)
		return
	}
	defer w.Finalize(ctx)
	c := w.Comm()
	_ = c.Send(ctx, []byte("hello"), c.Rank(), 0)
	buf := make([]byte, 16)
	st, _ := c.Recv(ctx, buf, adi.AnySource, adi.AnyTag)
	fmt.Printf("%s from rank %d\n", buf[:st.Count], st.Source)
	// Output: hello from rank 0
}

// TestSplitHost: ranks on hosts a, b, a, c, b, a get the communicators of
// their hosts' ranks, in rank order, isolated from each other.
func TestSplitHost(t *testing.T) {
	hosts := []string{"a", "b", "a", "c", "b", "a"}
	ws, _ := loopWorldsOn(t, len(hosts), func(r int) string { return hosts[r] })
	cs := make([]*adi.Comm, len(ws))
	for i, w := range ws {
		cs[i] = w.Comm()
	}
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		h, err := c.SplitHost(ctx)
		if err != nil {
			return err
		}
		var want []int
		for r, name := range hosts {
			if name == hosts[c.Rank()] {
				want = append(want, r)
			}
		}
		if h.Size() != len(want) {
			return fmt.Errorf("host %s: %d ranks, want %v", hosts[c.Rank()], h.Size(), want)
		}
		for i, r := range want {
			if wr, _ := h.WorldRank(i); wr != r {
				return fmt.Errorf("host %s: rank %d is world rank %d, want %d", hosts[c.Rank()], i, wr, r)
			}
		}
		// Each host's ranks sum their world ranks among themselves.
		sum := []int64{int64(c.Rank())}
		if err := adi.Allreduce(ctx, h, sum, sum, adi.Sum); err != nil {
			return err
		}
		var wantSum int64
		for _, r := range want {
			wantSum += int64(r)
		}
		if sum[0] != wantSum {
			return fmt.Errorf("host %s: sum %d, want %d", hosts[c.Rank()], sum[0], wantSum)
		}
		return nil
	})
}

// TestSplitBadColor: a rank passing a color that is neither >= 0 nor
// Undefined gets an error, and the others learn of it (ErrMismatch)
// rather than wait for it; the communicator goes on working.
func TestSplitBadColor(t *testing.T) {
	const n = 3
	cs := loopJob(t, n)
	ctx := ctxT(t)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, c := range cs {
		wg.Go(func() {
			color := 0
			if r == 1 {
				color = adi.Undefined - 1
			}
			_, errs[r] = c.Split(ctx, color, 0)
		})
	}
	wg.Wait()
	for r, err := range errs {
		switch {
		case r == 1 && (err == nil || errors.Is(err, adi.ErrMismatch)):
			t.Errorf("rank 1, with the bad color: %v, want an error of its own", err)
		case r != 1 && !errors.Is(err, adi.ErrMismatch):
			t.Errorf("rank %d: %v, want ErrMismatch", r, err)
		}
	}
	for r, c := range cs {
		wg.Go(func() {
			if _, err := c.Split(ctx, r%2, 0); err != nil {
				t.Errorf("rank %d: split after the bad one: %v", r, err)
			}
		})
	}
	wg.Wait()
}

// TestSplitColorCannotSteerContext: a child's context id mixes in its
// color's index among the colors passed, not the color: this color made
// the same id as the parent's sixth Dup when the color went in as it
// was, and the Dup then saw the child's messages.
func TestSplitColorCannotSteerContext(t *testing.T) {
	var crafted int64 = 5369350149147204876
	if strconv.IntSize < 64 {
		t.Skip("the crafted color needs 64-bit ints")
	}
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	each(t, cs, func(c *adi.Comm) error {
		sp, err := c.Split(ctx, int(crafted), 0)
		if err != nil {
			return err
		}
		dups := make([]*adi.Comm, 8)
		for i := range dups {
			if dups[i], err = c.Dup(ctx); err != nil {
				return err
			}
		}
		if c.Rank() == 0 {
			return sp.Send(ctx, []byte("child"), 1, 5)
		}
		if _, err := sp.Probe(ctx, 0, 5); err != nil { // it has arrived
			return err
		}
		for i, d := range dups {
			if st, ok, err := d.Iprobe(adi.AnySource, adi.AnyTag); ok || err != nil {
				return fmt.Errorf("Dup %d after the Split sees a message of the Split's child: %+v, %v", i+1, st, err)
			}
		}
		_, err = sp.Recv(ctx, make([]byte, 8), 0, 5)
		return err
	})
}
