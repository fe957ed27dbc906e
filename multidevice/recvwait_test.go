package multidevice

import (
	"context"
	"encoding/binary"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
	"github.com/hpc-multidevice/multidevice/subdevices/shm"
)

// ctxCutSub is a subdevice that, before it hands an arriving frame to the
// device, calls the function in cut (once): a test ends a receive's ctx
// there, so that the receive's waiter wakes for its ctx while the
// message that completes it is being delivered.
type ctxCutSub struct {
	sdi.SubDevice
	cut *atomic.Pointer[func()]
}

func (c *ctxCutSub) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	p.Handler = ctxCutHandler{p.Handler, c.cut}
	return c.SubDevice.Open(ctx, p)
}

type ctxCutHandler struct {
	sdi.Handler
	cut *atomic.Pointer[func()]
}

func (h ctxCutHandler) Deliver(from sdi.Rank, header, payload []byte) {
	if f := h.cut.Swap(nil); f != nil {
		(*f)()
	}
	h.Handler.Deliver(from, header, payload)
}

// TestRecvCtxEndsAsMessageArrives: a blocking Recv whose ctx ends as its
// message arrives returns the message, or returns ctx's error and leaves
// the message to the next receive; never the error with the message
// taken. The subdevice does not poll, so the Recv parks at once; its ctx
// ends just before the message is delivered, and the parked waiter,
// woken for the ctx, runs only after the delivery completed it.
func TestRecvCtxEndsAsMessageArrives(t *testing.T) {
	cut := new(atomic.Pointer[func()])
	fab := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop"})
	factory := func(log hclog.Logger) sdi.SubDevice { return &ctxCutSub{fab.New(log), cut} }
	ds := openJob(t, jobSpec{n: 2, subs: []string{"loop"}, factories: map[string]sdi.Factory{"loop": factory}})
	buf := make([]byte, 8)
	for i := range uint64(20) {
		ctx, cancel := context.WithCancel(t.Context())
		f := func() { cancel() }
		cut.Store(&f)
		msg := binary.LittleEndian.AppendUint64(nil, i+1)
		sent := make(chan error, 1)
		go func() {
			time.Sleep(time.Millisecond) // the Recv parks first
			sent <- ds[0].Send(t.Context(), msg, 1, 0, 0, false)
		}()
		clear(buf)
		_, err := ds[1].Recv(ctx, buf, 0, 0, 0)
		cancel()
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
		if err == nil {
			if got := binary.LittleEndian.Uint64(buf); got != i+1 {
				t.Fatalf("message %d: received %d", i+1, got)
			}
			continue
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		// Not received: the next receive must find it.
		next, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		_, err = ds[1].Recv(next, buf, 0, 0, 0)
		cancel()
		if err != nil {
			t.Fatalf("message %d: the Recv whose ctx ended returned %v and took it: the next Recv got %v", i+1, context.Canceled, err)
		}
		if got := binary.LittleEndian.Uint64(buf); got != i+1 {
			t.Fatalf("message %d: the next Recv received %d", i+1, got)
		}
	}
}

// countPoll counts the polls of its subdevice; hook, if set, runs in
// place of the next poll, which then reports that it handled nothing.
type countPoll struct {
	sdi.SubDevice
	polls atomic.Int64
	hook  atomic.Pointer[func()]
}

func (c *countPoll) Poll() int {
	c.polls.Add(1)
	if h := c.hook.Swap(nil); h != nil {
		(*h)()
		return 0
	}
	return c.SubDevice.(sdi.Poller).Poll()
}

func (c *countPoll) Idle() { c.SubDevice.(sdi.Idler).Idle() }

// TestPollOneSeesCompletionElsewhere: a blocking Recv whose receive
// another goroutine completes during its wait's first poll (a second
// waiter's poll, a subdevice's own progress) returns after that poll,
// instead of polling on through pollOne's rounds.
func TestPollOneSeesCompletionElsewhere(t *testing.T) {
	var subs [2]*countPoll
	var n atomic.Int32
	factory := func(l hclog.Logger) sdi.SubDevice {
		c := &countPoll{SubDevice: shm.New(l)}
		subs[n.Add(1)-1] = c
		return c
	}
	d := openJob(t, jobSpec{n: 2, subs: []string{"shm"}, factories: map[string]sdi.Factory{"shm": factory}})[1]
	var cp *countPoll
	for _, c := range subs {
		for _, pp := range d.prog.peerPollers[0] {
			if pp.p == sdi.Poller(c) {
				cp = c
			}
		}
	}
	if cp == nil || len(d.prog.peerPollers[0]) != 1 || d.prog.crowded {
		t.Skipf("needs one uncrowded poller for rank 0 (crowded: %v)", d.prog.crowded)
	}
	hb := make([]byte, shortHeaderSize)
	putShort(hb, 1, 9, 0)
	hook := func() {
		done := make(chan struct{})
		go func() { d.arriveShort(0, hb, []byte("x")); close(done) }()
		<-done
	}
	cp.hook.Store(&hook)
	before := cp.polls.Load()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if st, err := d.Recv(ctx, make([]byte, 8), 0, 1, 9); err != nil || st.Count != 1 {
		t.Fatal(st, err)
	}
	if p := cp.polls.Load() - before; p > 1 {
		t.Errorf("Recv polled %d times more after its receive completed in the first poll", p-1)
	}
}
