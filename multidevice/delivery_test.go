package multidevice

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/conntable"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// toggleSlowSub delays the frames its rank receives by *pause (0: none),
// so that a route measured fast can turn slow mid-job.
type toggleSlowSub struct {
	countingSub
	pause *atomic.Int64
}

func (s toggleSlowSub) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	p.Handler = toggleSlowHandler{p.Handler, s.pause}
	return s.countingSub.Open(ctx, p)
}

type toggleSlowHandler struct {
	sdi.Handler
	pause *atomic.Int64
}

func (h toggleSlowHandler) Deliver(from sdi.Rank, hdr, payload []byte) {
	if p := h.pause.Load(); p > 0 {
		time.Sleep(time.Duration(p))
	}
	h.Handler.Deliver(from, hdr, payload)
}

// relayCutJob opens ranks 0 and 1 in different sites, linked by relays 2
// (slow: 2 ms a frame) and 3, and sends 256 KiB from rank 1 to 0, so that
// rank 1's line to 0 measured the trunk through 3 fastest and its credits
// take it. cut then makes relay 3 fail every frame it passes on to rank
// 0, without PeerDown: credits from rank 1 that take it are lost there.
func relayCutJob(t *testing.T) (devs []*Device, cut func()) {
	at, to := new(atomic.Int32), new(atomic.Int32)
	at.Store(-1)
	to.Store(-1)
	t.Cleanup(func() { at.Store(-1) })
	net := &cutNet{fab: sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: fwdCaps}),
		cut: siteCut([]int{0, 1, -1, -1}), slowRank: 2, slow: 2 * time.Millisecond}
	devs = openJob(t, jobSpec{n: 4, subs: []string{"loop"}, relays: 2,
		factories: map[string]sdi.Factory{"loop": func(log hclog.Logger) sdi.SubDevice {
			return &linkCut{SubDevice: net.New(log), at: at, to: to}
		}},
		forward: ForwardOptions{BlockSize: 2000, Window: 64 << 10}})
	const size = 256 << 10
	waitAll(t, []*Request{must(t)(devs[0].Irecv(make([]byte, size), 1, 1, 0)), must(t)(devs[1].Isend(numbered(size, 1, 0), 0, 1, 0, false))})
	return devs, func() {
		to.Store(0)
		at.Store(3)
	}
}

// TestCreditWayAvoidsLosingTrunk protects credits from a trunk that
// swallows them (relayCutJob). Credits from rank 1 that kept taking the
// trunk with the least srtt all vanished, and a 256 KiB message from 0
// to 1 crawled on nudges (over 5 s, 1 MiB took 116 s). Relay 3 now tells
// rank 1 of each credit it loses (lost.go); before that, once a nudge's
// copy showed a credit missing (after about a second through gateways),
// credits avoided that trunk.
func TestCreditWayAvoidsLosingTrunk(t *testing.T) {
	devs, cut := relayCutJob(t)
	cut()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	const size = 256 << 10
	start := time.Now()
	rr := must(t)(devs[1].Irecv(make([]byte, size), 0, 2, 0))
	sr := must(t)(devs[0].Isend(numbered(size, 0, 1), 1, 2, 0, false))
	if _, err := rr.Wait(ctx); err != nil {
		t.Fatalf("256 KiB from rank 0 to 1 after relay 3 lost its link to 0: %v after %v; source %+v", err, time.Since(start), devs[0].ForwardStats())
	}
	t.Logf("256 KiB in %v; source %+v", time.Since(start), devs[0].ForwardStats())
	waitAll(t, []*Request{sr})
}

// TestStandbyCarriesNoCredits protects doc.go's promise that "a route on
// standby carries nothing while one that is not lives", credits included:
// while route a was severed, rank 1 sent to rank 0 over standby b (so only
// b has a delivery time measured); once a is back, the credits rank 1
// returns for rank 0's stream must not take b.
func TestStandbyCarriesNoCredits(t *testing.T) {
	devs, fabs, sends := failoverJobOpts(t, 2, true, true, fwdCaps,
		ForwardOptions{BlockSize: 2000, Window: 32 << 10, Retry: 20 * time.Millisecond})
	fabs["a"].Sever(1)
	for i := range 5 {
		waitAll(t, []*Request{must(t)(devs[0].Irecv(make([]byte, 3000), 1, 1, 0)), must(t)(devs[1].Isend(numbered(3000, 1, i), 0, 1, 0, false))})
	}
	fabs["a"].Mend(1)
	for r := range devs {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if sub, _, _ := devs[r].Path(1-r, 100); sub == "a" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("rank %d: a never came back", r)
			}
		}
	}
	b := sends["b"].Load()
	var reqs []*Request
	for i := range 200 { // eager: rank 1 sends nothing back but credits
		reqs = append(reqs, must(t)(devs[1].Irecv(make([]byte, 100), 0, 2, 0)), must(t)(devs[0].Isend(numbered(100, 0, i), 1, 2, 0, false)))
	}
	waitAll(t, reqs)
	if n := sends["b"].Load() - b; n != 0 {
		t.Errorf("the standby route carried %d frames after the first came back", n)
	}
}

// TestMovedBlocksStillReported protects the source's per-slot byte counts
// from blocks that arrived but whose credit was lost: slot 0's trunk dies
// and resendLocked moves them to slot 1, yet the destination still counts
// them through slot 0. Once slot 0 is back and a new block is on its way,
// a report that does not include that block yet must not make the source
// believe slot 0 delivered it (nor time a delivery).
func TestMovedBlocksStillReported(t *testing.T) {
	const n = 2064
	l := &txLine{load: make([]int, 2), stats: make([]wayStat, 2)}
	var rx rxLine
	for range 3 { // sent over slot 0, arrived; the credit is lost
		l.load[0] += n
		l.sending(0, n, true)
		rx.count(1, n)
	}
	var ends []uint64
	for range 3 { // slot 0 dies: resendLocked moves them
		l.load[0] -= n
		l.moved(0)
		l.load[1] += n
		ends = append(ends, l.sending(1, n, true))
		rx.count(2, n) // the copies arrive (and are dropped as duplicates)
	}
	for _, e := range ends { // onCredit releases them
		l.load[1] -= n
		l.delivered(1, e, time.Now())
	}
	l.settle()
	// Slot 0 is back and takes a block, still on its way when a report
	// (blocks arrive out of order) leaves the destination.
	l.load[0] += n
	l.sending(0, n, true)
	time.Sleep(10 * time.Millisecond)
	counts, err := decodeReport(nil, appendReport(nil, rx.got))
	if err != nil {
		t.Fatal(err)
	}
	for s, c := range counts {
		l.delivered(s, c, time.Now())
	}
	l.settle()
	if c, w := l.carrying(0), l.stats[0]; c != n || w.srtt != 0 {
		t.Errorf("slot 0 carries %d bytes (want %d: its block is on its way), delivery time measured %v (want none yet); report %v, slot 0 sent %d", c, n, w.srtt, rx.got, w.sent)
	}
}

// TestStaleRate protects striping from delivery measures gone stale:
// route b is severed while rank 0 sends 2 MiB to rank 1 over a, so a is
// measured fast; b comes back and a turns slow (2 ms a frame). The slow
// route must take few frames (under half of b's: the counts include rank
// 1's credits, some of which go over a; 200-300 against about 1055 in
// runs here, 1916 against 177 with the defect): neither blocks at the rate a used to have (each
// sample moved it by a quarter only) nor credits by the delivery time
// rank 1 measured of a before b came back (b never measured; the line
// then moved at the pace of a's credits).
func TestStaleRate(t *testing.T) {
	if runtime.GOMAXPROCS(0) == 1 {
		// Both ranks live in this process: on one processor their
		// scheduling, not the routes, sets the delivery times the
		// source measures (the slow route got 1541 frames against 559
		// under taskset -c 0), which no rank of a real job, a process
		// of its own, sees.
		t.Skip("needs two processors: the routes, not the ranks' scheduling, must set the delivery times")
	}
	pause := new(atomic.Int64)
	fabs, sends := map[string]*sditest.Fabric{}, map[string]*atomic.Int64{}
	factories := map[string]sdi.Factory{}
	for _, name := range []string{"a", "b"} {
		fab, count := sditest.NewFabric(sditest.LoopbackOptions{Name: name, Caps: fwdCaps}), new(atomic.Int64)
		fabs[name], sends[name] = fab, count
		p := new(atomic.Int64)
		if name == "a" {
			p = pause
		}
		factories[name] = func(log hclog.Logger) sdi.SubDevice {
			return toggleSlowSub{countingSub{fab.New(log), count}, p}
		}
	}
	table := &conntable.Table{Version: conntable.Version, Peers: []conntable.Entry{{
		To: conntable.SelectAll, Failover: true,
		Routes: map[string][]conntable.Route{conntable.AllClasses: {{SubDevice: "a"}, {SubDevice: "b"}}},
	}}}
	devs := openJob(t, jobSpec{n: 2, subs: []string{"a", "b"}, factories: factories, table: table,
		forward: ForwardOptions{BlockSize: 2000, Window: 64 << 10, Retry: 20 * time.Millisecond}})
	const size = 2 << 20
	fabs["b"].Sever(1)
	waitAll(t, []*Request{must(t)(devs[1].Irecv(make([]byte, size), 0, 1, 0)), must(t)(devs[0].Isend(numbered(size, 0, 0), 1, 1, 0, false))})
	fabs["b"].Mend(1)
	tx := devs[0].fwd.tx[1]
	for deadline := time.Now().Add(10 * time.Second); devs[0].fwd.isDead(tx.ways[1]); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("b never came back")
		}
	}
	pause.Store(int64(2 * time.Millisecond))
	a0, b0 := sends["a"].Load(), sends["b"].Load()
	start := time.Now()
	waitAll(t, []*Request{must(t)(devs[1].Irecv(make([]byte, size), 0, 2, 0)), must(t)(devs[0].Isend(numbered(size, 0, 1), 1, 2, 0, false))})
	a, b := sends["a"].Load()-a0, sends["b"].Load()-b0
	t.Logf("frames a %d b %d; 2 MiB in %v", a, b, time.Since(start).Round(time.Millisecond))
	if 2*a > b {
		t.Errorf("the slow route (2 ms a frame) carried %d frames, the fast one %d", a, b)
	}
}

// TestFreshLineSpreadsBlocks protects a new line from its first trunk in
// route order: ranks 0 and 1 in different sites, linked by relays 2
// (slow: 2 ms a frame) and 3. While no trunk of rank 0's line to 1 was
// measured, every trunk with a block in flight would finish never
// (txLine.finish), all tied, and the slow relay, first, took 258 frames
// of the first 256 KiB against the fast one's 8. With the default 64 KiB
// blocks through gateways, a sample's bytes or more each, one block in
// flight still made a trunk finish never, and the slow relay took 15 of
// 16 blocks (and taken in turn, a slow network got half of a new line's
// window): with every trunk at that, the line waits for a credit.
func TestFreshLineSpreadsBlocks(t *testing.T) {
	for _, tc := range []struct {
		name     string
		forward  ForwardOptions
		maxFrame int
		size     int
	}{
		{"2000-byte blocks", ForwardOptions{BlockSize: 2000, Window: 64 << 10}, 0, 256 << 10},
		{"default blocks", ForwardOptions{}, 1 << 20, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			devs, _ := openSites(t, siteJob{sites: []int{0, 1, -1, -1}, relays: 2, slowRank: 2, slow: 2 * time.Millisecond,
				forward: tc.forward, maxFrame: tc.maxFrame})
			start := time.Now()
			waitAll(t, []*Request{must(t)(devs[1].Irecv(make([]byte, tc.size), 0, 1, 0)), must(t)(devs[0].Isend(numbered(tc.size, 0, 1), 1, 1, 0, false))})
			slow, fast := devs[2].ForwardStats(), devs[3].ForwardStats()
			t.Logf("%d KiB in %v; slow relay passed %d frames, fast one %d", tc.size>>10, time.Since(start).Round(time.Millisecond), slow.Forwarded, fast.Forwarded)
			if slow.Bytes > 2*fast.Bytes {
				t.Errorf("the slow relay (2 ms a frame) passed %d bytes (%d frames), the fast one %d (%d frames)", slow.Bytes, slow.Forwarded, fast.Bytes, fast.Forwarded)
			}
		})
	}
}

// rankCountSub counts the frames rank 1 sends over it and delays every
// frame its rank receives by *pause.
type rankCountSub struct {
	sdi.SubDevice
	rank  sdi.Rank
	pause *atomic.Int64
	sends *atomic.Int64
}

func (s *rankCountSub) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	s.rank = p.Rank
	p.Handler = toggleSlowHandler{p.Handler, s.pause}
	return s.SubDevice.Open(ctx, p)
}

func (s *rankCountSub) Send(f *sdi.Frame) (bool, error) {
	if s.rank == 1 {
		s.sends.Add(1)
	}
	return s.SubDevice.Send(f)
}

// TestCreditBlamesDeadTrunkOnly protects a rank that only receives from
// blaming the wrong trunk for a lost credit: failover routes a (fast) and
// b (5 ms a frame), both active. Rank 1 sends to 0 first, so its line
// measures a fastest and its credits take a; then route b dies for 50 ms
// and comes back. The credit resent for fear of b's loss blamed a, the
// trunk the previous credit took, and rank 1, which measures nothing
// while it only receives, never cleared that: its credits took b for
// good, and 3000 eager messages ran 15-20 times slower.
func TestCreditBlamesDeadTrunkOnly(t *testing.T) {
	fabs, sends := map[string]*sditest.Fabric{}, map[string]*atomic.Int64{}
	factories := map[string]sdi.Factory{}
	for _, name := range []string{"a", "b"} {
		fab, count, pause := sditest.NewFabric(sditest.LoopbackOptions{Name: name, Caps: fwdCaps}), new(atomic.Int64), new(atomic.Int64)
		if name == "b" {
			pause.Store(int64(5 * time.Millisecond))
		}
		fabs[name], sends[name] = fab, count
		factories[name] = func(log hclog.Logger) sdi.SubDevice {
			return &rankCountSub{SubDevice: fab.New(log), pause: pause, sends: count}
		}
	}
	table := &conntable.Table{Version: conntable.Version, Peers: []conntable.Entry{{
		To: conntable.SelectAll, Failover: true,
		Routes: map[string][]conntable.Route{conntable.AllClasses: {{SubDevice: "a"}, {SubDevice: "b"}}},
	}}}
	devs := openJob(t, jobSpec{n: 2, subs: []string{"a", "b"}, factories: factories, table: table,
		forward: ForwardOptions{BlockSize: 2000, Window: 64 << 10, Retry: 20 * time.Millisecond}})
	for i := range 3 { // rank 1's line to 0 measures both trunks
		waitAll(t, []*Request{must(t)(devs[0].Irecv(make([]byte, 64<<10), 1, 1, 0)), must(t)(devs[1].Isend(numbered(64<<10, 1, i), 0, 1, 0, false))})
	}
	stream := func(tag, n int) {
		var reqs []*Request
		for i := range n { // eager: rank 1 returns only credits
			reqs = append(reqs, must(t)(devs[1].Irecv(make([]byte, 400), 0, tag, 0)), must(t)(devs[0].Isend(numbered(400, 0, i), 1, tag, 0, false)))
		}
		waitAll(t, reqs)
	}
	stream(2, 200) // rank 1's credits take a, the fastest
	// Rank 0 sends nothing again when b dies, so that no copy (onForward's
	// duplicate) blames a for a lost credit before the blame expires.
	for deadline, l := time.Now().Add(5*time.Second), devs[0].fwd.tx[1]; ; time.Sleep(time.Millisecond) {
		l.mu.Lock()
		n := len(l.retained)
		l.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rank 0 still retains %d blocks to rank 1", n)
		}
	}
	tx := devs[1].fwd.tx[0]
	fabs["b"].Sever(1)
	time.Sleep(50 * time.Millisecond)
	fabs["b"].Mend(1)
	for deadline := time.Now().Add(10 * time.Second); devs[1].fwd.isDead(tx.ways[1]) || devs[0].fwd.isDead(devs[0].fwd.tx[1].ways[1]); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("route b never came back")
		}
	}
	a0, b0, start := sends["a"].Load(), sends["b"].Load(), time.Now()
	stream(3, 1000)
	a, b := sends["a"].Load()-a0, sends["b"].Load()-b0
	tx.mu.Lock()
	missed := []time.Time{tx.stats[0].missed, tx.stats[1].missed}
	tx.mu.Unlock()
	t.Logf("after b came back: rank 1 sent a %d frames, b %d; 1000 messages in %v", a, b, time.Since(start).Round(time.Millisecond))
	if a*4 < b {
		t.Errorf("after b came back, rank 1's credits took the fast route a %d times, the slow b %d (a missed until %v, b until %v)", a, b, missed[0], missed[1])
	}
}

// TestCreditBlameExpires: a trunk blamed for a lost credit (wayStat.miss)
// takes credits again after its pause, or once its delivery time is
// measured; a rank that only receives measures nothing, and a trunk it
// blamed once took none of its credits again. A burst of losses blames
// it once; a loss after the pause doubles it.
func TestCreditBlameExpires(t *testing.T) {
	devs, _ := openSites(t, siteJob{sites: []int{0, 1, -1, -1}, relays: 2})
	d, l := devs[1], devs[1].fwd.tx[0]
	l.mu.Lock()
	for s := range l.stats { // slot 0 delivers fastest
		l.stats[s].srtt = time.Duration(s+1) * time.Millisecond
	}
	now := time.Now()
	w := &l.stats[0]
	w.miss(now)
	until := w.missed
	w.miss(now.Add(time.Millisecond))
	l.mu.Unlock()
	if want := now.Add(lostPause); !until.Equal(want) || !w.missed.Equal(until) {
		t.Fatalf("blamed twice in a burst: missed until %v (after the first: %v), want %v", w.missed, until, want)
	}
	way := func() int {
		t, ok := d.creditWay(0, false)
		if !ok {
			return -1
		}
		return t.slot
	}
	if s := way(); s == 0 {
		t.Errorf("while slot 0 is blamed, a credit took it")
	}
	l.mu.Lock()
	w.missed = time.Now().Add(-time.Millisecond) // its pause is over
	l.mu.Unlock()
	if s := way(); s != 0 {
		t.Errorf("after slot 0's pause, a credit took slot %d, want the fastest, 0", s)
	}
	l.mu.Lock()
	w.miss(time.Now())
	l.mu.Unlock()
	if w.missedFor != 2*lostPause {
		t.Errorf("blamed again after its pause: pause %v, want %v", w.missedFor, 2*lostPause)
	}
	l.mu.Lock()
	w.sent, w.timed, w.timedAt = 100, 100, time.Now()
	l.delivered(0, 100, time.Now())
	l.mu.Unlock()
	if s := way(); s != 0 || !w.missed.IsZero() || w.missedFor != 0 {
		t.Errorf("after slot 0's delivery time was measured: a credit took slot %d, missed until %v, pause %v", s, w.missed, w.missedFor)
	}
}

// TestCopyNotTimed protects the watch's patience from its own waits
// (Karn's rule, as TCP's): a failover line's trunk delivers every block
// 1 ms after it leaves, but now and then the credit for the last two
// blocks sent is lost, so the watch waits its patience and sends the
// oldest again (nudge), through the same trunk or the other. Counted from
// the original's send to the credit the copy brought, a delivery time
// absorbed the watch's wait, and each loss made the next wait longer:
// after 8, the watch waited 3 s for a trunk that delivers in 1 ms.
func TestCopyNotTimed(t *testing.T) {
	const n = 2064
	for _, tc := range []struct {
		name string
		via  int // the slot the copy takes; the originals take 0
	}{
		{"copy through the same trunk", 0},
		{"copy through another trunk", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &txLine{load: make([]int, 2), stats: make([]wayStat, 2)}
			clock := time.Now()
			send := func() *block {
				l.load[0] += n
				return &block{t: trunk{slot: 0}, data: make([]byte, n-headerSize), end: l.sending(0, n, true)}
			}
			round := func(lose bool) {
				clock = clock.Add(10 * time.Millisecond)
				bs := []*block{send(), send()}
				l.stats[0].timedAt, l.stats[0].busy = clock, clock
				if lose { // the watch waits, then sends a copy of the oldest
					clock = clock.Add(l.patience(bs[0]))
					l.copying(bs[0], tc.via)
					l.load[tc.via] += n
				}
				clock = clock.Add(time.Millisecond)
				for _, b := range bs { // a credit for both, as onCredit takes it
					if !b.copied {
						l.delivered(b.t.slot, b.end, clock)
					}
					l.load[b.t.slot] -= n
				}
				if lose {
					l.load[tc.via] -= n
				}
				l.settle()
			}
			for range 5 {
				round(false)
			}
			var ps []time.Duration
			for range 8 {
				round(true)
				ps = append(ps, l.patience(&block{t: trunk{slot: 0}, end: l.stats[0].sent + n}).Round(time.Millisecond))
			}
			if p := ps[len(ps)-1]; p > 4*nudgeAfter {
				t.Errorf("trunk delivers in 1 ms, yet after 8 lost credits the watch waits %v for a block (patience after each: %v; srtt %v rttvar %v)", p, ps, l.stats[0].srtt, l.stats[0].rttvar)
			}
		})
	}
}

// TestRevivedTrunkMeasuresNewBytes protects a trunk that came back from
// the blocks it lost when it died: resendLocked moves them away, but their
// bytes stay in the slot's sent (moved), so the first credit for a block
// sent after the revival took them for delivered along with it. One block
// of 2064 bytes delivered in 10 ms was a sample of 4.3 MB/s (20 times the
// trunk's rate), and the watch waited for the lost bytes' delivery too.
func TestRevivedTrunkMeasuresNewBytes(t *testing.T) {
	const n, lost = 2064, 20
	l := &txLine{load: make([]int, 2), stats: make([]wayStat, 2)}
	// Slot 0 was measured: n bytes every 10 ms, delivered in 10 ms.
	l.stats[0].rate, l.stats[0].last = n/0.01, n/0.01
	l.stats[0].srtt, l.stats[0].rttvar = 10*time.Millisecond, time.Millisecond
	for range lost { // sent through slot 0, lost as its trunk dies
		l.load[0] += n
		l.sending(0, n, true)
	}
	for range lost { // resendLocked moves them to slot 1, which delivers
		l.load[0] -= n
		l.moved(0)
		l.load[1] += n
		l.delivered(1, l.sending(1, n, true), time.Now())
		l.load[1] -= n
	}
	l.settle()
	// Slot 0 is back and takes a block, delivered 10 ms later.
	l.load[0] += n
	b := &block{t: trunk{slot: 0}, end: l.sending(0, n, true)}
	if p := l.patience(b); p > 2*nudgeAfter {
		t.Errorf("patience for the first block after the revival = %v, want about the trunk's delivery time (10 ms, at least %v)", p, nudgeAfter)
	}
	l.stats[0].rate, l.stats[0].last = 0, 0 // the next sample alone
	l.delivered(0, b.end, l.stats[0].busy.Add(10*time.Millisecond))
	if w := l.stats[0]; w.rate > 2*n/0.01 || w.accBytes > n {
		t.Errorf("after one block of %d bytes in 10 ms: rate %.0f bytes/s, %d bytes toward the next sample", n, w.rate, w.accBytes)
	}
}
