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
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/bootstrap"
	"github.com/hpc-multidevice/multidevice/conntable"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// Options configure a Device.
type Options struct {
	// Bootstrap tells the rank who it is and exchanges business cards.
	// Required.
	Bootstrap bootstrap.Bootstrap
	// Plugins lists the subdevices to load; nil loads DefaultPlugins.
	Plugins *PluginsConfig
	// Table forces routes; nil derives them (same host: shm, else tcp).
	Table *conntable.Table
	// Factories, when set, is consulted before the sdi registry; tests use
	// it to inject fakes.
	Factories map[string]sdi.Factory
	// Logger; nil means hclog's null logger.
	Logger hclog.Logger
	// Forward tunes routes through gateways: block size and the credit
	// window that bounds gateway memory (forward.go).
	Forward ForwardOptions
	// Relay makes this rank a dedicated relay: it takes no application
	// rank and only forwards for others (relay.go).
	Relay bool
	// Site names the cluster of hosts this rank's host belongs to, in a
	// job that spans clusters; "" when the job does not say. Every rank
	// learns every rank's (Device.Site). UTF-8, at most 255 bytes, no NUL.
	Site string
}

// subdev is one loaded subdevice. idx is its position in Device.subs.
type subdev struct {
	name    string
	idx     int
	sd      sdi.SubDevice
	caps    sdi.Caps
	card    []byte      // this rank's business card, as published
	matcher sdi.Matcher // non-nil when caps has FlagMatching
	// external: served by a plugin process, which polls on a thread of
	// its own while this rank polls it (progress.go counts those threads).
	external bool
	sent     []traffic // [peer]
}

// splits reports whether s carries a forwarded block split, its inner
// header in the frame's header (outFrame.setBlock).
func (s *subdev) splits() bool { return s.caps.MaxHeader >= 2*headerSize }

// Device is the multidevice of one rank: it owns that rank's subdevices,
// routes, matching queues and protocols. It is safe for concurrent use.
type Device struct {
	log  hclog.Logger
	boot bootstrap.Bootstrap
	rank int32
	size int // ranks in the job, relays included
	// appSize is the world applications see: the ranks before the relays.
	appSize int
	// hosts names each rank's host, as its launcher did, and sites its
	// cluster, as Options.Site did; set by Open.
	hosts, sites []string
	// site is this rank's Options.Site, handed to every subdevice's Open
	// so that one judging addresses (tcp) knows which hosts share a LAN.
	site    string
	isRelay bool

	subs     []*subdev // subs[0] is the built-in self path
	table    *conntable.Resolved
	routes   [][]int // [peer][class] -> index into subs
	matchSub []int   // [peer] -> matching subdevice carrying all traffic to peer, or -1
	matchers []int   // indexes of subdevices with FlagMatching

	nextID atomic.Uint64
	lanes  []lane // [peer] sequence numbers and sendNow's frame: lane.go
	// down holds, per peer, why a subdevice lost it. Atomic so that every
	// send can check it without taking the matching lock.
	down []atomic.Pointer[error]

	tokMu  sync.Mutex
	tokens map[uint64]*outFrame // frames a subdevice still owns, by token
	early  map[uint64]error     // SendDone that came before the frame was registered

	// mu guards the matching state below.
	mu         sync.Mutex
	posted     fifo[Request]
	unexpected fifo[inMsg]
	freeMsgs   []*inMsg                 // recycled unexpected messages: match.go
	recvSeq    []uint64                 // [source] next expected sequence number
	ooo        []map[uint64]*inMsg      // [source] arrived early
	rndvSend   map[uint64]*Request      // sends waiting for clear-to-send, by request id
	rndvRecv   map[uint64]*Request      // receives waiting for data, by request id
	abandoned  map[uint64]abandonedRecv // receives given up while their data came: place.go
	syncSend   map[uint64]*Request      // synchronous eager sends waiting for the acknowledgement
	placing    []placedEager            // eager messages matched in Place, waiting for their Deliver: place.go
	filling    []placedBlock            // rendezvous blocks given a place, being filled: place.go
	// held: receives from one source that a matching subdevice holds
	// alone (Request.atSub), by id, so that a loss of the source or Close
	// can fail them. Whoever takes one out (unhold) completes it.
	held map[uint64]*Request

	genMu sync.Mutex
	gen   chan struct{} // closed and replaced on a completion or arrival after Changed
	armed atomic.Bool   // someone holds gen from Changed; notifyAll must close it

	prog    progressState // waiting goroutines drive progress: progress.go
	fwd     forwarder     // indirect communication: forward.go, credit.go, trunk.go
	relayst relayState    // a dedicated relay's view of the job's end: relay.go

	out    outbox
	closed atomic.Bool
	// finalizing is set when this rank enters the finalize barrier: peers
	// that pass it first tear down their links, which is expected then.
	finalizing atomic.Bool
	closeMu    sync.Mutex
	wg         sync.WaitGroup

	skipped map[string]error // plugins left out at Open, and why (external.go)
}

// inMsg is an arrived matchable message kept in the unexpected or
// out-of-order queue. data is an owned copy (eager) or nil (RTS).
type inMsg struct {
	h    header
	data []byte
}

// Claim owners of the multidevice's side: its own queue and
// cancellation. A matching subdevice claims with an id of its own.
const (
	claimOwn    int64 = 1
	claimCancel int64 = math.MaxInt64
)

// Open builds the device for this rank: it loads and opens the subdevices,
// publishes their business cards, resolves the connection table and
// connects to the peers the routes name.
func Open(ctx context.Context, o Options) (*Device, error) {
	if o.Bootstrap == nil {
		return nil, errors.New("multidevice: Options.Bootstrap is required")
	}
	// UTF-8 because both go to every subdevice, a plugin's through a
	// protobuf string field, which refuses anything else.
	if strings.IndexByte(o.Site, 0) >= 0 || len(o.Site) > maxSiteLen || !utf8.ValidString(o.Site) {
		return nil, fmt.Errorf("multidevice: site %q: want UTF-8 text of at most %d bytes and no NUL (MD_SITE, mdrun's host@SITE)", o.Site, maxSiteLen)
	}
	if h := o.Bootstrap.Host(); strings.IndexByte(h, 0) >= 0 || !utf8.ValidString(h) { // NUL: the host key's separator
		return nil, fmt.Errorf("multidevice: host name %q: want UTF-8 text and no NUL", h)
	}
	log := o.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	b := o.Bootstrap
	d := &Device{
		log:       log.With("rank", b.Rank()),
		boot:      b,
		rank:      int32(b.Rank()),
		size:      b.Size(),
		appSize:   b.Size(),
		isRelay:   o.Relay,
		tokens:    make(map[uint64]*outFrame),
		early:     make(map[uint64]error),
		rndvSend:  make(map[uint64]*Request),
		rndvRecv:  make(map[uint64]*Request),
		abandoned: make(map[uint64]abandonedRecv),
		syncSend:  make(map[uint64]*Request),
		held:      make(map[uint64]*Request),
		gen:       make(chan struct{}),
	}
	d.lanes = make([]lane, d.size)
	for i := range d.lanes {
		d.lanes[i].short = -1 // no lane route until initLanes
	}
	d.down = make([]atomic.Pointer[error], d.size)
	d.recvSeq = make([]uint64, d.size)
	d.ooo = make([]map[uint64]*inMsg, d.size)
	d.relayst = relayState{gone: make([]atomic.Bool, d.size), kick: make(chan struct{}, 1)}
	d.fwd.opts, d.fwd.blockSet = o.Forward.withDefaults(), o.Forward.BlockSize != 0
	if err := d.fwd.opts.validate(); err != nil {
		return nil, err
	}
	d.fwd.life, d.fwd.stopLife = context.WithCancel(context.Background())
	d.out.init(d)
	d.wg.Add(1)
	go d.out.run(&d.wg)

	if err := d.open(ctx, o); err != nil {
		d.shutdown(context.Background())
		return nil, err
	}
	if err := d.initPolling(); err != nil {
		d.shutdown(context.Background())
		return nil, err
	}
	d.initLanes()
	d.fwdStart()
	return d, nil
}

func (d *Device) open(ctx context.Context, o Options) error {
	d.site = o.Site
	plugins := o.Plugins
	if plugins == nil {
		var err error
		if plugins, err = LoadPlugins(""); err != nil {
			return err
		}
	}
	self := newSelf()
	if err := d.addSub(ctx, selfName, self, nil, sdi.APIVersion); err != nil {
		return err
	}
	for _, spec := range plugins.SubDevices {
		if !spec.Enabled {
			continue
		}
		if spec.External() {
			d.openExternal(ctx, spec)
			continue
		}
		factory := o.Factories[spec.Name]
		if factory == nil {
			var err error
			if factory, err = sdi.Lookup(spec.BuiltinName()); err != nil {
				where := spec.Where // empty in a config made in code
				if where == "" {
					where = fmt.Sprintf("subdevice %q", spec.Name)
				}
				return fmt.Errorf("multidevice: %s: %w", where, err)
			}
		}
		sd := factory(d.log.Named(spec.Name))
		info, err := sd.Info(ctx)
		switch {
		case err != nil:
			err = fmt.Errorf("multidevice: subdevice %q: info: %w", spec.Name, err)
		case !speaks(info.APIVersions, sdi.APIVersion):
			err = fmt.Errorf("multidevice: subdevice %q speaks SDI %v, this build needs %s", spec.Name, info.APIVersions, sdi.APIVersion)
		default:
			err = d.addSub(ctx, spec.Name, sd, spec.Config, sdi.APIVersion)
		}
		if err != nil {
			if spec.Where != "" { // the plugins.hcl block, a config it refused
				return fmt.Errorf("%s: %w", spec.Where, err)
			}
			return err
		}
	}
	if len(d.subs) == 1 && d.size > 1 {
		if len(d.skipped) > 0 {
			// The plugins were enabled: why they are missing is the news.
			return fmt.Errorf("multidevice: no subdevice is left: every enabled one is a plugin that was skipped: %s", d.skippedWhy())
		}
		return errors.New("multidevice: no subdevice is enabled; plugins.hcl must enable at least one")
	}
	for _, s := range d.subs[1:] {
		if s.matcher != nil {
			d.matchers = append(d.matchers, s.idx)
		}
	}

	// Publish the host (and site) and every card, then learn everybody's.
	// The site rides with the host, after a NUL, so that learning both
	// costs one look-up per rank.
	where := d.boot.Host()
	if o.Site != "" {
		where += "\x00" + o.Site
	}
	if err := d.boot.Put("host", []byte(where)); err != nil {
		return fmt.Errorf("multidevice: publish host: %w", err)
	}
	if err := d.publishCPUs(); err != nil { // progress.go
		return err
	}
	if err := d.publishRole(); err != nil {
		return err
	}
	if err := d.boot.Fence(ctx); err != nil {
		return fmt.Errorf("multidevice: exchange business cards: %w", err)
	}
	if err := d.learnRoles(ctx); err != nil {
		return err
	}
	hosts, sites := make([]string, d.size), make([]string, d.size)
	for r := range hosts {
		h, err := d.boot.Get(ctx, r, "host")
		if err != nil {
			return fmt.Errorf("multidevice: host of rank %d: %w", r, err)
		}
		hosts[r], sites[r], _ = strings.Cut(string(h), "\x00")
	}
	d.hosts, d.sites = hosts, sites
	if err := d.noteHosts(ctx, hosts); err != nil { // progress.go
		return err
	}
	return d.route(ctx, o.Table, hosts)
}

func speaks(versions []string, want string) bool {
	for _, v := range versions {
		if v == want {
			return true
		}
	}
	return false
}

// addSub opens a subdevice and publishes its card. Until this returns the
// subdevice may already deliver frames: the receive state exists.
func (d *Device) addSub(ctx context.Context, name string, sd sdi.SubDevice, config []byte, api string) error {
	s := &subdev{name: name, idx: len(d.subs), sd: sd,
		sent: make([]traffic, d.size)}
	d.subs = append(d.subs, s)
	local, err := sd.Open(ctx, sdi.OpenParams{
		Rank:       sdi.Rank(d.rank),
		Size:       d.size,
		Host:       d.boot.Host(),
		Site:       d.site,
		JobID:      d.boot.JobID(),
		Secret:     d.boot.Secret(),
		APIVersion: api,
		Config:     config,
		Handler:    &handler{d: d, sub: s.idx},
		Logger:     d.log.Named(name),
	})
	if err != nil {
		return fmt.Errorf("multidevice: open subdevice %q: %w", name, err)
	}
	if err := local.Caps.Validate(); err != nil {
		return fmt.Errorf("multidevice: subdevice %q: %w", name, err)
	}
	if local.Caps.MaxHeader < headerSize {
		return fmt.Errorf("multidevice: subdevice %q carries headers of %d bytes, the multidevice needs %d", name, local.Caps.MaxHeader, headerSize)
	}
	s.caps = local.Caps
	s.card = local.Addr
	if local.Caps.Flags.Has(sdi.FlagMatching) {
		m, ok := sd.(sdi.Matcher)
		if !ok {
			return fmt.Errorf("multidevice: subdevice %q declares FlagMatching but does not implement sdi.Matcher", name)
		}
		s.matcher = m
	}
	if err := d.boot.Put("sdi/"+name, local.Addr); err != nil {
		return fmt.Errorf("multidevice: publish %q business card: %w", name, err)
	}
	return nil
}

// route resolves the connection table and connects what it names.
func (d *Device) route(ctx context.Context, t *conntable.Table, hosts []string) error {
	// A derived table names one subdevice per kind of peer; where it
	// cannot connect one, the other loaded subdevices are tried
	// (connectAny). A table given lists its own later routes.
	derived := t == nil
	if t == nil {
		var cands []conntable.Candidate
		for _, s := range d.subs[1:] {
			cands = append(cands, conntable.Candidate{Name: s.name, HostOnly: s.caps.Reach == sdi.ReachHost, Exclusivity: s.caps.Exclusivity})
		}
		if len(cands) == 0 { // a singleton with every subdevice disabled
			cands = append(cands, conntable.Candidate{Name: selfName})
		}
		var err error
		if t, err = conntable.Derive(cands); err != nil {
			return err
		}
	}
	if err := d.shareCards(ctx, hosts); err != nil {
		return err
	}
	res, err := t.Resolve(int(d.rank), hosts)
	if err != nil {
		return fmt.Errorf("multidevice: %w", err)
	}
	d.table = res
	// Not subs[0], the self path: it carries nothing to another rank, and
	// a table that names it for one must fail here, not at a send.
	byName := make(map[string]*subdev, len(d.subs))
	for _, s := range d.subs[1:] {
		byName[s.name] = s
	}
	nclass := len(res.Classes())
	d.routes = make([][]int, d.size)
	d.matchSub = make([]int, d.size)
	d.fwd.init(d.size, nclass, len(d.subs))
	lk := newLinker(d, hosts)
	// needVia[peer][class]: every direct attempt found the peer unreachable.
	needVia := make([][]bool, d.size)
	for peer := range d.size {
		d.matchSub[peer] = -1
		d.routes[peer] = make([]int, nclass)
		if peer == int(d.rank) {
			continue // routes[self] are all 0: the self path
		}
		for ci, hops := range res.ByClass(peer) {
			if len(hops) == 0 {
				return fmt.Errorf("%w: rank %d, class %q", ErrNoRoute, peer, res.Classes()[ci].Name)
			}
			if res.Failover(peer) && len(hops) > 1 {
				trunks, err := d.tableTrunks(ctx, lk, byName, peer, hops, true)
				if err != nil {
					return err
				}
				switch {
				case len(trunks) == 0: // failover, and no route reaches it
					if needVia[peer] == nil {
						needVia[peer] = make([]bool, nclass)
					}
					needVia[peer][ci] = true
				case len(trunks) == 1 && trunks[0].via == int32(peer):
					// One failover route left: a plain direct one.
					d.routes[peer][ci] = trunks[0].sub.idx
				default:
					d.fwd.setPath(peer, ci, trunks)
					d.routes[peer][ci] = trunks[0].sub.idx
				}
				continue
			}
			first, ok := byName[hops[0].SubDevice]
			if !ok {
				return d.missingSubDevice(peer, hosts[peer], hops[0].SubDevice)
			}
			d.routes[peer][ci] = first.idx
			ok, err := d.directHops(ctx, lk, byName, peer, ci, hops)
			if err != nil {
				return err
			}
			if !ok {
				if needVia[peer] == nil {
					needVia[peer] = make([]bool, nclass)
				}
				needVia[peer][ci] = true
			}
		}
		if m := d.matchSub[peer]; m >= 0 {
			for _, idx := range d.routes[peer] {
				if idx != m {
					return fmt.Errorf("multidevice: rank %d is routed over matching subdevice %q for some sizes and %q for others; a subdevice that matches on its own must carry all of a peer's traffic",
						peer, d.subs[m].name, d.subs[idx].name)
				}
			}
		}
	}
	lk.warnStandIns()
	if err := d.autoRoute(ctx, lk, needVia, hosts, derived); err != nil {
		return err
	}
	lk.keepCards()
	return nil
}

// shareCards gives subdevices that asked for it (sdi.FlagJobCards) the cards
// of the whole job before any Connect.
func (d *Device) shareCards(ctx context.Context, hosts []string) error {
	for _, s := range d.subs[1:] {
		if !s.caps.Flags.Has(sdi.FlagJobCards) {
			continue
		}
		jc, ok := s.sd.(sdi.JobCards)
		if !ok {
			return fmt.Errorf("multidevice: subdevice %q declares FlagJobCards but does not implement sdi.JobCards", s.name)
		}
		cards := make([][]byte, d.size)
		for r := range cards {
			if r == int(d.rank) {
				cards[r] = s.card
				continue
			}
			// A rank that did not open this subdevice published no card;
			// that is the subdevice's business, not an error here.
			if c, err := d.boot.Get(ctx, r, "sdi/"+s.name); err == nil {
				cards[r] = c
			} else if ctx.Err() != nil {
				return fmt.Errorf("multidevice: collect %q cards: %w", s.name, ctx.Err())
			}
		}
		if err := jc.SetJobCards(ctx, cards); err != nil {
			return fmt.Errorf("multidevice: subdevice %q: job cards: %w", s.name, err)
		}
	}
	return nil
}

// directHops routes class ci of peer over the first route of hops, a
// list without failover, that connects: the later routes stand in, in
// order, where the earlier ones cannot connect. A direct route whose subdevice is not loaded here (past the
// first), reaches only this host for a peer on another, or, past the
// first, matches on its own (it must carry all of the peer's traffic
// from the start, on both sides) is passed over; a run of routes through
// gateways becomes the class's trunks, those gateways that connect. It
// reports false when nothing in the list reaches the peer.
func (d *Device) directHops(ctx context.Context, lk *linker, byName map[string]*subdev, peer, ci int, hops []conntable.Hop) (bool, error) {
	var hostOnly error // a host-local subdevice that could not connect peer
	for i := 0; i < len(hops); i++ {
		if hops[i].Via >= 0 {
			j := i
			for j < len(hops) && hops[j].Via >= 0 {
				j++
			}
			trunks, err := d.gatewayTrunks(ctx, lk, byName, peer, hops[i:j])
			if err != nil {
				return false, err
			}
			if len(trunks) > 0 {
				d.fwd.setPath(peer, ci, trunks)
				d.routes[peer][ci] = trunks[0].sub.idx
				return true, nil
			}
			i = j - 1
			continue
		}
		s, ok := byName[hops[i].SubDevice]
		if !ok || i > 0 && s.matcher != nil {
			continue
		}
		if s.caps.Reach == sdi.ReachHost && lk.hosts[peer] != lk.hosts[d.rank] {
			key := [2]int{s.idx, peer}
			if _, tried := lk.tried[key]; !tried {
				lk.tried[key] = fmt.Errorf("%w: the table routes rank %d on host %q over %q, which only reaches host %q",
					sdi.ErrPeerUnreachable, peer, lk.hosts[peer], s.name, lk.hosts[d.rank])
			}
			continue
		}
		if err := lk.connect(ctx, s, peer); err != nil {
			if !errors.Is(err, sdi.ErrPeerUnreachable) {
				return false, err
			}
			if s.caps.Reach == sdi.ReachHost && hostOnly == nil {
				hostOnly = err
			}
			continue
		}
		if hostOnly != nil && !slices.Contains(lk.standIns, peer) {
			if lk.standIns = append(lk.standIns, peer); lk.standWhy == nil {
				lk.standWhy = hostOnly
			}
		}
		d.routes[peer][ci] = s.idx
		if s.matcher != nil {
			d.matchSub[peer] = s.idx
		}
		return true, nil
	}
	return false, nil
}

// gatewayTrunks connects to the gateways of hops, routes through gateways
// in a list without failover, and returns the trunks of those it reached;
// a gateway that is unreachable is left out, the list's later routes may
// stand in.
func (d *Device) gatewayTrunks(ctx context.Context, lk *linker, byName map[string]*subdev, peer int, hops []conntable.Hop) ([]trunk, error) {
	var trunks []trunk
	for _, hop := range hops {
		one, err := d.tableTrunks(ctx, lk, byName, peer, []conntable.Hop{hop}, false)
		switch {
		case errors.Is(err, sdi.ErrPeerUnreachable):
			continue
		case err != nil:
			return nil, err
		}
		for _, t := range one {
			if !slices.ContainsFunc(trunks, t.same) {
				trunks = append(trunks, t)
			}
		}
	}
	return trunks, nil
}

func (d *Device) connect(ctx context.Context, s *subdev, peer int, host string) ([]byte, error) {
	card, err := d.boot.Get(ctx, peer, "sdi/"+s.name)
	if err != nil {
		return nil, fmt.Errorf("multidevice: rank %d (host %q) published no %q business card (is %q enabled in its plugins.hcl?): %w", peer, host, s.name, s.name, err)
	}
	if err := s.sd.Connect(ctx, sdi.Rank(peer), card); err != nil {
		return nil, fmt.Errorf("multidevice: connect to rank %d (host %q) over %q: %w", peer, host, s.name, err)
	}
	return card, nil
}

func (d *Device) subNames() string {
	names := []string{}
	for _, s := range d.subs[1:] {
		names = append(names, s.name)
	}
	return fmt.Sprint(names)
}

// Rank is this rank's world rank.
func (d *Device) Rank() int { return int(d.rank) }

// Size is the number of ranks in the world applications see; dedicated
// relays (relay.go) are not counted.
func (d *Device) Size() int { return d.appSize }

// Host is the launcher's name for the host of rank r (ranks with the
// same name share a machine): a world rank, or a dedicated relay's rank
// after them; "" for any other r.
func (d *Device) Host(r int) string {
	if r < 0 || r >= len(d.hosts) {
		return ""
	}
	return d.hosts[r]
}

// maxSiteLen bounds a site's name.
const maxSiteLen = 255

// Site is the name of the cluster of hosts rank r's host belongs to, as
// that rank's Options.Site gave it ("" where it gave none; see Host for
// which r).
func (d *Device) Site(r int) string {
	if r < 0 || r >= len(d.sites) {
		return ""
	}
	return d.sites[r]
}

// Route names the subdevice that carries a message of n bytes to peer.
func (d *Device) Route(peer, n int) (string, error) {
	if peer < 0 || peer >= d.size {
		return "", fmt.Errorf("%w: %d not in [0,%d)", ErrRank, peer, d.size)
	}
	return d.subs[d.routes[peer][d.table.Class(n)]].name, nil
}

// LinkStats counts what one subdevice carried to one peer. Frames to a
// peer reached through gateways count at the gateway they went to.
type LinkStats struct {
	Peer      int
	SubDevice string
	Frames    uint64
	Bytes     uint64 // payload bytes
}

// Stats lists, for every (peer, subdevice) that carried traffic from this
// rank, the frames and payload bytes sent.
func (d *Device) Stats() []LinkStats {
	var out []LinkStats
	for peer := range d.size {
		for _, s := range d.subs {
			if f, b := d.sentTo(s, peer); f > 0 {
				out = append(out, LinkStats{Peer: peer, SubDevice: s.name, Frames: f, Bytes: b})
			}
		}
	}
	return out
}

// notifyAll wakes everybody waiting for "something changed". Without a
// Changed caller since the last notification it costs one atomic load: a
// caller that stores armed before it checks its condition either has its
// condition seen true or its channel closed here (both sides use
// sequentially consistent atomics).
func (d *Device) notifyAll() {
	if d.armed.Load() {
		d.notifyArmed()
	}
}

// notifyArmed is notifyAll once a Changed caller armed it; apart, so that
// notifyAll's test inlines into every completion.
func (d *Device) notifyArmed() {
	d.genMu.Lock()
	if d.armed.Load() {
		d.armed.Store(false)
		close(d.gen)
		d.gen = make(chan struct{})
	}
	d.genMu.Unlock()
}

// Changed returns a channel that is closed at the next request completion
// or message arrival after the call, or at the next Notify; WaitAny and
// Probe wait on it.
func (d *Device) Changed() <-chan struct{} {
	d.genMu.Lock()
	defer d.genMu.Unlock()
	d.armed.Store(true)
	return d.gen
}

// Notify closes the channel Changed returned, as a completion does: a
// layer above that completes operations of its own (adi's nonblocking
// collectives) calls it so that waiters on Changed look again.
func (d *Device) Notify() { d.notifyAll() }

// Close flushes, waits for every rank to reach Close (so nobody tears down a
// link a peer still uses), and closes the subdevices. It is idempotent.
// Requests still outstanding fail with ErrClosed, except receives whose
// buffer a subdevice whose Close failed (its ctx ended first, a transfer
// still under way) may yet write into: those never complete, since
// completing them would hand back a buffer still being written.
func (d *Device) Close(ctx context.Context) error {
	d.closeMu.Lock()
	defer d.closeMu.Unlock()
	if d.closed.Load() {
		return nil
	}
	var errs []error
	d.flushCredits()
	if err := d.out.drain(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := d.fwdDrain(ctx); err != nil {
		errs = append(errs, err)
	} else if err := d.out.drain(ctx); err != nil {
		errs = append(errs, err)
	}
	for peer := range d.size {
		if peer == int(d.rank) {
			continue
		}
		for _, s := range d.subs[1:] {
			if f, _ := d.sentTo(s, peer); f == 0 {
				continue
			}
			if err := s.sd.Flush(ctx, sdi.Rank(peer)); err != nil && !errors.Is(err, sdi.ErrClosed) {
				errs = append(errs, fmt.Errorf("multidevice: flush %q to rank %d: %w", s.name, peer, err))
			}
		}
	}
	d.finalizing.Store(true)
	if err := d.boot.Fence(ctx); err != nil {
		errs = append(errs, fmt.Errorf("multidevice: finalize barrier: %w", err))
		if d.isRelay {
			if err := d.relayLinger(ctx); err != nil {
				errs = append(errs, err)
			}
		}
	}
	errs = append(errs, d.shutdown(ctx))
	return errors.Join(errs...)
}

// shutdown closes subdevices and stops the engine.
func (d *Device) shutdown(ctx context.Context) error {
	d.closed.Store(true)
	d.fwd.end()
	var errs []error
	var unclosed map[int]bool
	for i, s := range d.subs {
		if err := s.sd.Close(ctx); err != nil && !errors.Is(err, sdi.ErrClosed) {
			errs = append(errs, fmt.Errorf("multidevice: close %q: %w", s.name, err))
			if unclosed == nil {
				unclosed = map[int]bool{}
			}
			unclosed[i] = true
		}
	}
	d.out.stop()
	d.wg.Wait()
	d.failAll(ErrClosed, unclosed)
	return errors.Join(errs...)
}

// failAll completes every outstanding request with err (a rendezvous
// receive that failed before, waiting only for its placed blocks, with
// its own failure), but for the receives whose buffers the subdevices in
// unclosed may still write into: those they were given as places
// (sdi.Placer ends a place only at its Deliver or a report of the peer
// down), those a matching subdevice holds (its Done may yet come), and
// duplicated receives whose claim a copy in one of them may have won.
func (d *Device) failAll(err error, unclosed map[int]bool) {
	matcherUnclosed := false
	for _, idx := range d.matchers {
		matcherUnclosed = matcherUnclosed || unclosed[idx]
	}
	d.mu.Lock()
	var reqs []*Request
	for _, r := range d.posted.take() {
		// Taking the claim keeps every copy out of the buffer. A copy
		// that won it first completes r by its Done, which a closed
		// subdevice no longer calls; which subdevice won is not known
		// (the claim holds the subdevice's own id).
		if r.claim != nil && !r.claim.TryClaim(claimCancel) && matcherUnclosed {
			continue
		}
		reqs = append(reqs, r)
	}
	for id, r := range d.held {
		if !unclosed[r.atSub] { // closed: it delivers nothing any more
			reqs = append(reqs, r)
			delete(d.held, id)
		}
	}
	for _, p := range d.placing {
		if !unclosed[p.sub] {
			reqs = append(reqs, p.r)
		}
	}
	held := map[*Request]bool{}
	var failed []*Request
	for _, p := range d.filling {
		if unclosed[p.sub] {
			held[p.r] = true
			continue
		}
		// Its subdevice closed: the block is done. A receive that failed
		// meanwhile left rndvRecv and waits for nothing else once its
		// last block is done (blockDone).
		p.r.rndvBusy--
		if p.r.rndvFail != nil && p.r.rndvBusy == 0 {
			failed = append(failed, p.r)
		}
	}
	d.placing, d.filling = nil, nil // the subdevices are closed: nothing delivers them any more
	for _, m := range []map[uint64]*Request{d.rndvSend, d.rndvRecv} {
		for id, r := range m {
			if !held[r] {
				reqs = append(reqs, r)
			}
			delete(m, id)
		}
	}
	acks := d.dropAcksLocked(func(*Request) bool { return true })
	d.mu.Unlock()
	for _, r := range reqs {
		r.complete(r.failStatus(), err)
	}
	for _, r := range failed {
		r.complete(r.failStatus(), r.rndvFail)
	}
	failAcks(acks, err)
}

func (d *Device) newRequest(send bool, peer int32) *Request {
	r := new(Request)
	d.initRequest(r, send, peer)
	return r
}
