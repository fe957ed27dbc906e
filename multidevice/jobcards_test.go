package multidevice

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/bootstrap"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// cardsSub is a loopback subdevice that records the job's cards and checks
// that they arrive before the first Connect.
type cardsSub struct {
	sdi.SubDevice
	mu        sync.Mutex
	cards     [][]byte
	connected bool
	early     bool // SetJobCards came after a Connect
}

func (c *cardsSub) SetJobCards(_ context.Context, cards [][]byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.early = c.connected
	c.cards = cards
	return nil
}

func (c *cardsSub) Connect(ctx context.Context, peer sdi.Rank, addr []byte) error {
	c.mu.Lock()
	c.connected = true
	c.mu.Unlock()
	return c.SubDevice.Connect(ctx, peer, addr)
}

func TestJobCardsBeforeConnect(t *testing.T) {
	caps := smallCaps
	caps.Flags |= sdi.FlagJobCards
	f := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: caps})
	const n = 3
	var mu sync.Mutex
	var subs []*cardsSub
	factory := func(l hclog.Logger) sdi.SubDevice {
		c := &cardsSub{SubDevice: f.New(l)}
		mu.Lock()
		subs = append(subs, c)
		mu.Unlock()
		return c
	}
	devs := openJob(t, jobSpec{n: n, subs: []string{"loop"}, factories: map[string]sdi.Factory{"loop": factory}})
	for _, d := range devs {
		s := d.subs[1]
		c := s.sd.(*cardsSub)
		if c.early {
			t.Errorf("rank %d: SetJobCards came after a Connect", d.rank)
		}
		if len(c.cards) != n {
			t.Fatalf("rank %d: got %d cards, want %d", d.rank, len(c.cards), n)
		}
		for r, card := range c.cards {
			want := devs[r].subs[1].card
			if len(want) == 0 || !bytes.Equal(card, want) {
				t.Errorf("rank %d: card of rank %d = %q, want %q", d.rank, r, card, want)
			}
		}
	}
}

// A subdevice that sets the flag without the method is refused by name.
func TestJobCardsFlagWithoutMethod(t *testing.T) {
	caps := smallCaps
	caps.Flags |= sdi.FlagJobCards
	f := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: caps})
	boots, err := bootstrap.InProcess(1, nil)
	if err != nil {
		t.Fatal(err)
	}
	plugins := &PluginsConfig{SubDevices: []SubDeviceSpec{{Name: "loop", Enabled: true}}}
	d, err := Open(context.Background(), Options{Bootstrap: boots[0], Plugins: plugins, Factories: map[string]sdi.Factory{"loop": f.New}, Logger: testLogger(t)})
	if err == nil {
		d.Close(context.Background())
		t.Fatal("Open accepted FlagJobCards from a subdevice without SetJobCards")
	}
	if !strings.Contains(err.Error(), `"loop" declares FlagJobCards`) {
		t.Errorf("error %q does not name the subdevice and the flag", err)
	}
}
