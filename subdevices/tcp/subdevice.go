package tcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hpc-multidevice/multidevice/sdi"
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

	mu        sync.Mutex
	opened    bool
	closed    atomic.Bool // set under mu; read without it on the hot path
	closeOnce sync.Once
	wg        sync.WaitGroup // every goroutine this instance starts
	inbound   map[*inbound]struct{}
	latest    map[sdi.Rank]*inbound // newest inbound connection per rank

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
	handshakes chan struct{}          // semaphore of maxHandshakes
}

// New returns an unopened tcp subdevice. logger is used until Open supplies
// [sdi.OpenParams.Logger]; nil means no logging.
func New(logger hclog.Logger) sdi.SubDevice {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &subDevice{baseLog: logger}
}

// Info returns the static identity; it may be called at any time.
func (sd *subDevice) Info(context.Context) (sdi.Info, error) {
	return sdi.Info{Name: "tcp", Version: Version, APIVersions: []string{sdi.APIVersion}}, nil
}

func caps() sdi.Caps {
	return sdi.Caps{
		MaxHeader:   maxHeader,
		MaxEager:    maxEager,
		MaxFrame:    maxFrame,
		Exclusivity: 10,
		Latency:     25 * time.Microsecond,
		Bandwidth:   1_250_000_000, // 10 Gbit/s Ethernet
		Reach:       sdi.ReachNetwork,
		Flags:       sdi.FlagReliable | sdi.FlagOrdered,
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
	log := p.Logger
	if log == nil {
		log = sd.baseLog
	}
	if len(p.Secret) == 0 {
		log.Warn("no job secret: any process that knows the job id can connect")
	}
	ln, err := listen(ctx, cfg.listen)
	if err != nil {
		return sdi.Local{}, err
	}
	lnAddr := ln.Addr().(*net.TCPAddr).AddrPort()
	addrs := cardAddrs(lnAddr.Addr(), log)
	c := card{Rank: p.Rank, JobTag: jobTag(p.JobID), Port: lnAddr.Port(), Host: p.Host, Addrs: addrs}
	b, err := c.encode()
	if err != nil {
		ln.Close()
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
	sd.inbound = make(map[*inbound]struct{})
	sd.latest = make(map[sdi.Rank]*inbound)
	sd.handshakes = make(chan struct{}, maxHandshakes)
	sd.wg.Add(1)
	go sd.acceptLoop()
	log.Debug("listening", "addr", ln.Addr(), "card_addrs", addrs, "queue_bytes", cfg.queueBytes, "connect_timeout", cfg.connectTimeout)
	return sdi.Local{Addr: b, Caps: caps()}, nil
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

// cardAddrs lists the addresses peers may dial to reach a listener bound to
// bound: loopback first, then the addresses of interfaces that are up. A
// listener bound to one address publishes only that one.
func cardAddrs(bound netip.Addr, log hclog.Logger) []netip.Prefix {
	bound = bound.Unmap()
	specific := !bound.IsUnspecified()
	want6 := bound.Is6() // the IPv6 wildcard is dual-stack; 0.0.0.0 is not
	ifaces, err := net.Interfaces()
	if err != nil {
		log.Warn("cannot list network interfaces; publishing loopback only", "error", err)
	}
	var loop6 bool
	var other []netip.Prefix
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 {
			continue
		}
		ias, err := ifc.Addrs()
		if err != nil {
			log.Debug("cannot list interface addresses", "interface", ifc.Name, "error", err)
			continue
		}
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
					return []netip.Prefix{netip.PrefixFrom(a, bits)}
				}
				continue
			}
			if a.Is6() && !want6 {
				continue
			}
			switch {
			case a == netip.IPv6Loopback():
				loop6 = true
			case a.IsLoopback():
				// 127.0.0.1 is published below; the rest of 127/8 adds nothing.
			case a.IsLinkLocalUnicast() || a.IsMulticast() || a.IsUnspecified():
				// Link-local needs a zone that means nothing on the peer.
			default:
				other = append(other, netip.PrefixFrom(a, bits))
			}
		}
	}
	if specific {
		// No interface lists the bound address (one went down meanwhile):
		// publish it as it is.
		return []netip.Prefix{netip.PrefixFrom(bound, bound.BitLen())}
	}
	// 127.0.0.1 exists on every host we run on, even when the interface list
	// is unavailable; ::1 only where an interface that is up carries it.
	loop := []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8")}
	if loop6 {
		loop = append(loop, netip.MustParsePrefix("::1/128"))
	}
	if len(loop)+len(other) > maxCardAddrs {
		log.Debug("too many addresses for the business card; dropping the rest", "kept", maxCardAddrs, "dropped", len(loop)+len(other)-maxCardAddrs)
		other = other[:maxCardAddrs-len(loop)]
	}
	return append(loop, other...)
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

// Send queues f for the peer's writer and returns done=false; SendDone
// follows from the writer goroutine once the frame is written (or failed).
// It never blocks: a peer whose queue holds queue_bytes or more gets
// ErrWouldBlock.
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
	return false, p.send(f)
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
	sd.peers[rank].CompareAndSwap(p, nil)
	sd.mu.Unlock()
	p.halt(fmt.Errorf("tcp: rank %d disconnected: %w", rank, sdi.ErrNotConnected), false)
	// Halting closed the connection, so the writer and watcher end without
	// waiting on the network.
	<-p.done
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
		p.halt(errClosed, false)
	}
	for _, c := range conns {
		c.Close()
	}
	sd.wg.Wait()
	sd.log.Debug("closed")
}
