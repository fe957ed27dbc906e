package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/internal/testlog"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// testLogger routes hclog into t.Log at the level in MP_TEST_LOG_LEVEL
// (default: errors only, so corrupt-ring tests show what they provoke).
func testLogger(t testing.TB) hclog.Logger { return testlog.New(t, "shm", hclog.Error) }

// msg is one delivered frame, copied out of the ring.
type msg struct {
	from    sdi.Rank
	header  []byte
	payload []byte
}

// recorder is a Handler that queues what it receives. Deliver blocks while
// gate is held, which tests use to keep a ring full.
type recorder struct {
	t     testing.TB
	msgs  chan msg
	down  chan downEvent
	dones chan sendDone
	gate  sync.RWMutex
}

// sendDone is one SendDone call.
type sendDone struct {
	token uint64
	err   error
}

type downEvent struct {
	peer sdi.Rank
	err  error
}

func newRecorder(t testing.TB) *recorder {
	return &recorder{t: t, msgs: make(chan msg, 1<<15), down: make(chan downEvent, 64), dones: make(chan sendDone, 1<<15)}
}

func (h *recorder) Deliver(from sdi.Rank, header, payload []byte) {
	h.gate.RLock()
	defer h.gate.RUnlock()
	h.msgs <- msg{from: from, header: append([]byte(nil), header...), payload: append([]byte(nil), payload...)}
}

// SendDone records the completion; only frames sent by descriptor
// (single copy) have one.
func (h *recorder) SendDone(token uint64, err error) {
	select {
	case h.dones <- sendDone{token, err}:
	default:
		h.t.Errorf("SendDone(%d, %v): more completions than the test expects", token, err)
	}
}

// nextDone returns the next SendDone, failing the test if none comes
// within the watchdog.
func (h *recorder) nextDone(t testing.TB) sendDone {
	t.Helper()
	select {
	case d := <-h.dones:
		return d
	case <-time.After(20 * time.Second):
		t.Fatal("no SendDone within the watchdog")
		return sendDone{}
	}
}

func (h *recorder) PeerDown(peer sdi.Rank, err error) {
	select {
	case h.down <- downEvent{peer, err}:
	default:
	}
}

// next returns the next delivered frame, failing the test if none arrives
// within a generous watchdog (a hang, not a performance assertion).
func (h *recorder) next(t testing.TB) msg {
	t.Helper()
	m, err := h.await()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// await is next for goroutines other than the test's.
func (h *recorder) await() (msg, error) {
	select {
	case m := <-h.msgs:
		return m, nil
	case <-time.After(20 * time.Second):
		return msg{}, errors.New("no frame delivered within the watchdog")
	}
}

func (h *recorder) nextDown(t testing.TB) downEvent {
	t.Helper()
	select {
	case d := <-h.down:
		return d
	case <-time.After(20 * time.Second):
		t.Fatal("no PeerDown within the watchdog")
		return downEvent{}
	}
}

// job is n opened and fully connected instances in this process.
type job struct {
	sds   []sdi.SubDevice
	hs    []*recorder
	local []sdi.Local
	id    string
}

type jobOpts struct {
	config []byte
	// noSleepBound makes doorbell sleeps unbounded, so a lost wake-up hangs
	// the test instead of costing half a second.
	noSleepBound bool
	// sleepFor, if set, bounds doorbell sleeps instead of sleepTimeout.
	sleepFor time.Duration
	// exploreEvery, if set, is how long every rank's choosers leave the
	// path they do not prefer untried, instead of exploreEvery.
	exploreEvery time.Duration
	host         func(r int) string
	// handler, if set, makes rank r's Handler from its recorder (a
	// wrapper that places payloads, say); j.hs still holds the recorder.
	handler func(r int, rec *recorder) sdi.Handler
}

// openJob opens n instances with a fresh job id and connects every pair
// (including each rank to itself). Close runs at cleanup.
func openJob(t testing.TB, n int, o jobOpts) *job {
	t.Helper()
	j := &job{id: fmt.Sprintf("test-%s-%d-%d", t.Name(), os.Getpid(), time.Now().UnixNano())}
	ctx := context.Background()
	for r := 0; r < n; r++ {
		h := newRecorder(t)
		sd := New(testLogger(t))
		if o.noSleepBound {
			sd.(*device).sleepFor = 0
		}
		if o.sleepFor != 0 {
			sd.(*device).sleepFor = o.sleepFor
		}
		if o.exploreEvery != 0 {
			sd.(*device).exploreEvery = o.exploreEvery
		}
		host := "host-a"
		if o.host != nil {
			host = o.host(r)
		}
		var hd sdi.Handler = h
		if o.handler != nil {
			hd = o.handler(r, h)
		}
		l, err := sd.Open(ctx, sdi.OpenParams{
			Rank: sdi.Rank(r), Size: n, Host: host, JobID: j.id, Secret: []byte("s3cret"),
			APIVersion: sdi.APIVersion, Config: o.config, Handler: hd, Logger: testLogger(t),
		})
		if err != nil {
			t.Fatalf("Open rank %d: %v", r, err)
		}
		if err := l.Caps.Validate(); err != nil {
			t.Fatalf("rank %d caps: %v", r, err)
		}
		t.Cleanup(func() {
			if err := sd.Close(context.Background()); err != nil {
				t.Errorf("Close rank %d: %v", r, err)
			}
		})
		j.sds, j.hs, j.local = append(j.sds, sd), append(j.hs, h), append(j.local, l)
	}
	if o.host != nil {
		return j // callers connect across hosts themselves
	}
	for a := range j.sds {
		for b := range j.sds {
			if err := j.sds[a].Connect(ctx, sdi.Rank(b), j.local[b].Addr); err != nil {
				t.Fatalf("Connect %d -> %d: %v", a, b, err)
			}
		}
	}
	return j
}

// sendRetry sends f, retrying while the ring is full. It may be called
// from any goroutine: it returns the error instead of failing the test.
func sendRetry(sd sdi.SubDevice, f *sdi.Frame) error {
	for tries := 0; ; tries++ {
		done, err := sd.Send(f)
		switch {
		case errors.Is(err, sdi.ErrWouldBlock):
			// Yield first; then nap, so that spinning senders do not starve
			// the receiver on a small machine.
			if tries < 64 {
				runtime.Gosched()
			} else {
				time.Sleep(20 * time.Microsecond)
			}
			continue
		case err != nil:
			return fmt.Errorf("Send to %d: %w", f.Peer, err)
		case !done && len(f.Payload) < defaultSingleCopyMin:
			return fmt.Errorf("Send to %d of %d bytes returned done=false; below single_copy_min shm completes at once", f.Peer, len(f.Payload))
		}
		return nil
	}
}

// mustSend is sendRetry for the test goroutine.
func mustSend(t testing.TB, sd sdi.SubDevice, f *sdi.Frame) {
	t.Helper()
	if err := sendRetry(sd, f); err != nil {
		t.Fatal(err)
	}
}

// pattern returns n bytes derived from seed, so corruption or mix-ups show.
func pattern(seed uint64, n int) []byte {
	b := make([]byte, n)
	x := seed*0x9e3779b97f4a7c15 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
	return b
}

func u64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

// waitGoroutines waits for the goroutine count to drop to at most want and
// reports the final count.
func waitGoroutines(want int) int {
	n := runtime.NumGoroutine()
	for i := 0; i < 200 && n > want; i++ {
		time.Sleep(10 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	return n
}

// scribble writes into the ring that carries rank from's frames to rank
// to, as a buggy or hostile sender could: write gets the ring and the
// sender's cursor and returns the new cursor, then the receiver's
// doorbell rings. It holds the sender's side of the ring meanwhile, so
// nothing honest is written between. Writers pass the put functions limit
// 0, clearing no stamp word ahead (putParts): they write what a broken
// sender could, and the ring tests check the clearing.
func scribble(t testing.TB, j *job, from, to sdi.Rank, write func(data []byte, tail uint64) uint64) {
	t.Helper()
	p := j.sds[from].(*device).peers[to].Load()
	if p == nil {
		t.Fatalf("rank %d is not connected to rank %d", from, to)
	}
	p.mu.Lock()
	p.tail = write(p.ring.data, p.tail)
	p.wake()
	p.mu.Unlock()
}

// rawRecord writes the wire header wh and body at cursor tail, stamped,
// and returns the cursor after it as the header's lengths say.
func rawRecord(data []byte, tail uint64, wh sdi.WireHeader, body []byte) uint64 {
	off := tail & uint64(len(data)-1)
	wh.Put(data[off+stampBytes:])
	copy(data[off+stampBytes+sdi.WireHeaderSize:], body)
	stamp(data, tail)
	return tail + recAlign
}
