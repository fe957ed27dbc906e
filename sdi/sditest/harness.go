package sditest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Harness describes the subdevice under test.
type Harness struct {
	// New returns a fresh, unopened instance. It is called once per rank
	// per subtest; it may use t for cleanup and temporary directories.
	New func(t testing.TB) sdi.SubDevice
	// Peers is how many instances each subtest opens and connects; at least
	// 2, default 2.
	Peers int
	// Skip maps a subtest name ("Ordering/PerPeerFIFO") to the reason it
	// does not apply. Skipped subtests are reported with t.Skip(reason),
	// never silently passed. Naming a subtest that does not exist is an
	// error, so a typo cannot hide a check.
	Skip map[string]string
	// Config is passed as OpenParams.Config to every instance.
	Config []byte
}

// Host is the OpenParams.Host every instance of a job gets: the suite runs
// all ranks in one process on one host.
const Host = "sditest-host"

// headerSize is the suite's own frame header: destination, stream, sequence
// number and payload length, so every arriving frame can be checked.
const headerSize = 16

// timing bounds every wait, so a broken subdevice fails instead of hanging.
type timing struct {
	watchdog time.Duration // a subtest running longer fails and has its contexts cancelled
	patience time.Duration // one wait for frames, completions or room to send
	quiet    time.Duration // how long to watch for calls that must not come
}

var defaultTiming = timing{watchdog: 30 * time.Second, patience: 10 * time.Second, quiet: 100 * time.Millisecond}

// Run runs the conformance catalogue against the subdevice h describes, one
// subtest per check, each with fresh instances.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("sditest: Harness.New is nil")
	}
	if h.Peers == 0 {
		h.Peers = 2
	}
	if h.Peers < 2 {
		t.Fatalf("sditest: Harness.Peers is %d, need at least 2", h.Peers)
	}
	for name := range h.Skip {
		if findCheck(name) == nil {
			t.Errorf("sditest: Harness.Skip names %q, which is not a subtest", name)
		}
	}
	for _, c := range catalogue {
		t.Run(c.name, func(t *testing.T) {
			if reason, ok := h.Skip[c.name]; ok {
				t.Skip(reason)
			}
			runCheck(t, h, c, defaultTiming)
		})
	}
}

func findCheck(name string) *check {
	for i := range catalogue {
		if catalogue[i].name == name {
			return &catalogue[i]
		}
	}
	return nil
}

// runCheck runs one check on t. Tests of the suite itself call it with a
// testing.TB that records failures instead of reporting them.
func runCheck(t testing.TB, h Harness, c check, tm timing) {
	t.Helper()
	e := newEnv(t, h, c.name, tm)
	switch c.setup {
	case setupConnected:
		e.open(t)
		e.connectAll(t)
	case setupOpened:
		e.open(t)
	}
	c.fn(t, e)
	e.finish(t)
}

// env is one subtest's job: its instances, the recording handlers and what
// they saw.
type env struct {
	h      Harness
	name   string
	tm     timing
	ctx    context.Context // cancelled by the watchdog and at cleanup
	cancel context.CancelFunc
	dead   chan struct{} // closed when the watchdog fires
	jobID  string
	secret []byte
	logger hclog.Logger
	logw   *tbWriter

	tmu      sync.Mutex
	finished bool
	timers   []*time.Timer

	sds       []sdi.SubDevice
	locals    []sdi.Local
	recs      []*recorder
	extra     []sdi.SubDevice // instances outside the job, opened by a check
	caps      sdi.Caps        // rank 0's; the suite sizes frames by it
	nextToken atomic.Uint64
	placing   bool // the handlers of instances opened from now on implement sdi.Placer

	mu         sync.Mutex // guards the fields below and every recorder's state
	changed    chan struct{}
	tokens     map[uint64]*tokenState
	violations []string
	dropped    int // violations beyond maxViolations
	reported   int
	lenient    bool // a rank closed or a frame went to a stranger: SendDone may fail
	placeAsks  int  // Place calls that found nothing wrong (place.go)
}

const maxViolations = 50

func newEnv(t testing.TB, h Harness, name string, tm timing) *env {
	ctx, cancel := context.WithCancel(context.Background())
	e := &env{
		h:       h,
		name:    name,
		tm:      tm,
		ctx:     ctx,
		cancel:  cancel,
		dead:    make(chan struct{}),
		jobID:   "sditest-" + randomHex(6),
		secret:  []byte(randomHex(16)),
		logw:    &tbWriter{t: t},
		changed: make(chan struct{}),
		tokens:  make(map[uint64]*tokenState),
	}
	e.logger = newLogger(e.logw)

	// Errorf from the timers is safe only while the test runs; cleanup sets
	// finished under tmu, so a late timer sees it and stays quiet.
	e.timers = append(e.timers, time.AfterFunc(tm.watchdog, func() {
		e.tmu.Lock()
		defer e.tmu.Unlock()
		if e.finished {
			return
		}
		t.Errorf("sditest: %s: watchdog fired after %v; cancelling its contexts. Goroutines:\n%s", name, tm.watchdog, stacks())
		close(e.dead)
		cancel()
	}))
	e.timers = append(e.timers, time.AfterFunc(tm.watchdog+10*time.Second, func() {
		e.tmu.Lock()
		defer e.tmu.Unlock()
		if !e.finished {
			panic(fmt.Sprintf("sditest: %s still hung 10s after its watchdog cancelled every context; some SubDevice call ignores its context. Goroutines:\n%s", name, stacks()))
		}
	}))
	t.Cleanup(func() { e.cleanup(t) })
	return e
}

func (e *env) cleanup(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), e.tm.patience)
	defer cancel()
	for i, sd := range e.sds {
		if e.recs[i].isClosed() {
			continue
		}
		err := sd.Close(ctx)
		if err != nil {
			t.Errorf("rank %d: Close: %v", i, err)
		}
		e.recs[i].markClosed()
		if err == nil {
			e.recs[i].endPlaces(-1, "Close returned nil")
		}
	}
	for _, sd := range e.extra {
		if err := sd.Close(ctx); err != nil {
			t.Errorf("extra instance: Close: %v", err)
		}
	}
	e.checkEndedPlaces()
	e.report(t)
	e.tmu.Lock()
	e.finished = true
	for _, tm := range e.timers {
		tm.Stop()
	}
	e.tmu.Unlock()
	e.cancel()
	e.logw.stop()
}

// finish ends a check: it reports what the handlers saw, including PeerDown
// for a peer that the check never closed.
func (e *env) finish(t testing.TB) {
	t.Helper()
	e.mu.Lock()
	if !e.lenient {
		for tok, st := range e.tokens {
			if st.sendDones > 0 && st.err != nil {
				e.violateLocked("rank %d: SendDone(%d, %v) failed a frame while every rank was open and connected; a failed frame is the loss of its peer", st.from, tok, st.err)
			}
		}
	}
	for _, r := range e.recs {
		if r.closed {
			continue
		}
		for _, pd := range r.peerDowns {
			if int(pd.peer) < len(e.recs) && !e.recs[pd.peer].closed {
				e.violateLocked("rank %d: PeerDown(%d, %v) while rank %d was open and healthy", r.rank, pd.peer, pd.err, pd.peer)
			}
		}
	}
	e.mu.Unlock()
	e.report(t)
}

func (e *env) report(t testing.TB) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, v := range e.violations[e.reported:] {
		t.Error(v)
	}
	e.reported = len(e.violations)
	if e.dropped > 0 {
		t.Errorf("... and %d more contract violations", e.dropped)
		e.dropped = 0
	}
}

func (e *env) violateLocked(format string, args ...any) {
	if len(e.violations) >= maxViolations {
		e.dropped++
		return
	}
	e.violations = append(e.violations, fmt.Sprintf(format, args...))
}

func (e *env) broadcastLocked() {
	close(e.changed)
	e.changed = make(chan struct{})
}

func (e *env) params(rank sdi.Rank, size int, host, jobID string, secret []byte, rec *recorder) sdi.OpenParams {
	return sdi.OpenParams{
		Rank:       rank,
		Size:       size,
		Host:       host,
		JobID:      jobID,
		Secret:     secret,
		APIVersion: sdi.APIVersion,
		Config:     e.h.Config,
		Handler:    rec.handler(),
		Logger:     e.logger.Named(e.name).With("rank", rank),
	}
}

// open opens Peers instances of one job.
func (e *env) open(t testing.TB) {
	t.Helper()
	for i := range e.h.Peers {
		sd := e.h.New(t)
		if sd == nil {
			t.Fatal("sditest: Harness.New returned nil")
		}
		rec := newRecorder(e, sdi.Rank(i))
		e.sds = append(e.sds, sd)
		e.recs = append(e.recs, rec)
		local, err := sd.Open(e.ctx, e.params(sdi.Rank(i), e.h.Peers, Host, e.jobID, e.secret, rec))
		if err != nil {
			t.Fatalf("rank %d: Open: %v", i, err)
		}
		if err := local.Caps.Validate(); err != nil {
			t.Fatalf("rank %d: Open returned caps %+v that break the contract: %v", i, local.Caps, err)
		}
		e.locals = append(e.locals, local)
	}
	e.caps = e.locals[0].Caps
	if e.caps.MaxHeader < headerSize {
		t.Fatalf("sditest: Caps.MaxHeader is %d; the suite needs %d bytes of header to identify its frames", e.caps.MaxHeader, headerSize)
	}
}

// openExtra opens an instance outside the job's peers, closed at cleanup.
func (e *env) openExtra(t testing.TB, p sdi.OpenParams) sdi.Local {
	t.Helper()
	sd := e.h.New(t)
	if sd == nil {
		t.Fatal("sditest: Harness.New returned nil")
	}
	e.extra = append(e.extra, sd)
	local, err := sd.Open(e.ctx, p)
	if err != nil {
		t.Fatalf("Open of an instance with rank %d, host %q, job %q: %v", p.Rank, p.Host, p.JobID, err)
	}
	return local
}

// connectAll connects every ordered pair. Each rank connects from its own
// goroutine, so a subdevice whose Connect waits for the peer's Connect works.
func (e *env) connectAll(t testing.TB) {
	t.Helper()
	errs := make([]error, len(e.sds))
	var wg sync.WaitGroup
	for i, sd := range e.sds {
		wg.Go(func() {
			for j := range e.sds {
				if i == j {
					continue
				}
				if err := sd.Connect(e.ctx, sdi.Rank(j), e.locals[j].Addr); err != nil {
					errs[i] = fmt.Errorf("rank %d: Connect to rank %d with card %s: %w", i, j, cardString(e.locals[j].Addr), err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// closeRank closes rank i and records that its handler must stay silent.
func (e *env) closeRank(i int) error {
	e.mu.Lock()
	e.lenient = true
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(e.ctx, e.tm.patience)
	defer cancel()
	err := e.sds[i].Close(ctx)
	e.recs[i].markClosed()
	if err == nil {
		e.recs[i].endPlaces(-1, "Close returned nil")
	}
	return err
}

func (e *env) ordered() bool { return e.caps.Flags.Has(sdi.FlagOrdered) }

// count shrinks a frame count under -short.
func count(full int) int {
	if testing.Short() {
		return max(full/10, 10)
	}
	return full
}

// msg names one frame of the suite: from rank, to rank, a stream (a sender
// goroutine or a phase of a check) and a sequence number within it.
type msg struct {
	from, to int
	stream   uint16
	seq      uint64
	size     int // payload bytes
	hdr      int // header bytes; headerSize when 0
}

// frame builds m with a fresh token and contents derived from m, so the
// receiver can check every byte.
func (e *env) frame(m msg) *sdi.Frame {
	hdr := m.hdr
	if hdr == 0 {
		hdr = headerSize
	}
	f := &sdi.Frame{
		Peer:    sdi.Rank(m.to),
		Header:  make([]byte, hdr),
		Payload: make([]byte, m.size),
		Token:   e.nextToken.Add(1),
	}
	m.fill(f.Header, f.Payload)
	return f
}

func (m msg) seed() uint64 {
	return uint64(m.from)<<48 ^ uint64(m.to)<<40 ^ uint64(m.stream)<<32 ^ m.seq
}

func (m msg) fill(header, payload []byte) {
	binary.LittleEndian.PutUint16(header[0:], uint16(m.to))
	binary.LittleEndian.PutUint16(header[2:], m.stream)
	binary.LittleEndian.PutUint64(header[4:], m.seq)
	binary.LittleEndian.PutUint32(header[12:], uint32(len(payload)))
	pattern(header[headerSize:], m.seed()^0x5a5a)
	pattern(payload, m.seed())
}

// Patterns are windows of one table of xorshift output, a window per
// chunk of patternChunk bytes at an offset mixed from the frame's seed and
// the chunk's index: no two offsets or frames look alike, so a shifted,
// truncated or mixed-up payload is caught. Filled and checked by copy and
// bytes.Equal rather than word by word: under the race detector every
// word's access was a call into it, and the suites spent most of their
// CPU there (the shm suite's Concurrent/Sends, 85 %).
const (
	noiseBytes    = 1 << 20
	patternChunk  = 64 << 10
	patternStarts = (noiseBytes - patternChunk) / 8 // 8-byte aligned window starts
)

// noise is the table patterns are windows of.
var noise = sync.OnceValue(func() []byte {
	b := make([]byte, noiseBytes)
	x := uint64(0x9e3779b97f4a7c15)
	for i := 0; i < len(b); i += 8 {
		x = xorshift(x)
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	return b
})

// window returns the pattern of chunk i of a pattern with seed: up to
// patternChunk bytes of noise.
func window(seed uint64, i int) []byte {
	x := seed ^ uint64(i)*0x9e3779b97f4a7c15
	// splitmix64's finalizer: neighbouring seeds and chunks land far apart.
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	x ^= x >> 31
	off := int(x%patternStarts) * 8
	return noise()[off : off+patternChunk]
}

// pattern fills b with the pattern of seed.
func pattern(b []byte, seed uint64) {
	for i := 0; i < len(b); i += patternChunk {
		copy(b[i:], window(seed, i/patternChunk))
	}
}

// mismatch returns the first offset at which b differs from pattern(seed), or -1.
func mismatch(b []byte, seed uint64) int {
	for i := 0; i < len(b); i += patternChunk {
		c := b[i:min(i+patternChunk, len(b))]
		w := window(seed, i/patternChunk)[:len(c)]
		if bytes.Equal(c, w) {
			continue
		}
		for k := range c {
			if c[k] != w[k] {
				return i + k
			}
		}
	}
	return -1
}

func xorshift(x uint64) uint64 {
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	return x
}

// decode checks an arriving frame and says what is wrong with it, if anything.
func decode(to, from sdi.Rank, header, payload []byte) (streamKey, uint64, string) {
	m, plen, problem := decodeHeader(to, from, header)
	key := streamKey{from: from, stream: m.stream}
	switch {
	case problem != "":
		return key, m.seq, problem
	case plen != len(payload):
		return key, m.seq, fmt.Sprintf("stream %d seq %d with %d payload bytes, sent with %d", m.stream, m.seq, len(payload), plen)
	}
	if i := mismatch(payload, m.seed()); i >= 0 {
		return key, m.seq, fmt.Sprintf("stream %d seq %d with payload byte %d of %d altered (or from rank %d is wrong)", m.stream, m.seq, i, len(payload), from)
	}
	return key, m.seq, ""
}

// decodeHeader checks the header of an arriving frame, which Place sees
// without its payload, and returns the frame it names and its payload length.
func decodeHeader(to, from sdi.Rank, header []byte) (msg, int, string) {
	if len(header) < headerSize {
		return msg{}, 0, fmt.Sprintf("a %d-byte header; the suite never sends less than %d", len(header), headerSize)
	}
	m := msg{
		from:   int(from),
		to:     int(binary.LittleEndian.Uint16(header[0:])),
		stream: binary.LittleEndian.Uint16(header[2:]),
		seq:    binary.LittleEndian.Uint64(header[4:]),
	}
	plen := int(binary.LittleEndian.Uint32(header[12:]))
	if m.to != int(to) {
		return m, plen, fmt.Sprintf("a frame addressed to rank %d", m.to)
	}
	if i := mismatch(header[headerSize:], m.seed()^0x5a5a); i >= 0 {
		return m, plen, fmt.Sprintf("stream %d seq %d with header byte %d altered (or from rank %d is wrong)", m.stream, m.seq, headerSize+i, from)
	}
	return m, plen, ""
}

type streamKey struct {
	from   sdi.Rank
	stream uint16
}

type peerDown struct {
	peer sdi.Rank
	err  error
}

// recorder is the Handler of one instance. It checks every call against the
// contract as it happens and records what arrived; its state is guarded by
// env.mu.
type recorder struct {
	e         *env
	rank      sdi.Rank
	closed    bool // Close returned: any call now is a violation
	inDeliver map[sdi.Rank]bool
	arrivals  map[streamKey][]uint64
	seen      map[streamKey]map[uint64]bool // to report a duplicate whenever it comes
	peerDowns []peerDown
	places    map[frameKey]*place // the places Place gave, when e.placing (place.go)
}

func newRecorder(e *env, rank sdi.Rank) *recorder {
	return &recorder{e: e, rank: rank, inDeliver: make(map[sdi.Rank]bool), arrivals: make(map[streamKey][]uint64), seen: make(map[streamKey]map[uint64]bool), places: make(map[frameKey]*place)}
}

func (r *recorder) Deliver(from sdi.Rank, header, payload []byte) {
	e := r.e
	e.mu.Lock()
	if r.closed {
		e.violateLocked("rank %d: Deliver from rank %d after Close returned", r.rank, from)
	}
	if r.inDeliver[from] {
		e.violateLocked("rank %d: overlapping Deliver calls for rank %d; they must be serialized per peer", r.rank, from)
	}
	r.inDeliver[from] = true
	pl := r.placeOfLocked(from, header, payload)
	e.mu.Unlock()

	key, seq, problem := decode(r.rank, from, header, payload)

	e.mu.Lock()
	defer e.mu.Unlock()
	r.inDeliver[from] = false
	if pl != nil {
		pl.deliveredLocked()
	}
	if problem != "" {
		e.violateLocked("rank %d: Deliver from rank %d: %s", r.rank, from, problem)
	} else {
		if r.seen[key] == nil {
			r.seen[key] = make(map[uint64]bool)
		}
		if r.seen[key][seq] {
			e.violateLocked("rank %d: Deliver from rank %d: stream %d seq %d again; every frame arrives once", r.rank, from, key.stream, seq)
		}
		r.seen[key][seq] = true
		r.arrivals[key] = append(r.arrivals[key], seq)
	}
	e.broadcastLocked()
}

func (r *recorder) SendDone(token uint64, err error) {
	e := r.e
	e.mu.Lock()
	defer e.mu.Unlock()
	defer e.broadcastLocked()
	if r.closed {
		e.violateLocked("rank %d: SendDone(%d, %v) after Close returned", r.rank, token, err)
	}
	st := e.tokens[token]
	switch {
	case st == nil:
		e.violateLocked("rank %d: SendDone for token %d, which was never sent", r.rank, token)
		return
	case st.from != r.rank:
		e.violateLocked("rank %d: SendDone for token %d, which rank %d sent", r.rank, token, st.from)
		return
	}
	st.sendDones++
	st.err = err
	switch {
	case st.inSend && goid() == st.gid:
		e.violateLocked("rank %d: SendDone for token %d from within Send", r.rank, token)
	case st.sendDones > 1:
		e.violateLocked("rank %d: SendDone for token %d called %d times", r.rank, token, st.sendDones)
	case st.outcome == outcomeDone:
		e.violateLocked("rank %d: SendDone for token %d after Send returned done=true", r.rank, token)
	case st.outcome == outcomeRejected:
		e.violateLocked("rank %d: SendDone for token %d after Send rejected it with %v", r.rank, token, st.sendErr)
	}
}

func (r *recorder) PeerDown(peer sdi.Rank, err error) {
	e := r.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if r.closed {
		e.violateLocked("rank %d: PeerDown(%d, %v) after Close returned", r.rank, peer, err)
	}
	r.endPlacesLocked(peer, fmt.Sprintf("PeerDown(%d)", peer))
	r.peerDowns = append(r.peerDowns, peerDown{peer, err})
	e.broadcastLocked()
}

func (r *recorder) markClosed() {
	r.e.mu.Lock()
	defer r.e.mu.Unlock()
	r.closed = true
}

func (r *recorder) isClosed() bool {
	r.e.mu.Lock()
	defer r.e.mu.Unlock()
	return r.closed
}

type outcome uint8

const (
	outcomeNone     outcome = iota // not yet accepted (or ErrWouldBlock)
	outcomePending                 // done=false: exactly one SendDone owed
	outcomeDone                    // done=true: no SendDone may follow
	outcomeRejected                // an error: no SendDone may follow
)

// tokenState is what the suite knows about one frame it sent.
type tokenState struct {
	from      sdi.Rank
	inSend    bool
	gid       uint64 // goroutine calling Send, to spot SendDone from within it
	outcome   outcome
	sendErr   error
	sendDones int
	err       error // passed to SendDone
}

// sendOnce calls Send once and records the outcome for the completion checks.
func (e *env) sendOnce(from int, sd sdi.SubDevice, f *sdi.Frame) (bool, error) {
	gid := goid()
	e.mu.Lock()
	st := e.tokens[f.Token]
	if st == nil {
		st = &tokenState{from: sdi.Rank(from)}
		e.tokens[f.Token] = st
	}
	st.inSend, st.gid = true, gid
	e.mu.Unlock()

	done, err := sd.Send(f)

	e.mu.Lock()
	defer e.mu.Unlock()
	st.inSend = false
	switch {
	case errors.Is(err, sdi.ErrWouldBlock):
		if done {
			e.violateLocked("rank %d: Send returned done=true with ErrWouldBlock", from)
		}
	case err != nil:
		st.outcome, st.sendErr = outcomeRejected, err
		if done {
			e.violateLocked("rank %d: Send returned done=true with error %v", from, err)
		}
		if st.sendDones > 0 {
			e.violateLocked("rank %d: Send rejected token %d with %v, yet SendDone was called for it", from, f.Token, err)
		}
	case done:
		st.outcome = outcomeDone
		if st.sendDones > 0 {
			e.violateLocked("rank %d: Send returned done=true for token %d, yet SendDone was called for it", from, f.Token)
		}
	default:
		st.outcome = outcomePending
	}
	e.broadcastLocked()
	return done, err
}

// send sends f from rank from, retrying ErrWouldBlock with a short backoff
// as the contract asks of callers, for at most the patience.
func (e *env) send(from int, f *sdi.Frame) (bool, error) {
	deadline := time.Now().Add(e.tm.patience)
	for try := 0; ; try++ {
		done, err := e.sendOnce(from, e.sds[from], f)
		if !errors.Is(err, sdi.ErrWouldBlock) {
			return done, err
		}
		if time.Now().After(deadline) {
			return false, fmt.Errorf("rank %d: Send to rank %d kept returning ErrWouldBlock for %v: accepted frames never drain", from, f.Peer, e.tm.patience)
		}
		select {
		case <-e.dead:
			return false, fmt.Errorf("rank %d: watchdog fired while Send to rank %d returned ErrWouldBlock", from, f.Peer)
		default:
		}
		if try < 10 {
			runtime.Gosched()
		} else {
			time.Sleep(min(time.Microsecond<<min(try-10, 10), time.Millisecond))
		}
	}
}

// mustSend is send for the test goroutine: any error is fatal.
func (e *env) mustSend(t testing.TB, from int, f *sdi.Frame) bool {
	t.Helper()
	done, err := e.send(from, f)
	if err != nil {
		t.Fatalf("rank %d: Send %d+%d bytes to rank %d: %v", from, len(f.Header), len(f.Payload), f.Peer, err)
	}
	return done
}

// sendStream sends n frames of one stream, sizes chosen by size(seq).
func (e *env) sendStream(from, to int, stream uint16, n int, size func(seq int) int) error {
	for i := range n {
		m := msg{from: from, to: to, stream: stream, seq: uint64(i), size: size(i)}
		if _, err := e.send(from, e.frame(m)); err != nil {
			return err
		}
	}
	return nil
}

// parallel runs fn(0..n-1) in goroutines and fails t with their errors;
// goroutines other than the test's must not call t.Fatal.
func parallel(t testing.TB, n int, fn func(i int) error) {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = fn(i) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// await blocks until cond holds, for at most the patience. cond runs with
// e.mu held and describes what it waits for, for the failure message.
func (e *env) await(t testing.TB, cond func() (bool, string)) {
	t.Helper()
	if err := e.awaitFor(e.tm.patience, cond); err != nil {
		t.Fatal(err)
	}
}

func (e *env) awaitFor(d time.Duration, cond func() (bool, string)) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		e.mu.Lock()
		ok, what := cond()
		ch := e.changed
		e.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-timer.C:
			return fmt.Errorf("gave up after %v waiting for %s", d, what)
		case <-e.dead:
			return fmt.Errorf("watchdog fired while waiting for %s", what)
		}
	}
}

// awaitStream waits until rank to has n frames of stream from rank from.
func (e *env) awaitStream(t testing.TB, to, from int, stream uint16, n int) {
	t.Helper()
	key := streamKey{sdi.Rank(from), stream}
	e.await(t, func() (bool, string) {
		got := len(e.recs[to].arrivals[key])
		return got >= n, fmt.Sprintf("rank %d to receive %d frames of stream %d from rank %d (has %d)", to, n, stream, from, got)
	})
}

// checkStream reports missing and duplicate frames of a stream, and frames
// out of send order when ordered.
func (e *env) checkStream(t testing.TB, to, from int, stream uint16, n int, ordered bool) {
	t.Helper()
	e.mu.Lock()
	seqs := append([]uint64(nil), e.recs[to].arrivals[streamKey{sdi.Rank(from), stream}]...)
	e.mu.Unlock()
	seen := make([]int, n)
	for i, s := range seqs {
		if s >= uint64(n) {
			t.Errorf("rank %d got seq %d of stream %d from rank %d, which was never sent", to, s, stream, from)
			continue
		}
		seen[s]++
		if ordered && s != uint64(i) {
			t.Errorf("rank %d: frame %d of stream %d from rank %d arrived as number %d; FlagOrdered promises send order", to, s, stream, from, i)
			ordered = false // one report per stream
		}
	}
	var missing, dup []int
	for s, c := range seen {
		if c == 0 {
			missing = append(missing, s)
		}
		if c > 1 {
			dup = append(dup, s)
		}
	}
	if len(missing) > 0 {
		t.Errorf("rank %d: %d frames of stream %d from rank %d never arrived, e.g. seq %v", to, len(missing), stream, from, head(missing))
	}
	if len(dup) > 0 {
		t.Errorf("rank %d: %d frames of stream %d from rank %d arrived more than once, e.g. seq %v", to, len(dup), stream, from, head(dup))
	}
}

func head(s []int) []int { return s[:min(len(s), 5)] }

// awaitCompletions waits until every frame accepted with done=false from
// the given ranks (all ranks when none given) has had its SendDone.
func (e *env) awaitCompletions(t testing.TB, ranks ...int) {
	t.Helper()
	e.await(t, func() (bool, string) {
		n, example := e.owedLocked(ranks)
		return n == 0, fmt.Sprintf("SendDone for %d accepted frames (e.g. token %d)", n, example)
	})
}

// owedLocked counts frames accepted with done=false whose SendDone has not
// come, from the given ranks or all.
func (e *env) owedLocked(ranks []int) (n int, example uint64) {
	for tok, st := range e.tokens {
		if st.outcome != outcomePending || st.sendDones > 0 {
			continue
		}
		if len(ranks) > 0 && !containsRank(ranks, st.from) {
			continue
		}
		n++
		example = tok
	}
	return n, example
}

func containsRank(ranks []int, r sdi.Rank) bool {
	for _, x := range ranks {
		if sdi.Rank(x) == r {
			return true
		}
	}
	return false
}

// goid returns the calling goroutine's id. The runtime hides it on purpose;
// the suite needs it only to tell "SendDone from within Send" from a
// SendDone that another goroutine raced ahead of Send's return.
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, _ := strconv.ParseUint(string(b), 10, 64)
	return id
}

func stacks() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// cardString shows a business card readably in failure messages.
func cardString(card []byte) string {
	const limit = 64
	s := string(card)
	if len(s) > limit {
		s = s[:limit] + "..."
	}
	if strings.IndexFunc(s, func(r rune) bool { return r < ' ' || r > '~' }) >= 0 {
		return "0x" + hex.EncodeToString(card[:min(len(card), limit/2)])
	}
	return strconv.Quote(s)
}

// tbWriter routes hclog output into t.Log until the test ends; a subdevice
// goroutine that logs late must not panic the test binary.
type tbWriter struct {
	mu      sync.Mutex
	t       testing.TB
	stopped bool
}

func (w *tbWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

func (w *tbWriter) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
}

// newLogger logs at the level in MP_TEST_LOG_LEVEL (trace, debug, info,
// warn, error), and not at all when it is unset.
func newLogger(w *tbWriter) hclog.Logger {
	level := hclog.LevelFromString(os.Getenv("MP_TEST_LOG_LEVEL"))
	if level == hclog.NoLevel {
		level = hclog.Off
	}
	return hclog.New(&hclog.LoggerOptions{Name: "sditest", Level: level, Output: w, DisableTime: true})
}
