package multidevice

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/bootstrap"
	"github.com/hpc-multidevice/multidevice/conntable"
	"github.com/hpc-multidevice/multidevice/internal/testlog"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// TestFallBackToAnotherSubDevice: the subdevice the routes name cannot
// connect one pair of ranks (as shm cannot when /dev/shm is full), while
// another subdevice reaches them. Their traffic goes over that one,
// directly, as an MPI library falls back to another transport, instead of
// through a third rank as a gateway or not at all; the other pairs keep
// their routes.
func TestFallBackToAnotherSubDevice(t *testing.T) {
	nearCaps := fwdCaps
	nearCaps.Exclusivity = 2
	cut02 := func(a, b int) bool { return a+b == 2 && a != b }
	near := &cutNet{fab: sditest.NewFabric(sditest.LoopbackOptions{Name: "near", Caps: nearCaps}), cut: cut02}
	far := &cutNet{fab: sditest.NewFabric(sditest.LoopbackOptions{Name: "far", Caps: fwdCaps}), cut: func(int, int) bool { return false }}
	devs := openJob(t, jobSpec{n: 3, subs: []string{"near", "far"},
		factories: map[string]sdi.Factory{"near": near.New, "far": far.New}})

	for _, tc := range []struct {
		from, to int
		want     string
	}{
		{0, 1, "near"}, {1, 2, "near"}, {0, 2, "far"}, {2, 0, "far"},
	} {
		for _, n := range []int{8, 1 << 20} {
			if got, err := devs[tc.from].Route(tc.to, n); err != nil || got != tc.want {
				t.Errorf("rank %d: Route(%d, %d) = %q, %v; want %q", tc.from, tc.to, n, got, err, tc.want)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, pair := range [][2]int{{0, 2}, {2, 0}} {
		src, dst := pair[0], pair[1]
		for i, size := range []int{8, 5000} {
			rr := must(t)(devs[dst].Irecv(make([]byte, size), src, i, 0))
			if err := devs[src].Send(ctx, numbered(size, src, i), dst, i, 0, false); err != nil {
				t.Fatalf("%d->%d: send %d: %v", src, dst, i, err)
			}
			if _, err := wait(t, rr); err != nil {
				t.Fatalf("%d->%d: message %d: %v", src, dst, i, err)
			}
		}
	}
	if f := devs[1].ForwardStats().Forwarded; f != 0 {
		t.Errorf("rank 1 forwarded %d frames between ranks 0 and 2, which reach each other over far", f)
	}
}

// TestTableLaterRoutes: a table's list without failover is tried in
// order, and a later direct route carries the class where the first
// cannot connect; with a table given, a subdevice it does not list for
// the peer is not tried, though it is loaded and would reach it.
func TestTableLaterRoutes(t *testing.T) {
	cut02 := func(a, b int) bool { return a+b == 2 && a != b }
	never := func(int, int) bool { return false }
	near := &cutNet{fab: sditest.NewFabric(sditest.LoopbackOptions{Name: "near", Caps: fwdCaps}), cut: cut02}
	far1 := &cutNet{fab: sditest.NewFabric(sditest.LoopbackOptions{Name: "far1", Caps: fwdCaps}), cut: never}
	far2 := &cutNet{fab: sditest.NewFabric(sditest.LoopbackOptions{Name: "far2", Caps: fwdCaps}), cut: never}
	tab := &conntable.Table{Version: 1, Peers: []conntable.Entry{{To: "*", Routes: map[string][]conntable.Route{
		"*": {{SubDevice: "near"}, {SubDevice: "far2"}}}}}}
	devs := openJob(t, jobSpec{n: 3, subs: []string{"near", "far1", "far2"}, table: tab,
		factories: map[string]sdi.Factory{"near": near.New, "far1": far1.New, "far2": far2.New}})
	for _, tc := range []struct {
		from, to int
		want     string
	}{{0, 1, "near"}, {0, 2, "far2"}, {2, 0, "far2"}, {2, 1, "near"}} {
		if got, err := devs[tc.from].Route(tc.to, 8); err != nil || got != tc.want {
			t.Errorf("rank %d: Route(%d) = %q, %v; want %q", tc.from, tc.to, got, err, tc.want)
		}
	}
	sendsDirect(t, devs, 0, 2, 1)
}

// TestTableHostOnlyFirstRoute: "*": [a subdevice that reaches only its
// host, far]: for a peer on another host the first route cannot connect,
// and the later one takes it, as conntable says; Open once failed.
func TestTableHostOnlyFirstRoute(t *testing.T) {
	hostCaps := fwdCaps
	hostCaps.Reach = sdi.ReachHost
	near := sditest.NewFabric(sditest.LoopbackOptions{Name: "near", Caps: hostCaps})
	far := sditest.NewFabric(sditest.LoopbackOptions{Name: "far", Caps: fwdCaps})
	tab := &conntable.Table{Version: 1, Peers: []conntable.Entry{{To: "*", Routes: map[string][]conntable.Route{
		"*": {{SubDevice: "near"}, {SubDevice: "far"}}}}}}
	devs := openJob(t, jobSpec{n: 3, subs: []string{"near", "far"}, table: tab,
		hostOf:    func(r int) string { return []string{"h1", "h1", "h2"}[r] },
		factories: map[string]sdi.Factory{"near": near.New, "far": far.New}})
	if got, err := devs[0].Route(2, 8); err != nil || got != "far" {
		t.Fatalf("Route(2) = %q, %v; want far", got, err)
	}
}

// TestTableMixedList: rank 2's list is [near, near via rank:1, far2];
// near connects rank 0 neither to 2 nor to 1, so neither the direct route
// nor the gateway connects, and the list's last route, far2, takes it.
// Open once failed at the unreachable gateway.
func TestTableMixedList(t *testing.T) {
	cut := func(a, b int) bool { return a != b && (a == 0 || b == 0) && a+b != 3 } // 0 cut from 1 and 2 on near
	never := func(int, int) bool { return false }
	near := &cutNet{fab: sditest.NewFabric(sditest.LoopbackOptions{Name: "near", Caps: fwdCaps}), cut: cut}
	far2 := &cutNet{fab: sditest.NewFabric(sditest.LoopbackOptions{Name: "far2", Caps: fwdCaps}), cut: never}
	tab := &conntable.Table{Version: 1, Peers: []conntable.Entry{
		{To: "*", Routes: map[string][]conntable.Route{"*": {{SubDevice: "near"}, {SubDevice: "far2"}}}},
		{To: "rank:2", Routes: map[string][]conntable.Route{"*": {{SubDevice: "near"}, {SubDevice: "near", Via: "rank:1"}, {SubDevice: "far2"}}}},
	}}
	devs := openJob(t, jobSpec{n: 4, subs: []string{"near", "far2"}, table: tab,
		factories: map[string]sdi.Factory{"near": near.New, "far2": far2.New}})
	if got, err := devs[0].Route(2, 8); err != nil || got != "far2" {
		t.Fatalf("Route(2) = %q, %v; want far2", got, err)
	}
}

// TestTableLaterMatcherNotStandIn: "*": [x, tm], where tm matches on its
// own, and x cannot connect 0 to 1 but connects 1 to 0 (rank 1 behind a
// NAT, say). tm must carry all of a peer's traffic on both sides or none:
// rank 0 taking it for 1 while rank 1 keeps x for 0 left 1's receives
// unmatched forever. Open fails with the reason instead.
func TestTableLaterMatcherNotStandIn(t *testing.T) {
	x := &cutNet{fab: sditest.NewFabric(sditest.LoopbackOptions{Name: "x", Caps: fwdCaps}), cut: func(a, b int) bool { return a == 0 && b == 1 }}
	tm := sditest.NewMatchFabric()
	tab := &conntable.Table{Version: 1, Peers: []conntable.Entry{{To: "*", Routes: map[string][]conntable.Route{
		"*": {{SubDevice: "x"}, {SubDevice: "tm"}}}}}}
	boots, err := bootstrap.InProcess(2, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	plugins := &PluginsConfig{SubDevices: []SubDeviceSpec{{Name: "x", Enabled: true}, {Name: "tm", Enabled: true}}}
	devs, errs := make([]*Device, 2), make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			devs[r], errs[r] = Open(ctx, Options{Bootstrap: boots[r], Plugins: plugins, Table: tab,
				Factories: map[string]sdi.Factory{"x": x.New, "tm": tm.New}, Logger: testLogger(t)})
			if errs[r] != nil {
				_ = boots[r].Abort(1, errs[r].Error())
			}
		})
	}
	wg.Wait()
	for _, d := range devs {
		if d != nil {
			_ = d.shutdown(ctx)
		}
	}
	if err := errs[0]; !errors.Is(err, ErrNoRoute) || !strings.Contains(err.Error(), "cut: rank 0 to 1") {
		t.Fatalf("rank 0's Open = %v, want ErrNoRoute saying x could not connect", err)
	}
}

// TestTableGatewayFirstThenDirect: rank 2's list is [near via rank:1,
// far2], as mdconfig writes when a direct route comes within a few per
// cent of the best one through a gateway. Rank 0 cannot reach rank 1
// over near, so the gateway does not connect and the direct route stands
// in, as conntable says of a list without failover. Open once failed at
// the gateway: a list that began with a gateway was not walked.
func TestTableGatewayFirstThenDirect(t *testing.T) {
	cut01 := func(a, b int) bool { return a+b == 1 }
	never := func(int, int) bool { return false }
	near := &cutNet{fab: sditest.NewFabric(sditest.LoopbackOptions{Name: "near", Caps: fwdCaps}), cut: cut01}
	far2 := &cutNet{fab: sditest.NewFabric(sditest.LoopbackOptions{Name: "far2", Caps: fwdCaps}), cut: never}
	tab := &conntable.Table{Version: 1, Peers: []conntable.Entry{
		{To: "*", Routes: map[string][]conntable.Route{"*": {{SubDevice: "near"}, {SubDevice: "far2"}}}},
		{To: "rank:2", Routes: map[string][]conntable.Route{"*": {{SubDevice: "near", Via: "rank:1"}, {SubDevice: "far2"}}}},
	}}
	devs := openJob(t, jobSpec{n: 3, subs: []string{"near", "far2"}, table: tab,
		factories: map[string]sdi.Factory{"near": near.New, "far2": far2.New}})
	if got, err := devs[0].Route(2, 8); err != nil || got != "far2" {
		t.Fatalf("Route(2) = %q, %v; want far2", got, err)
	}
	sendsDirect(t, devs, 0, 2, 1)
}

// sendsDirect checks that a rendezvous message from rank from reaches
// rank to with rank not forwarding any of it: from's stand-in route to
// to is a direct one.
func sendsDirect(t *testing.T, devs []*Device, from, to, not int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rr := must(t)(devs[to].Irecv(make([]byte, 5000), from, 1, 0))
	if err := devs[from].Send(ctx, numbered(5000, from, 1), to, 1, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := wait(t, rr); err != nil {
		t.Fatal(err)
	}
	if f := devs[not].ForwardStats().Forwarded; f != 0 {
		t.Errorf("rank %d forwarded %d frames; the route from %d to %d is direct", not, f, from, to)
	}
}

// TestFallBackWarns: a subdevice that reaches only this host and cannot
// connect a peer on it is never expected (shm with /dev/shm full, say),
// and the later route that takes the peer instead costs a lot: each rank
// says so once, naming the peers and the error. The fallback was silent,
// so a container's jobs ran over tcp through loopback with no hint why. A
// network subdevice that cannot connect a peer is the table's business
// (a cluster's own network often reaches only the cluster), and is not
// warned of.
func TestFallBackWarns(t *testing.T) {
	hostCaps := fwdCaps
	hostCaps.Exclusivity, hostCaps.Reach = 2, sdi.ReachHost
	netCaps := fwdCaps
	netCaps.Exclusivity = 2
	for _, tc := range []struct {
		name string
		caps sdi.Caps
		warn bool
	}{
		{"host-local subdevice", hostCaps, true},
		{"network subdevice", netCaps, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cut02 := func(a, b int) bool { return a+b == 2 && a != b }
			near := &cutNet{fab: sditest.NewFabric(sditest.LoopbackOptions{Name: "near", Caps: tc.caps}), cut: cut02}
			far := &cutNet{fab: sditest.NewFabric(sditest.LoopbackOptions{Name: "far", Caps: fwdCaps}), cut: func(int, int) bool { return false }}
			var logs testlog.Buffer
			devs := openJob(t, jobSpec{n: 3, subs: []string{"near", "far"}, logger: hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Warn}),
				factories: map[string]sdi.Factory{"near": near.New, "far": far.New}})
			if got, err := devs[0].Route(2, 8); err != nil || got != "far" {
				t.Fatalf("Route(2) = %q, %v; want far", got, err)
			}
			l := logs.String()
			warned := strings.Contains(l, "could not connect some peers on it") && strings.Contains(l, "cut: rank 0 to 2")
			if warned != tc.warn || strings.Count(l, "could not connect some peers") > 2 {
				t.Errorf("warned %v, want %v (once per rank of 0 and 2); log:\n%s", warned, tc.warn, l)
			}
		})
	}
}
