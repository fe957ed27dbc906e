package multidevice

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/conntable"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// hop2Job opens 4 ranks where rank 0 reaches dst through gateway 1 over
// subdevice "a", and gateway 1 reaches dst through another gateway over
// "b" (caps bCaps); every other pair is direct over "a". Trunks are not
// revived (Retry -1).
func hop2Job(t *testing.T, bCaps sdi.Caps, dst int) ([]*Device, map[string]*sditest.Fabric) {
	fabs, factories := map[string]*sditest.Fabric{}, map[string]sdi.Factory{}
	for name, caps := range map[string]sdi.Caps{"a": fwdCaps, "b": bCaps} {
		fab := sditest.NewFabric(sditest.LoopbackOptions{Name: name, Caps: caps})
		fabs[name], factories[name] = fab, func(log hclog.Logger) sdi.SubDevice { return fab.New(log) }
	}
	gw2 := 2
	if dst == 2 {
		gw2 = 3
	}
	tables := viaTables("a", dst, map[int][]conntable.Route{0: {hop("a", 1)}, 1: {hop("b", gw2)}})
	return openJob(t, jobSpec{n: 4, subs: []string{"a", "b"}, factories: factories, tableOf: tables,
		forward: ForwardOptions{Retry: -1}}), fabs
}

// TestGatewayLossTellsSource: a gateway past the first hop that loses its
// only way on tells the source, whose sends to the destination then fail
// with the gateway's reason. The source once kept the block for a credit
// that never came: a synchronous send only timed out, a rendezvous send
// ignored its ctx, and nothing said why.
func TestGatewayLossTellsSource(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int
		sync bool
	}{
		{"synchronous eager", 10, true},
		{"rendezvous", 4000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			devs, fabs := hop2Job(t, fwdCaps, 3)
			fabs["b"].Sever(2) // gateway 1's only way on to 3
			must(t)(devs[3].Irecv(make([]byte, tc.size), 0, 1, 5))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err := devs[0].Send(ctx, numbered(tc.size, 0, 1), 3, 1, 5, tc.sync)
			if !errors.Is(err, ErrPeerDown) || !strings.Contains(err.Error(), "gateway rank 1 lost a block") {
				t.Fatalf("Send through a gateway that lost its way on = %v, want ErrPeerDown with the gateway's reason", err)
			}
			if n := devs[1].ForwardStats().Lost; n == 0 {
				t.Error("the gateway counted no lost block")
			}
		})
	}
}

// TestGatewayLossTakesOtherTrunk: with two gateways to the destination,
// the one that lost its way on is cut from the line and the blocks it
// lost go through the other: every message arrives.
func TestGatewayLossTakesOtherTrunk(t *testing.T) {
	fabs, factories := map[string]*sditest.Fabric{}, map[string]sdi.Factory{}
	for _, name := range []string{"a", "b"} {
		fab := sditest.NewFabric(sditest.LoopbackOptions{Name: name, Caps: fwdCaps})
		fabs[name], factories[name] = fab, func(log hclog.Logger) sdi.SubDevice { return fab.New(log) }
	}
	// 0 reaches 4 through gateways 1 and 2 over "a"; gateway 1 goes on
	// through 3 over "b", gateway 2 straight over "a".
	tables := viaTables("a", 4, map[int][]conntable.Route{0: {hop("a", 1), hop("a", 2)}, 1: {hop("b", 3)}})
	devs := openJob(t, jobSpec{n: 5, subs: []string{"a", "b"}, factories: factories, tableOf: tables, forward: ForwardOptions{Retry: -1}})
	fabs["b"].Sever(3) // gateway 1 loses its way on; 2 still has its own
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 20 {
		size := []int{10, 3000, 9000}[i%3]
		rr := must(t)(devs[4].Irecv(make([]byte, size), 0, i, 5))
		if err := devs[0].Send(ctx, numbered(size, 0, i), 4, i, 5, i%2 == 0); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		if _, err := wait(t, rr); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
}

// TestOversizedPassedFrame: a block larger than a later hop's subdevice
// takes (blocks are cut for the source's first hop) is lost with a
// reason naming MD_FORWARD_BLOCK, and the gateway keeps its working link
// to the destination: it once took ErrTooLarge for that link's end and
// reported the destination lost.
func TestOversizedPassedFrame(t *testing.T) {
	small := fwdCaps
	small.MaxFrame = 1024
	devs, _ := hop2Job(t, small, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	must(t)(devs[2].Irecv(make([]byte, 4000), 0, 2, 5))
	err := devs[0].Send(ctx, make([]byte, 4000), 2, 2, 5, true)
	if !errors.Is(err, ErrPeerDown) || !strings.Contains(err.Error(), "MD_FORWARD_BLOCK") {
		t.Fatalf("Ssend of blocks too large for the gateway's next hop = %v, want ErrPeerDown naming MD_FORWARD_BLOCK", err)
	}
	rr := must(t)(devs[2].Irecv(make([]byte, 3000), 1, 3, 5))
	if err := devs[1].Send(ctx, make([]byte, 3000), 2, 3, 5, false); err != nil {
		t.Fatalf("gateway 1's own send to 2 after an oversized block: %v", err)
	}
	if _, err := wait(t, rr); err != nil {
		t.Fatal(err)
	}
}
