package multidevice

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Indirect communication. A peer the connection table (or the automatic
// routing in reach.go) reaches "via rank G" gets every frame of the
// multidevice protocol — eager, ready-to-send, clear-to-send, rendezvous
// data, acknowledgements — wrapped as a system message of kind sysFwd:
//
//	outer header (64 bytes)                     payload
//	+--------------------------------------+    +----------------+-----------+
//	| kind sys, tag sysFwd                 |    | inner header   | data of   |
//	| source, final destination            |    | (the frame as  | at most   |
//	| sequence: block number on the line   |    | sent directly) | one block |
//	| length: payload bytes                |    +----------------+-----------+
//	| offset: message length (size class) |
//	| context: hops travelled so far       |
//	| flags: credit (receiver request id:  |
//	|   credit for the line the other way),|
//	|   urgent (the source wants credit)   |
//	+--------------------------------------+
//
// Where the subdevice takes headers of 128 bytes the block travels split:
// the inner header follows the outer one in the frame's header and the
// payload is the data alone, which then need not follow the inner header
// in memory (the source sends rendezvous data from the application's
// buffer) and which the destination's subdevice can write straight into
// the receive buffer (Place). The outer header's length counts the inner
// header either way.
//
// Rendezvous data is cut into blocks of ForwardOptions.BlockSize, so a
// gateway sends block k on while block k+1 is still arriving and no link
// is held for a whole message. A gateway (any rank the frame reaches with a
// destination other than itself) copies the frame and sends it on its own
// route to the destination: the next gateway or the destination itself.
// The destination unwraps the inner frame and handles it exactly as if it
// had come directly: the inner header carries the end-to-end sequence
// number, so MPI order holds however the blocks travelled, and rendezvous
// blocks land at their offset.
//
// Each (source, destination) pair through gateways is a virtual line with
// its own block numbers. The source keeps every block until the
// destination acknowledges it with a credit message (sysCredit, a
// cumulative block number, not wrapped, forwarded like sysFwd along the
// reverse route, its payload the bytes received per trunk: delivery.go)
// and stops admitting blocks while ForwardOptions.Window bytes are
// unacknowledged: that bounds what all gateways of the line hold together
// (credit.go). Several gateways to one destination are trunks; blocks go
// to the one that would deliver them first, and the blocks a dead gateway held are
// sent again through the others (trunk.go); the destination drops the
// duplicates by block number. A gateway that cannot pass a block on tells
// its source with a sysLost message, forwarded like a credit (lost.go).

// System message tags for indirect communication (see send.go for the
// others).
const (
	sysFwd    int32 = -4 // a forwarded block: inner header + data
	sysCredit int32 = -5 // the destination acknowledges blocks: seq = every block below is received; payload: a report (delivery.go)
	// sysLost: a gateway could not pass a block on (lost.go). seq = the
	// block, offset = its line's destination, sreq = the block's trunk
	// slot plus one, as the source stamped it; payload: why. Of a credit
	// it could not pass on: sreq 0, rreq = the credit's trunk slot plus one.
	sysLost int32 = -6
)

// ForwardOptions tune indirect routes. The zero value takes the defaults.
// Only the source of a virtual line uses them, so ranks need not agree.
type ForwardOptions struct {
	// BlockSize is the most data bytes one forwarded block carries; 0 means
	// 64 KiB through gateways and a quarter of Window on a failover route
	// whose trunks all go straight to the peer (no gateway holds its
	// blocks). It is further capped so a block fits the MaxFrame of the
	// first hop's subdevices (with its inner header, unless they take
	// headers of 128 bytes); every later hop must carry frames that large
	// too.
	BlockSize int
	// Window is the credit of one virtual line: the most bytes (blocks
	// with their inner header) a source keeps sent but unacknowledged
	// towards one destination through gateways. It bounds what gateways
	// hold for the line, however slowly the destination drains: a gateway
	// holds at most Window bytes of it that the destination has not
	// received, plus at most one block whose next subdevice reports the
	// send complete only after delivery (the credit may overtake that
	// report). 0 means 4 MiB; it must hold at least one block.
	Window int
	// Retry is the pause before a dead trunk (a route of a failover
	// entry, or a gateway) is tried again, doubled after every attempt
	// that fails up to 30 s, or Retry if that is longer (trunk.go). 0
	// means 1 s; a negative Retry leaves dead trunks dead.
	Retry time.Duration
}

const (
	defaultBlockSize = 64 << 10
	defaultWindow    = 4 << 20
	defaultRetry     = time.Second
	// maxHops drops a frame that has passed this many gateways: a routing
	// loop from inconsistent tables must not circle forever.
	maxHops = 16
	// maxAhead bounds how far beyond the next expected block a destination
	// remembers arrivals; a source never runs that far ahead.
	maxAhead = 1 << 20
	// maxPooledBlock is the largest block buffer kept for reuse.
	maxPooledBlock = 1<<20 + 2*headerSize
)

// Environment variables that set ForwardOptions for programs built on adi
// and for cmd/mdrelay: block and window in whole numbers of bytes, retry
// as a duration ("500ms", "2s") or "off".
const (
	EnvForwardBlock  = "MD_FORWARD_BLOCK"
	EnvForwardWindow = "MD_FORWARD_WINDOW"
	EnvForwardRetry  = "MD_FORWARD_RETRY"
)

// ForwardFromEnv reads ForwardOptions from MD_FORWARD_BLOCK,
// MD_FORWARD_WINDOW and MD_FORWARD_RETRY through getenv (os.Getenv); unset
// means the default.
func ForwardFromEnv(getenv func(string) string) (ForwardOptions, error) {
	var o ForwardOptions
	switch s := getenv(EnvForwardRetry); s {
	case "":
	case "off":
		o.Retry = -1
	default:
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return ForwardOptions{}, fmt.Errorf("multidevice: %s=%q: want a positive duration such as 500ms or 2s, or off", EnvForwardRetry, s)
		}
		o.Retry = d
	}
	for _, v := range []struct {
		name string
		dst  *int
	}{{EnvForwardBlock, &o.BlockSize}, {EnvForwardWindow, &o.Window}} {
		s := getenv(v.name)
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			return ForwardOptions{}, fmt.Errorf("multidevice: %s=%q: want a positive whole number of bytes", v.name, s)
		}
		*v.dst = n
	}
	return o, o.withDefaults().validate()
}

func (o ForwardOptions) withDefaults() ForwardOptions {
	if o.BlockSize == 0 {
		o.BlockSize = defaultBlockSize
	}
	if o.Window == 0 {
		o.Window = defaultWindow
	}
	if o.Retry == 0 {
		o.Retry = defaultRetry
	}
	return o
}

func (o ForwardOptions) validate() error {
	switch {
	case o.BlockSize < 1:
		return fmt.Errorf("multidevice: forward block size %d must be positive", o.BlockSize)
	case o.Window < o.BlockSize+headerSize:
		return fmt.Errorf("multidevice: forward window %d must hold one block (block size %d + %d header bytes)", o.Window, o.BlockSize, headerSize)
	}
	return nil
}

// trunk is one way towards an indirect peer: the subdevice to hand the
// frame to and the gateway rank it goes to (the peer itself on a failover
// route). A trunk on standby carries nothing while one that is not lives.
type trunk struct {
	sub     *subdev
	via     int32
	standby bool
	// slot indexes the peer's txLine.load and stats: one per distinct trunk of the
	// peer's classes, set by setPath. A map keyed by trunk cost a hash of
	// the struct on every block admitted and acknowledged.
	slot int
}

// forwarder is the Device's state for indirect communication.
type forwarder struct {
	opts     ForwardOptions
	blockSet bool // opts.BlockSize was given, not the default
	// Written by route during Open, read-only afterwards.
	indirect []bool          // [peer] some size class reaches it through gateways
	gated    []bool          // [peer] some trunk to it is a gateway, not the peer itself
	paths    [][][]trunk     // [peer][class] trunks; nil for a direct route
	chunk    [][]int         // [peer][class] data bytes per block, for indirect routes
	split    [][]bool        // [peer][class] every trunk splits: rendezvous data goes uncopied
	tx       []*txLine       // [peer] non-nil for indirect peers: credit.go
	rx       []rxLine        // [source] lines ending here, guarded by rxMu
	rxMu     sync.Mutex      // taken under Device.mu (placeForwarded), never the reverse
	dead     [][]atomic.Bool // [via][subdevice] trunks found dead: trunk.go
	// cards are the business cards of every trunk's first hop, kept from
	// Open for trying a dead trunk again; read-only after Open.
	cards map[trunkKey][]byte
	// life ends when the Device shuts down (end); it stops those
	// attempts. lifeMu orders starting one (Device.wg.Add) before the end.
	life     context.Context
	stopLife context.CancelFunc
	lifeMu   sync.Mutex

	held       atomic.Int64 // bytes this rank holds as a gateway
	heldMax    atomic.Int64
	forwarded  atomic.Uint64 // frames this rank passed on as a gateway
	fwdBytes   atomic.Uint64
	resent     atomic.Uint64 // blocks sent again after a gateway died
	nudged     atomic.Uint64 // blocks sent again because credit stopped coming (watch)
	credits    atomic.Uint64 // credit messages sent: spreads them over trunks
	dups       atomic.Uint64 // blocks that arrived here twice and were dropped
	lostBlocks atomic.Uint64 // blocks this rank, a gateway, could not pass on (lost.go)

	// Frames to forward or unwrap can arrive while this rank still computes
	// its routes (peers that finished Open already send); they wait in
	// early until Open is done.
	ready   atomic.Bool
	earlyMu sync.Mutex
	early   []earlyFrame
}

type earlyFrame struct {
	from        int32
	h           header
	inner, data []byte
}

func (f *forwarder) init(size, nclass, nsub int) {
	f.indirect = make([]bool, size)
	f.gated = make([]bool, size)
	f.paths = make([][][]trunk, size)
	f.chunk = make([][]int, size)
	f.split = make([][]bool, size)
	f.tx = make([]*txLine, size)
	f.rx = make([]rxLine, size)
	f.dead = make([][]atomic.Bool, size)
	f.cards = make(map[trunkKey][]byte)
	for p := range size {
		f.dead[p] = make([]atomic.Bool, nsub)
		f.paths[p] = make([][]trunk, nclass)
		f.chunk[p] = make([]int, nclass)
		f.split[p] = make([]bool, nclass)
	}
}

// setPath makes class ci of peer go through trunks.
func (f *forwarder) setPath(peer, ci int, trunks []trunk) {
	f.indirect[peer] = true
	f.paths[peer][ci] = trunks
	chunk, split, direct := f.opts.BlockSize, true, true
	for _, t := range trunks {
		split = split && t.sub.splits()
		direct = direct && t.via == int32(peer)
	}
	f.gated[peer] = f.gated[peer] || !direct
	if direct && !f.blockSet {
		// No gateway holds a block of a failover route: its blocks may be
		// as large as the subdevices carry, as the frames of a plain
		// route are. In blocks of 64 KiB the system calls per frame cost
		// a line over tcp half its bandwidth.
		chunk = f.opts.Window / 4
	}
	for _, t := range trunks {
		room := t.sub.caps.MaxFrame
		if !split { // the inner header travels in the payload
			room -= headerSize
		}
		chunk = min(chunk, room)
	}
	f.chunk[peer][ci], f.split[peer][ci] = chunk, split
	l := f.tx[peer]
	if l == nil {
		l = &txLine{}
		f.tx[peer] = l
	}
	for i, t := range trunks {
		t.slot = slices.IndexFunc(l.ways, func(w trunk) bool { return w.same(t) && w.standby == t.standby })
		if t.slot < 0 {
			t.slot = len(l.ways)
			l.ways = append(l.ways, t)
			l.load = append(l.load, 0)
			l.stats = append(l.stats, wayStat{})
		}
		trunks[i] = t
	}
}

// same reports whether t and o are one way: the same subdevice to the
// same rank.
func (t trunk) same(o trunk) bool { return t.sub == o.sub && t.via == o.via }

// trunkKey names a trunk's way: the rank it reaches first and the index
// of its subdevice.
type trunkKey struct {
	via int32
	sub int
}

func (t trunk) key() trunkKey { return trunkKey{t.via, t.sub.idx} }

// isDead reports whether trunk t was found dead.
func (f *forwarder) isDead(t trunk) bool { return f.dead[t.via][t.sub.idx].Load() }

// live returns the trunks of (peer, class) that carry traffic now: the
// live ones not on standby, or, when none of those lives, the live ones
// on standby. It allocates: the block path uses pickTrunkLocked, and a
// gateway passing frames on uses nextHop.
func (f *forwarder) live(peer, class int) []trunk {
	var active, standby []trunk
	for _, t := range f.paths[peer][class] {
		switch {
		case f.isDead(t):
		case t.standby:
			standby = append(standby, t)
		default:
			active = append(active, t)
		}
	}
	if len(active) > 0 {
		return active
	}
	return standby
}

// ForwardStats describe this rank's part in indirect communication.
type ForwardStats struct {
	Held      int64  // bytes held now as a gateway (copied, not yet handed on)
	MaxHeld   int64  // the most bytes ever held at once as a gateway
	Forwarded uint64 // frames passed on as a gateway
	Bytes     uint64 // payload bytes passed on as a gateway
	Resent    uint64 // blocks this rank sent again after a gateway died
	Nudged    uint64 // blocks this rank sent again because their credit stopped coming
	Dropped   uint64 // blocks that reached this rank twice (sent again) and were dropped
	Lost      uint64 // blocks this rank could not pass on as a gateway; each source was told
}

// ForwardStats reports what this rank forwarded and holds.
func (d *Device) ForwardStats() ForwardStats {
	f := &d.fwd
	return ForwardStats{Held: f.held.Load(), MaxHeld: f.heldMax.Load(), Forwarded: f.forwarded.Load(), Bytes: f.fwdBytes.Load(), Resent: f.resent.Load(), Nudged: f.nudged.Load(), Dropped: f.dups.Load(), Lost: f.lostBlocks.Load()}
}

// Path describes how a message of n bytes travels to peer: the subdevice of
// the first hop and the gateways it may go through (empty for a direct
// link). Only the trunks that carry traffic now count (see live): after a
// failover the subdevice is the first of those.
func (d *Device) Path(peer, n int) (subdevice string, gateways []int, err error) {
	if peer < 0 || peer >= d.size {
		return "", nil, fmt.Errorf("%w: %d not in [0,%d)", ErrRank, peer, d.size)
	}
	ci := d.table.Class(n)
	subdevice = d.subs[d.routes[peer][ci]].name
	live := d.fwd.live(peer, ci)
	if len(live) > 0 {
		subdevice = live[0].sub.name
	}
	for _, t := range live {
		if t.via != int32(peer) && !slices.Contains(gateways, int(t.via)) {
			gateways = append(gateways, int(t.via))
		}
	}
	return subdevice, gateways, nil
}

// post sends a protocol frame to peer, directly or through gateways. With
// direct set the caller may call into subdevices (an application
// goroutine); otherwise everything goes through the outbox.
func (d *Device) post(peer int32, class, msgLen int, of *outFrame, direct bool) {
	if d.indirect(peer, class) {
		d.fwdSend(peer, class, msgLen, of, direct)
		return
	}
	s := d.subs[d.routes[peer][class]]
	if direct {
		d.trySend(s, of, true)
	} else {
		d.out.push(outItem{sub: s, frame: of})
	}
}

// indirect reports whether messages of class go to peer through gateways.
func (d *Device) indirect(peer int32, class int) bool {
	return d.fwd.indirect[peer] && d.fwd.paths[peer][class] != nil
}

// eagerMax is the largest message sent eagerly to peer in class; chunk the
// data bytes per frame of a rendezvous.
func (d *Device) eagerMax(peer int32, class int, s *subdev) int {
	if d.indirect(peer, class) {
		return min(s.caps.MaxEager, d.fwd.chunk[peer][class])
	}
	return s.caps.MaxEager
}

func (d *Device) chunk(peer int32, class int, s *subdev) int {
	if d.indirect(peer, class) {
		return d.fwd.chunk[peer][class]
	}
	return s.caps.MaxFrame
}

// onIndirect handles a sysFwd or sysCredit frame: for this rank it is
// unwrapped or credited, for another it is passed on. A block's inner
// header and data come apart: sent split, the inner header arrived in the
// frame's header, and sub is the subdevice that delivered it (it may have
// placed the data); -1 otherwise.
func (d *Device) onIndirect(sub int, from int32, h *header, inner, data []byte) {
	if !d.fwd.ready.Load() {
		f := &d.fwd
		f.earlyMu.Lock()
		if !f.ready.Load() {
			f.early = append(f.early, earlyFrame{from: from, h: *h, inner: slices.Clone(inner), data: slices.Clone(data)})
			f.earlyMu.Unlock()
			return
		}
		f.earlyMu.Unlock()
	}
	if h.tag == sysFwd && (len(inner) != headerSize || uint64(headerSize+len(data)) != h.length) {
		d.log.Warn("dropping forwarded block whose payload disagrees with its header", "from", from, "payload", len(inner)+len(data), "length", h.length)
		return
	}
	if h.tag == sysCredit && uint64(len(inner)+len(data)) != h.length {
		d.log.Warn("dropping credit whose report disagrees with its header", "from", from, "payload", len(inner)+len(data), "length", h.length)
		return
	}
	switch {
	case h.src == d.rank:
		// Passed on, it would reach its destination as a block of this
		// rank's own line that this rank never sent, and the credit for
		// it would then cover blocks not sent yet: the line would stall,
		// or drop the real block of that number as a duplicate.
		d.log.Warn("dropping forwarded frame from this very rank (a routing loop, or a peer that forges frames)", "from", from, "destination", h.dst, "tag", h.tag)
	case h.dst != d.rank:
		d.passOn(from, h, inner, data)
	case h.tag == sysFwd:
		d.onForward(sub, from, h, inner, data)
	case h.tag == sysLost:
		d.onLost(h, string(inner)+string(data))
	default:
		rep := inner
		if len(data) > 0 { // a report of more than eight slots
			rep = append(slices.Clip(inner), data...)
		}
		d.onCredit(h.src, h.seq, rep)
	}
}

// fwdStart is called once routes are final: indirect frames that came
// early are handled now, and later ones at once.
func (d *Device) fwdStart() {
	f := &d.fwd
	f.earlyMu.Lock()
	f.ready.Store(true)
	early := f.early
	f.early = nil
	f.earlyMu.Unlock()
	for i := range early {
		e := &early[i]
		d.onIndirect(-1, e.from, &e.h, e.inner, e.data) // none was placed
	}
}

// passOn passes a frame for another rank on along this rank's own route to
// it. The payload is copied (it is valid only during Deliver) and counted
// as held until the next subdevice has it.
func (d *Device) passOn(from int32, h *header, inner, data []byte) {
	if h.context >= maxHops {
		d.log.Warn("dropping forwarded frame that passed too many gateways (routing loop?)", "from", from, "source", h.src, "destination", h.dst, "hops", h.context)
		d.lost(h, fmt.Sprintf("it passed %d gateways (the tables route in a loop?)", h.context))
		return
	}
	class := d.table.Class(int(min(h.offset, maxMessage)))
	t, ok := d.nextHop(h.dst, class, h.seq)
	if !ok {
		d.log.Warn("dropping forwarded frame: no live route from this gateway", "from", from, "source", h.src, "destination", h.dst)
		d.lost(h, "no live route from there")
		return
	}
	n := len(inner) + len(data)
	var buf []byte
	var bufp *[]byte
	if n > 0 {
		bufp = getBlock(n)
		buf = *bufp
		copy(buf[copy(buf, inner):], data)
	}
	fh := *h
	fh.context++
	f := &d.fwd
	held := f.held.Add(int64(n))
	for {
		m := f.heldMax.Load()
		if held <= m || f.heldMax.CompareAndSwap(m, held) {
			break
		}
	}
	f.forwarded.Add(1)
	f.fwdBytes.Add(uint64(n))
	d.pass(&fh, class, t, buf, bufp)
}

// pass sends a copied frame for another rank (header fh, bytes buf) to
// its next hop t. If the frame fails there, the trunk is down (finishFrame
// marked it) and the frame goes out again through the next live hop, as
// the blocks a source keeps go through another trunk when one fails: a
// gateway loses only what no live route can take.
func (d *Device) pass(fh *header, class int, t trunk, buf []byte, bufp *[]byte) {
	var of *outFrame
	if fh.tag == sysFwd {
		of = framePool.Get().(*outFrame)
		of.setBlock(t.via, fh, buf[:headerSize], buf[headerSize:], buf, t.sub.splits())
	} else {
		of = d.frame(t.via, fh, buf)
	}
	h := *fh // the frame's header bytes are its own; this is for a resend
	of.passed = true
	of.done = func(err error) {
		// Finalizing too: a relay passes frames on from inside its Close.
		if err != nil && !d.closed.Load() {
			next, ok := d.nextHop(h.dst, class, h.seq)
			if errors.Is(err, sdi.ErrTooLarge) {
				// The trunk lives (it is not marked dead for this), so
				// nextHop would give it again: another that takes it.
				next, ok = d.hopThatFits(h.dst, class, t, len(buf))
			}
			if ok && next != t {
				d.log.Debug("forwarding failed; passing on through another hop", "source", h.src, "destination", h.dst, "next", t.via, "then", next.via, "error", err)
				d.pass(&h, class, next, buf, bufp)
				return
			}
			d.log.Warn("forwarding failed", "source", h.src, "destination", h.dst, "next", t.via, "error", err)
			why := fmt.Sprintf("passing it on to rank %d over %q failed: %v", t.via, t.sub.name, err)
			if errors.Is(err, sdi.ErrTooLarge) {
				why += fmt.Sprintf(" (blocks are cut for the source's first hop; MD_FORWARD_BLOCK below %d bytes fits this one)", t.sub.caps.MaxFrame-headerSize)
			}
			d.lost(&h, why)
		}
		d.fwd.held.Add(-int64(len(buf)))
		if bufp != nil {
			putBlock(bufp)
		}
	}
	d.out.push(outItem{sub: t.sub, frame: of})
}

// nextHop picks where a frame for dst goes from here: the destination
// itself on a direct route, else a live gateway (spread by key).
func (d *Device) nextHop(dst int32, class int, key uint64) (trunk, bool) {
	trunks := d.fwd.paths[dst][class]
	if trunks == nil {
		if err := d.down[dst].Load(); err != nil {
			return trunk{}, false
		}
		return trunk{sub: d.subs[d.routes[dst][class]], via: dst}, true
	}
	// As live, without allocating: this runs for every frame a gateway
	// passes on.
	for _, standby := range [2]bool{false, true} {
		n := 0
		for _, t := range trunks {
			if t.standby == standby && !d.fwd.isDead(t) {
				n++
			}
		}
		k := int(key % uint64(max(n, 1)))
		for _, t := range trunks {
			if t.standby == standby && !d.fwd.isDead(t) {
				if k == 0 {
					return t, true
				}
				k--
			}
		}
	}
	return trunk{}, false
}

// hopThatFits is a live trunk to dst other than not whose subdevice
// carries frames of n bytes, standing by or not.
func (d *Device) hopThatFits(dst int32, class int, not trunk, n int) (trunk, bool) {
	for _, standby := range [2]bool{false, true} {
		for _, t := range d.fwd.paths[dst][class] {
			if t.standby == standby && t != not && !d.fwd.isDead(t) && t.sub.caps.MaxFrame >= n {
				return t, true
			}
		}
	}
	return trunk{}, false
}

var errBadForward = errors.New("multidevice: malformed forwarded block")

// unwrap checks a forwarded block addressed to this rank, its inner
// header ib and its data, and returns the frame inside it. It never
// panics.
func unwrap(outer *header, ib, data []byte, size int) (header, []byte, error) {
	if len(ib) != headerSize {
		return header{}, nil, fmt.Errorf("%w: inner header of %d bytes", errBadForward, len(ib))
	}
	inner, err := decodeHeader(ib, size)
	if err != nil {
		return header{}, nil, fmt.Errorf("%w: inner %w", errBadForward, err)
	}
	switch {
	case inner.kind == kindSys && (inner.tag == sysFwd || inner.tag == sysCredit || inner.tag == sysLost):
		return header{}, nil, fmt.Errorf("%w: nested %d system message", errBadForward, inner.tag)
	case inner.src != outer.src || inner.dst != outer.dst:
		return header{}, nil, fmt.Errorf("%w: inner frame %d->%d in a block %d->%d", errBadForward, inner.src, inner.dst, outer.src, outer.dst)
	}
	return inner, data, nil
}

// blockPool recycles the buffers of forwarded blocks.
var blockPool sync.Pool // *[]byte

func getBlock(n int) *[]byte {
	if p, _ := blockPool.Get().(*[]byte); p != nil && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	b := make([]byte, n)
	return &b
}

// putBlock gives back a buffer from getBlock, as the pointer getBlock
// returned: a new pointer to the slice would cost an allocation per block.
func putBlock(p *[]byte) {
	if cap(*p) <= maxPooledBlock {
		blockPool.Put(p)
	}
}
