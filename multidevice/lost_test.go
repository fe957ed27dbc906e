package multidevice

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/conntable"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// hop2Job opens 4 ranks where rank 0 reaches dst through gateway 1 over
// subdevice "a", and gateway 1 reaches dst through another gateway over
// "b" (caps bCaps); every other pair is direct over "a". Trunks are not
// revived (Retry -1).
func hop2Job(t *testing.T, bCaps sdi.Caps, dst int) ([]*Device, map[string]*sditest.Fabric) {
	fabs, factories := map[string]*sditest.Fabric{}, map[string]sdi.Factory{}
	for name, caps := range map[string]sdi.Caps{"a": fwdCaps, "b": bCaps} {
		fab := sditest.NewFabric(sditest.LoopbackOptions{Name: name, Caps: caps})
		fabs[name], factories[name] = fab, func(log hclog.Logger) sdi.SubDevice { return fab.New(log) }
	}
	gw2 := 2
	if dst == 2 {
		gw2 = 3
	}
	tables := viaTables("a", dst, map[int][]conntable.Route{0: {hop("a", 1)}, 1: {hop("b", gw2)}})
	return openJob(t, jobSpec{n: 4, subs: []string{"a", "b"}, factories: factories, tableOf: tables,
		forward: ForwardOptions{Retry: -1}}), fabs
}

// TestGatewayLossTellsSource: a gateway past the first hop that loses its
// only way on tells the source, whose sends to the destination then fail
// with the gateway's reason. The source once kept the block for a credit
// that never came: a synchronous send only timed out, a rendezvous send
// ignored its ctx, and nothing said why.
func TestGatewayLossTellsSource(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int
		sync bool
	}{
		{"synchronous eager", 10, true},
		{"rendezvous", 4000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			devs, fabs := hop2Job(t, fwdCaps, 3)
			fabs["b"].Sever(2) // gateway 1's only way on to 3
			must(t)(devs[3].Irecv(make([]byte, tc.size), 0, 1, 5))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err := devs[0].Send(ctx, numbered(tc.size, 0, 1), 3, 1, 5, tc.sync)
			if !errors.Is(err, ErrPeerDown) || !strings.Contains(err.Error(), "gateway rank 1 lost a block") {
				t.Fatalf("Send through a gateway that lost its way on = %v, want ErrPeerDown with the gateway's reason", err)
			}
			if n := devs[1].ForwardStats().Lost; n == 0 {
				t.Error("the gateway counted no lost block")
			}
		})
	}
}

// TestGatewayLossTakesOtherTrunk: with two gateways to the destination,
// the one that lost its way on is cut from the line and the blocks it
// lost go through the other: every message arrives.
func TestGatewayLossTakesOtherTrunk(t *testing.T) {
	fabs, factories := map[string]*sditest.Fabric{}, map[string]sdi.Factory{}
	for _, name := range []string{"a", "b"} {
		fab := sditest.NewFabric(sditest.LoopbackOptions{Name: name, Caps: fwdCaps})
		fabs[name], factories[name] = fab, func(log hclog.Logger) sdi.SubDevice { return fab.New(log) }
	}
	// 0 reaches 4 through gateways 1 and 2 over "a"; gateway 1 goes on
	// through 3 over "b", gateway 2 straight over "a".
	tables := viaTables("a", 4, map[int][]conntable.Route{0: {hop("a", 1), hop("a", 2)}, 1: {hop("b", 3)}})
	devs := openJob(t, jobSpec{n: 5, subs: []string{"a", "b"}, factories: factories, tableOf: tables, forward: ForwardOptions{Retry: -1}})
	fabs["b"].Sever(3) // gateway 1 loses its way on; 2 still has its own
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 20 {
		size := []int{10, 3000, 9000}[i%3]
		rr := must(t)(devs[4].Irecv(make([]byte, size), 0, i, 5))
		if err := devs[0].Send(ctx, numbered(size, 0, i), 4, i, 5, i%2 == 0); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		if _, err := wait(t, rr); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
}

// TestOversizedPassedFrame: a block larger than a later hop's subdevice
// takes (blocks are cut for the source's first hop) is lost with a
// reason naming MD_FORWARD_BLOCK, and the gateway keeps its working link
// to the destination: it once took ErrTooLarge for that link's end and
// reported the destination lost.
func TestOversizedPassedFrame(t *testing.T) {
	small := fwdCaps
	small.MaxFrame = 1024
	devs, _ := hop2Job(t, small, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	must(t)(devs[2].Irecv(make([]byte, 4000), 0, 2, 5))
	err := devs[0].Send(ctx, make([]byte, 4000), 2, 2, 5, true)
	if !errors.Is(err, ErrPeerDown) || !strings.Contains(err.Error(), "MD_FORWARD_BLOCK") {
		t.Fatalf("Ssend of blocks too large for the gateway's next hop = %v, want ErrPeerDown naming MD_FORWARD_BLOCK", err)
	}
	rr := must(t)(devs[2].Irecv(make([]byte, 3000), 1, 3, 5))
	if err := devs[1].Send(ctx, make([]byte, 3000), 2, 3, 5, false); err != nil {
		t.Fatalf("gateway 1's own send to 2 after an oversized block: %v", err)
	}
	if _, err := wait(t, rr); err != nil {
		t.Fatal(err)
	}
}

// TestPassedTooLargeTakesAnotherHop: gateway 1 has two ways on to 2:
// through 3 over "b" (MaxFrame 1024) and through 4 over "a" (4096). A
// block too large for "b" goes through 4. Once ErrTooLarge no longer took
// the trunk for dead, nextHop gave the same trunk again, and the block
// was lost though a route fit.
func TestPassedTooLargeTakesAnotherHop(t *testing.T) {
	small := fwdCaps
	small.MaxFrame = 1024
	factories := map[string]sdi.Factory{}
	for name, caps := range map[string]sdi.Caps{"a": fwdCaps, "b": small} {
		fab := sditest.NewFabric(sditest.LoopbackOptions{Name: name, Caps: caps})
		factories[name] = func(log hclog.Logger) sdi.SubDevice { return fab.New(log) }
	}
	tables := viaTables("a", 2, map[int][]conntable.Route{0: {hop("a", 1)}, 1: {hop("b", 3), hop("a", 4)}})
	devs := openJob(t, jobSpec{n: 5, subs: []string{"a", "b"}, factories: factories, tableOf: tables,
		forward: ForwardOptions{Retry: -1}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 6 {
		size := []int{4000, 10, 3000}[i%3]
		rr := must(t)(devs[2].Irecv(make([]byte, size), 0, i, 5))
		if err := devs[0].Send(ctx, numbered(size, 0, i), 2, i, 5, false); err != nil {
			t.Fatalf("send %d: %v (gateway 1 lost %d blocks)", i, err, devs[1].ForwardStats().Lost)
		}
		if _, err := wait(t, rr); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLostBurstCutsBriefly: a short outage beyond gateway 1 loses several
// blocks; only the first notice cuts the source's trunk through 1 (the
// others name blocks already sent again through gateway 2), so the cut
// lasts its first pause, not up to 30 s. Once the outage is over and
// gateway 2 dies, the line goes on through gateway 1.
func TestLostBurstCutsBriefly(t *testing.T) {
	fabs, factories := map[string]*sditest.Fabric{}, map[string]sdi.Factory{}
	for _, name := range []string{"a", "b"} {
		fab := sditest.NewFabric(sditest.LoopbackOptions{Name: name, Caps: fwdCaps})
		fabs[name], factories[name] = fab, func(log hclog.Logger) sdi.SubDevice { return fab.New(log) }
	}
	tables := viaTables("a", 4, map[int][]conntable.Route{0: {hop("a", 1), hop("a", 2)}, 1: {hop("b", 3)}})
	devs := openJob(t, jobSpec{n: 5, subs: []string{"a", "b"}, factories: factories, tableOf: tables,
		forward: ForwardOptions{Retry: 50 * time.Millisecond}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	send := func(i, size int) error {
		rr := must(t)(devs[4].Irecv(make([]byte, size), 0, i, 5))
		if err := devs[0].Send(ctx, numbered(size, 0, i), 4, i, 5, false); err != nil {
			return err
		}
		_, err := wait(t, rr)
		return err
	}
	fabs["b"].Sever(3) // gateway 1 loses its way on, briefly
	var reqs []*Request
	for i := range 20 { // a burst: blocks in flight over both trunks
		reqs = append(reqs, must(t)(devs[4].Irecv(make([]byte, 400), 0, 100+i, 5)))
		reqs = append(reqs, must(t)(devs[0].Isend(numbered(400, 0, i), 4, 100+i, 5, false)))
	}
	waitAll(t, reqs)
	fabs["b"].Mend(3)
	time.Sleep(3 * time.Second) // gateway 1 revived its trunk long ago; the source's first pause is 1 s
	fabs["a"].Kill(2)           // the other gateway dies
	time.Sleep(100 * time.Millisecond)
	if err := send(1, 10); err != nil {
		t.Fatalf("after the outage beyond gateway 1 ended (it lost %d blocks): %v", devs[1].ForwardStats().Lost, err)
	}
}

// TestLostNoticeThroughGateways: 0 -a-> 1 -b-> 2 -c-> 3, and gateway 2
// reaches the source 0 only through 1. Gateway 2 loses its link to 3; its
// notice travels back through 1, and the source's send fails with its
// reason.
func TestLostNoticeThroughGateways(t *testing.T) {
	fabs, factories := map[string]*sditest.Fabric{}, map[string]sdi.Factory{}
	for _, name := range []string{"a", "b", "c"} {
		fab := sditest.NewFabric(sditest.LoopbackOptions{Name: name, Caps: fwdCaps})
		fabs[name], factories[name] = fab, func(log hclog.Logger) sdi.SubDevice { return fab.New(log) }
	}
	all := func(sub string) conntable.Entry {
		return conntable.Entry{To: "*", Routes: map[string][]conntable.Route{"*": {{SubDevice: sub}}}}
	}
	to := func(r int, routes ...conntable.Route) conntable.Entry {
		return conntable.Entry{To: fmt.Sprint("rank:", r), Routes: map[string][]conntable.Route{"*": routes}}
	}
	tables := map[int]*conntable.Table{
		0: {Version: 1, Peers: []conntable.Entry{all("a"), to(3, hop("a", 1)), to(2, hop("a", 1))}},
		1: {Version: 1, Peers: []conntable.Entry{all("a"), to(2, conntable.Route{SubDevice: "b"}), to(3, hop("b", 2))}},
		2: {Version: 1, Peers: []conntable.Entry{all("c"), to(1, conntable.Route{SubDevice: "b"}), to(0, hop("b", 1))}},
		3: {Version: 1, Peers: []conntable.Entry{all("a"), to(2, conntable.Route{SubDevice: "c"}), to(1, conntable.Route{SubDevice: "a"}), to(0, conntable.Route{SubDevice: "a"})}},
	}
	devs := openJob(t, jobSpec{n: 4, subs: []string{"a", "b", "c"}, factories: factories,
		tableOf: func(r int) *conntable.Table { return tables[r] }, forward: ForwardOptions{Retry: -1}})
	fabs["c"].Sever(3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	must(t)(devs[3].Irecv(make([]byte, 10), 0, 1, 5))
	err := devs[0].Send(ctx, numbered(10, 0, 1), 3, 1, 5, true)
	if err == nil || !strings.Contains(err.Error(), "gateway rank 2 lost a block") {
		t.Fatalf("Ssend = %v (gateway 2 lost %d)", err, devs[2].ForwardStats().Lost)
	}
}

// TestWatchKeepsGatewayWithinWindow: ForwardOptions.Window promises that
// a gateway holds at most Window bytes of a line plus one block. A
// destination that stalls for 4 s (slow, not cut off) gets one copy of
// its oldest block from the source's watch, not one per look: each would
// sit in the gateway beyond the window.
func TestWatchKeepsGatewayWithinWindow(t *testing.T) {
	const block, window = 2000, 2 * (2000 + 64)
	caps := fwdCaps
	caps.MaxEager = 4096
	sites := []int{0, 1, -1}
	sn := &stallNet{inner: &cutNet{fab: sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: caps, QueueLimit: 2}), cut: siteCut(sites)}, rank: 1}
	devs := openJob(t, jobSpec{n: 3, subs: []string{"loop"}, factories: map[string]sdi.Factory{"loop": sn.New}, relays: 1,
		forward: ForwardOptions{BlockSize: block, Window: window}})
	sn.until.Store(time.Now().Add(4 * time.Second).UnixNano()) // rank 1 stops handling frames for 4 s
	var reqs []*Request
	for i := range 4 {
		reqs = append(reqs, must(t)(devs[1].Irecv(make([]byte, 1990), 0, i, 9)))
		reqs = append(reqs, must(t)(devs[0].Isend(numbered(1990, 0, i), 1, i, 9, false)))
	}
	waitAll(t, reqs)
	st := devs[2].ForwardStats()
	if bound := int64(window + block + headerSize); st.MaxHeld > bound {
		t.Fatalf("relay held %d bytes, more than the window %d plus one block (%d); rank 0 nudged %d", st.MaxHeld, window, bound, devs[0].ForwardStats().Nudged)
	}
}

// stallNet makes one rank's Deliver wait until a time, as a destination
// that stops handling frames for a while.
type stallNet struct {
	inner *cutNet
	rank  int
	until atomic.Int64 // unix nanoseconds
}

func (n *stallNet) New(log hclog.Logger) sdi.SubDevice {
	return &stallSub{SubDevice: n.inner.New(log), n: n}
}

type stallSub struct {
	sdi.SubDevice
	n *stallNet
}

func (s *stallSub) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	if int(p.Rank) == s.n.rank {
		p.Handler = stallHandler{Handler: p.Handler, n: s.n}
	}
	return s.SubDevice.Open(ctx, p)
}

type stallHandler struct {
	sdi.Handler
	n *stallNet
}

func (h stallHandler) Deliver(from sdi.Rank, hdr, payload []byte) {
	time.Sleep(time.Until(time.Unix(0, h.n.until.Load())))
	h.Handler.Deliver(from, hdr, payload)
}

// TestNudgeTakesAnotherGateway: gateway 1's link to the destination dies
// as tcp's does: for a while it takes frames and loses them unknowing,
// then reports the peer down. The source's watch sends the oldest block
// again; its first copy went through gateway 1 in that while and was
// lost too. A line through gateways once nudged a block only once, so the
// stream stalled for good though gateway 2 was up; a later nudge now goes
// through a gateway that has no copy of the block yet.
func TestNudgeTakesAnotherGateway(t *testing.T) {
	fab := sditest.NewFabric(sditest.LoopbackOptions{Name: "a", Caps: fwdCaps})
	link := &quietLink{from: 1, to: 3, quiet: 1500 * time.Millisecond}
	factories := map[string]sdi.Factory{"a": func(log hclog.Logger) sdi.SubDevice {
		return &quietSub{SubDevice: fab.New(log), link: link}
	}}
	tables := viaTables("a", 3, map[int][]conntable.Route{0: {hop("a", 1), hop("a", 2)}})
	devs := openJob(t, jobSpec{n: 4, subs: []string{"a"}, factories: factories, tableOf: tables,
		forward: ForwardOptions{Retry: -1, BlockSize: 1000, Window: 4000}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var reqs []*Request
	for i := range 40 {
		if i == 4 {
			link.start() // blocks in flight through both gateways
		}
		reqs = append(reqs, must(t)(devs[3].Irecv(make([]byte, 900), 0, i, 5)))
		reqs = append(reqs, must(t)(devs[0].Isend(numbered(900, 0, i), 3, i, 5, false)))
	}
	for i, r := range reqs {
		if _, err := r.Wait(ctx); err != nil {
			t.Fatalf("request %d: %v (source nudged %d blocks)", i, err, devs[0].ForwardStats().Nudged)
		}
	}
}

// quietLink is the link from one rank to another dying as a tcp
// connection does: from start on, for quiet, frames are taken and lost
// without a word; then the peer is reported down and sends fail.
type quietLink struct {
	from, to sdi.Rank
	quiet    time.Duration
	since    atomic.Int64 // unix nanoseconds; 0 while the link works
}

func (l *quietLink) start() { l.since.Store(time.Now().UnixNano()) }

type quietSub struct {
	sdi.SubDevice
	link *quietLink
	rank sdi.Rank
	h    sdi.Handler
	once sync.Once
}

func (s *quietSub) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	s.rank, s.h = p.Rank, p.Handler
	return s.SubDevice.Open(ctx, p)
}

func (s *quietSub) Send(f *sdi.Frame) (bool, error) {
	since := s.link.since.Load()
	if s.rank != s.link.from || f.Peer != s.link.to || since == 0 {
		return s.SubDevice.Send(f)
	}
	if time.Since(time.Unix(0, since)) < s.link.quiet {
		return true, nil // into a socket buffer that will never drain
	}
	err := fmt.Errorf("link to rank %d timed out: %w", s.link.to, sdi.ErrPeerUnreachable)
	s.once.Do(func() { s.h.PeerDown(s.link.to, err) })
	return false, err
}

// TestEagerCreditsLostAtRelay protects a line's credits from a gateway
// that drops them (relayCutJob): rank 0 sends 400 eager messages of 400
// bytes (three windows) to rank 1, which sends no block back whose loss
// relay 3 could report, only credits. Relay 3 dropped them without a
// word, and rank 1 kept returning credits through it until rank 0's watch
// sent a block again a second later (2.3 s, against 0.16 s with relay 3
// whole). Told of each lost credit, rank 1 returns them through relay 2,
// and rank 0 never has to send a block again: the stall's mark is the
// watch's copy, counted, not the time, which the machine sets too.
func TestEagerCreditsLostAtRelay(t *testing.T) {
	devs, cut := relayCutJob(t)
	cut()
	start := time.Now()
	var reqs []*Request
	for i := range 400 {
		reqs = append(reqs, must(t)(devs[1].Irecv(make([]byte, 400), 0, 2, 0)), must(t)(devs[0].Isend(numbered(400, 0, i), 1, 2, 0, false)))
	}
	waitAll(t, reqs)
	nudged := devs[0].ForwardStats().Nudged
	t.Logf("400 eager messages in %v; source nudged %d times", time.Since(start).Round(time.Millisecond), nudged)
	if nudged != 0 {
		t.Errorf("after relay 3 lost its link to rank 0, rank 0 sent blocks again %d times: credits stopped coming", nudged)
	}
}

// TestLostCreditNotice: a notice of a lost credit (lost.go) cuts the trunk
// it names from the credits its receiver returns on the line, and a burst
// of them cuts it once, not for ever longer; one that names no trunk of
// the line, as a faulty or hostile gateway may send, changes nothing. It
// never cuts the trunk for blocks: a lost credit must not fail the line.
func TestLostCreditNotice(t *testing.T) {
	devs, _ := openSites(t, siteJob{sites: []int{0, 1, -1, -1}, relays: 2})
	d, l := devs[1], devs[1].fwd.tx[0]
	notice := func(slot uint64) {
		d.onLost(&header{kind: kindSys, tag: sysLost, src: 3, dst: 1, offset: 0, rreq: slot}, "a test's")
	}
	cuts := func() []time.Time {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.cut != nil {
			t.Errorf("a lost credit cut the line's blocks too: %v", l.cut)
		}
		return slices.Clone(l.creditCut)
	}
	for _, rreq := range []uint64{uint64(len(l.ways)) + 1, 1 << 63, math.MaxUint64} {
		if notice(rreq); cuts() != nil {
			t.Errorf("a notice naming slot %d of a line with %d cut %v", rreq-1, len(l.ways), cuts())
		}
	}
	notice(2)
	first := cuts()
	if now := time.Now(); len(first) != len(l.ways) || !first[1].After(now) || first[0].After(now) {
		t.Fatalf("after a notice naming slot 1, cuts are %v, want slot 1 alone", first)
	}
	notice(2)
	if again := cuts(); !again[1].Equal(first[1]) {
		t.Errorf("a second notice while slot 1 is cut moved its end from %v to %v", first[1], again[1])
	}
	// A loss long after the last cut ended starts from lostPause again:
	// doubled for good, brief outages left later ones waiting 30 s.
	l.mu.Lock()
	l.creditCut[1], l.creditCutFor[1] = time.Now().Add(-time.Hour), 16*time.Second
	l.mu.Unlock()
	notice(2)
	l.mu.Lock()
	pause := l.creditCutFor[1]
	l.mu.Unlock()
	if pause != lostPause {
		t.Errorf("a lost credit an hour after a 16 s cut ended cuts for %v, want %v", pause, lostPause)
	}
}

// TestNextPause: cuts double while losses follow each other, and start
// over after a quiet spell.
func TestNextPause(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name string
		last time.Duration
		end  time.Time
		want time.Duration
	}{
		{"first", 0, time.Time{}, lostPause},
		{"during the last", 2 * time.Second, now.Add(time.Second), 4 * time.Second},
		{"right after the last", 2 * time.Second, now.Add(-time.Second), 4 * time.Second},
		{"capped", retryMax, now, retryMax},
		{"after a quiet spell", 8 * time.Second, now.Add(-9 * time.Second), lostPause},
	} {
		if got := nextPause(tc.last, tc.end, now); got != tc.want {
			t.Errorf("%s: nextPause(%v, end %v ago) = %v, want %v", tc.name, tc.last, now.Sub(tc.end), got, tc.want)
		}
	}
}

// frameCountSub counts the frames rank from sends to rank to (linkCut
// does the cut).
type frameCountSub struct {
	*linkCut
	from, to int32
	n        *atomic.Int64
}

func (c frameCountSub) Send(f *sdi.Frame) (bool, error) {
	if int32(c.rank) == c.from && int32(f.Peer) == c.to {
		c.n.Add(1)
	}
	return c.linkCut.Send(f)
}

// oneRelayCutJob opens ranks 0 and 1 in two sites joined by one relay
// (2), and has 1 receive a message from 0, so that rank 1 returns credits
// on its line to 0, whose only trunk is relay 2. cut(true) makes relay 2
// fail every frame it passes on to rank 0 (no PeerDown), cut(false) ends
// that; n counts the frames rank 1 sends to relay 2.
func oneRelayCutJob(t *testing.T) (devs []*Device, cut func(bool), n *atomic.Int64) {
	at, to := new(atomic.Int32), new(atomic.Int32)
	at.Store(-1)
	to.Store(0)
	t.Cleanup(func() { at.Store(-1) })
	n = new(atomic.Int64)
	net := &cutNet{fab: sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: fwdCaps}), cut: siteCut([]int{0, 1, -1})}
	devs = openJob(t, jobSpec{n: 3, subs: []string{"loop"}, relays: 1,
		factories: map[string]sdi.Factory{"loop": func(log hclog.Logger) sdi.SubDevice {
			return frameCountSub{linkCut: &linkCut{SubDevice: net.New(log), at: at, to: to}, from: 1, to: 2, n: n}
		}},
		forward: ForwardOptions{BlockSize: 2000, Window: 64 << 10}})
	waitAll(t, []*Request{must(t)(devs[1].Irecv(make([]byte, 3000), 0, 1, 0)), must(t)(devs[0].Isend(numbered(3000, 0, 0), 1, 1, 0, false))})
	time.Sleep(50 * time.Millisecond) // its credits settle
	return devs, func(on bool) { at.Store(map[bool]int32{true: 2, false: -1}[on]) }, n
}

// TestLostCreditNoLoop protects the network from a credit and its loss
// notice chasing each other (oneRelayCutJob): with no other trunk left,
// the credit a notice had sent again went back through the relay that
// lost it, which noticed again: 16651 frames in 200 ms for one credit.
func TestLostCreditNoLoop(t *testing.T) {
	devs, cut, n := oneRelayCutJob(t)
	cut(true)
	defer cut(false) // before Close
	waitAll(t, []*Request{must(t)(devs[1].Irecv(make([]byte, 100), 0, 2, 0)), must(t)(devs[0].Isend(numbered(100, 0, 1), 1, 2, 0, false))})
	before := n.Load()
	time.Sleep(200 * time.Millisecond)
	if sent := n.Load() - before; sent > 50 {
		t.Errorf("in 200 ms with one credit to return, rank 1 sent relay 2 %d frames", sent)
	}
}

// TestLostCreditKeepsPeer: a lost credit alone must not cost a rank its
// peer (oneRelayCutJob). Rank 1 only returned credits while relay 2 could
// not reach rank 0; the notices cut relay 2 from rank 1's line for blocks
// too, for a pause doubling with each, so rank 1's line failed at its next
// send, 200 ms after relay 2 reached 0 again, and rank 0 was lost for good.
func TestLostCreditKeepsPeer(t *testing.T) {
	devs, cut, _ := oneRelayCutJob(t)
	cut(true)
	waitAll(t, []*Request{must(t)(devs[1].Irecv(make([]byte, 100), 0, 2, 0)), must(t)(devs[0].Isend(numbered(100, 0, 1), 1, 2, 0, false))})
	time.Sleep(20 * time.Millisecond)
	cut(false)
	time.Sleep(200 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rr := must(t)(devs[0].Irecv(make([]byte, 100), 1, 3, 0))
	if _, err := must(t)(devs[1].Isend(numbered(100, 1, 0), 0, 3, 0, false)).Wait(ctx); err != nil {
		t.Fatalf("rank 1's send to 0, 200 ms after relay 2 reaches 0 again: %v", err)
	}
	if _, err := rr.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestLostCreditSentAfterHeal: relay 2, the only route, cannot pass
// frames on to rank 0 for a while, so rank 1's credit for rank 0's block
// is lost there and noticed. It must go again once the relay reaches rank
// 0: the source's watch sends a block through each trunk once, and after
// an outage longer than that the block stayed uncredited for good (a
// send waiting for it hung).
func TestLostCreditSentAfterHeal(t *testing.T) {
	devs, cut, _ := oneRelayCutJob(t)
	cut(true)
	waitAll(t, []*Request{must(t)(devs[1].Irecv(make([]byte, 100), 0, 2, 0)), must(t)(devs[0].Isend(numbered(100, 0, 1), 1, 2, 0, false))})
	time.Sleep(2500 * time.Millisecond) // past the watch's one copy per trunk
	cut(false)
	l := devs[0].fwd.tx[1]
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		l.mu.Lock()
		n, nudges := len(l.retained), l.nudges
		l.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after relay 2 reaches rank 0 again, rank 0 still retains %d block(s) to rank 1, never credited (%d nudges)", n, nudges)
		}
	}
}
