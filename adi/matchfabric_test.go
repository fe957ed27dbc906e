package adi_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/conntable"
	"github.com/hpc-multidevice/multidevice/multidevice"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// matchFabric is an in-memory subdevice that matches on its own
// (sdi.FlagMatching), a copy of multidevice/matchdev_test.go's tmFabric
// (test files do not cross packages) with Kill added. The windows' tests
// use it because a window's server takes its requests with a matched
// probe, which a matching subdevice's messages do not allow, and because
// such a subdevice's messages are probed at the subdevice, not in the
// device's own queues.
type matchFabric struct {
	mu   sync.Mutex
	devs map[sdi.Rank]*matchDev
	dead map[sdi.Rank]bool
}

func newMatchFabric() *matchFabric {
	return &matchFabric{devs: map[sdi.Rank]*matchDev{}, dead: map[sdi.Rank]bool{}}
}

func (f *matchFabric) New(hclog.Logger) sdi.SubDevice {
	return &matchDev{f: f, wake: make(chan struct{}, 1), quit: make(chan struct{}), claimID: rand.Int64N(1<<40) + 100}
}

var errMatchPeerKilled = errors.New("matchfabric: peer killed")

// Kill cuts rank r off, as sditest.Fabric.Sever does: nothing more goes
// to or comes from it, every other rank gets PeerDown for it, and it
// gets PeerDown for every other rank.
func (f *matchFabric) Kill(r sdi.Rank) {
	f.mu.Lock()
	f.dead[r] = true
	self := f.devs[r]
	others := make(map[sdi.Rank]*matchDev)
	for rr, d := range f.devs {
		if rr != r {
			others[rr] = d
		}
	}
	f.mu.Unlock()
	for rr, d := range others {
		d.post(func() { d.h.PeerDown(r, errMatchPeerKilled) })
		self.post(func() { self.h.PeerDown(rr, errMatchPeerKilled) })
	}
}

func (f *matchFabric) isDead(r sdi.Rank) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dead[r]
}

type matchMsg struct {
	env     sdi.Envelope
	data    []byte
	onMatch func()
}

type matchDev struct {
	f       *matchFabric
	rank    sdi.Rank
	h       sdi.Handler
	claimID int64

	mu         sync.Mutex
	posted     []*sdi.PostedRecv
	unexpected []*matchMsg
	jobs       []func()
	closed     bool

	wake chan struct{}
	quit chan struct{}
	wg   sync.WaitGroup
}

func (d *matchDev) Info(context.Context) (sdi.Info, error) {
	return sdi.Info{Name: "tm", APIVersions: []string{sdi.APIVersion}}, nil
}

func (d *matchDev) Open(_ context.Context, p sdi.OpenParams) (sdi.Local, error) {
	d.rank, d.h = p.Rank, p.Handler
	d.f.mu.Lock()
	d.f.devs[p.Rank] = d
	d.f.mu.Unlock()
	d.wg.Add(1)
	go d.run()
	return sdi.Local{Addr: []byte{1}, Caps: sdi.Caps{MaxHeader: 128, MaxEager: 1 << 20, MaxFrame: 1 << 20,
		Reach: sdi.ReachNetwork, Flags: sdi.FlagReliable | sdi.FlagOrdered | sdi.FlagMatching}}, nil
}

func (d *matchDev) post(fn func()) {
	d.mu.Lock()
	d.jobs = append(d.jobs, fn)
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *matchDev) run() {
	defer d.wg.Done()
	for {
		select {
		case <-d.wake:
		case <-d.quit:
			return
		}
		d.mu.Lock()
		jobs := d.jobs
		d.jobs = nil
		d.mu.Unlock()
		for _, j := range jobs {
			j()
		}
	}
}

func (d *matchDev) peer(r sdi.Rank) *matchDev {
	d.f.mu.Lock()
	defer d.f.mu.Unlock()
	return d.f.devs[r]
}

func (d *matchDev) Connect(context.Context, sdi.Rank, []byte) error { return nil }
func (d *matchDev) Disconnect(context.Context, sdi.Rank) error      { return nil }
func (d *matchDev) Flush(context.Context, sdi.Rank) error           { return nil }

func (d *matchDev) Send(f *sdi.Frame) (bool, error) {
	if d.f.isDead(f.Peer) || d.f.isDead(d.rank) {
		return true, errMatchPeerKilled
	}
	p := d.peer(f.Peer)
	hdr, pl := slices.Clone(f.Header), slices.Clone(f.Payload)
	from := d.rank
	p.post(func() { p.h.Deliver(from, hdr, pl) })
	return true, nil
}

func (d *matchDev) SendTagged(m *sdi.TaggedMessage) (bool, error) {
	if d.f.isDead(m.Peer) || d.f.isDead(d.rank) {
		return true, errMatchPeerKilled
	}
	p := d.peer(m.Peer)
	msg := &matchMsg{env: sdi.Envelope{Source: d.rank, Tag: m.Tag, Context: m.Context, Len: len(m.Payload)}, data: slices.Clone(m.Payload)}
	if m.Sync {
		token := m.Token
		msg.onMatch = func() { d.post(func() { d.h.SendDone(token, nil) }) }
	}
	p.post(func() { p.arrive(msg) })
	return !m.Sync, nil
}

func matchFabricMatches(p *sdi.PostedRecv, e sdi.Envelope) bool {
	return p.Context == e.Context && (p.Source == sdi.AnySource || p.Source == e.Source) && (p.Tag == sdi.AnyTag || p.Tag == e.Tag)
}

func (d *matchDev) arrive(m *matchMsg) {
	d.mu.Lock()
	for i := 0; i < len(d.posted); {
		p := d.posted[i]
		if !matchFabricMatches(p, m.env) {
			i++
			continue
		}
		d.posted = slices.Delete(d.posted, i, i+1)
		if p.Claim != nil && !p.Claim.TryClaim(d.claimID) {
			continue
		}
		d.mu.Unlock()
		d.fill(p, m)
		return
	}
	d.unexpected = append(d.unexpected, m)
	d.mu.Unlock()
}

func (d *matchDev) fill(p *sdi.PostedRecv, m *matchMsg) {
	n := copy(p.Buf, m.data)
	p.Done(m.env, n, nil)
	if m.onMatch != nil {
		m.onMatch()
	}
}

func (d *matchDev) PostRecv(p *sdi.PostedRecv) error {
	if p.Claim != nil && p.Claim.Owner() != 0 {
		return nil
	}
	d.mu.Lock()
	for i, m := range d.unexpected {
		if !matchFabricMatches(p, m.env) {
			continue
		}
		if p.Claim != nil && !p.Claim.TryClaim(d.claimID) {
			d.mu.Unlock()
			return nil
		}
		d.unexpected = slices.Delete(d.unexpected, i, i+1)
		d.mu.Unlock()
		d.post(func() { d.fill(p, m) })
		return nil
	}
	d.posted = append(d.posted, p)
	d.mu.Unlock()
	return nil
}

func (d *matchDev) CancelRecv(id uint64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, p := range d.posted {
		if p.ID == id {
			d.posted = slices.Delete(d.posted, i, i+1)
			return true
		}
	}
	return false
}

func (d *matchDev) Probe(src sdi.Rank, tag int32, ctx uint64) (sdi.Envelope, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	probe := &sdi.PostedRecv{Source: src, Tag: tag, Context: ctx}
	for _, m := range d.unexpected {
		if matchFabricMatches(probe, m.env) {
			return m.env, true
		}
	}
	return sdi.Envelope{}, false
}

func (d *matchDev) Close(context.Context) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	close(d.quit)
	d.wg.Wait()
	return nil
}

// matchWorlds starts n in-process ranks whose traffic all goes over a
// matchFabric, and returns them with the fabric.
func matchWorlds(t testing.TB, n int) ([]*adi.World, *matchFabric) {
	f := newMatchFabric()
	ws := jobEach(t, n, nil, func(r int) []adi.Option {
		return []adi.Option{adi.WithSubDevice("tm", f.New),
			adi.WithPlugins(&multidevice.PluginsConfig{SubDevices: []multidevice.SubDeviceSpec{{Name: "tm", Enabled: true}}}),
			adi.WithConnTable(&conntable.Table{Version: conntable.Version, Peers: []conntable.Entry{{To: conntable.SelectAll, Routes: map[string][]conntable.Route{conntable.AllClasses: {{SubDevice: "tm"}}}}}})}
	})
	return ws, f
}
