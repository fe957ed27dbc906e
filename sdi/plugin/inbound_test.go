package plugin_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/plugin"
	"github.com/hpc-multidevice/multidevice/subdevices/tcp"
)

// bigMaxFrame is the MaxFrame of deliverAtConnect: beyond any ring.
const bigMaxFrame = 100_000_000

// deliverAtConnect is a subdevice whose MaxFrame exceeds what a ring holds,
// as one whose other end runs it built in (and so cuts frames to its full
// MaxFrame) sees it: Connect delivers one frame of n payload bytes from
// the peer.
type deliverAtConnect struct {
	sdi.SubDevice
	n int
	h sdi.Handler
}

func serveDeliverAtConnect(n int) {
	plugin.Serve(func(l hclog.Logger) sdi.SubDevice { return &deliverAtConnect{SubDevice: tcp.New(l), n: n} })
}

func (d *deliverAtConnect) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	d.h = p.Handler
	l, err := d.SubDevice.Open(ctx, p)
	l.Caps.MaxFrame = bigMaxFrame
	l.Caps.Flags &^= sdi.FlagJobCards | sdi.FlagPoll | sdi.FlagIdle // the embedding hides their interfaces
	return l, err
}

func (d *deliverAtConnect) Connect(_ context.Context, peer sdi.Rank, _ []byte) error {
	payload := make([]byte, d.n)
	payload[0], payload[d.n-1] = 1, 2
	go d.h.Deliver(peer, []byte("hdr"), payload)
	return nil
}

// inboundHandler reports the length of each delivered payload, or the
// error of a PeerDown as a negative length's companion.
type inboundHandler struct {
	nopHandler
	got chan inboundEvent
}

type inboundEvent struct {
	n    int
	ends bool // first and last byte as sent
	down error
}

func (h inboundHandler) Deliver(_ sdi.Rank, _, p []byte) {
	h.got <- inboundEvent{n: len(p), ends: len(p) > 1 && p[0] == 1 && p[len(p)-1] == 2}
}
func (h inboundHandler) PeerDown(_ sdi.Rank, err error) { h.got <- inboundEvent{down: err} }

// TestInboundBeyondRingLimit: a plugin fits its subdevice's MaxFrame to
// its data plane, but a peer running the subdevice built in still sends
// frames up to the subdevice's own MaxFrame (plugins.hcl.md: "the same
// name can be built in on one site and a plugin on another"). Such a frame
// once was dropped by the plugin with a warning only, and the receive
// waited for ever. It is carried where the data plane can (a place-area
// slot, up to 64 MiB); beyond that the peer is reported down with both
// limits named.
func TestInboundBeyondRingLimit(t *testing.T) {
	exe, _ := os.Executable()
	for _, tc := range []struct {
		name   string
		n      int
		stream bool
		down   bool // else delivered whole
	}{
		{"ring, 40 MB", 40_000_000, false, false},
		{"ring, 64 MiB", 64 << 20, false, false},
		{"ring, 70 MB", 70_000_000, false, true},
		{"stream, 40 MB", 40_000_000, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			c, err := plugin.Start(ctx, plugin.Config{Name: "fab", Path: exe, Args: []string{helperArg, "deliver-at-connect:" + strconv.Itoa(tc.n)},
				Stream: tc.stream, Timeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(ctx)
			h := inboundHandler{got: make(chan inboundEvent, 4)}
			l, err := c.Open(ctx, sdi.OpenParams{Rank: 1, Size: 2, Host: "h", JobID: "big", Secret: []byte("s"), APIVersion: sdi.APIVersion,
				Handler: h, Config: []byte(`{"listen": "127.0.0.1:0"}`)})
			if err != nil {
				t.Fatal(err)
			}
			if l.Caps.MaxFrame >= tc.n {
				t.Fatalf("MaxFrame as a plugin is %d: the frame of %d bytes tests nothing", l.Caps.MaxFrame, tc.n)
			}
			if err := c.Connect(ctx, 0, []byte("x")); err != nil {
				t.Fatal(err)
			}
			var ev inboundEvent
			select {
			case ev = <-h.got:
			case <-time.After(15 * time.Second):
				t.Fatalf("a frame of %d bytes (the subdevice's MaxFrame is %d, %d as a plugin) neither arrived nor took its peer down",
					tc.n, bigMaxFrame, l.Caps.MaxFrame)
			}
			switch {
			case tc.down && ev.down == nil:
				t.Fatalf("delivered %d bytes, want the peer down", ev.n)
			case tc.down && !(strings.Contains(ev.down.Error(), strconv.Itoa(bigMaxFrame)) && strings.Contains(ev.down.Error(), strconv.Itoa(tc.n))):
				t.Fatalf("PeerDown(%v): want the frame's size and the subdevice's MaxFrame named", ev.down)
			case !tc.down && (ev.down != nil || ev.n != tc.n || !ev.ends):
				t.Fatalf("got %+v, want the %d bytes delivered whole", ev, tc.n)
			}
			if ev.down != nil {
				t.Log(ev.down)
			}
		})
	}
}

// abandonThenCarry is deliverAtConnect that first, at Connect(0), takes
// every place-area slot for frames from rank 2 and reports rank 2 down,
// as tcp and shm do when a connection breaks in the middle of placed
// frames, and only then delivers rank 0's frame, too large for the ring.
type abandonThenCarry struct{ deliverAtConnect }

func serveAbandonThenCarry(n int) {
	plugin.Serve(func(l hclog.Logger) sdi.SubDevice {
		return &abandonThenCarry{deliverAtConnect{SubDevice: tcp.New(l), n: n}}
	})
}

func (d *abandonThenCarry) Connect(ctx context.Context, peer sdi.Rank, addr []byte) error {
	if peer != 0 {
		return nil
	}
	for range 8 {
		d.h.(sdi.Placer).Place(2, []byte("hdr"), 1<<20)
	}
	d.h.PeerDown(2, errors.New("rank 2's connection broke mid-frame"))
	return d.deliverAtConnect.Connect(ctx, peer, addr)
}

// TestPlacesEndedByPeerDownFreeSlots: a report of a peer down ends every
// place given for its frames (sdi.Placer), so the plugin must hand their
// slots out again. It once kept them taken for good, and once a few
// broken connections had taken all 8, a frame too large for the ring,
// which only a slot carries, held up the plugin's receive path for good.
func TestPlacesEndedByPeerDownFreeSlots(t *testing.T) {
	exe, _ := os.Executable()
	const n = 40_000_000
	ctx := context.Background()
	c, err := plugin.Start(ctx, plugin.Config{Name: "fab", Path: exe, Args: []string{helperArg, "abandon-then-carry:" + strconv.Itoa(n)}, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	h := inboundHandler{got: make(chan inboundEvent, 8)}
	if _, err := c.Open(ctx, sdi.OpenParams{Rank: 1, Size: 3, Host: "h", JobID: "abandon", Secret: []byte("s"), APIVersion: sdi.APIVersion,
		Handler: h, Config: []byte(`{"listen": "127.0.0.1:0"}`)}); err != nil {
		t.Fatal(err)
	}
	if err := c.Connect(ctx, 0, []byte("x")); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(15 * time.Second)
	for {
		select {
		case ev := <-h.got:
			if ev.down != nil {
				t.Logf("PeerDown: %v", ev.down)
				continue
			}
			if ev.n != n || !ev.ends {
				t.Fatalf("got %+v, want %d bytes whole", ev, n)
			}
			return
		case <-deadline:
			t.Fatalf("the %d-byte frame from rank 0 never arrived: the 8 place-area slots given for rank 2's frames were not freed when rank 2 was reported down", n)
		}
	}
}
