package shm

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/hpc-multidevice/multidevice/internal/futex"
	"github.com/hpc-multidevice/multidevice/internal/shmem"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// Version is the shm subdevice's own version.
const Version = "0.1.0"

// Lifecycle states of a device.
const (
	devNew int32 = iota
	devOpen
	devClosed
)

var errNotOpen = errors.New("shm: subdevice not open")

// device is the shm subdevice. It is safe for concurrent use, as
// [sdi.SubDevice] requires.
type device struct {
	logger hclog.Logger // from New; replaced by OpenParams.Logger at Open

	state atomic.Int32 // devNew, devOpen, devClosed

	// Set by Open, read-only afterwards.
	log hclog.Logger
	// trace is the logger's level at Open: asking the logger on every
	// delivered frame cost several percent of a small message.
	trace   bool
	handler sdi.Handler
	rank    sdi.Rank
	host    string
	jobID   string
	jobHash [16]byte
	secHash [16]byte
	cfg     config
	caps    sdi.Caps
	seg     *shmem.Segment // this rank's segment: the inbound rings
	inbound []ring         // inbound[r] carries frames from rank r
	placer  sdi.Placer     // the Handler, if it places payloads; else nil

	// Single copy (singlecopy.go): whether this rank reads peers' memory
	// (and why not), and srcProc[r], the process of rank r once a probe
	// succeeded (pidfd.go). It outlives Disconnect, since r may have
	// published descriptors before it saw that this rank stopped reading;
	// a reconnect or Close releases it. inflight counts descriptors sent
	// and not yet reported.
	copyWant      uint32 // copyRing, copyDesc or copyAuto (choose.go)
	singleCopyWhy string
	srcProc       []atomic.Pointer[peerProc]
	inflight      atomic.Int64
	// pidfdOpen opens peers' pidfds (pidfd.go); tests make it fail.
	// pidfdOnce logs once that it is unavailable.
	pidfdOpen pidfdOpener
	pidfdOnce sync.Once

	// peers[r] is the outbound connection to rank r, nil when not connected.
	// Send reads it without locks; connMu serializes Connect, Disconnect and
	// Close's sweep so no peer is installed after Close took them down.
	peers  []atomic.Pointer[peer]
	connMu sync.Mutex

	// sleepFor bounds a doorbell sleep; tests set it to 0 (no bound) so a
	// lost wake-up shows up as a hang instead of a delay.
	sleepFor time.Duration
	// assistPatience is how long a receiver waits for the chunks a sender
	// took before it says so and waits more patiently (assist.go); tests
	// shorten it. assistStalls counts such waits; tests read it.
	assistPatience time.Duration
	assistStalls   atomic.Int64
	// exploreEvery is how long a sender's chooser leaves the path it does
	// not prefer untried (choose.go); tests that check every frame's path
	// raise it so that no trial comes between their frames however slowly
	// they run.
	exploreEvery time.Duration
	// sleeps counts the progress goroutine's doorbell sleeps, and naps
	// those it napped instead because another goroutine was runnable
	// (progress.go). Tests read them.
	sleeps, naps atomic.Int64

	// rx is the receive state; rxMu makes the progress goroutine and
	// goroutines in Poll take turns with it (see progress.go).
	rx   *receiver
	rxMu sync.Mutex
	// polled is set by Poll and cleared by the progress goroutine, which
	// naps while it finds it set. Poll stores only when it finds the flag
	// clear, about once per nap: a counter bumped by every poll cost a
	// locked instruction on each turn of a waiter's loop. It sits on its
	// own cache line.
	_      [64]byte
	polled atomic.Bool
	_      [63]byte
	// stopping is closed by Close, which ends the progress goroutine's
	// nap at once.
	stopping chan struct{}

	stop      atomic.Bool // tells the progress goroutine to return
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
	closed    chan struct{} // closed once Close's teardown finished
}

// New returns an unopened shm subdevice that logs through logger (nil means
// no logging) until Open supplies its own.
func New(logger hclog.Logger) sdi.SubDevice {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &device{logger: logger, sleepFor: sleepTimeout, assistPatience: assistPatience, exploreEvery: exploreEvery, pidfdOpen: unix.PidfdOpen, stopping: make(chan struct{}), closed: make(chan struct{})}
}

// Info implements [sdi.SubDevice.Info].
func (sd *device) Info(context.Context) (sdi.Info, error) {
	return sdi.Info{Name: "shm", Version: Version, APIVersions: []string{sdi.APIVersion}}, nil
}

// Open creates this rank's segment with one inbound ring per rank of the job,
// starts the progress goroutine and returns the business card.
func (sd *device) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	if err := ctx.Err(); err != nil {
		return sdi.Local{}, fmt.Errorf("shm: open: %w", err)
	}
	switch {
	case p.Handler == nil:
		return sdi.Local{}, errors.New("shm: open: nil Handler")
	case p.Size <= 0 || p.Rank < 0 || int(p.Rank) >= p.Size:
		return sdi.Local{}, fmt.Errorf("shm: open: rank %d not in a job of %d ranks", p.Rank, p.Size)
	}
	cfg, err := parseConfig(p.Config)
	if err != nil {
		return sdi.Local{}, err
	}
	size, err := segmentSize(p.Size, cfg.RingBytes)
	if err != nil {
		return sdi.Local{}, fmt.Errorf("shm: open: %w", err)
	}
	copyWant, copyWhy, err := singleCopyWanted(cfg)
	if err != nil {
		return sdi.Local{}, err
	}
	if !sd.state.CompareAndSwap(devNew, devOpen) {
		if sd.state.Load() == devClosed {
			return sdi.Local{}, fmt.Errorf("shm: open: %w", sdi.ErrClosed)
		}
		return sdi.Local{}, errors.New("shm: open: already open")
	}
	log := p.Logger
	if log == nil {
		log = sd.logger
	}
	sd.log = log.With("rank", p.Rank)
	sd.trace = sd.log.IsTrace()
	sd.handler = p.Handler
	sd.rank = p.Rank
	sd.host = p.Host
	sd.jobID = p.JobID
	sd.jobHash = hash16([]byte(p.JobID))
	sd.secHash = hash16(p.Secret)
	sd.cfg = cfg
	sd.caps = cfg.caps()
	sd.placer, _ = p.Handler.(sdi.Placer)
	sd.copyWant, sd.singleCopyWhy = copyWant, copyWhy
	sd.srcProc = make([]atomic.Pointer[peerProc], p.Size)
	if sd.copyWant != copyRing {
		allowPeerReads(sd.log)
	}

	// Segments whose creator died without Close, of any job: under a
	// process manager other than mdrun nobody else removes them.
	if n, err := shmem.RemoveStale("mdshm."); err != nil {
		sd.log.Warn("removing stale shared-memory segments", "error", err)
	} else if n > 0 {
		sd.log.Debug("removed stale shared-memory segments", "count", n)
	}

	// The random suffix keeps names unique even when a job id is reused or
	// several instances of one rank exist (tests); the card carries the name.
	var nonce [8]byte
	_, _ = rand.Read(nonce[:]) // crypto/rand.Read never fails on Linux
	name := fmt.Sprintf("%sr%d.%s", shmem.JobPrefix(p.JobID), p.Rank, hex.EncodeToString(nonce[:]))
	addr, err := card{Host: p.Host, JobID: p.JobID, Rank: p.Rank, Segment: name}.encode()
	if err != nil {
		sd.state.Store(devNew)
		return sdi.Local{}, err
	}
	seg, err := shmem.Create(name, size)
	if err != nil {
		sd.state.Store(devNew)
		return sdi.Local{}, fmt.Errorf("shm: open: %w", err)
	}
	// The header and attach table are touched at once; the rings when a
	// connection reserves them (Connect).
	if err := seg.Reserve(0, ringOffset(p.Size, 0, cfg.RingBytes)); err != nil {
		sd.state.Store(devNew)
		return sdi.Local{}, errors.Join(fmt.Errorf("shm: open: %w", err), seg.Close())
	}
	sd.seg = seg
	mem := seg.Bytes()
	copy(mem[offMagic:], segMagic)
	word32(mem, offVersion).Store(segVersion)
	word32(mem, offNRings).Store(uint32(p.Size))
	word64(mem, offRingBytes).Store(cfg.RingBytes)
	word32(mem, offRank).Store(uint32(p.Rank))
	word32(mem, offPID).Store(uint32(os.Getpid()))
	copy(mem[offJobHash:], sd.jobHash[:])
	copy(mem[offSecretHash:], sd.secHash[:])
	word64(mem, offProbeAddr).Store(uint64(uintptr(unsafe.Pointer(&probeWord))))
	word64(mem, offProbeVal).Store(probeWord)
	sd.inbound = make([]ring, p.Size)
	for r := range sd.inbound {
		sd.inbound[r] = ringAt(mem, p.Size, r, cfg.RingBytes)
	}
	sd.peers = make([]atomic.Pointer[peer], p.Size)
	sd.rx = newReceiver(sd)
	// Publishing the state last orders every header field before it for a
	// peer that loads stateOpen in Connect.
	word32(mem, offState).Store(stateOpen)

	sd.wg.Add(1)
	go sd.progress()
	sd.log.Debug("opened shared-memory segment", "segment", name, "rings", p.Size, "ring_bytes", cfg.RingBytes)
	return sdi.Local{Addr: addr, Caps: sd.caps}, nil
}

// Flush implements [sdi.SubDevice.Flush]. Frames copied into the ring are
// complete when Send returns; Flush waits for the descriptors of large
// payloads until the peer has read them (or they failed), polling every
// flushPoll, since the progress goroutine or a poller reports them.
func (sd *device) Flush(ctx context.Context, peer sdi.Rank) error {
	switch sd.state.Load() {
	case devNew:
		return fmt.Errorf("shm: flush rank %d: %w", peer, errNotOpen)
	case devClosed:
		return fmt.Errorf("shm: flush rank %d: %w", peer, sdi.ErrClosed)
	}
	if peer < 0 || int(peer) >= len(sd.peers) {
		return nil
	}
	for {
		p := sd.peers[peer].Load()
		if p == nil || p.pendingDescs() == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("shm: flush rank %d: %d large frames not yet read: %w", peer, p.pendingDescs(), ctx.Err())
		case <-sd.closed:
			return fmt.Errorf("shm: flush rank %d: %w", peer, sdi.ErrClosed)
		case <-time.After(flushPoll):
		}
	}
}

// flushPoll is how often Flush looks at the descriptors in flight.
const flushPoll = 100 * time.Microsecond

// Close stops the progress goroutine, tells peers this rank is gone, unmaps
// every segment and unlinks this rank's own. It is idempotent; later calls
// wait for the first to finish and return nil. If ctx ends while a Handler
// call is still running, or while a sender still copies chunks of a
// payload into a place (assist.go), Close returns ctx's error and the
// teardown finishes in the background when they are done.
func (sd *device) Close(ctx context.Context) error {
	first := false
	sd.closeOnce.Do(func() {
		first = true
		prev := sd.state.Swap(devClosed)
		if prev != devOpen {
			close(sd.closed)
			return
		}
		mem := sd.seg.Bytes()
		// Senders check the state before every frame and stop with
		// ErrPeerUnreachable.
		word32(mem, offState).Store(stateClosed)
		sd.stop.Store(true)
		sd.ringDoorbell(mem)
		close(sd.stopping)
		go func() {
			sd.wg.Wait()
			sd.closeErr = sd.teardown()
			close(sd.closed)
		}()
	})
	select {
	case <-sd.closed:
		if first {
			return sd.closeErr
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("shm: close: waiting for the progress goroutine: %w", ctx.Err())
	}
}

// teardown releases the peers' mappings and this rank's segment. It runs
// after the progress goroutine has returned.
func (sd *device) teardown() error {
	// A goroutine still in Poll may be reading the rings; later ones see
	// stop and leave them alone.
	sd.rxMu.Lock()
	defer sd.rxMu.Unlock()
	sd.connMu.Lock()
	defer sd.connMu.Unlock()
	var errs []error
	for r := range sd.rx.watch {
		sd.rx.unwatch(r)
	}
	// A read parked on a sender's chunks ends before the multidevice may
	// hand its place back, which it does once Close returns: this waits
	// for the chunks while the sender's process runs (assist.go).
	for r := range sd.rx.parked {
		if pk := &sd.rx.parked[r]; pk.pr != nil {
			if err := sd.rx.awaitSender(r, pk.pr, sd.inbound[r].assist.done, pk.want); err != nil {
				sd.log.Debug("sender went away while a payload of its was read", "peer", r, "error", err)
			}
		}
		sd.rx.unpark(r)
	}
	for r := range sd.peers {
		if p := sd.peers[r].Swap(nil); p != nil {
			errs = append(errs, p.detach(fmt.Errorf("shm: rank %d: %w", p.rank, sdi.ErrClosed)))
		}
		if pr := sd.srcProc[r].Swap(nil); pr != nil {
			errs = append(errs, pr.release())
		}
	}
	if err := sd.seg.Close(); err != nil {
		errs = append(errs, fmt.Errorf("shm: close own segment: %w", err))
	}
	sd.log.Debug("closed shared-memory segment", "segment", sd.seg.Name())
	return errors.Join(errs...)
}

// ringDoorbell wakes the owner of the segment mapped at mem if it is
// sleeping, or about to. See progress.go for why this cannot lose a wake-up.
func (sd *device) ringDoorbell(mem []byte) {
	if word32(mem, offSleeping).Load() == 0 {
		return
	}
	word32(mem, offDoorbell).Add(1)
	if _, err := futex.Wake(rawWord32(mem, offDoorbell), 1); err != nil {
		sd.log.Warn("futex wake failed", "error", err)
	}
}

func hash16(b []byte) [16]byte {
	s := sha256.Sum256(b)
	return [16]byte(s[:16])
}
