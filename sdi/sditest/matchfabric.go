package sditest

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// MatchFabric is an in-memory network of subdevices that match on their
// own ([sdi.FlagMatching], [sdi.Matcher]), standing in for a hardware
// tag-matching transport. It is a fake for tests of code above the SDI
// (the multidevice's duplicated-request ANY_SOURCE, probes answered by the
// subdevice), not a subdevice to use: it is not checked by [Run], ignores
// JobID, Secret and business cards, and sends to a rank that never opened
// are a fault of the test.
//
// Every open [MatchDev] owns one goroutine that makes its Handler calls
// and calls Done of its receives. Send and an eager SendTagged complete at
// once; a synchronous SendTagged completes by SendDone once the receiver
// matched it. Posted and unexpected messages are kept per rank, as a
// NIC's tag-matching lists are.
//
// A MatchFabric and its subdevices are safe for concurrent use.
type MatchFabric struct {
	mu   sync.Mutex
	devs map[sdi.Rank]*MatchDev
	dead map[sdi.Rank]bool
}

// NewMatchFabric returns an empty matching network.
func NewMatchFabric() *MatchFabric {
	return &MatchFabric{devs: map[sdi.Rank]*MatchDev{}, dead: map[sdi.Rank]bool{}}
}

// New returns an unopened [*MatchDev] attached to f. Its signature makes
// f.New usable as an [sdi.Factory]; tests that change what the device
// does embed the *MatchDev it returns.
func (f *MatchFabric) New(hclog.Logger) sdi.SubDevice {
	// The claim id is random, so the devices of one rank tell apart which
	// of them won a duplicated receive, and kept clear of the small and the
	// largest ids, which the multidevice claims with for its own queue and
	// for cancellation.
	return &MatchDev{f: f, wake: make(chan struct{}, 1), quit: make(chan struct{}), claimID: rand.Int64N(1<<40) + 100}
}

// errMatchPeerKilled deliberately does not wrap sdi.ErrPeerUnreachable:
// the tests written on this fake expect a killed peer's sends to fail
// with a bare subdevice error, which the multidevice does not turn into
// its own ErrPeerDown.
var errMatchPeerKilled = errors.New("sditest: match fabric: peer killed")

// Kill cuts rank r off, as [Fabric.Sever] does: nothing more goes to or
// comes from it (Send and SendTagged fail), every other rank that opened
// gets PeerDown for it, and it gets PeerDown for every such rank. Close
// still has to be called on its device to release it.
func (f *MatchFabric) Kill(r sdi.Rank) {
	f.mu.Lock()
	f.dead[r] = true
	self := f.devs[r]
	others := make(map[sdi.Rank]*MatchDev)
	for rr, d := range f.devs {
		if rr != r {
			others[rr] = d
		}
	}
	f.mu.Unlock()
	for rr, d := range others {
		d.Post(func() { d.h.PeerDown(r, errMatchPeerKilled) })
		if self != nil {
			self.Post(func() { self.h.PeerDown(rr, errMatchPeerKilled) })
		}
	}
}

func (f *MatchFabric) isDead(r sdi.Rank) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dead[r]
}

// matchMsg is a tagged message waiting at its receiver.
type matchMsg struct {
	env  sdi.Envelope
	data []byte
	// onMatch, for a synchronous send, tells the sender it matched.
	onMatch func()
}

// MatchDev is one rank's subdevice on a [MatchFabric]; it implements
// [sdi.SubDevice] and [sdi.Matcher]. Tests embed it to override a method
// (SendTagged, PostRecv, Close, ...) and reach it through [MatchDev.Post],
// [MatchDev.Handler], [MatchDev.Rank] and [MatchDev.ClaimID].
type MatchDev struct {
	f       *MatchFabric
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

// Info names the device "tm".
func (d *MatchDev) Info(context.Context) (sdi.Info, error) {
	return sdi.Info{Name: "tm", APIVersions: []string{sdi.APIVersion}}, nil
}

// Open joins the fabric as p.Rank and starts the device's goroutine. The
// caps are reliable, ordered and matching, with 1 MiB frames.
func (d *MatchDev) Open(_ context.Context, p sdi.OpenParams) (sdi.Local, error) {
	d.rank, d.h = p.Rank, p.Handler
	d.f.mu.Lock()
	d.f.devs[p.Rank] = d
	d.f.mu.Unlock()
	d.wg.Add(1)
	go d.run()
	return sdi.Local{Addr: []byte{1}, Caps: sdi.Caps{MaxHeader: 128, MaxEager: 1 << 20, MaxFrame: 1 << 20,
		Reach: sdi.ReachNetwork, Flags: sdi.FlagReliable | sdi.FlagOrdered | sdi.FlagMatching}}, nil
}

// Rank returns the rank the device was opened as.
func (d *MatchDev) Rank() sdi.Rank { return d.rank }

// Handler returns the Handler the device was opened with. Call it only
// from a function given to [MatchDev.Post], as the device does.
func (d *MatchDev) Handler() sdi.Handler { return d.h }

// ClaimID returns the id the device takes a duplicated receive's
// [sdi.Claim] with, so an override can claim one as the device would.
func (d *MatchDev) ClaimID() int64 { return d.claimID }

// Post queues fn to run on the device's goroutine, the only caller of
// its Handler methods and of its receives' Done, after the work queued
// before it. A test uses it to make Handler calls of its own, or to keep
// the goroutine busy. Once Close returned, fn never runs.
func (d *MatchDev) Post(fn func()) {
	d.mu.Lock()
	d.jobs = append(d.jobs, fn)
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *MatchDev) run() {
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

func (d *MatchDev) peer(r sdi.Rank) *MatchDev {
	d.f.mu.Lock()
	defer d.f.mu.Unlock()
	return d.f.devs[r]
}

// Connect succeeds at once: every rank of the fabric reaches every other.
func (d *MatchDev) Connect(context.Context, sdi.Rank, []byte) error { return nil }

// Disconnect does nothing.
func (d *MatchDev) Disconnect(context.Context, sdi.Rank) error { return nil }

// Flush returns at once: every send completes when it is made.
func (d *MatchDev) Flush(context.Context, sdi.Rank) error { return nil }

// Send delivers a copy of f on the peer's goroutine and is done at once.
func (d *MatchDev) Send(f *sdi.Frame) (bool, error) {
	if d.f.isDead(f.Peer) || d.f.isDead(d.rank) {
		return true, errMatchPeerKilled
	}
	p := d.peer(f.Peer)
	hdr, pl := slices.Clone(f.Header), slices.Clone(f.Payload)
	from := d.rank
	p.Post(func() { p.h.Deliver(from, hdr, pl) })
	return true, nil
}

// SendTagged hands a copy of m to the peer, which matches it on its
// goroutine. An eager message is done at once; a synchronous one
// (m.Sync) completes by SendDone once a receive matched it.
func (d *MatchDev) SendTagged(m *sdi.TaggedMessage) (bool, error) {
	if d.f.isDead(m.Peer) || d.f.isDead(d.rank) {
		return true, errMatchPeerKilled
	}
	p := d.peer(m.Peer)
	msg := &matchMsg{env: sdi.Envelope{Source: d.rank, Tag: m.Tag, Context: m.Context, Len: len(m.Payload)}, data: slices.Clone(m.Payload)}
	if m.Sync {
		token := m.Token
		msg.onMatch = func() { d.Post(func() { d.h.SendDone(token, nil) }) }
	}
	p.Post(func() { p.arrive(msg) })
	return !m.Sync, nil
}

func matchesEnvelope(p *sdi.PostedRecv, e sdi.Envelope) bool {
	return p.Context == e.Context && (p.Source == sdi.AnySource || p.Source == e.Source) && (p.Tag == sdi.AnyTag || p.Tag == e.Tag)
}

// arrive matches m against the posted receives in posting order; copies
// of a duplicated receive whose claim another device took are dropped on
// the way, as the SDI asks.
func (d *MatchDev) arrive(m *matchMsg) {
	d.mu.Lock()
	for i := 0; i < len(d.posted); {
		p := d.posted[i]
		if !matchesEnvelope(p, m.env) {
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

func (d *MatchDev) fill(p *sdi.PostedRecv, m *matchMsg) {
	n := copy(p.Buf, m.data)
	p.Done(m.env, n, nil)
	if m.onMatch != nil {
		m.onMatch()
	}
}

// PostRecv matches p against the unexpected messages, oldest first, and
// keeps it posted if none matches. A duplicated receive already claimed
// elsewhere, or claimed elsewhere first, is dropped without Done.
func (d *MatchDev) PostRecv(p *sdi.PostedRecv) error {
	if p.Claim != nil && p.Claim.Owner() != 0 {
		return nil
	}
	d.mu.Lock()
	for i, m := range d.unexpected {
		if !matchesEnvelope(p, m.env) {
			continue
		}
		if p.Claim != nil && !p.Claim.TryClaim(d.claimID) {
			d.mu.Unlock()
			return nil
		}
		d.unexpected = slices.Delete(d.unexpected, i, i+1)
		d.mu.Unlock()
		d.Post(func() { d.fill(p, m) })
		return nil
	}
	d.posted = append(d.posted, p)
	d.mu.Unlock()
	return nil
}

// CancelRecv removes the posted receive with the given id if no message
// matched it yet.
func (d *MatchDev) CancelRecv(id uint64) bool {
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

// Probe reports the envelope of the oldest unexpected message matching
// src, tag and ctx, leaving the message where it is.
func (d *MatchDev) Probe(src sdi.Rank, tag int32, ctx uint64) (sdi.Envelope, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	probe := &sdi.PostedRecv{Source: src, Tag: tag, Context: ctx}
	for _, m := range d.unexpected {
		if matchesEnvelope(probe, m.env) {
			return m.env, true
		}
	}
	return sdi.Envelope{}, false
}

// Close stops the device's goroutine and waits for it; work still queued
// is dropped. Closing again does nothing.
func (d *MatchDev) Close(context.Context) error {
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
