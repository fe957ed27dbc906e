package multidevice

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// idleSub is a loopback subdevice that counts Poll and Idle calls, and
// whether a Poll came after the last Idle (the waiter parked while the
// subdevice still thought it polled).
type idleSub struct {
	sdi.SubDevice
	polls, idles  atomic.Int64
	pollSinceIdle atomic.Bool
}

func (s *idleSub) Poll() int {
	s.polls.Add(1)
	s.pollSinceIdle.Store(true)
	return 0
}

func (s *idleSub) Idle() {
	s.idles.Add(1)
	s.pollSinceIdle.Store(false)
}

// A waiter that gives up polling tells the subdevices with FlagIdle before
// it parks, and only those.
func TestIdleBeforePark(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags sdi.Flag
		want  bool // Idle calls expected
	}{
		{"idle", sdi.FlagPoll | sdi.FlagIdle, true},
		{"poll only", sdi.FlagPoll, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			caps := smallCaps
			caps.Flags |= tc.flags
			f := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: caps})
			factory := func(l hclog.Logger) sdi.SubDevice { return &idleSub{SubDevice: f.New(l)} }
			devs := openJob(t, jobSpec{n: 2, subs: []string{"loop"}, factories: map[string]sdi.Factory{"loop": factory}})
			defer closeJob(t, devs)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			buf := make([]byte, 8)
			if _, err := devs[0].Recv(ctx, buf, 1, 5, 0); err == nil {
				t.Fatal("Recv of a message never sent returned no error")
			}
			s := devs[0].subs[1].sd.(*idleSub)
			if s.polls.Load() == 0 {
				t.Fatal("the waiter never polled")
			}
			if got := s.idles.Load() > 0; got != tc.want {
				t.Fatalf("Idle called: %v, want %v", got, tc.want)
			}
			if tc.want && s.pollSinceIdle.Load() {
				t.Error("the waiter polled again after Idle and parked without a new Idle")
			}
		})
	}
}
