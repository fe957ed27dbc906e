package multidevice

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/bootstrap"
	"github.com/hpc-multidevice/multidevice/conntable"
	"github.com/hpc-multidevice/multidevice/mdconfig"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// cutNet is a loopback fabric split into sites: a rank of one site cannot
// connect to a rank of another (Connect fails with sdi.ErrPeerUnreachable,
// as tcp's does for two clusters on the same private range), while ranks
// of site -1 (gateways, relays) reach everybody. A slow rank's Deliver
// pauses before every frame, like a destination that drains slowly.
type cutNet struct {
	fab      *sditest.Fabric
	cut      func(a, b int) bool
	slowRank int
	slow     time.Duration
}

func (n *cutNet) New(log hclog.Logger) sdi.SubDevice {
	return &cutSub{SubDevice: n.fab.New(log), net: n}
}

type cutSub struct {
	sdi.SubDevice
	net  *cutNet
	rank sdi.Rank
}

func (c *cutSub) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	c.rank = p.Rank
	if c.net.slow > 0 && int(p.Rank) == c.net.slowRank {
		p.Handler = slowHandler{Handler: p.Handler, pause: c.net.slow}
	}
	return c.SubDevice.Open(ctx, p)
}

func (c *cutSub) Connect(ctx context.Context, peer sdi.Rank, addr []byte) error {
	if c.net.cut(int(c.rank), int(peer)) {
		return fmt.Errorf("cut: rank %d to %d: %w", c.rank, peer, sdi.ErrPeerUnreachable)
	}
	return c.SubDevice.Connect(ctx, peer, addr)
}

type slowHandler struct {
	sdi.Handler
	pause time.Duration
}

func (h slowHandler) Deliver(from sdi.Rank, hdr, payload []byte) {
	time.Sleep(h.pause)
	h.Handler.Deliver(from, hdr, payload)
}

// siteCut separates ranks of different non-negative sites.
func siteCut(sites []int) func(a, b int) bool {
	return func(a, b int) bool { return sites[a] >= 0 && sites[b] >= 0 && sites[a] != sites[b] }
}

// fwdCaps keep blocks small, so that messages of a few KiB are several
// blocks.
var fwdCaps = sdi.Caps{MaxHeader: 128, MaxEager: 512, MaxFrame: 4096, Reach: sdi.ReachNetwork, Flags: sdi.FlagReliable | sdi.FlagOrdered, Exclusivity: 1}

type siteJob struct {
	sites      []int // per rank; -1 reaches every site
	relays     int   // the last ranks are dedicated relays
	forward    ForwardOptions
	queueLimit int
	slowRank   int
	slow       time.Duration
	tableOf    func(rank int) *conntable.Table
	maxFrame   int // the subdevice's largest frame; 0: fwdCaps's
}

func openSites(t testing.TB, sj siteJob) ([]*Device, *cutNet) {
	caps := fwdCaps
	if sj.maxFrame > 0 {
		caps.MaxFrame = sj.maxFrame
	}
	net := &cutNet{fab: sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: caps, QueueLimit: sj.queueLimit}),
		cut: siteCut(sj.sites), slowRank: sj.slowRank, slow: sj.slow}
	devs := openJob(t, jobSpec{n: len(sj.sites), subs: []string{"loop"}, factories: map[string]sdi.Factory{"loop": net.New},
		relays: sj.relays, forward: sj.forward, tableOf: sj.tableOf})
	return devs, net
}

// numbered returns message i of the stream from src to dst: its header is
// (i, src), the rest a pattern both sides can recompute.
func numbered(size, src, i int) []byte {
	m := pattern(size, src*1_000_003+i)
	if size >= 16 {
		binary.LittleEndian.PutUint64(m, uint64(i))
		binary.LittleEndian.PutUint64(m[8:], uint64(src))
	}
	return m
}

// TestForwardAllPairs: two sites that cannot reach each other and one
// application rank that reaches both. Every rank sends every other eager,
// rendezvous and multi-block messages, some synchronous; each arrives
// intact, in order, through the gateway where there is no direct link.
func TestForwardAllPairs(t *testing.T) {
	sites := []int{0, 0, 1, 1, -1}
	devs, _ := openSites(t, siteJob{sites: sites, forward: ForwardOptions{BlockSize: 1000, Window: 8000}})
	n := len(devs)
	if _, gws, _ := devs[0].Path(2, 20000); !slices.Equal(gws, []int{4}) {
		t.Fatalf("rank 0 reaches rank 2 through %v, want [4]", gws)
	}
	if _, gws, _ := devs[0].Path(1, 20000); len(gws) != 0 {
		t.Fatalf("rank 0 reaches rank 1 (same site) through %v, want a direct link", gws)
	}
	sizes := []int{0, 100, 511, 3000, 20000, 70000}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for me := range n {
		wg.Go(func() {
			if err := allPairs(ctx, devs[me], sizes, 7, func(k int) bool { return k%2 == 1 }); err != nil {
				t.Errorf("rank %d: %v", me, err)
			}
		})
	}
	wg.Wait()
	// The receivers are done once the gateway's last frames are delivered;
	// the gateway's subdevice reports those sends complete just after, and
	// credits for the last blocks may still be passing through.
	st := devs[4].ForwardStats()
	for deadline := time.Now().Add(5 * time.Second); st.Held != 0 && time.Now().Before(deadline); st = devs[4].ForwardStats() {
		time.Sleep(time.Millisecond)
	}
	if st.Forwarded == 0 || st.Held != 0 {
		t.Errorf("gateway stats %+v: want frames forwarded and nothing held", st)
	}
	for _, r := range []int{0, 1, 2, 3} {
		if st := devs[r].ForwardStats(); st.Forwarded != 0 {
			t.Errorf("rank %d forwarded %d frames; only rank 4 is a gateway", r, st.Forwarded)
		}
	}
}

// allPairs sends every other rank one message of each size (tag = index
// into sizes, synchronous where sync says), receives theirs, and checks
// each status and payload.
func allPairs(ctx context.Context, d *Device, sizes []int, ctxID uint64, sync func(k int) bool) error {
	n, me := d.Size(), d.Rank()
	var sends, recvs []*Request
	bufs := map[[2]int][]byte{}
	for peer := range n {
		if peer == me {
			continue
		}
		for k, size := range sizes {
			buf := make([]byte, size)
			bufs[[2]int{peer, k}] = buf
			r, err := d.Irecv(buf, peer, k, ctxID)
			if err != nil {
				return err
			}
			recvs = append(recvs, r)
		}
		for k, size := range sizes {
			r, err := d.Isend(numbered(size, me, k), peer, k, ctxID, sync(k))
			if err != nil {
				return err
			}
			sends = append(sends, r)
		}
	}
	if err := waitReqs(ctx, sends); err != nil {
		return fmt.Errorf("all-pairs send: %w", err)
	}
	i := 0
	for peer := range n {
		if peer == me {
			continue
		}
		for k, size := range sizes {
			st, err := recvs[i].Wait(ctx)
			i++
			if err != nil || st.Source != peer || st.Tag != k || st.Count != size {
				return fmt.Errorf("all-pairs: from %d message %d: status %+v, %v", peer, k, st, err)
			}
			if !bytes.Equal(bufs[[2]int{peer, k}], numbered(size, peer, k)) {
				return fmt.Errorf("all-pairs: from %d message %d (%d bytes) corrupted", peer, k, size)
			}
		}
	}
	return nil
}

// TestForwardStress: random sizes, tags and synchronous flags from every
// rank to random ranks across two sites joined by two relays (trunks); the
// receivers take everything with ANY_SOURCE and check every message and
// each sender's order.
func TestForwardStress(t *testing.T) {
	sites := []int{0, 0, 0, 1, 1, 1, -1, -1}
	const apps, perSender = 6, 120
	devs, _ := openSites(t, siteJob{sites: sites, relays: 2, forward: ForwardOptions{BlockSize: 2048, Window: 16 << 10}})
	if got := devs[0].Size(); got != apps {
		t.Fatalf("Size = %d with 2 relays, want %d", got, apps)
	}
	// plan[s] lists (destination, size, sync) per message of sender s.
	type msg struct {
		dst, size int
		sync      bool
	}
	plan := make([][]msg, apps)
	expect := make([]int, apps)
	for s := range apps {
		rng := rand.New(rand.NewPCG(uint64(s), 7))
		for range perSender {
			dst := rng.IntN(apps - 1)
			if dst >= s {
				dst++
			}
			size := 16 + rng.IntN(12000)
			plan[s] = append(plan[s], msg{dst, size, rng.IntN(8) == 0})
			expect[dst]++
		}
	}
	var wg sync.WaitGroup
	for s := range apps {
		wg.Go(func() {
			seq := make([]int, apps)
			var reqs []*Request
			for _, m := range plan[s] {
				r, err := devs[s].Isend(numbered(m.size, s, seq[m.dst]), m.dst, seq[m.dst]%5, 3, m.sync)
				seq[m.dst]++
				if err != nil {
					t.Error(err)
					return
				}
				reqs = append(reqs, r)
			}
			waitAll(t, reqs)
		})
		wg.Go(func() {
			next := make([]int, apps)
			buf := make([]byte, 16<<10)
			for range expect[s] {
				st, err := wait(t, must(t)(devs[s].Irecv(buf, AnySource, AnyTag, 3)))
				if err != nil {
					t.Error(err)
					return
				}
				i := int(binary.LittleEndian.Uint64(buf))
				if i != next[st.Source] {
					t.Errorf("rank %d: message %d from %d, want %d: order broken", s, i, st.Source, next[st.Source])
					return
				}
				next[st.Source]++
				if string(buf[:st.Count]) != string(numbered(st.Count, st.Source, i)) {
					t.Errorf("rank %d: message %d from %d corrupted", s, i, st.Source)
				}
			}
			if _, ok, _ := devs[s].Iprobe(AnySource, AnyTag, 3); ok {
				t.Errorf("rank %d: a message beyond the plan arrived (duplicate?)", s)
			}
		})
	}
	wg.Wait()
	var used int
	for _, r := range []int{6, 7} {
		if devs[r].ForwardStats().Forwarded > 0 {
			used++
		}
	}
	if used != 2 {
		t.Errorf("%d of 2 relays carried traffic; trunks should share it", used)
	}
}

// TestForwardMultiHop: ranks on a chain where only neighbours connect;
// messages from one end to the other pass two gateways, with routes found
// automatically or given by connection tables.
func TestForwardMultiHop(t *testing.T) {
	chain := func(a, b int) bool { return a-b > 1 || b-a > 1 }
	viaTable := func(rank int) *conntable.Table {
		e := []conntable.Entry{{To: conntable.SelectAll, Routes: map[string][]conntable.Route{"*": {{SubDevice: "loop"}}}}}
		for peer := range 4 {
			if d := peer - rank; d > 1 || d < -1 {
				next := rank + 1
				if d < 0 {
					next = rank - 1
				}
				e = append(e, conntable.Entry{To: fmt.Sprintf("rank:%d", peer), Routes: map[string][]conntable.Route{"*": {{SubDevice: "loop", Via: fmt.Sprintf("rank:%d", next)}}}})
			}
		}
		return &conntable.Table{Version: conntable.Version, Peers: e}
	}
	for _, tc := range []struct {
		name    string
		tableOf func(int) *conntable.Table
	}{{"automatic", nil}, {"table", viaTable}} {
		t.Run(tc.name, func(t *testing.T) {
			net := &cutNet{fab: sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: fwdCaps}), cut: chain}
			devs := openJob(t, jobSpec{n: 4, subs: []string{"loop"}, factories: map[string]sdi.Factory{"loop": net.New},
				tableOf: tc.tableOf, forward: ForwardOptions{BlockSize: 1500, Window: 6000}})
			if _, gws, _ := devs[0].Path(3, 1); !slices.Equal(gws, []int{1}) {
				t.Fatalf("rank 0 reaches rank 3 through %v, want [1]", gws)
			}
			if _, gws, _ := devs[1].Path(3, 1); !slices.Equal(gws, []int{2}) {
				t.Fatalf("rank 1 reaches rank 3 through %v, want [2]", gws)
			}
			for _, size := range []int{10, 4000, 50000} {
				for _, pair := range [][2]int{{0, 3}, {3, 0}} {
					src, dst := pair[0], pair[1]
					buf := make([]byte, size)
					rr := must(t)(devs[dst].Irecv(buf, src, 1, 5))
					must(t)(devs[src].Isend(numbered(size, src, 0), dst, 1, 5, true))
					if st, err := wait(t, rr); err != nil || st.Count != size {
						t.Fatalf("%d -> %d, %d bytes: %+v %v", src, dst, size, st, err)
					}
					if string(buf) != string(numbered(size, src, 0)) {
						t.Fatalf("%d -> %d, %d bytes: corrupted", src, dst, size)
					}
				}
			}
			if devs[1].ForwardStats().Forwarded == 0 || devs[2].ForwardStats().Forwarded == 0 {
				t.Fatal("both middle ranks should have forwarded")
			}
		})
	}
}

// TestGatewayMemoryBounded: a relay between a fast source and a
// destination that drains slowly holds at most the credit window (plus the
// one block a loopback completion may lag behind its credit), however much
// the source has to send.
func TestGatewayMemoryBounded(t *testing.T) {
	const window, block = 24 << 10, 2000
	sites := []int{0, 1, -1}
	devs, _ := openSites(t, siteJob{sites: sites, relays: 1, queueLimit: 2, slowRank: 1, slow: 100 * time.Microsecond,
		forward: ForwardOptions{BlockSize: block, Window: window}})
	const size, count = 200 << 10, 3
	var reqs []*Request
	bufs := make([][]byte, count)
	for i := range count {
		bufs[i] = make([]byte, size)
		reqs = append(reqs, must(t)(devs[1].Irecv(bufs[i], 0, i, 9)))
	}
	for i := range count {
		reqs = append(reqs, must(t)(devs[0].Isend(numbered(size, 0, i), 1, i, 9, false)))
	}
	for i := range 200 { // and a burst of eager messages
		reqs = append(reqs, must(t)(devs[0].Isend(numbered(300, 0, i), 1, 1000, 9, false)))
		reqs = append(reqs, must(t)(devs[1].Irecv(make([]byte, 300), 0, 1000, 9)))
	}
	waitAll(t, reqs)
	for i := range count {
		if string(bufs[i]) != string(numbered(size, 0, i)) {
			t.Fatalf("message %d corrupted", i)
		}
	}
	st := devs[2].ForwardStats()
	bound := int64(window + block + headerSize)
	t.Logf("relay held at most %d bytes; window %d, forwarded %d bytes", st.MaxHeld, window, st.Bytes)
	if st.MaxHeld > bound {
		t.Fatalf("relay held %d bytes, more than the window %d plus one block", st.MaxHeld, window)
	}
	if st.MaxHeld < window/2 {
		t.Fatalf("relay held at most %d bytes: the slow destination did not back traffic up into it, the test proves nothing", st.MaxHeld)
	}
}

// TestTrunkFailover: three relays carry two sites' traffic; one dies in
// the middle. Its blocks are sent again through the others and every
// message arrives once, intact and in order.
func TestTrunkFailover(t *testing.T) {
	sites := []int{0, 0, 1, 1, -1, -1, -1}
	devs, net := openSites(t, siteJob{sites: sites, relays: 3, slowRank: 2, slow: 20 * time.Microsecond,
		forward: ForwardOptions{BlockSize: 2000, Window: 32 << 10}})
	const count, size = 30, 30000
	streamThroughFailure(t, devs, [][2]int{{0, 2}, {1, 3}, {3, 0}}, count, func(int) int { return size },
		func(i int) bool { return i%3 == 0 }, func() { net.fab.Kill(4) })
	var resent uint64
	for r, other := range map[int]int{0: 2, 1: 3, 3: 0} {
		resent += devs[r].ForwardStats().Resent
		if _, gws, _ := devs[r].Path(other, size); slices.Contains(gws, 4) {
			t.Errorf("rank %d still routes through the dead relay 4", r)
		}
	}
	if resent == 0 {
		t.Fatal("no block was sent again: the relay died holding nothing, the test proves nothing")
	}
	t.Logf("%d blocks sent again after relay 4 died", resent)
}

// streamThroughFailure streams count numbered messages (message i of
// size(i) bytes, synchronous where ssend says) for each (source,
// destination) pair, calls fail once after a third of them arrived
// somewhere, and checks that every message arrives once, intact and in
// order, and nothing beyond.
func streamThroughFailure(t *testing.T, devs []*Device, pairs [][2]int, count int, size func(i int) int, ssend func(i int) bool, fail func()) {
	t.Helper()
	maxSize := 0
	for i := range count {
		maxSize = max(maxSize, size(i))
	}
	var wg sync.WaitGroup
	var failOnce sync.Once
	for _, p := range pairs {
		src, dst := p[0], p[1]
		wg.Go(func() {
			var reqs []*Request
			for i := range count {
				reqs = append(reqs, must(t)(devs[src].Isend(numbered(size(i), src, i), dst, 4, 2, ssend(i))))
			}
			waitAll(t, reqs)
		})
		wg.Go(func() {
			buf := make([]byte, maxSize)
			for i := range count {
				st, err := wait(t, must(t)(devs[dst].Irecv(buf, src, 4, 2)))
				if err != nil || st.Count != size(i) {
					t.Errorf("%d -> %d message %d: %+v %v", src, dst, i, st, err)
					return
				}
				if string(buf[:st.Count]) != string(numbered(size(i), src, i)) {
					t.Errorf("%d -> %d message %d corrupted or out of order", src, dst, i)
					return
				}
				if i == count/3 {
					failOnce.Do(fail)
				}
			}
			if _, ok, _ := devs[dst].Iprobe(src, AnyTag, 2); ok {
				t.Errorf("%d -> %d: a message beyond the %d sent arrived", src, dst, count)
			}
		})
	}
	wg.Wait()
}

// openErr opens a job whose Open is expected to fail somewhere and returns
// the errors; devices that opened are closed.
func openErr(t *testing.T, n int, relayAt func(int) bool, factory sdi.Factory) []error {
	boots, err := bootstrap.InProcess(n, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := make([]error, n)
	devs := make([]*Device, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			devs[r], errs[r] = Open(ctx, Options{Bootstrap: boots[r], Plugins: &PluginsConfig{SubDevices: []SubDeviceSpec{{Name: "loop", Enabled: true}}},
				Factories: map[string]sdi.Factory{"loop": factory}, Logger: testLogger(t), Relay: relayAt(r)})
			if errs[r] != nil {
				_ = boots[r].Abort(1, errs[r].Error()) // release ranks waiting in a fence
			}
		})
	}
	wg.Wait()
	for _, d := range devs {
		if d != nil {
			_ = d.shutdown(ctx)
		}
	}
	return errs
}

// viaTables gives every rank a direct route over sub to every other, and
// the ranks in via their routes to dst: through gateways (hop).
func viaTables(sub string, dst int, via map[int][]conntable.Route) func(r int) *conntable.Table {
	return func(r int) *conntable.Table {
		e := []conntable.Entry{{To: conntable.SelectAll, Routes: map[string][]conntable.Route{conntable.AllClasses: {{SubDevice: sub}}}}}
		if routes, ok := via[r]; ok {
			e = append(e, conntable.Entry{To: fmt.Sprint("rank:", dst), Routes: map[string][]conntable.Route{conntable.AllClasses: routes}})
		}
		return &conntable.Table{Version: conntable.Version, Peers: e}
	}
}

// hop is a route over sub through gateway gw.
func hop(sub string, gw int) conntable.Route {
	return conntable.Route{SubDevice: sub, Via: fmt.Sprint("rank:", gw)}
}

// TestGatewayPassesOnOverLiveTrunk: in the chain 0 -a-> 1 -b-> 3 -a-> 2,
// gateway 1 losing its direct "a" link to rank 3 marks rank 3 down for
// its own messages, yet still passes blocks from 0 to 2 on to gateway 3
// over its trunk on "b", which works.
func TestGatewayPassesOnOverLiveTrunk(t *testing.T) {
	factories := map[string]sdi.Factory{}
	for _, name := range []string{"a", "b"} {
		fab := sditest.NewFabric(sditest.LoopbackOptions{Name: name, Caps: fwdCaps})
		factories[name] = func(log hclog.Logger) sdi.SubDevice { return fab.New(log) }
	}
	tableOf := viaTables("a", 2, map[int][]conntable.Route{0: {hop("a", 1)}, 1: {hop("b", 3)}})
	devs := openJob(t, jobSpec{n: 4, subs: []string{"a", "b"}, factories: factories, tableOf: tableOf,
		forward: ForwardOptions{BlockSize: 1500, Window: 6000}})
	send := func(tag int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		rr := must(t)(devs[2].Irecv(make([]byte, 10), 0, tag, 5))
		if err := devs[0].Send(ctx, numbered(10, 0, tag), 2, tag, 5, false); err != nil {
			return err
		}
		_, err := rr.Wait(ctx)
		return err
	}
	if err := send(1); err != nil {
		t.Fatalf("before the loss: %v", err)
	}
	a := slices.IndexFunc(devs[1].subs, func(s *subdev) bool { return s.name == "a" })
	(&handler{d: devs[1], sub: a}).PeerDown(3, fmt.Errorf("a: link to 3 died: %w", sdi.ErrPeerUnreachable))
	if _, gws, _ := devs[1].Path(2, 10); len(gws) != 1 || gws[0] != 3 {
		t.Fatalf("gateway 1 reaches 2 through %v, want gateway 3", gws)
	}
	if err := send(2); err != nil {
		t.Fatalf("after gateway 1 lost its direct link to 3: %v (gateway 1 forwarded %d)", err, devs[1].ForwardStats().Forwarded)
	}
}

// linkCut fails, on rank at, every frame to rank to, at Send and without
// PeerDown: to the device, the loss of that peer over the subdevice.
type linkCut struct {
	sdi.SubDevice
	at, to *atomic.Int32
	rank   sdi.Rank
}

func (l *linkCut) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	l.rank = p.Rank
	return l.SubDevice.Open(ctx, p)
}

func (l *linkCut) Send(f *sdi.Frame) (bool, error) {
	if int32(l.rank) == l.at.Load() && int32(f.Peer) == l.to.Load() {
		return false, fmt.Errorf("cut: rank %d down: %w", f.Peer, sdi.ErrPeerUnreachable)
	}
	return l.SubDevice.Send(f)
}

// TestFailedPassedFrame: rank 0 reaches dst through a gateway gw, which
// reaches dst through gateways cut and alt. When gw's subdevice fails the
// frames it passes on to cut, with or without PeerDown, gw drops that
// trunk and the blocks reach dst through alt. The gateway is a rank of
// the application, or a dedicated relay, also as cmd/mdrelay runs one
// (adi.RunRelay: Open, then Finalize at once, passing frames on from
// inside Close).
func TestFailedPassedFrame(t *testing.T) {
	for _, c := range []struct {
		name                      string
		dst, gw, cut, alt, relays int
		peerDown, closing         bool
	}{
		{"gateway/PeerDown", 3, 1, 2, 4, 0, true, false},
		{"gateway", 3, 1, 2, 4, 0, false, false},
		{"relay", 1, 2, 3, 4, 3, false, false}, // ranks 2, 3 and 4 are relays
		{"relay in Close", 1, 2, 3, 4, 3, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			at, to := new(atomic.Int32), new(atomic.Int32)
			at.Store(-1)
			to.Store(-1)
			fab := sditest.NewFabric(sditest.LoopbackOptions{Name: "a", Caps: fwdCaps})
			factories := map[string]sdi.Factory{"a": func(log hclog.Logger) sdi.SubDevice {
				return &linkCut{SubDevice: fab.New(log), at: at, to: to}
			}}
			tableOf := viaTables("a", c.dst, map[int][]conntable.Route{0: {hop("a", c.gw)}, c.gw: {hop("a", c.cut), hop("a", c.alt)}})
			devs := openJob(t, jobSpec{n: 5, subs: []string{"a"}, factories: factories, tableOf: tableOf, relays: c.relays,
				forward: ForwardOptions{BlockSize: 1500, Window: 6000, Retry: -1}})
			gw := devs[c.gw]
			if _, gws, _ := gw.Path(c.dst, 10); len(gws) != 2 {
				t.Fatalf("gateway %d reaches %d through %v, want %d and %d", c.gw, c.dst, gws, c.cut, c.alt)
			}
			if c.closing {
				for r := len(devs) - c.relays; r < len(devs); r++ {
					go devs[r].Close(context.Background()) // as mdrelay: forwards until the job closes
				}
				for !gw.finalizing.Load() {
					time.Sleep(time.Millisecond)
				}
			}
			at.Store(int32(c.gw))
			to.Store(int32(c.cut))
			defer at.Store(-1) // let Close drain
			if c.peerDown {
				a := slices.IndexFunc(gw.subs, func(s *subdev) bool { return s.name == "a" })
				(&handler{d: gw, sub: a}).PeerDown(sdi.Rank(c.cut), fmt.Errorf("a: link to %d died: %w", c.cut, sdi.ErrPeerUnreachable))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for tag := range 6 {
				rr := must(t)(devs[c.dst].Irecv(make([]byte, 10), 0, tag, 5))
				if err := devs[0].Send(ctx, numbered(10, 0, tag), c.dst, tag, 5, false); err != nil {
					t.Fatalf("send %d: %v", tag, err)
				}
				if _, err := rr.Wait(ctx); err != nil {
					t.Fatalf("message %d never arrived: %v (gateway %d forwarded %d)", tag, err, c.gw, gw.ForwardStats().Forwarded)
				}
			}
		})
	}
}

func TestOpenRefuses(t *testing.T) {
	plain := func(int) bool { return false }
	for _, tc := range []struct {
		name    string
		n       int
		relayAt func(int) bool
		cut     func(a, b int) bool
		want    error
		text    string
	}{
		{"no gateway between sites", 2, plain, siteCut([]int{0, 1}), ErrNoRoute, "no chain of ranks"},
		{"says why each subdevice failed", 2, plain, siteCut([]int{0, 1}), ErrNoRoute, `reaches it; loop: multidevice: connect to rank 1 (host "localhost") over "loop": cut: rank 0 to 1`},
		{"relay before an application rank", 3, func(r int) bool { return r == 1 }, func(int, int) bool { return false }, nil, "relays must be the last ranks"},
		{"only relays", 2, func(int) bool { return true }, func(int, int) bool { return false }, nil, "needs an application rank"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			net := &cutNet{fab: sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: fwdCaps}), cut: tc.cut}
			errs := openErr(t, tc.n, tc.relayAt, net.New)
			found := false
			for _, err := range errs {
				if err != nil && (tc.want == nil || errors.Is(err, tc.want)) && strings.Contains(err.Error(), tc.text) {
					found = true
				}
			}
			if !found {
				t.Fatalf("errors %v: want one wrapping %v saying %q", errs, tc.want, tc.text)
			}
		})
	}
}

func TestNextHops(t *testing.T) {
	// reach builds rows from an edge list (symmetric).
	reach := func(n int, edges ...[2]int) [][]bool {
		rows := make([][]bool, n)
		for i := range rows {
			rows[i] = make([]bool, n)
			rows[i][i] = true
		}
		for _, e := range edges {
			rows[e[0]][e[1]], rows[e[1]][e[0]] = true, true
		}
		return rows
	}
	for _, tc := range []struct {
		name      string
		rows      [][]bool
		self, dst int
		want      []int
	}{
		{"one gateway", reach(3, [2]int{0, 2}, [2]int{1, 2}), 0, 1, []int{2}},
		{"two trunks", reach(4, [2]int{0, 2}, [2]int{0, 3}, [2]int{1, 2}, [2]int{1, 3}), 0, 1, []int{2, 3}},
		{"chain takes the next link", reach(4, [2]int{0, 1}, [2]int{1, 2}, [2]int{2, 3}), 0, 3, []int{1}},
		{"shortest only", reach(5, [2]int{0, 1}, [2]int{1, 4}, [2]int{0, 2}, [2]int{2, 3}, [2]int{3, 4}), 0, 4, []int{1}},
		{"island", reach(3, [2]int{0, 2}), 0, 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := nextHops(tc.rows, tc.self, tc.dst); !slices.Equal(got, tc.want) {
				t.Fatalf("nextHops = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestReachRow(t *testing.T) {
	for _, n := range []int{1, 7, 8, 9, 100} {
		row := make([]bool, n)
		for i := range row {
			row[i] = i%3 == 0
		}
		got, err := decodeReach(encodeReach(row), n)
		if err != nil || !slices.Equal(got, row) {
			t.Fatalf("n=%d: round trip %v, %v", n, got, err)
		}
	}
	for _, tc := range []struct {
		name string
		b    []byte
		size int
	}{
		{"empty", nil, 3},
		{"short", []byte{reachVersion}, 9},
		{"long", []byte{reachVersion, 0, 0}, 8},
		{"version", []byte{9, 0}, 8},
		{"bit beyond the job", []byte{reachVersion, 0x10}, 4},
	} {
		if _, err := decodeReach(tc.b, tc.size); !errors.Is(err, errBadReach) {
			t.Errorf("%s: err = %v, want errBadReach", tc.name, err)
		}
	}
}

func FuzzDecodeReach(f *testing.F) {
	f.Add(encodeReach([]bool{true, false, true}), 3)
	f.Add([]byte{}, 0)
	f.Fuzz(func(t *testing.T, b []byte, size int) {
		if size < 0 || size > 1<<16 {
			return
		}
		row, err := decodeReach(b, size)
		if err != nil {
			return
		}
		if string(encodeReach(row)) != string(b) {
			t.Fatalf("re-encoding a valid row changed it")
		}
	})
}

func TestUnwrap(t *testing.T) {
	outer := header{kind: kindSys, tag: sysFwd, src: 1, dst: 2}
	frame := func(h header, data int) []byte {
		b := make([]byte, headerSize+data)
		h.put(b)
		return b
	}
	inner := header{kind: kindEager, tag: 3, src: 1, dst: 2, length: 5}
	b := frame(inner, 5)
	h, data, err := unwrap(&outer, b[:headerSize], b[headerSize:], 4)
	if err != nil || h != inner || len(data) != 5 {
		t.Fatalf("unwrap = %+v, %d bytes, %v", h, len(data), err)
	}
	for _, tc := range []struct {
		name  string
		inner []byte
	}{
		{"short", make([]byte, 10)},
		{"long", make([]byte, headerSize+1)},
		{"bad inner header", make([]byte, headerSize)},
		{"nested forward", frame(header{kind: kindSys, tag: sysFwd, src: 1, dst: 2}, 0)},
		{"inner from another source", frame(header{kind: kindEager, tag: 3, src: 0, dst: 2}, 0)},
		{"inner for another destination", frame(header{kind: kindEager, tag: 3, src: 1, dst: 3}, 0)},
	} {
		if _, _, err := unwrap(&outer, tc.inner, nil, 4); !errors.Is(err, errBadForward) {
			t.Errorf("%s: err = %v, want errBadForward", tc.name, err)
		}
	}
}

func FuzzUnwrap(f *testing.F) {
	b := make([]byte, headerSize)
	(&header{kind: kindEager, tag: 1, src: 1, dst: 2, length: 3}).put(b)
	f.Add(b, []byte("abc"))
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, ib, data []byte) {
		outer := header{kind: kindSys, tag: sysFwd, src: 1, dst: 2}
		h, got, err := unwrap(&outer, ib, data, 4)
		if err != nil {
			return
		}
		if h.src != 1 || h.dst != 2 || len(got) != len(data) {
			t.Fatalf("accepted %+v with %d data bytes of %d", h, len(got), len(data))
		}
	})
}

// TestForwardDuplicateBlock: a block that reaches its destination twice
// (sent again after a gateway died although it had arrived) is handled
// once.
func TestForwardDuplicateBlock(t *testing.T) {
	devs, _ := openSites(t, siteJob{sites: []int{0, 1, -1}})
	d := devs[1]
	inner := header{kind: kindEager, tag: 6, src: 0, dst: 1, length: 4, seq: 0}
	payload := make([]byte, headerSize+4)
	inner.put(payload)
	copy(payload[headerSize:], "abcd")
	outer := header{kind: kindSys, tag: sysFwd, src: 0, dst: 1, seq: 0, length: uint64(len(payload))}
	for range 2 {
		d.onIndirect(-1, 2, &outer, payload[:headerSize], payload[headerSize:])
	}
	buf := make([]byte, 4)
	if st, err := wait(t, must(t)(d.Irecv(buf, 0, 6, 0))); err != nil || string(buf) != "abcd" {
		t.Fatalf("receive: %+v %v %q", st, err, buf)
	}
	if st := d.ForwardStats(); st.Dropped != 1 {
		t.Fatalf("dropped %d duplicate blocks, want 1", st.Dropped)
	}
}

// relayNet is examples/networks/relays.hcl in small, over the loopback
// subdevice: two private clusters, each with a relay host, and the relays
// joined by a WAN.
const relayNet = `
penalty = "off"
subdevice "loop" {
  latency   = "30us"
  bandwidth = "10Gbit/s"
}
network "p-private" {
  subdevice = "loop"
  hosts     = ["p[01-02]", "p-relay"]
}
network "q-private" {
  subdevice = "loop"
  hosts     = ["q[01-02]", "q-relay"]
}
network "wan" {
  subdevice = "loop"
  hosts     = ["p-relay", "q-relay"]
  latency   = "5ms"
  bandwidth = "1Gbit/s"
}
host "p-relay" { penalty = "20us" }
host "q-relay" { penalty = "20us" }
`

// TestForwardMdconfigTables: per-host tables that mdconfig computed route
// the clusters' traffic through both relays (two gateways on the way), the
// relays being dedicated relay ranks.
func TestForwardMdconfigTables(t *testing.T) {
	desc, diags := mdconfig.Parse([]byte(relayNet), "relays.hcl")
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	hosts := []string{"p01", "p02", "q01", "q02", "p-relay", "q-relay"}
	nets := map[string][]string{"p01": {"p"}, "p02": {"p"}, "q01": {"q"}, "q02": {"q"}, "p-relay": {"p", "wan"}, "q-relay": {"q", "wan"}}
	apart := func(a, b int) bool {
		for _, n := range nets[hosts[a]] {
			if slices.Contains(nets[hosts[b]], n) {
				return false
			}
		}
		return true
	}
	net := &cutNet{fab: sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: fwdCaps}), cut: apart}
	devs := openJob(t, jobSpec{n: len(hosts), subs: []string{"loop"}, factories: map[string]sdi.Factory{"loop": net.New},
		relays: 2, hostOf: func(r int) string { return hosts[r] },
		tableOf: func(r int) *conntable.Table {
			tb, err := desc.Table(hosts[r])
			if err != nil {
				t.Error(err)
			}
			return tb
		}})
	if _, gws, _ := devs[0].Path(3, 1<<20); !slices.Equal(gws, []int{4}) {
		t.Fatalf("p01 reaches q02 through %v, want [4] (p-relay)", gws)
	}
	if _, gws, _ := devs[4].Path(3, 1<<20); !slices.Equal(gws, []int{5}) {
		t.Fatalf("p-relay reaches q02 through %v, want [5] (q-relay)", gws)
	}
	for _, size := range []int{100, 3000, 60000} {
		for _, pair := range [][2]int{{0, 3}, {2, 1}} {
			src, dst := pair[0], pair[1]
			buf := make([]byte, size)
			rr := must(t)(devs[dst].Irecv(buf, src, 2, 0))
			must(t)(devs[src].Isend(numbered(size, src, 1), dst, 2, 0, false))
			if st, err := wait(t, rr); err != nil || st.Count != size || string(buf) != string(numbered(size, src, 1)) {
				t.Fatalf("%s -> %s, %d bytes: %+v %v", hosts[src], hosts[dst], size, st, err)
			}
		}
	}
	for _, r := range []int{4, 5} {
		if devs[r].ForwardStats().Forwarded == 0 {
			t.Errorf("%s forwarded nothing", hosts[r])
		}
	}
}

// TestBlockSize: a failover route, whose trunks go straight to the peer,
// cuts data into blocks as large as its subdevices carry (within a
// quarter of the window); a route through gateways into BlockSize, 64 KiB
// by default; a BlockSize given is kept on both. Blocks travel split where
// every subdevice takes a 128-byte header, else the inner header takes
// room from the payload.
func TestBlockSize(t *testing.T) {
	big := &subdev{idx: 1, caps: sdi.Caps{MaxHeader: 256, MaxFrame: 1 << 20}}
	narrow := &subdev{idx: 2, caps: sdi.Caps{MaxHeader: 64, MaxFrame: 1 << 20}}
	small := &subdev{idx: 3, caps: sdi.Caps{MaxHeader: 256, MaxFrame: 8000}}
	tests := []struct {
		name      string
		block     int
		trunks    []trunk // to peer 1
		wantChunk int
		wantSplit bool
	}{
		{"failover", 0, []trunk{{sub: big, via: 1}, {sub: big, via: 1}}, defaultWindow / 4, true},
		{"failover, one subdevice with short headers", 0, []trunk{{sub: big, via: 1}, {sub: narrow, via: 1}}, 1<<20 - headerSize, false},
		{"failover, small frames", 0, []trunk{{sub: big, via: 1}, {sub: small, via: 1}}, 8000, true},
		{"failover, block size given", 5000, []trunk{{sub: big, via: 1}, {sub: big, via: 1}}, 5000, true},
		{"gateways", 0, []trunk{{sub: big, via: 2}, {sub: big, via: 3}}, defaultBlockSize, true},
		{"a gateway and the peer", 0, []trunk{{sub: big, via: 1}, {sub: big, via: 2}}, defaultBlockSize, true},
		{"gateways, block size given", 5000, []trunk{{sub: big, via: 2}}, 5000, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var f forwarder
			f.init(4, 1, 4)
			o := ForwardOptions{BlockSize: tt.block}
			f.opts, f.blockSet = o.withDefaults(), o.BlockSize != 0
			f.setPath(1, 0, tt.trunks)
			if f.chunk[1][0] != tt.wantChunk || f.split[1][0] != tt.wantSplit {
				t.Fatalf("blocks of %d bytes, split %v; want %d, %v", f.chunk[1][0], f.split[1][0], tt.wantChunk, tt.wantSplit)
			}
		})
	}
}

func TestForwardFromEnv(t *testing.T) {
	for _, tt := range []struct {
		env  map[string]string
		want ForwardOptions
		bad  string // in the error
	}{
		{env: nil},
		{env: map[string]string{EnvForwardBlock: "1000", EnvForwardWindow: "100000"}, want: ForwardOptions{BlockSize: 1000, Window: 100000}},
		{env: map[string]string{EnvForwardRetry: "500ms"}, want: ForwardOptions{Retry: 500 * time.Millisecond}},
		{env: map[string]string{EnvForwardRetry: "off"}, want: ForwardOptions{Retry: -1}},
		{env: map[string]string{EnvForwardBlock: "64k"}, bad: EnvForwardBlock + `="64k"`},
		{env: map[string]string{EnvForwardWindow: "-5"}, bad: EnvForwardWindow},
		{env: map[string]string{EnvForwardRetry: "0"}, bad: EnvForwardRetry + `="0"`},
		{env: map[string]string{EnvForwardRetry: "-1s"}, bad: EnvForwardRetry},
		{env: map[string]string{EnvForwardRetry: "soon"}, bad: "positive duration"},
		{env: map[string]string{EnvForwardBlock: "100000", EnvForwardWindow: "1000"}, bad: "must hold one block"},
	} {
		got, err := ForwardFromEnv(func(k string) string { return tt.env[k] })
		switch {
		case tt.bad != "":
			if err == nil || !strings.Contains(err.Error(), tt.bad) {
				t.Errorf("%v: error %v, want one naming %s", tt.env, err, tt.bad)
			}
		case err != nil:
			t.Errorf("%v: %v", tt.env, err)
		case got != tt.want:
			t.Errorf("%v: %+v, want %+v", tt.env, got, tt.want)
		}
	}
}

// TestSlowGatewayTrunk: a line through two gateways, one of which takes
// 2 ms to receive each frame. Blocks carry their trunk's slot through
// the gateways, so the destination's reports tell the source what each
// trunk delivers, and the slow gateway carries clearly fewer blocks than
// the fast one. Picked by unacknowledged bytes, the two carried about as
// many (798 and 760), and 2 MiB took 1.7 s instead of 0.1 s.
func TestSlowGatewayTrunk(t *testing.T) {
	devs, _ := openSites(t, siteJob{sites: []int{0, 1, -1, -1}, relays: 2, slowRank: 3, slow: 2 * time.Millisecond,
		forward: ForwardOptions{BlockSize: 2000, Window: 64 << 10}})
	const size = 2 << 20
	rr := must(t)(devs[1].Irecv(make([]byte, size), 0, 1, 0))
	sr := must(t)(devs[0].Isend(numbered(size, 0, 0), 1, 1, 0, false))
	waitAll(t, []*Request{rr, sr})
	fast, slow, src, dst := devs[2].ForwardStats(), devs[3].ForwardStats(), devs[0].ForwardStats(), devs[1].ForwardStats()
	t.Logf("fast gateway %+v, slow gateway %+v, source %+v, destination %+v", fast, slow, src, dst)
	if 4*slow.Forwarded > fast.Forwarded {
		t.Errorf("the slow gateway passed on %d frames, the fast one %d: trunking ignores delivery", slow.Forwarded, fast.Forwarded)
	}
	if src.Nudged+dst.Nudged > 0 || src.Dropped+dst.Dropped > 0 {
		t.Errorf("no gateway failed, yet %d blocks were sent again and %d copies dropped", src.Nudged+dst.Nudged, src.Dropped+dst.Dropped)
	}
}

// TestDecodeReport: a credit's delivery report is a whole number of
// 8-byte counts, at most one per trunk slot; anything else is refused
// (it comes from the network) and says why.
func TestDecodeReport(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		want []uint64 // nil: refused
	}{
		{"empty", nil, []uint64{}},
		{"two slots", appendReport(nil, []uint64{5, 1 << 40}), []uint64{5, 1 << 40}},
		{"every slot", appendReport(nil, make([]uint64, maxSlots)), make([]uint64, maxSlots)},
		{"ragged", make([]byte, 12), nil},
		{"one byte", []byte{1}, nil},
		{"more slots than a line has", make([]byte, 8*(maxSlots+1)), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeReport([]uint64{}, tc.b)
			switch {
			case tc.want == nil && !errors.Is(err, errBadReport):
				t.Fatalf("decodeReport = %v, %v; want errBadReport", got, err)
			case tc.want != nil && (err != nil || !slices.Equal(got, tc.want)):
				t.Fatalf("decodeReport = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// FuzzDecodeReport: reports come from the network; decoding one never
// panics, and one it takes encodes back to the same bytes.
func FuzzDecodeReport(f *testing.F) {
	f.Add(appendReport(nil, []uint64{1, 2, 3}))
	f.Add([]byte{})
	f.Add(make([]byte, 7))
	f.Fuzz(func(t *testing.T, b []byte) {
		counts, err := decodeReport(nil, b)
		if err != nil {
			return
		}
		if len(counts) > maxSlots || string(appendReport(nil, counts)) != string(b) {
			t.Fatalf("took %d bytes as %d counts that encode otherwise", len(b), len(counts))
		}
	})
}

// TestDeliveryEstimates: what a line measured of its trunks decides where
// a block goes and how long the watch waits for it. A trunk not measured
// yet takes about a sample's bytes at most (it may be the slow one) and
// counts as the average until then; a measured one finishes by what it carries at
// its rate, or at its latest sample's if lower (it may have turned slow).
// The watch waits a second before any measure, then the measured
// delivery time, or longer for a long queue ahead of the block, never
// less than nudgeAfter.
func TestDeliveryEstimates(t *testing.T) {
	l := &txLine{load: make([]int, 2), stats: make([]wayStat, 2)}
	send := func(s, n int) *block {
		l.load[s] += n
		return &block{t: trunk{slot: s}, end: l.sending(s, n, true)}
	}
	if got := l.finish(0, 1000, 0); got != 1000 {
		t.Errorf("an idle trunk, nothing measured: finish = %v, want the bytes alone", got)
	}
	b := send(0, 4000)
	if got := l.finish(0, 1000, 0); got != 5000 {
		t.Errorf("a trunk not measured yet with less than a sample in flight: finish = %v, want its bytes in flight and the new ones", got)
	}
	send(1, rateSample)
	if got := l.finish(1, 1000, 1e6); !math.IsInf(got, 1) {
		t.Errorf("a trunk not measured yet with a sample's bytes in flight: finish = %v, want never", got)
	}
	l.load[1] = 0 // its blocks were acknowledged: idle again
	if got := l.patience(b); got != initialRTO {
		t.Errorf("patience before any measure = %v, want %v", got, initialRTO)
	}
	l.delivered(0, b.end, l.stats[0].busy.Add(2*time.Millisecond))
	l.settle()
	if w := l.stats[0]; w.srtt != 2*time.Millisecond || w.rate != 0 || !w.busy.IsZero() {
		t.Errorf("after 4000 bytes in 2 ms: srtt %v, rate %v (want none: too few bytes), busy %v (want idle)", w.srtt, w.rate, w.busy)
	}
	if got := l.patience(send(0, 100)); got != nudgeAfter {
		t.Errorf("patience with a 2 ms delivery time = %v, want the least, %v", got, nudgeAfter)
	}
	b = send(0, rateSample)
	l.delivered(0, b.end, l.stats[0].busy.Add(100*time.Millisecond))
	w := l.stats[0]
	if w.rate <= 0 || w.rate > float64(rateSample+4100)/0.1 {
		t.Fatalf("rate after %d bytes in 100 ms = %v", rateSample, w.rate)
	}
	const queued = 1 << 20
	if got, least := l.patience(send(0, queued)), time.Duration(2*queued/w.rate*float64(time.Second)); got < least {
		t.Errorf("patience behind %d bytes at %.0f bytes/s = %v, want at least twice their time, %v", queued, w.rate, got, least)
	}
	l.load[0] = 0
	if got0, got1 := l.finish(0, 1000, w.rate), l.finish(1, 1000, w.rate); got0 != got1 {
		t.Errorf("an idle trunk not measured counts as the average: finish %v, measured one %v", got1, got0)
	}
	// The trunk turns slow: its next sample caps its rate at once.
	b = send(0, rateSample)
	l.delivered(0, b.end, l.stats[0].busy.Add(100*time.Second))
	if got, avg := l.stats[0].rateNow(), l.stats[0].rate; got >= avg/2 {
		t.Errorf("rate after a sample 1000 times slower = %v, want far below the average %v", got, avg)
	}
}
