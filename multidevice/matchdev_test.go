package multidevice

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// tmFabric is an in-memory subdevice that matches on its own
// (sdi.FlagMatching), standing in for a hardware tag-matching transport. It
// exists to exercise the duplicated-request ANY_SOURCE path.
type tmFabric struct {
	mu   sync.Mutex
	devs map[sdi.Rank]*tmDev
}

func newTMFabric() *tmFabric { return &tmFabric{devs: map[sdi.Rank]*tmDev{}} }

func (f *tmFabric) New(hclog.Logger) sdi.SubDevice {
	return &tmDev{f: f, wake: make(chan struct{}, 1), quit: make(chan struct{}), claimID: rand.Int64N(1<<40) + 100}
}

type tmMsg struct {
	env     sdi.Envelope
	data    []byte
	onMatch func()
}

type tmDev struct {
	f       *tmFabric
	rank    sdi.Rank
	h       sdi.Handler
	claimID int64

	mu         sync.Mutex
	posted     []*sdi.PostedRecv
	unexpected []*tmMsg
	jobs       []func()
	closed     bool

	wake chan struct{}
	quit chan struct{}
	wg   sync.WaitGroup
}

func (d *tmDev) Info(context.Context) (sdi.Info, error) {
	return sdi.Info{Name: "tm", APIVersions: []string{sdi.APIVersion}}, nil
}

func (d *tmDev) Open(_ context.Context, p sdi.OpenParams) (sdi.Local, error) {
	d.rank, d.h = p.Rank, p.Handler
	d.f.mu.Lock()
	d.f.devs[p.Rank] = d
	d.f.mu.Unlock()
	d.wg.Add(1)
	go d.run()
	return sdi.Local{Addr: []byte{1}, Caps: sdi.Caps{MaxHeader: 128, MaxEager: 1 << 20, MaxFrame: 1 << 20,
		Reach: sdi.ReachNetwork, Flags: sdi.FlagReliable | sdi.FlagOrdered | sdi.FlagMatching}}, nil
}

// post queues work for the device's goroutine, the only caller of Handler
// methods and Done.
func (d *tmDev) post(fn func()) {
	d.mu.Lock()
	d.jobs = append(d.jobs, fn)
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *tmDev) run() {
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

func (d *tmDev) peer(r sdi.Rank) *tmDev {
	d.f.mu.Lock()
	defer d.f.mu.Unlock()
	return d.f.devs[r]
}

func (d *tmDev) Connect(context.Context, sdi.Rank, []byte) error { return nil }
func (d *tmDev) Disconnect(context.Context, sdi.Rank) error      { return nil }
func (d *tmDev) Flush(context.Context, sdi.Rank) error           { return nil }

func (d *tmDev) Send(f *sdi.Frame) (bool, error) {
	p := d.peer(f.Peer)
	hdr, pl := slices.Clone(f.Header), slices.Clone(f.Payload)
	from := d.rank
	p.post(func() { p.h.Deliver(from, hdr, pl) })
	return true, nil
}

func (d *tmDev) SendTagged(m *sdi.TaggedMessage) (bool, error) {
	p := d.peer(m.Peer)
	msg := &tmMsg{env: sdi.Envelope{Source: d.rank, Tag: m.Tag, Context: m.Context, Len: len(m.Payload)}, data: slices.Clone(m.Payload)}
	if m.Sync {
		token := m.Token
		msg.onMatch = func() { d.post(func() { d.h.SendDone(token, nil) }) }
	}
	p.post(func() { p.arrive(msg) })
	return !m.Sync, nil
}

func tmMatches(p *sdi.PostedRecv, e sdi.Envelope) bool {
	return p.Context == e.Context && (p.Source == sdi.AnySource || p.Source == e.Source) && (p.Tag == sdi.AnyTag || p.Tag == e.Tag)
}

func (d *tmDev) arrive(m *tmMsg) {
	d.mu.Lock()
	for i := 0; i < len(d.posted); {
		p := d.posted[i]
		if !tmMatches(p, m.env) {
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

func (d *tmDev) fill(p *sdi.PostedRecv, m *tmMsg) {
	n := copy(p.Buf, m.data)
	p.Done(m.env, n, nil)
	if m.onMatch != nil {
		m.onMatch()
	}
}

func (d *tmDev) PostRecv(p *sdi.PostedRecv) error {
	if p.Claim != nil && p.Claim.Owner() != 0 {
		return nil
	}
	d.mu.Lock()
	for i, m := range d.unexpected {
		if !tmMatches(p, m.env) {
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

func (d *tmDev) CancelRecv(id uint64) bool {
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

func (d *tmDev) Probe(src sdi.Rank, tag int32, ctx uint64) (sdi.Envelope, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	probe := &sdi.PostedRecv{Source: src, Tag: tag, Context: ctx}
	for _, m := range d.unexpected {
		if tmMatches(probe, m.env) {
			return m.env, true
		}
	}
	return sdi.Envelope{}, false
}

func (d *tmDev) Close(context.Context) error {
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
