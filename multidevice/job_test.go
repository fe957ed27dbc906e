package multidevice

import (
	"context"
	"fmt"
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

func testLogger(t testing.TB) hclog.Logger { return testlog.New(t, "multidevice", hclog.Off) }

// jobSpec describes an in-process job for a test.
type jobSpec struct {
	n         int
	subs      []string // plugins.hcl subdevice names, in order
	factories map[string]sdi.Factory
	table     *conntable.Table
	tableOf   func(rank int) *conntable.Table // per-rank tables; overrides table
	hostOf    func(int) string
	logger    hclog.Logger
	relays    int            // the last relays ranks open as dedicated relays
	forward   ForwardOptions // for every rank
	// wrapBoot, if set, stands in for each rank's bootstrap: a test
	// watches what a rank tells its launcher (reportingOpen).
	wrapBoot func(rank int, b bootstrap.Bootstrap) bootstrap.Bootstrap
}

// openJob opens n devices concurrently (Open fences) and closes them at the
// end of the test.
func openJob(t testing.TB, js jobSpec) []*Device {
	t.Helper()
	boots, err := bootstrap.InProcess(js.n, js.hostOf)
	if err != nil {
		t.Fatal(err)
	}
	if js.wrapBoot != nil {
		for r, b := range boots {
			boots[r] = js.wrapBoot(r, b)
		}
	}
	plugins := &PluginsConfig{}
	for _, s := range js.subs {
		plugins.SubDevices = append(plugins.SubDevices, SubDeviceSpec{Name: s, Enabled: true})
	}
	log := js.logger
	if log == nil {
		log = testLogger(t)
	}
	devs := make([]*Device, js.n)
	errs := make([]error, js.n)
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for r := range js.n {
		wg.Go(func() {
			table := js.table
			if js.tableOf != nil {
				table = js.tableOf(r)
			}
			devs[r], errs[r] = Open(ctx, Options{Bootstrap: boots[r], Plugins: plugins, Table: table, Factories: js.factories, Logger: log.Named(fmt.Sprint(r)),
				Relay: r >= js.n-js.relays, Forward: js.forward})
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("open rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() { closeJob(t, devs) })
	return devs
}

func closeJob(t testing.TB, devs []*Device) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for r, d := range devs {
		wg.Go(func() {
			if err := d.Close(ctx); err != nil {
				t.Errorf("close rank %d: %v", r, err)
			}
		})
	}
	wg.Wait()
}

// wait waits for a request with a watchdog.
func wait(t testing.TB, r *Request) (Status, error) {
	t.Helper()
	select {
	case <-r.Done():
		return r.Result()
	case <-time.After(20 * time.Second):
		t.Fatalf("request %d did not complete", r.id)
		return Status{}, nil
	}
}

// waitAll waits for every request and reports failures without stopping,
// so it can run on a sender goroutine.
func waitAll(t testing.TB, reqs []*Request) {
	t.Helper()
	for _, r := range reqs {
		if _, err := wait(t, r); err != nil {
			t.Error(err)
		}
	}
}

// must fails the test on an error: must(t)(d.Isend(...)).
func must(t testing.TB) func(*Request, error) *Request {
	return func(r *Request, err error) *Request {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
}

// loopJob is a job over one loopback fabric with the given caps.
func loopJob(t testing.TB, n int, caps sdi.Caps) []*Device {
	f := sditest.NewFabric(sditest.LoopbackOptions{Name: "loop", Caps: caps})
	return openJob(t, jobSpec{n: n, subs: []string{"loop"}, factories: map[string]sdi.Factory{"loop": f.New}})
}

// smallCaps make rendezvous and multi-block data cheap to reach.
var smallCaps = sdi.Caps{MaxHeader: 128, MaxEager: 256, MaxFrame: 1000, Reach: sdi.ReachNetwork, Flags: sdi.FlagReliable | sdi.FlagOrdered, Exclusivity: 1}
