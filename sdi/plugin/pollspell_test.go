package plugin

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/internal/shmem"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// spellSub is a plugin-side subdevice that only counts Poll and Idle.
type spellSub struct {
	sdi.SubDevice
	polls, idles atomic.Int64
}

func (s *spellSub) Poll() int { s.polls.Add(1); return 0 }
func (s *spellSub) Idle()     { s.idles.Add(1) }

type quietHandler struct{}

func (quietHandler) Deliver(sdi.Rank, []byte, []byte) {}
func (quietHandler) SendDone(uint64, error)           {}
func (quietHandler) PeerDown(sdi.Rank, error)         {}

// eventually waits up to 5 s for cond, calling step between checks.
func eventually(t *testing.T, what string, cond func() bool, step func()) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting: %s", what)
		}
		step()
	}
}

// The plugin polls its subdevice exactly while a rank polls the host's
// side: not before, it stops at Idle, starts again at the next Poll, and
// stops by itself once Poll calls stop coming without an Idle.
func TestPluginPollsWhileHostPolls(t *testing.T) {
	name := segmentName()
	hostSeg, err := shmem.Create(name, segmentSize(minRingBytes, minRingBytes))
	if err != nil {
		t.Skipf("no shared memory here: %v", err)
	}
	initSegment(hostSeg.Bytes(), minRingBytes, minRingBytes)
	plugSeg, err := shmem.Open(name)
	hostSeg.Unlink()
	if err != nil {
		hostSeg.Close()
		t.Fatal(err)
	}
	lim := limits{maxHeader: 64, maxPayload: 1024, size: 2}
	sub := &spellSub{}
	srv := newServer(sub, hclog.NewNullLogger(), nil)
	srv.poller, srv.idler = sub, sub
	pr := newPluginRing(plugSeg, nil, srv, lim)
	defer pr.stop()
	hr := newHostRing(hostSeg, nil, quietHandler{}, lim, func(err error) { t.Errorf("data plane failed: %v", err) })
	defer hr.stop()

	nap := func() { time.Sleep(time.Millisecond) }
	time.Sleep(20 * time.Millisecond)
	if n := sub.polls.Load(); n != 0 {
		t.Fatalf("the plugin polled %d times before the host did", n)
	}

	eventually(t, "the plugin polls while the host polls", func() bool { return sub.polls.Load() > 0 }, func() { hr.poll() })
	hr.idle()
	eventually(t, "Idle reaches the plugin's subdevice", func() bool { return sub.idles.Load() == 1 }, nap)
	before := sub.polls.Load()
	time.Sleep(20 * time.Millisecond)
	if n := sub.polls.Load(); n != before {
		t.Fatalf("the plugin polled %d more times after the host parked", n-before)
	}

	// A new spell: the first Poll stores a new count and nudges the
	// sleeping plugin. Polling goes on until the plugin polls, since a
	// single Poll followed by silence is also a rank that went back to work.
	eventually(t, "the plugin polls again after a new Poll", func() bool { return sub.polls.Load() > before }, func() { hr.poll() })
	// No Idle this time: the host went back to work. Both sides notice.
	eventually(t, "the plugin stops polling without an Idle", func() bool { return sub.idles.Load() >= 2 }, nap)
	eventually(t, "the host's consumer takes over from a rank that stopped polling", func() bool { return !hr.polling.Load() }, nap)
}
