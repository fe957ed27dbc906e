package sditest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// faulty is a working loopback with one rule broken by whichever function
// fields are set; the others pass through.
type faulty struct {
	sdi.SubDevice
	h    sdi.Handler // the suite's handler, captured at Open
	sent atomic.Int64

	mu   sync.Mutex
	held *sdi.Frame

	openF    func(x *faulty)
	paramsF  func(p *sdi.OpenParams)
	sendF    func(x *faulty, f *sdi.Frame) (bool, error)
	connectF func(x *faulty, err error) error
	flushF   func(ctx context.Context) error
	closeF   func(x *faulty, err error) error
	handlerF func(x *faulty, h sdi.Handler) sdi.Handler
	capsF    func(c *sdi.Caps)
	// connectAllF, when set, replaces Connect.
	connectAllF func(x *faulty, ctx context.Context, peer sdi.Rank, addr []byte) error
	redirect    atomic.Bool // for the fault that sends rank 1's frames elsewhere
	// pollF, when set, makes the subdevice a Poller (see pollingFaulty).
	pollF func(x *faulty) int
	// afterPlaceF, when set, runs after a frame was delivered in its place.
	afterPlaceF func(dst []byte)
	// holdPlacesF, when set, makes a placing x hold every placed frame
	// from the third of its stream on, unfilled and undelivered, as if
	// still in flight, and replaces PeerDown; held pairs place and payload.
	holdPlacesF func(h sdi.Handler, peer sdi.Rank, err error, held [][2][]byte)
}

// placing makes x ask the suite's Handler for a place for every arriving
// frame (it implements sdi.Placer in the Place checks), as a subdevice with
// a single-copy path does. fill moves the payload into dst and returns the
// slice to deliver; a correct fill copies all of it and returns dst.
func (x *faulty) placing(fill func(dst, payload []byte) []byte) {
	x.handlerF = func(x *faulty, h sdi.Handler) sdi.Handler {
		pl, ok := h.(sdi.Placer)
		if !ok {
			return h
		}
		var mu sync.Mutex
		var held [][2][]byte
		hf := handlerFuncs{Handler: h, deliver: func(from sdi.Rank, header, payload []byte) {
			dst := pl.Place(from, header, len(payload))
			if dst == nil {
				h.Deliver(from, header, payload)
				return
			}
			if x.holdPlacesF != nil && binary.LittleEndian.Uint64(header[4:]) >= 2 {
				mu.Lock()
				held = append(held, [2][]byte{dst, append([]byte(nil), payload...)})
				mu.Unlock()
				return
			}
			h.Deliver(from, header, fill(dst, payload))
			if x.afterPlaceF != nil {
				x.afterPlaceF(dst)
			}
		}}
		if x.holdPlacesF != nil {
			hf.peerDown = func(peer sdi.Rank, err error) {
				mu.Lock()
				defer mu.Unlock()
				x.holdPlacesF(h, peer, err, held)
			}
		}
		return hf
	}
}

// pollingFaulty is a faulty that implements sdi.Poller with its pollF.
type pollingFaulty struct{ *faulty }

func (x pollingFaulty) Poll() int { return x.pollF(x.faulty) }

// subDevice is x, as a Poller when it has a pollF.
func (x *faulty) subDevice() sdi.SubDevice {
	if x.pollF != nil {
		return pollingFaulty{x}
	}
	return x
}

// pollable makes x claim FlagPoll, with a Poll that leaves progress to
// the loopback's goroutine: a legal, if idle, Poller.
func (x *faulty) pollable() {
	x.capsF = func(c *sdi.Caps) { c.Flags |= sdi.FlagPoll }
	x.pollF = func(*faulty) int { return 0 }
}

func (x *faulty) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	x.h = p.Handler
	if x.handlerF != nil {
		p.Handler = x.handlerF(x, p.Handler)
	}
	if x.openF != nil {
		x.openF(x)
	}
	if x.paramsF != nil {
		x.paramsF(&p)
	}
	l, err := x.SubDevice.Open(ctx, p)
	if err == nil && x.capsF != nil {
		x.capsF(&l.Caps)
	}
	return l, err
}

func (x *faulty) Send(f *sdi.Frame) (bool, error) {
	if x.sendF != nil {
		return x.sendF(x, f)
	}
	return x.SubDevice.Send(f)
}

func (x *faulty) Connect(ctx context.Context, peer sdi.Rank, addr []byte) error {
	if x.connectAllF != nil {
		return x.connectAllF(x, ctx, peer, addr)
	}
	err := x.SubDevice.Connect(ctx, peer, addr)
	if x.connectF != nil {
		return x.connectF(x, err)
	}
	return err
}

func (x *faulty) Flush(ctx context.Context, peer sdi.Rank) error {
	if x.flushF != nil {
		return x.flushF(ctx)
	}
	return x.SubDevice.Flush(ctx, peer)
}

func (x *faulty) Close(ctx context.Context) error {
	err := x.SubDevice.Close(ctx)
	if x.closeF != nil {
		return x.closeF(x, err)
	}
	return err
}

// handlerFuncs overrides the methods of a Handler whose fields are set.
type handlerFuncs struct {
	sdi.Handler
	deliver  func(from sdi.Rank, header, payload []byte)
	sendDone func(token uint64, err error)
	peerDown func(peer sdi.Rank, err error)
}

func (h handlerFuncs) PeerDown(peer sdi.Rank, err error) {
	if h.peerDown != nil {
		h.peerDown(peer, err)
		return
	}
	h.Handler.PeerDown(peer, err)
}

func (h handlerFuncs) Deliver(from sdi.Rank, header, payload []byte) {
	if h.deliver != nil {
		h.deliver(from, header, payload)
		return
	}
	h.Handler.Deliver(from, header, payload)
}

func (h handlerFuncs) SendDone(token uint64, err error) {
	if h.sendDone != nil {
		h.sendDone(token, err)
		return
	}
	h.Handler.SendDone(token, err)
}

// fault is a broken subdevice and the check that must catch it.
type fault struct {
	name  string
	check string
	want  string // part of the failure message the check must produce
	setup func(x *faulty, stop <-chan struct{})
}

// hangs lists the faults that hang, with a watchdog short enough to catch
// them quickly.
var hangs = map[string]time.Duration{
	"Flush waits for its context, never for frames": 300 * time.Millisecond,
}

var faults = []fault{
	{"drops every 10th frame", "PingPong/1000", "waiting for rank 1 to receive 10 frames",
		func(x *faulty, _ <-chan struct{}) {
			x.sendF = func(x *faulty, f *sdi.Frame) (bool, error) {
				if x.sent.Add(1)%10 == 0 {
					return true, nil
				}
				return x.SubDevice.Send(f)
			}
		}},
	{"drops every 10th frame", "Concurrent/Sends", "gave up",
		func(x *faulty, _ <-chan struct{}) {
			x.sendF = func(x *faulty, f *sdi.Frame) (bool, error) {
				if x.sent.Add(1)%10 == 0 {
					return true, nil
				}
				return x.SubDevice.Send(f)
			}
		}},
	{"calls SendDone twice", "Send/CompletionExactlyOnce", "called 2 times",
		func(x *faulty, _ <-chan struct{}) {
			x.handlerF = func(_ *faulty, h sdi.Handler) sdi.Handler {
				return handlerFuncs{Handler: h, sendDone: func(token uint64, err error) {
					h.SendDone(token, err)
					h.SendDone(token, err)
				}}
			}
		}},
	{"returns done=true and calls SendDone too", "Send/CompletionExactlyOnce", "done=true",
		func(x *faulty, _ <-chan struct{}) {
			x.sendF = func(x *faulty, f *sdi.Frame) (bool, error) {
				_, err := x.SubDevice.Send(f)
				return err == nil, err
			}
		}},
	{"calls SendDone from within Send", "Send/CompletionExactlyOnce", "from within Send",
		func(x *faulty, _ <-chan struct{}) {
			x.sendF = func(x *faulty, f *sdi.Frame) (bool, error) {
				done, err := x.SubDevice.Send(f)
				if err == nil && done {
					x.h.SendDone(f.Token, nil)
					return false, nil
				}
				return done, err
			}
		}},
	{"keeps the caller's buffer after done=true", "Send/BufferReuseAfterDone", "waiting for rank 1 to receive",
		func(x *faulty, _ <-chan struct{}) {
			x.sendF = func(x *faulty, f *sdi.Frame) (bool, error) {
				x.mu.Lock()
				prev := x.held
				x.held = f
				x.mu.Unlock()
				if prev != nil {
					x.SubDevice.Send(prev) // reads what the caller wrote since
				}
				return true, nil
			}
		}},
	{"reports oversized frames with its own error", "Send/Sizes", "want sdi.ErrTooLarge",
		func(x *faulty, _ <-chan struct{}) {
			x.sendF = func(x *faulty, f *sdi.Frame) (bool, error) {
				done, err := x.SubDevice.Send(f)
				if errors.Is(err, sdi.ErrTooLarge) {
					return false, errors.New("frame too big")
				}
				return done, err
			}
		}},
	{"never has room", "Backpressure/WouldBlockThenDrains", "kept returning ErrWouldBlock",
		func(x *faulty, _ <-chan struct{}) {
			x.sendF = func(*faulty, *sdi.Frame) (bool, error) { return false, sdi.ErrWouldBlock }
		}},
	{"swaps pairs of frames while claiming FlagOrdered", "Ordering/PerPeerFIFO", "FlagOrdered promises send order",
		func(x *faulty, _ <-chan struct{}) {
			x.handlerF = func(_ *faulty, h sdi.Handler) sdi.Handler {
				var mu sync.Mutex
				held := map[sdi.Rank][2][]byte{}
				return handlerFuncs{Handler: h, deliver: func(from sdi.Rank, header, payload []byte) {
					mu.Lock()
					defer mu.Unlock()
					prev, ok := held[from]
					if !ok {
						held[from] = [2][]byte{append([]byte(nil), header...), append([]byte(nil), payload...)}
						return
					}
					delete(held, from)
					h.Deliver(from, header, payload)
					h.Deliver(from, prev[0], prev[1])
				}}
			}
		}},
	{"accepts garbage cards", "Connect/BadAddr", "want an error wrapping sdi.ErrPeerUnreachable",
		func(x *faulty, _ <-chan struct{}) {
			x.connectF = func(*faulty, error) error { return nil }
		}},
	{"returns from Flush at once", "Flush/CompletesAll", "Flush returned while",
		func(x *faulty, _ <-chan struct{}) {
			x.flushF = func(context.Context) error { return nil }
			x.handlerF = func(_ *faulty, h sdi.Handler) sdi.Handler {
				return handlerFuncs{Handler: h, sendDone: func(token uint64, err error) {
					time.AfterFunc(20*time.Millisecond, func() { h.SendDone(token, err) })
				}}
			}
		}},
	{"Flush waits for its context, never for frames", "Flush/CompletesAll", "watchdog fired",
		func(x *faulty, _ <-chan struct{}) {
			x.flushF = func(ctx context.Context) error {
				<-ctx.Done()
				return ctx.Err()
			}
		}},
	{"calls the Handler after Close", "Close/FailsPendingOrCompletes", "after Close returned",
		func(x *faulty, _ <-chan struct{}) {
			// The late call waits for the suite to see Close return,
			// rather than for a timer: under -race on a loaded machine a
			// 1 ms timer fired after the suite had stopped watching.
			x.closeF = func(x *faulty, err error) error {
				r := x.h.(*recorder)
				go func() {
					for !r.isClosed() {
						runtime.Gosched()
					}
					x.h.PeerDown(1, errors.New("late"))
				}()
				return err
			}
		}},
	{"leaks a goroutine", "Close/NoLeakedGoroutines", "still running",
		func(x *faulty, stop <-chan struct{}) {
			x.openF = func(*faulty) { go func() { <-stop }() }
		}},
	{"leaks a goroutine per refused Connect", "Close/NoLeakedGoroutines", "still running",
		func(x *faulty, stop <-chan struct{}) {
			x.connectF = func(_ *faulty, err error) error {
				if err != nil {
					go func() { <-stop }()
				}
				return err
			}
		}},
	{"fails frames it delivered", "Send/CompletionExactlyOnce", "failed a frame while every rank was open",
		func(x *faulty, _ <-chan struct{}) {
			x.handlerF = func(_ *faulty, h sdi.Handler) sdi.Handler {
				return handlerFuncs{Handler: h, sendDone: func(token uint64, err error) {
					if err == nil {
						err = errors.New("fault: lost")
					}
					h.SendDone(token, err)
				}}
			}
		}},
	{"takes any secret", "Connect/BadAddr", "does not know the job's secret",
		func(x *faulty, _ <-chan struct{}) {
			x.paramsF = func(p *sdi.OpenParams) { p.Secret = []byte("one secret for all") }
		}},
	{"delivers every 7th frame twice", "Ordering/PerPeerFIFO", "again; every frame arrives once",
		func(x *faulty, _ <-chan struct{}) {
			var n atomic.Int64
			x.handlerF = func(_ *faulty, h sdi.Handler) sdi.Handler {
				return handlerFuncs{Handler: h, deliver: func(from sdi.Rank, header, payload []byte) {
					h.Deliver(from, header, payload)
					if n.Add(1)%7 == 0 {
						h.Deliver(from, header, payload)
					}
				}}
			}
		}},
	{"claims FlagReliable but drops frames to a closed peer unreported", "PeerDown/OnPeerClose", "they vanished",
		func(x *faulty, _ <-chan struct{}) {
			x.sendF = func(x *faulty, f *sdi.Frame) (bool, error) {
				if done, err := x.SubDevice.Send(f); err == nil || errors.Is(err, sdi.ErrWouldBlock) {
					return done, err
				}
				return true, nil
			}
			x.handlerF = func(_ *faulty, h sdi.Handler) sdi.Handler {
				return handlerFuncs{Handler: h, peerDown: func(sdi.Rank, error) {}}
			}
		}},
	{"takes another rank's card for rank 1", "Connect/BadAddr", "a frame addressed to rank 1",
		func(x *faulty, _ <-chan struct{}) {
			x.connectAllF = func(x *faulty, ctx context.Context, peer sdi.Rank, addr []byte) error {
				err := x.SubDevice.Connect(ctx, peer, addr)
				if peer != 1 || err == nil {
					x.redirect.Store(false)
					return err
				}
				// The card is rank 0's: send rank 1's frames there.
				if err := x.SubDevice.Connect(ctx, 0, addr); err != nil {
					return err
				}
				x.redirect.Store(true)
				return nil
			}
			x.sendF = func(x *faulty, f *sdi.Frame) (bool, error) {
				if x.redirect.Load() && f.Peer == 1 {
					g := *f
					g.Peer = 0
					return x.SubDevice.Send(&g)
				}
				return x.SubDevice.Send(f)
			}
		}},
	{"sets FlagPoll without a Poller", "Poll/Caps", "does not implement sdi.Poller",
		func(x *faulty, _ <-chan struct{}) {
			x.capsF = func(c *sdi.Caps) { c.Flags |= sdi.FlagPoll }
		}},
	{"blocks in Poll", "Poll/Concurrent", "Poll must never block",
		func(x *faulty, stop <-chan struct{}) {
			x.pollable()
			x.pollF = func(*faulty) int { <-stop; return 0 }
		}},
	{"delivers a frame again from Poll", "Poll/Concurrent", "again; every frame arrives once",
		func(x *faulty, _ <-chan struct{}) {
			x.pollable()
			var mu sync.Mutex
			var last *[3][]byte
			x.handlerF = func(_ *faulty, h sdi.Handler) sdi.Handler {
				return handlerFuncs{Handler: h, deliver: func(from sdi.Rank, header, payload []byte) {
					h.Deliver(from, header, payload)
					mu.Lock()
					last = &[3][]byte{{byte(from)}, append([]byte(nil), header...), append([]byte(nil), payload...)}
					mu.Unlock()
				}}
			}
			x.pollF = func(x *faulty) int {
				mu.Lock()
				f := last
				last = nil
				mu.Unlock()
				if f == nil {
					return 0
				}
				x.h.Deliver(sdi.Rank(f[0][0]), f[1], f[2])
				return 1
			}
		}},
	{"stands its own progress by for good once polled", "Poll/HandsBack", "waiting for rank 1 to receive",
		func(x *faulty, _ <-chan struct{}) {
			x.pollable()
			var mu sync.Mutex
			var polled bool
			var queue [][3][]byte
			x.handlerF = func(_ *faulty, h sdi.Handler) sdi.Handler {
				return handlerFuncs{Handler: h, deliver: func(from sdi.Rank, header, payload []byte) {
					mu.Lock()
					defer mu.Unlock()
					if !polled {
						h.Deliver(from, header, payload)
						return
					}
					queue = append(queue, [3][]byte{{byte(from)}, append([]byte(nil), header...), append([]byte(nil), payload...)})
				}}
			}
			x.pollF = func(x *faulty) int {
				mu.Lock()
				defer mu.Unlock()
				polled = true
				for _, f := range queue {
					x.h.Deliver(sdi.Rank(f[0][0]), f[1], f[2])
				}
				n := len(queue)
				queue = queue[:0]
				return n
			}
		}},
	// The multidevice skips a subdevice whose headers cannot carry its own
	// (multidevice/header.go); a suite that passed it would promise a
	// subdevice that is then never used.
	{"publishes MaxHeader below sdi.MinHeader", "Open/CapsSane", "below sdi.MinHeader",
		func(x *faulty, _ <-chan struct{}) {
			x.capsF = func(c *sdi.Caps) { c.MaxHeader = 40 }
		}},
	{"delivers a placed frame from its own buffer", "Place/Delivers", "not in the place Place returned",
		func(x *faulty, _ <-chan struct{}) {
			x.placing(func(dst, payload []byte) []byte { copy(dst, payload); return payload })
		}},
	{"delivers a place before filling all of it", "Place/Delivers", "payload byte",
		func(x *faulty, _ <-chan struct{}) {
			x.placing(func(dst, payload []byte) []byte { copy(dst, payload[:len(payload)/2]); return dst })
		}},
	{"writes into a place after delivering it", "Place/Delivers", "after delivering it",
		func(x *faulty, _ <-chan struct{}) {
			x.placing(func(dst, payload []byte) []byte { copy(dst, payload); return dst })
			x.afterPlaceF = func(dst []byte) { dst[len(dst)-1] ^= 0xff }
		}},
	{"leaves a place unfilled when its peer goes", "Place/EndedByPeerDown", "neither filled and delivered nor ended by PeerDown",
		func(x *faulty, _ <-chan struct{}) {
			x.placing(func(dst, payload []byte) []byte { copy(dst, payload); return dst })
			x.holdPlacesF = func(h sdi.Handler, peer sdi.Rank, err error, held [][2][]byte) {}
		}},
	{"writes into a place after reporting its peer down", "Place/EndedByPeerDown", "after PeerDown(1)",
		func(x *faulty, _ <-chan struct{}) {
			x.placing(func(dst, payload []byte) []byte { copy(dst, payload); return dst })
			x.holdPlacesF = func(h sdi.Handler, peer sdi.Rank, err error, held [][2][]byte) {
				h.PeerDown(peer, err)
				// The late write is passed to the suite's checker through
				// its lock, so that -race reports the fault's effect
				// rather than the data race such a write is.
				mu := &h.(placingRecorder).e.mu
				mu.Lock()
				defer mu.Unlock()
				for _, f := range held {
					copy(f[0], f[1])
				}
			}
		}},
	{"accepts frames after Close", "Close/SendAfterClose", "Send after Close",
		func(x *faulty, _ <-chan struct{}) {
			x.sendF = func(x *faulty, f *sdi.Frame) (bool, error) {
				done, err := x.SubDevice.Send(f)
				if errors.Is(err, sdi.ErrClosed) {
					return true, nil
				}
				return done, err
			}
		}},
}

// recordingTB records failures instead of reporting them, so a test can
// assert that a check fails. Like testing.T, FailNow and SkipNow end the
// calling goroutine.
type recordingTB struct {
	*testing.T
	mu       sync.Mutex
	failures []string
	skipped  bool
}

func (r *recordingTB) record(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = append(r.failures, s)
}

func (r *recordingTB) Helper()                           {}
func (r *recordingTB) Fail()                             { r.record("Fail") }
func (r *recordingTB) FailNow()                          { r.record("FailNow"); runtime.Goexit() }
func (r *recordingTB) Error(args ...any)                 { r.record(fmt.Sprint(args...)) }
func (r *recordingTB) Errorf(format string, args ...any) { r.record(fmt.Sprintf(format, args...)) }
func (r *recordingTB) Fatal(args ...any)                 { r.Error(args...); runtime.Goexit() }
func (r *recordingTB) Fatalf(format string, args ...any) { r.Errorf(format, args...); runtime.Goexit() }
func (r *recordingTB) Skip(args ...any)                  { r.SkipNow() }
func (r *recordingTB) Skipf(string, ...any)              { r.SkipNow() }

func (r *recordingTB) SkipNow() {
	r.mu.Lock()
	r.skipped = true
	r.mu.Unlock()
	runtime.Goexit()
}

func (r *recordingTB) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.failures) > 0
}

func (r *recordingTB) Skipped() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.skipped
}

// runRecorded runs one check of the catalogue on a recordingTB inside a
// subtest, so the check's cleanup has run when it returns.
func runRecorded(t *testing.T, name string, tm timing, newSD func(testing.TB) sdi.SubDevice) *recordingTB {
	t.Helper()
	c := findCheck(name)
	if c == nil {
		t.Fatalf("no check %q", name)
	}
	var rec *recordingTB
	t.Run(name, func(t *testing.T) {
		rec = &recordingTB{T: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			runCheck(rec, Harness{New: newSD, Peers: 2}, *c, tm)
		}()
		<-done
	})
	return rec
}

// faultTiming gives up sooner than the default: every fault that shows as a
// missing frame costs one patience.
var faultTiming = timing{watchdog: 20 * time.Second, patience: 2 * time.Second, quiet: 50 * time.Millisecond}

// TestSuiteCatchesFaults proves the suite can fail: each check, given a
// subdevice that breaks the rule it guards, reports the violation.
func TestSuiteCatchesFaults(t *testing.T) {
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			stop := make(chan struct{})
			t.Cleanup(func() { close(stop) })
			fabric := NewFabric(LoopbackOptions{})
			tm := faultTiming
			if d, ok := hangs[f.name]; ok {
				tm.watchdog = d
			}
			rec := runRecorded(t, f.check, tm, func(testing.TB) sdi.SubDevice {
				x := &faulty{SubDevice: fabric.New(hclog.NewNullLogger())}
				f.setup(x, stop)
				return x.subDevice()
			})
			if rec.Skipped() {
				t.Fatalf("%s skipped instead of catching the fault", f.check)
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			for _, msg := range rec.failures {
				if strings.Contains(msg, f.want) {
					t.Logf("caught: %s", msg)
					return
				}
			}
			t.Errorf("%s did not report a subdevice that %s with a failure mentioning %q; it reported %q", f.check, f.name, f.want, rec.failures)
		})
	}
}

// TestFaultyWrapperIsTransparent is the control for TestSuiteCatchesFaults:
// without a fault, the wrapper passes the same checks, so what they catch
// is the fault and not the wrapper.
func TestFaultyWrapperIsTransparent(t *testing.T) {
	checked := map[string]bool{}
	for _, f := range faults {
		if checked[f.check] {
			continue
		}
		checked[f.check] = true
		fabric := NewFabric(LoopbackOptions{})
		rec := runRecorded(t, f.check, defaultTiming, func(testing.TB) sdi.SubDevice {
			x := &faulty{SubDevice: fabric.New(hclog.NewNullLogger())}
			if strings.HasPrefix(f.check, "Poll/") {
				x.pollable() // the checks skip a subdevice without FlagPoll
			}
			if strings.HasPrefix(f.check, "Place/") {
				// The loopback never asks for a place; this one does, correctly.
				x.placing(func(dst, payload []byte) []byte { copy(dst, payload); return dst })
			}
			return x.subDevice()
		})
		if rec.Failed() || rec.Skipped() {
			t.Errorf("%s failed or skipped on the unbroken wrapper: %q", f.check, rec.failures)
		}
	}
}
