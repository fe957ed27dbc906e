//go:build udapl && cgo

package udapl

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/sdi"
)

const (
	// fallbackIA is dialed when the DAT registry lists nothing: the OFED
	// cma provider on the first IPoIB interface.
	fallbackIA = "ofa-v2-ib0"

	// loopSlice bounds each dat_evd_wait of the listener and connection
	// goroutines: DAT cannot wake a waiter from another thread, so this is
	// how long Close may wait for them to notice it.
	loopSlice = 20 * time.Millisecond
	// waitSlice bounds each dat_evd_wait of Wait, for the same reason, and
	// because the completions the provider makes itself (flushes of freed
	// endpoints) cannot wake a DAT waiter either: they are seen within it.
	waitSlice = 5 * time.Millisecond
	// acceptTimeout bounds Accept's wait for the connection to be
	// established; a provider reports a peer that vanishes mid-handshake
	// well before it.
	acceptTimeout = 30 * time.Second

	// Queue lengths asked of dat_evd_create, capped by the adapter's
	// max_evd_qlen. Connection events are two or three per endpoint and
	// drained continuously. The DTO queue is the engine's CQSize, which
	// bounds the connections (the engine reserves 80 entries for each at
	// the default recv_slots); dapl keeps a 120-byte DAT_EVENT per entry
	// beside the CQ, 8 MB for these 65536.
	asyncQlen = 64
	crQlen    = 1024
	connQlen  = 4096
	dtoQlen   = 1 << 16

	// minQueueDepth is the least send and receive depth of an endpoint;
	// it grows to twice the engine's receive slots.
	minQueueDepth = 128
	// maxReadDepth caps the RDMA reads in flight per endpoint each way, as
	// InfiniBand adapters do (max_qp_rd_atom).
	maxReadDepth = 16
	// maxPrivateWire is the private data every DAT provider carries in a
	// connection request: the 92 bytes of an InfiniBand CM REQ less the
	// RDMA CM's header. Providers that report more do not all deliver it.
	maxPrivateWire = 56
	// maxMsgCap keeps MaxMsg an int on every platform and below what any
	// single work request needs.
	maxMsgCap = 1 << 30
	// dequeueBatch is how many DTO events Poll takes per C call.
	dequeueBatch = 64
)

// provider is one opened uDAPL interface adapter. It is safe for concurrent
// use as rdma.Provider requires.
//
// Goroutines and what they own:
//   - the engine's goroutines call Register, Dial, Accept, Reject, the
//     endpoints' posts and Close, any of them at once;
//   - one goroutine at a time polls or waits (Poll, Wait); evMu makes the
//     DTO EVD theirs, since dapl refuses dat_evd_dequeue while another
//     thread is inside dat_evd_wait on the same EVD, and watch takes it
//     to free an endpoint, which writes into that EVD unlocked;
//   - listen owns the CR EVD and delivers connection requests;
//   - watch owns the connection and async EVDs and frees closed endpoints
//     (see freeEndpoints for why there).
//
// Close stops listen and watch, then takes closeMu for writing, so that no
// DAT call that reads provider-wide handles (Register, Dial, Accept, Reject,
// Endpoint.Close) runs while it frees them.
type provider struct {
	log    hclog.Logger
	iaName string

	// Handles, set by openProvider and freed only by Close.
	ia, asyncEVD, pz, dtoEVD, crEVD, connEVD, psp datHandle

	card   []byte
	limits rdma.Limits
	attrs  epAttrs

	reqs chan rdma.Request // sent to by listen only; closed by Close after listen ended
	done chan struct{}     // closed by Close: listen, watch and waiting Dials and Accepts stop
	wg   sync.WaitGroup    // listen and watch

	// dead is set once, by fail, when the IA or the provider's view of it
	// is gone for good; deadCh is closed then. See fail.
	dead   atomic.Pointer[iaError]
	deadCh chan struct{}

	closeOnce sync.Once
	closeErr  error
	closed    atomic.Bool
	closeMu   sync.RWMutex

	// lifeMu is held by whoever creates an endpoint and by watch while it
	// frees one and drains the connection events that may name it: a new
	// endpoint cannot be given a freed handle's address while such events
	// are queued.
	lifeMu sync.Mutex

	mu      sync.Mutex
	eps     map[datHandle]*endpoint // open and closing endpoints, until freed
	regions map[*region]struct{}    // registered, not yet closed
	crs     map[*request]struct{}   // delivered, not yet answered
	freeq   []*endpoint             // closed, waiting for watch to free them
	stuck   []*region               // dat_lmr_free refused: pinned until dat_ia_close
	failed  []uint64                // serials of endpoints whose work failed, for watch to disconnect
	causes  map[uint64]error        // by serial: why endpoints were cut (see endpoint.cut), until freed
	serial  uint64                  // the last endpoint serial number given out

	wrs wrTable

	evMu     sync.Mutex // the DTO EVD: held by Poll, Wait and Close
	evClosed bool       // guarded by evMu
	evBuf    [dequeueBatch]dtoEvent
	waitEv   dtoEvent

	pendMu sync.Mutex
	// pending holds completions that come before those still in the DTO
	// EVD: the event Wait took out of it, and flushes the provider made
	// itself.
	pending []rdma.Completion
}

var _ rdma.Provider = (*provider)(nil)

// errFlushed is the error of work an endpoint's end cut off.
var errFlushed = fmt.Errorf("udapl: %w", rdma.ErrFlushed)

// open is the rdma.OpenFunc of the subdevice.
func open(ctx context.Context, params sdi.OpenParams) (rdma.Provider, rdma.Settings, error) {
	cfg, err := parseConfig(params.Config)
	if err != nil {
		return nil, rdma.Settings{}, err
	}
	if err := ctx.Err(); err != nil {
		return nil, rdma.Settings{}, fmt.Errorf("udapl: open: %w", err)
	}
	p, err := openProvider(cfg, params.Logger)
	if err != nil {
		return nil, rdma.Settings{}, err
	}
	return p, cfg.settings, nil
}

// openProvider opens the interface adapter cfg names and everything the
// provider keeps for its life. On error every handle it made is freed.
// dat_ia_open cannot be cancelled; it fails fast where there is no device.
func openProvider(cfg config, log hclog.Logger) (*provider, error) {
	name, from := cfg.ia, "config key ia"
	if name == "" {
		if first, ok := firstProvider(); ok {
			name, from = first, "the first entry of the DAT registry"
		} else {
			name, from = fallbackIA, "the default; the DAT registry lists nothing"
		}
	}
	ia, async, st := iaOpen(name, asyncQlen)
	if !st.ok() {
		return nil, fmt.Errorf("udapl: dat_ia_open %q (%s): %w: %w "+
			"(is the adapter there and up, and does /etc/dat.conf, or the file $DAT_OVERRIDE names, list %q? config key ia chooses another entry)",
			name, from, st, rdma.ErrNoDevice, name)
	}
	p := &provider{
		log:      log,
		iaName:   name,
		ia:       ia,
		asyncEVD: async,
		reqs:     make(chan rdma.Request),
		done:     make(chan struct{}),
		deadCh:   make(chan struct{}),
		eps:      make(map[datHandle]*endpoint),
		regions:  make(map[*region]struct{}),
		crs:      make(map[*request]struct{}),
		causes:   make(map[uint64]error),
	}
	if err := p.setUp(cfg); err != nil {
		return nil, errors.Join(err, p.release())
	}
	p.wg.Add(2)
	go p.listen()
	go p.watch()
	log.Info("opened uDAPL interface adapter", "ia", name, "from", from, "card", p.cardAddr(),
		"max_msg", p.limits.MaxMsg, "queue_depth", p.limits.MaxRecvWR, "cq_size", p.limits.CQSize,
		"max_private", p.limits.MaxPrivate)
	return p, nil
}

// setUp queries the adapter, derives the limits and makes the PZ, the
// EVDs and the PSP.
func (p *provider) setUp(cfg config) error {
	info, st := iaQuery(p.ia)
	if !st.ok() {
		return fmt.Errorf("udapl: dat_ia_query of %q: %w", p.iaName, st)
	}
	addr, ok := info.ipAddr()
	// A provider that packs InfiniBand addressing into the sockaddr (the
	// ucm and mcm ones) fills sin6_flowinfo with a queue pair number.
	if !ok || info.flowinfo != 0 {
		return fmt.Errorf("udapl: IA %q reports an address of family %d that is not an IP address; "+
			"the card carries one, so use a cma or scm entry of /etc/dat.conf (ofa-v2-ib0, ofa-v2-mlx4_0-1), not ucm or mcm: %w",
			p.iaName, info.family, rdma.ErrNoDevice)
	}
	if addr.IsUnspecified() {
		return fmt.Errorf("udapl: IA %q has no address (is its interface configured?): %w", p.iaName, rdma.ErrNoDevice)
	}

	maxMsg := info.maxMessageSize
	if info.maxRDMASize != 0 && info.maxRDMASize < maxMsg {
		maxMsg = info.maxRDMASize
	}
	if maxMsg == 0 {
		return fmt.Errorf("udapl: IA %q reports a largest message of 0 bytes", p.iaName)
	}
	maxMsg = min(maxMsg, maxMsgCap)
	slots := cfg.settings.RecvSlots
	if slots == 0 {
		slots = rdma.DefaultRecvSlots
	}
	depth := max(minQueueDepth, 2*slots)
	if info.maxDTOPerEP > 0 {
		depth = min(depth, info.maxDTOPerEP)
	}
	privWire := min(info.maxPrivate, maxPrivateWire)
	if privWire < 2 {
		return fmt.Errorf("udapl: IA %q carries %d bytes of private data in a connection request, too few", p.iaName, info.maxPrivate)
	}
	p.attrs = epAttrs{
		maxRecv: depth,
		maxSend: depth,
		maxMsg:  maxMsg,
		readIn:  min(max(info.maxReadIn, 1), maxReadDepth),
		readOut: min(max(info.maxReadOut, 1), maxReadDepth),
	}
	capQ := func(n int) int {
		if info.maxEVDQlen > 0 {
			return min(n, info.maxEVDQlen)
		}
		return n
	}

	if p.pz, st = pzCreate(p.ia); !st.ok() {
		return fmt.Errorf("udapl: dat_pz_create: %w", st)
	}
	cq := capQ(dtoQlen)
	if p.dtoEVD, st = evdCreate(p.ia, cq, evdDTO); !st.ok() {
		return fmt.Errorf("udapl: dat_evd_create of the completion EVD (%d events)%s: %w", cq, st.memlockHint(), st)
	}
	if p.crEVD, st = evdCreate(p.ia, capQ(crQlen), evdCR); !st.ok() {
		return fmt.Errorf("udapl: dat_evd_create of the connection request EVD%s: %w", st.memlockHint(), st)
	}
	if p.connEVD, st = evdCreate(p.ia, capQ(connQlen), evdConnection); !st.ok() {
		return fmt.Errorf("udapl: dat_evd_create of the connection EVD%s: %w", st.memlockHint(), st)
	}
	port, err := p.createPSP(cfg.port)
	if err != nil {
		return err
	}
	p.card = encodeCard(netip.AddrPortFrom(addr, port))
	p.limits = rdma.Limits{
		MaxSendWR:  depth,
		MaxRecvWR:  depth,
		MaxMsg:     int(maxMsg),
		MaxPrivate: privWire - 1, // one byte of it carries the length; see Dial
		CQSize:     cq,
	}
	return nil
}

// createPSP listens on qualifier port, or without one on the first free
// qualifier from defaultPortBase, and returns the qualifier.
func (p *provider) createPSP(port uint16) (uint16, error) {
	if port != 0 {
		psp, st := pspCreate(p.ia, port, p.crEVD)
		if !st.ok() {
			return 0, fmt.Errorf("udapl: dat_psp_create on connection qualifier %d (config key port): %w", port, st)
		}
		p.psp = psp
		return port, nil
	}
	for q := defaultPortBase; q < defaultPortBase+portScan; q++ {
		psp, st := pspCreate(p.ia, uint16(q), p.crEVD)
		if st.ok() {
			p.psp = psp
			return uint16(q), nil
		}
		if st.typ() != datConnQualInUse && st.typ() != datPortInUse {
			return 0, fmt.Errorf("udapl: dat_psp_create on connection qualifier %d: %w", q, st)
		}
	}
	return 0, fmt.Errorf("udapl: dat_psp_create: connection qualifiers %d to %d are all in use (config key port chooses one)",
		defaultPortBase, defaultPortBase+portScan-1)
}

func (p *provider) cardAddr() string {
	ap, err := parseCard(p.card)
	if err != nil {
		return fmt.Sprintf("%x", p.card)
	}
	return ap.String()
}

// Card returns the IA address and connection qualifier of the listener.
func (p *provider) Card() []byte { return append([]byte(nil), p.card...) }

// Limits returns the limits derived from the adapter at open.
func (p *provider) Limits() rdma.Limits { return p.limits }

// Requests returns the channel listen delivers connection requests on.
func (p *provider) Requests() <-chan rdma.Request { return p.reqs }

// pushPending adds completions the provider made itself. After Close they
// are dropped: none are polled then.
func (p *provider) pushPending(cs ...rdma.Completion) {
	if len(cs) == 0 {
		return
	}
	p.pendMu.Lock()
	if !p.closed.Load() {
		p.pending = append(p.pending, cs...)
	}
	p.pendMu.Unlock()
}

func (p *provider) takePending(cs []rdma.Completion) int {
	p.pendMu.Lock()
	defer p.pendMu.Unlock()
	n := copy(cs, p.pending)
	p.pending = p.pending[:copy(p.pending, p.pending[n:])]
	return n
}

func (p *provider) hasPending() bool {
	p.pendMu.Lock()
	defer p.pendMu.Unlock()
	return len(p.pending) > 0
}

// Poll moves completions into cs: first those the provider holds, then
// those in the DTO EVD. It does not block: while Wait owns the EVD it
// returns what the provider holds, and Wait's return makes the engine poll
// again.
//
// Once Close has begun Poll returns nothing, and no error: the engine may
// still be polling while it closes, and a closing provider has not failed.
func (p *provider) Poll(cs []rdma.Completion) (int, error) {
	if p.closed.Load() {
		return 0, nil
	}
	n := p.takePending(cs)
	if n == len(cs) || p.dead.Load() != nil || !p.evMu.TryLock() {
		return n, nil
	}
	defer p.evMu.Unlock()
	if p.evClosed {
		return n, nil
	}
	for n < len(cs) {
		want := min(len(cs)-n, len(p.evBuf))
		got, st := dtoDequeue(p.dtoEVD, p.evBuf[:want])
		for i := range got {
			if c, ok := p.completion(&p.evBuf[i]); ok {
				cs[n] = c
				n++
			}
		}
		if !st.ok() {
			// dapl fails every dequeue once the EVD overflowed, and
			// the completions it lost would never come: the provider
			// fails, and watch flushes the work still posted. No error
			// is returned: the engine fails connections by their
			// completions, and would only log it.
			p.fail(&iaError{ia: p.iaName, what: "dequeuing its completions failed (the completion EVD overflowed?)",
				err: fmt.Errorf("dat_evd_dequeue of the completion EVD: %w", st)})
			return n, nil
		}
		if got < want {
			break
		}
	}
	return n, nil
}

// completion turns a DTO event into the engine's completion; false for an
// event that completes nothing (stale, see wrTable).
func (p *provider) completion(ev *dtoEvent) (rdma.Completion, bool) {
	number, cookie, status, length := ev.fields()
	if number != evDTOCompletion {
		p.log.Warn("unexpected event on the completion EVD", "event", number)
		return rdma.Completion{}, false
	}
	c, owner, ok := p.wrs.take(cookie)
	if !ok {
		if p.log.IsTrace() {
			p.log.Trace("completion of flushed or unknown work dropped", "cookie", cookie, "status", status)
		}
		return rdma.Completion{}, false
	}
	switch status {
	case dtoSuccess:
		if c.Op == rdma.OpRecv {
			c.Len = length
		}
	case dtoFlushed:
		c.Err = flushedBy(p.causeOwner(owner))
	default:
		c.Err = fmt.Errorf("udapl: %s on endpoint %d failed: %s", c.Op, c.Endpoint, status)
		if cause := p.causeOwner(owner); cause != nil {
			c.Err = fmt.Errorf("%w: %w", c.Err, cause)
		}
		// The queue pair is in error now and flushes the rest of its
		// work, but the peer's flushes only when the connection ends;
		// watch disconnects it.
		p.mu.Lock()
		p.failed = append(p.failed, owner)
		p.mu.Unlock()
	}
	return c, true
}

// Arm does nothing: dat_evd_wait looks at the queue before it sleeps, so a
// completion that came before Wait wakes it whether armed or not.
func (p *provider) Arm() error { return nil }

// Wait waits on the DTO EVD in slices of waitSlice until an event comes,
// the provider holds completions, or ctx is done. The event it takes out of
// the EVD is kept, and the next Poll returns it first.
func (p *provider) Wait(ctx context.Context) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if p.hasPending() {
			return nil
		}
		slice := waitSlice
		if dl, ok := ctx.Deadline(); ok {
			slice = max(min(slice, time.Until(dl)), time.Microsecond)
		}
		if p.dead.Load() != nil {
			// Nothing completes any more but what watch flushes.
			t := time.NewTimer(slice)
			select {
			case <-ctx.Done():
			case <-p.done:
			case <-t.C:
			}
			t.Stop()
			return nil
		}
		p.evMu.Lock()
		if p.evClosed {
			p.evMu.Unlock()
			return fmt.Errorf("udapl: wait: %w", sdi.ErrClosed)
		}
		st := dtoWait(p.dtoEVD, uint32(slice/time.Microsecond), &p.waitEv)
		if st.ok() {
			if c, ok := p.completion(&p.waitEv); ok {
				p.pushPending(c)
			}
		}
		p.evMu.Unlock()
		switch {
		case st.ok():
			return nil
		case !st.idle():
			p.fail(&iaError{ia: p.iaName, what: "waiting for its completions failed (the completion EVD overflowed?)",
				err: fmt.Errorf("dat_evd_wait on the completion EVD: %w", st)})
			return nil
		}
	}
}

// Close stops the listener, fails unanswered requests, closes every
// endpoint and region and frees the handles, in the order DAT requires:
// endpoints, memory, service point, EVDs, protection zone, IA. It waits at
// most a loop slice for listen and watch, and for DAT calls in flight.
func (p *provider) Close() error {
	p.closeOnce.Do(func() {
		p.closed.Store(true)
		close(p.done)
		p.wg.Wait()
		close(p.reqs)

		p.closeMu.Lock()
		defer p.closeMu.Unlock()
		// Poll and Wait stop first, so that no thread is inside the DTO
		// EVD while endpoints are freed and then the EVD itself.
		p.evMu.Lock()
		p.evClosed = true
		p.evMu.Unlock()
		p.pendMu.Lock()
		p.pending = nil
		p.pendMu.Unlock()
		p.closeErr = p.release()
		p.log.Debug("closed uDAPL interface adapter", "ia", p.iaName, "error", p.closeErr)
	})
	return p.closeErr
}

// release answers and frees everything still held. It runs with no other
// goroutine using the handles: from Close, or from openProvider before the
// provider was returned.
func (p *provider) release() error {
	var errs []error
	p.mu.Lock()
	crs, eps, regions := p.crs, p.eps, p.regions
	p.crs, p.eps, p.regions, p.freeq = map[*request]struct{}{}, map[datHandle]*endpoint{}, map[*region]struct{}{}, nil
	p.mu.Unlock()

	for r := range crs {
		if r.answer() {
			if st := crReject(r.cr); !st.ok() {
				errs = append(errs, fmt.Errorf("udapl: close: dat_cr_reject: %w", st))
			}
		}
	}
	for h, e := range eps {
		e.markClosed()
		if st := epFree(h); !st.ok() {
			// dat_ia_close below still frees it.
			errs = append(errs, fmt.Errorf("udapl: close: dat_ep_free of endpoint %d: %w", e.id, st))
		}
	}
	for r := range regions {
		if err := r.deregister(); err != nil {
			errs = append(errs, fmt.Errorf("udapl: close: %w", err))
		}
	}
	free := func(h *datHandle, what string, f func(datHandle) datStatus) {
		if *h == nil {
			return
		}
		if st := f(*h); !st.ok() {
			errs = append(errs, fmt.Errorf("udapl: close: %s: %w", what, st))
		}
		*h = nil
	}
	free(&p.psp, "dat_psp_free", pspFree)
	free(&p.connEVD, "dat_evd_free of the connection EVD", evdFree)
	free(&p.crEVD, "dat_evd_free of the connection request EVD", evdFree)
	free(&p.dtoEVD, "dat_evd_free of the completion EVD", evdFree)
	free(&p.pz, "dat_pz_free", pzFree)
	// The async EVD belongs to the IA, which frees it.
	p.asyncEVD = nil
	free(&p.ia, "dat_ia_close", iaClose)
	// dat_ia_close took the registrations dat_lmr_free refused with it.
	p.mu.Lock()
	stuck := p.stuck
	p.stuck = nil
	p.mu.Unlock()
	for _, r := range stuck {
		r.pin.Unpin()
	}
	return errors.Join(errs...)
}
