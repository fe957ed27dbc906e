package multidevice

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// stallPass is a pollable loopback that refuses 64-byte frames while
// stall is set and, called from heldPass, first waits for release: a
// waiter preempted inside the subdevice's Send in the middle of a pass.
type stallPass struct {
	sdi.SubDevice
	stall   *atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (s stallPass) Poll() int { return 0 }

func (s stallPass) Send(f *sdi.Frame) (bool, error) {
	if s.stall.Load() && len(f.Payload) == 64 {
		buf := make([]byte, 8192)
		if strings.Contains(string(buf[:runtime.Stack(buf, false)]), "heldPass") {
			close(s.entered)
			<-s.release
		}
		return false, sdi.ErrWouldBlock
	}
	return s.SubDevice.Send(f)
}

// heldPass is a waiter's polling rounds, helping the outbox, until one
// pass met the stalled Send.
func heldPass(d *Device, entered chan struct{}) {
	for {
		d.out.help()
		select {
		case <-entered:
			return
		default:
			time.Sleep(10 * time.Microsecond)
		}
	}
}

// outboxInPass opens a job and returns rank 0 with a request whose frame
// a waiter's pass holds, stalled in Send until release is closed.
func outboxInPass(t *testing.T) (d *Device, r *Request, release chan struct{}) {
	caps := smallCaps
	caps.Flags |= sdi.FlagPoll
	f := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: caps})
	var stall atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	mk := func(l hclog.Logger) sdi.SubDevice { return stallPass{f.New(l), &stall, entered, release} }
	devs := openJob(t, jobSpec{n: 2, subs: []string{"loop"}, factories: map[string]sdi.Factory{"loop": mk}})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
		stall.Store(false)
	})
	d = devs[0]
	stall.Store(true)
	// A goroutine of rank 0 waits, spinning: pushes do not wake the
	// outbox goroutine then, the waiter sends what is queued.
	d.prog.spinners.Add(1)
	r = must(t)(d.Isend(pattern(64, 1), 1, 3, 0, false)) // refused: queued
	go func() { heldPass(d, entered); d.stopSpinning() }()
	<-entered
	return d, r, release
}

// TestOutboxStopsDuringPass: the outbox stops (Close's failRest) while a
// waiter's pass holds the queue: the frame the pass keeps fails with
// ErrClosed. It was put back into a queue nobody drained any more, and
// its request, outstanding at Close, never completed.
func TestOutboxStopsDuringPass(t *testing.T) {
	d, r, release := outboxInPass(t)
	d.out.failRest() // as the outbox goroutine does when Close stops it
	close(release)
	select {
	case <-r.Done():
		if _, err := r.Result(); !errors.Is(err, ErrClosed) {
			t.Fatalf("send kept by a pass after the outbox stopped: %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("send kept by a pass after the outbox stopped still pending; queued: %d", d.out.queued.Load())
	}
}

// TestOutboxDrainWaitsForPass: drain (Close's flush) waits for the frames
// a pass holds as for those queued; it returned at once while a pass had
// them out of the queue, and Close went on before they were sent.
func TestOutboxDrainWaitsForPass(t *testing.T) {
	d, _, _ := outboxInPass(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := d.out.drain(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("drain while a pass holds a frame = %v, want it to wait (and its ctx to end)", err)
	}
}
