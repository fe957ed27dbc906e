package tcp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/subdevices/tcp/addrsel"
)

// Version is the tcp subdevice's own version, reported in [sdi.Info].
const Version = "0.1.0"

// maxHandshakes bounds the connections being authenticated at once, so a
// flood of strangers costs at most this many goroutines and sockets until
// their deadlines expire.
const maxHandshakes = 64

// subDevice implements sdi.SubDevice over TCP. It is safe for concurrent use.
type subDevice struct {
	baseLog hclog.Logger
	// ifaces, when set before Open, replaces the host's interfaces on the
	// card: tests use two loopback addresses as two interfaces to get
	// several connections to a peer on one host.
	ifaces []cardIface

	mu        sync.Mutex
	opened    bool
	closed    atomic.Bool // set under mu; read without it on the hot path
	closeOnce sync.Once
	wg        sync.WaitGroup // every goroutine this instance starts
	inbound   map[*inbound]struct{}
	latest    map[sdi.Rank]*session       // newest inbound session per rank
	sessions  map[sessionKey]*session     // inbound sessions with a lane open
	gens      uint64                      // outbound sessions installed so far (peer.gen)
	chosen    map[sdi.Rank]addrsel.Result // the last selection per rank, for Chosen

	// Set by Open and read-only afterwards.
	log        hclog.Logger
	h          sdi.Handler
	cfg        config
	auth       auth
	host       string
	ln         net.Listener
	life       context.Context // done when Close starts; bounds Connect and accept back-off
	cancel     context.CancelFunc
	peers      []atomic.Pointer[peer] // indexed by rank; nil until Connect
	deliverMu  []sync.Mutex           // indexed by rank: one Deliver at a time per rank
	handshakes chan struct{}          // semaphore of maxHandshakes
	ep         addrsel.Endpoint       // this rank's card, for address selection

	job atomic.Pointer[addrsel.Job] // from SetJobCards; nil until then

	// reporting counts, per rank, the reports of the rank down under way
	// (reportDown): while one is, no frame of the rank gets a place.
	// Indexed by rank (made by Open), each guarded by deliverMu[rank].
	reporting []int

	// Progress by polling (poll.go): the inbound connections Poll reads
	// and the outbound lanes it pushes, each replaced whole under mu; the
	// lanes with frames queued; and the readers' and writers' stand-by
	// while pollers work (made by New).
	pollList atomic.Pointer[[]*inbound]
	pushList atomic.Pointer[[]*lane]
	backlog  atomic.Int32
	standby  *standby
	idle     *idleWaiter // where readers wait while nobody polls
	pset     *pollSet    // which polled connections have something (pollset.go)
}

// New returns an unopened tcp subdevice. logger is used until Open supplies
// [sdi.OpenParams.Logger]; nil means no logging.
func New(logger hclog.Logger) sdi.SubDevice {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &subDevice{baseLog: logger, standby: newStandby(pollNap, hintedNap)}
}

// Info returns the static identity; it may be called at any time.
func (sd *subDevice) Info(context.Context) (sdi.Info, error) {
	return sdi.Info{Name: "tcp", Version: Version, APIVersions: []string{sdi.APIVersion}}, nil
}

// caps are the same for every rank opened with the same config, as sdi
// requires: whether frames to a peer may take several connections depends
// on max_connections, not on this host's interfaces.
func caps(cfg config) sdi.Caps {
	flags := sdi.FlagReliable | sdi.FlagJobCards | sdi.FlagPoll | sdi.FlagIdle
	if cfg.ordered() {
		flags |= sdi.FlagOrdered
	}
	return sdi.Caps{
		MaxHeader:   maxHeader,
		MaxEager:    maxEager,
		MaxFrame:    maxFrame,
		Exclusivity: 10,
		Latency:     25 * time.Microsecond,
		Bandwidth:   1_250_000_000, // 10 Gbit/s Ethernet
		Reach:       sdi.ReachNetwork,
		Flags:       flags,
	}
}

// Open validates the parameters and config, starts listening and returns
// the business card.
func (sd *subDevice) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	sd.mu.Lock()
	defer sd.mu.Unlock()
	switch {
	case sd.closed.Load():
		return sdi.Local{}, fmt.Errorf("tcp: open: %w", sdi.ErrClosed)
	case sd.opened:
		return sdi.Local{}, errors.New("tcp: open: already open")
	case p.Handler == nil:
		return sdi.Local{}, errors.New("tcp: open: nil Handler")
	case p.Size <= 0:
		return sdi.Local{}, fmt.Errorf("tcp: open: job size %d must be positive", p.Size)
	case p.Rank < 0 || int(p.Rank) >= p.Size:
		return sdi.Local{}, fmt.Errorf("tcp: open: rank %d out of range [0,%d)", p.Rank, p.Size)
	case p.APIVersion != "" && p.APIVersion != sdi.APIVersion:
		return sdi.Local{}, fmt.Errorf("tcp: open: SDI version %q not spoken, want %q", p.APIVersion, sdi.APIVersion)
	case len(p.Host) > maxCardHostLen:
		return sdi.Local{}, fmt.Errorf("tcp: open: host name is %d bytes, at most %d", len(p.Host), maxCardHostLen)
	}
	cfg, err := parseConfig(p.Config)
	if err != nil {
		return sdi.Local{}, err
	}
	// An algorithm named outright applies to every peer (the address does
	// not matter) and must work: better refused here than at each Connect.
	if names, strict := cfg.congestionFor(netip.Addr{}); strict {
		if err := checkCongestion(names[0]); err != nil {
			return sdi.Local{}, err
		}
	}
	log := p.Logger
	if log == nil {
		log = sd.baseLog
	}
	if len(p.Secret) == 0 {
		log.Warn("no job secret: any process that knows the job id can connect")
	}
	idle, err := newIdleWaiter()
	if err != nil {
		return sdi.Local{}, fmt.Errorf("tcp: open: %w", err)
	}
	pset, err := newPollSet()
	if err != nil {
		idle.close()
		return sdi.Local{}, fmt.Errorf("tcp: open: %w", err)
	}
	ln, err := listen(ctx, cfg.listen)
	if err != nil {
		idle.close()
		pset.close()
		return sdi.Local{}, err
	}
	lnAddr := ln.Addr().(*net.TCPAddr).AddrPort()
	ifaces := sd.ifaces
	if ifaces == nil {
		ifaces = cardIfaces(lnAddr.Addr(), cfg.filter, log)
	}
	c := card{Rank: p.Rank, JobTag: jobTag(p.JobID), Port: lnAddr.Port(), Host: p.Host, Site: p.Site, Ifaces: ifaces}
	b, err := c.encode()
	if err != nil {
		ln.Close()
		idle.close()
		pset.close()
		return sdi.Local{}, fmt.Errorf("tcp: open: %w", err)
	}

	sd.opened = true
	sd.log = log
	sd.h = p.Handler
	sd.cfg = cfg
	sd.auth = auth{secret: append([]byte(nil), p.Secret...), jobID: p.JobID, rank: p.Rank, size: p.Size}
	sd.host = p.Host
	sd.ln = ln
	sd.life, sd.cancel = context.WithCancel(context.Background())
	sd.peers = make([]atomic.Pointer[peer], p.Size)
	sd.deliverMu = make([]sync.Mutex, p.Size)
	sd.reporting = make([]int, p.Size)
	sd.ep = c.endpoint()
	sd.inbound = make(map[*inbound]struct{})
	sd.latest = make(map[sdi.Rank]*session)
	sd.sessions = make(map[sessionKey]*session)
	sd.chosen = make(map[sdi.Rank]addrsel.Result)
	sd.handshakes = make(chan struct{}, maxHandshakes)
	sd.idle, sd.pset = idle, pset
	sd.wg.Add(3)
	go sd.acceptLoop()
	go func() {
		defer sd.wg.Done()
		sd.standby.watch(sd.life)
	}()
	go func() {
		defer sd.wg.Done()
		sd.idle.run()
	}()
	if log.IsDebug() {
		desc := make([]string, len(ifaces))
		for i, f := range ifaces {
			desc[i] = fmt.Sprintf("%s %v speed=%d", f.Name, f.Addrs, f.Speed)
		}
		log.Debug("listening", "addr", ln.Addr(), "card_interfaces", desc, "queue_bytes", cfg.queueBytes,
			"connect_timeout", cfg.connectTimeout, "max_connections", cfg.maxConns)
	}
	return sdi.Local{Addr: b, Caps: caps(cfg)}, nil
}

// SetJobCards takes every rank's card so that Connect can find private
// ranges that collide across the job (see package addrsel). A card that
// does not decode is an error naming its rank; nil cards (ranks that did
// not open tcp) are skipped.
func (sd *subDevice) SetJobCards(ctx context.Context, cards [][]byte) error {
	if sd.closed.Load() {
		return fmt.Errorf("tcp: job cards: %w", sdi.ErrClosed)
	}
	if len(sd.peers) == 0 {
		return errors.New("tcp: job cards: not open")
	}
	if len(cards) != len(sd.peers) {
		return fmt.Errorf("tcp: job cards: %d cards for a job of %d ranks", len(cards), len(sd.peers))
	}
	tag := jobTag(sd.auth.jobID)
	eps := []addrsel.Endpoint{sd.ep}
	for r, b := range cards {
		if b == nil || sdi.Rank(r) == sd.auth.rank {
			continue
		}
		c, err := decodeCard(b)
		if err != nil {
			return fmt.Errorf("tcp: job cards: rank %d: %w", r, err)
		}
		if c.JobTag != tag {
			return fmt.Errorf("tcp: job cards: the card at rank %d is from another job", r)
		}
		if c.Rank != sdi.Rank(r) {
			return fmt.Errorf("tcp: job cards: the card at rank %d belongs to rank %d", r, c.Rank)
		}
		eps = append(eps, c.endpoint())
	}
	sd.job.Store(addrsel.NewJob(eps))
	return nil
}

// listen binds addr, or by default every address in both families, falling
// back to IPv4 alone on a host without IPv6.
func listen(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	if addr != "" {
		// Go makes any wildcard listener dual-stack on "tcp"; an IPv4
		// literal such as 0.0.0.0 means IPv4 only to the user.
		network := "tcp"
		if host, _, _ := net.SplitHostPort(addr); host != "" {
			if a, err := netip.ParseAddr(host); err == nil && a.Is4() {
				network = "tcp4"
			}
		}
		ln, err := lc.Listen(ctx, network, addr)
		if err != nil {
			return nil, fmt.Errorf("tcp: listen on %q: %w", addr, err)
		}
		return ln, nil
	}
	ln, err6 := lc.Listen(ctx, "tcp", "[::]:0")
	if err6 == nil {
		return ln, nil
	}
	ln, err4 := lc.Listen(ctx, "tcp4", "0.0.0.0:0")
	if err4 != nil {
		return nil, fmt.Errorf("tcp: listen on [::]:0 (%w) and on 0.0.0.0:0: %w", err6, err4)
	}
	return ln, nil
}

// cardIfaces lists the interfaces peers may reach a listener bound to bound
// on: every interface that is up and running, with the addresses filter
// keeps, loopback included. A listener bound to one address publishes only
// that address, whatever the filter says.
func cardIfaces(bound netip.Addr, filter ifaceFilter, log hclog.Logger) []cardIface {
	bound = bound.Unmap()
	specific := !bound.IsUnspecified()
	want6 := bound.Is6() // the IPv6 wildcard is dual-stack; 0.0.0.0 is not
	ifaces, err := net.Interfaces()
	if err != nil {
		log.Warn("cannot list network interfaces; publishing loopback only", "error", err)
	}
	var out []cardIface
	naddrs := 0
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagRunning == 0 {
			continue
		}
		if len(ifc.Name) == 0 || len(ifc.Name) > maxIfaceNameLen {
			log.Debug("skipping interface with an unusable name", "interface", ifc.Name)
			continue
		}
		ias, err := ifc.Addrs()
		if err != nil {
			log.Debug("cannot list interface addresses", "interface", ifc.Name, "error", err)
			continue
		}
		f := cardIface{Name: ifc.Name}
		for _, ia := range ias {
			ipn, ok := ia.(*net.IPNet)
			if !ok {
				continue
			}
			a, ok := netip.AddrFromSlice(ipn.IP)
			if !ok {
				continue
			}
			a = a.Unmap()
			bits, _ := ipn.Mask.Size()
			if specific {
				if a == bound {
					return []cardIface{{Name: ifc.Name, Speed: linkSpeed(ifc.Name), Addrs: []netip.Prefix{netip.PrefixFrom(a, bits)}}}
				}
				continue
			}
			switch {
			case a.Is6() && !want6, a.IsMulticast(), a.IsUnspecified():
				continue
			case a.IsLoopback() && a.Is4() && a != netip.AddrFrom4([4]byte{127, 0, 0, 1}):
				continue // 127.0.0.1 stands for all of 127/8
			case !filter.keep(ifc.Name, a):
				continue
			case naddrs == maxCardAddrs:
				log.Debug("too many addresses for the business card; dropping the rest", "kept", maxCardAddrs, "interface", ifc.Name, "addr", a)
				continue
			}
			f.Addrs = append(f.Addrs, netip.PrefixFrom(a, bits))
			naddrs++
		}
		if len(f.Addrs) == 0 || len(out) == maxCardIfaces {
			continue
		}
		f.Speed = linkSpeed(ifc.Name)
		out = append(out, f)
	}
	if specific {
		// No interface lists the bound address (one went down meanwhile):
		// publish it as it is.
		return []cardIface{{Name: "listen", Addrs: []netip.Prefix{netip.PrefixFrom(bound, bound.BitLen())}}}
	}
	if len(out) == 0 && err != nil {
		// 127.0.0.1 exists on every host we run on, even when the
		// interface list is unavailable.
		out = []cardIface{{Name: "lo", Addrs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8")}}}
	}
	return out
}

// linkSpeed returns the interface's speed in Mbit/s as Linux reports it, or
// 0 where it does not (virtual devices, other systems, a link that is down).
func linkSpeed(name string) uint32 {
	b, err := os.ReadFile("/sys/class/net/" + name + "/speed")
	if err != nil {
		return 0
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || v <= 0 || v > math.MaxUint32 {
		return 0
	}
	return uint32(v)
}

// peer returns the outbound state for rank, or an error wrapping
// ErrNotConnected (also for ranks outside the job and before Open).
func (sd *subDevice) peer(rank sdi.Rank, op string) (*peer, error) {
	if rank < 0 || int(rank) >= len(sd.peers) {
		return nil, fmt.Errorf("tcp: %s rank %d: %w", op, rank, sdi.ErrNotConnected)
	}
	p := sd.peers[rank].Load()
	if p == nil {
		return nil, fmt.Errorf("tcp: %s rank %d: %w", op, rank, sdi.ErrNotConnected)
	}
	return p, nil
}

// Send writes f to the socket at once when nothing is queued before it and
// returns done=true if the socket took all of it. Otherwise it queues f, or
// what is left of it, for the peer's writer and returns done=false;
// SendDone follows from the writer goroutine once the frame is written (or
// failed). It never blocks: a peer whose queue holds queue_bytes or more
// gets ErrWouldBlock.
func (sd *subDevice) Send(f *sdi.Frame) (bool, error) {
	if sd.closed.Load() {
		return false, fmt.Errorf("tcp: send: %w", sdi.ErrClosed)
	}
	if len(f.Header) > maxHeader || len(f.Payload) > maxFrame {
		return false, fmt.Errorf("tcp: send to rank %d: header %d bytes (max %d), payload %d bytes (max %d): %w",
			f.Peer, len(f.Header), maxHeader, len(f.Payload), maxFrame, sdi.ErrTooLarge)
	}
	p, err := sd.peer(f.Peer, "send to")
	if err != nil {
		return false, err
	}
	return p.send(f)
}

// Flush waits until every frame accepted for rank before the call has had
// its SendDone.
func (sd *subDevice) Flush(ctx context.Context, rank sdi.Rank) error {
	if sd.closed.Load() {
		return fmt.Errorf("tcp: flush: %w", sdi.ErrClosed)
	}
	p, err := sd.peer(rank, "flush")
	if err != nil {
		return err
	}
	if err := p.flush(ctx); err != nil {
		return fmt.Errorf("tcp: flush rank %d: %w", rank, err)
	}
	if sd.closed.Load() {
		return fmt.Errorf("tcp: flush rank %d: %w", rank, sdi.ErrClosed)
	}
	return nil
}

// Disconnect flushes the frames queued for rank, closes the connection this
// rank opened to it and forgets it; Send then returns ErrNotConnected until
// the next Connect. Frames still queued when ctx ends fail with an error
// wrapping ErrNotConnected. The peer's own connection to us is its to close.
func (sd *subDevice) Disconnect(ctx context.Context, rank sdi.Rank) error {
	if sd.closed.Load() {
		return fmt.Errorf("tcp: disconnect: %w", sdi.ErrClosed)
	}
	p, err := sd.peer(rank, "disconnect")
	if err != nil {
		return err
	}
	ferr := p.flush(ctx)
	sd.mu.Lock()
	if sd.peers[rank].CompareAndSwap(p, nil) {
		sd.listLanes()
	}
	sd.mu.Unlock()
	p.halt(fmt.Errorf("tcp: rank %d disconnected: %w", rank, sdi.ErrNotConnected))
	// Halting closed the connections, so the writers and watchers end
	// without waiting on the network.
	p.wait()
	if ferr != nil {
		return fmt.Errorf("tcp: disconnect rank %d: frames still queued: %w", rank, ferr)
	}
	sd.log.Debug("disconnected", "peer", rank)
	return nil
}

// Close stops the listener, closes every connection, fails queued frames
// with ErrClosed and waits for every goroutine, so no Handler call happens
// after it returns. It does not flush: call Flush first to drain. It does not
// need ctx: once the sockets are closed nothing it waits for can block.
// Calling it again returns nil.
func (sd *subDevice) Close(context.Context) error {
	sd.closeOnce.Do(sd.shutdown)
	return nil
}

func (sd *subDevice) shutdown() {
	sd.mu.Lock()
	sd.closed.Store(true)
	var peers []*peer
	for i := range sd.peers {
		if p := sd.peers[i].Load(); p != nil {
			peers = append(peers, p)
		}
	}
	var conns []net.Conn
	for in := range sd.inbound {
		conns = append(conns, in.conn)
	}
	sd.mu.Unlock()
	if !sd.opened {
		return
	}
	sd.cancel()
	sd.ln.Close()
	errClosed := fmt.Errorf("tcp: closed with the frame still queued: %w", sdi.ErrClosed)
	for _, p := range peers {
		p.halt(errClosed)
	}
	for _, c := range conns {
		c.Close()
	}
	sd.idle.stop()
	sd.wg.Wait()
	sd.idle.close()
	sd.pset.close()
	sd.log.Debug("closed")
}
