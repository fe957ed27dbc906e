package multidevice

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/internal/netns"
)

// TestNetnsFailover: two hosts joined by two networks, each carried by a
// tcp subdevice of its own ("tcp" on the first, "tcpb", the built-in tcp
// again, on the second), and a connection table that asks for failover
// over both. Rank 0 streams to rank 1 over both; the first network fails
// in the middle, either taken down or silently dropping everything with
// the link up; either way tcp's link_timeout (2 s) is what notices (a
// link taken down fails no read or write at once). What the dead network carried goes again over
// the second, and every message arrives once, in order.
func TestNetnsFailover(t *testing.T) {
	tests := []struct {
		name string
		kill func(a1, a2 *netns.Iface) error
	}{
		{"link down", func(a1, _ *netns.Iface) error { return a1.SetDown() }},
		{"link silent", func(a1, a2 *netns.Iface) error {
			if err := a1.Blackhole(); err != nil {
				return err
			}
			return a2.Blackhole()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The failure must hit blocks in flight on the first network
			// for the test to prove anything: the stream's data from
			// rank 0, or rank 1's answers (clear-to-sends, acknowledgments
			// of synchronous sends). The first network is the faster, so
			// it nearly always carries some; a run where it carried none
			// at that moment is tried again. When the receiver took one
			// message at a time, a third to a half of the tries failed
			// that way; with its receives posted ahead, blocks are nearly
			// always on the wire.
			const tries = 5
			for try := 1; ; try++ {
				if failover(t, tt.kill) {
					return
				}
				if try == tries {
					t.Fatalf("%d times the network failed carrying nothing unacknowledged: the test proves nothing", tries)
				}
				t.Logf("try %d: the network failed carrying nothing unacknowledged; again", try)
			}
		})
	}
}

// TestNetnsFailoverRecovers: the first network of TestNetnsFailover
// drops everything silently in the middle of a longer stream and comes
// back 4 s later. The ranks notice the loss within tcp's link_timeout
// (2 s), finish over the second network meanwhile, try the first again
// in the background and, once it connects, send over it again: it
// carries a good share of the rest of the stream.
func TestNetnsFailoverRecovers(t *testing.T) {
	sb, a1, a2 := failoverBed(t)
	var atBack uint64
	back := make(chan error, 1)
	go func() {
		back <- func() error {
			for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				_, tx, err := a1.Counters()
				if err != nil {
					return err
				}
				if tx <= 4<<20 {
					continue
				}
				for _, nic := range []*netns.Iface{a1, a2} {
					if err := nic.Blackhole(); err != nil {
						return err
					}
				}
				time.Sleep(4 * time.Second)
				for _, nic := range []*netns.Iface{a1, a2} {
					if err := nic.Limit("200mbit"); err != nil {
						return err
					}
				}
				_, atBack, err = a1.Counters()
				return err
			}
			return errors.New("the first network never carried 4 MiB of the stream")
		}()
	}()
	// 64 MiB: over the second network alone the stream lasts ~11 s, far
	// beyond the first's return.
	outs := sb.run(t, []int{0, 1}, 0, "stream", envBytes+"="+strconv.Itoa(64<<20),
		envTable+"="+filepath.Join(sb.dir, "table.json"))
	if err := <-back; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(outs[1], "ok received=") {
		t.Fatalf("destination did not finish: %q", outs[1])
	}
	_, tx, err := a1.Counters()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the first network carried %d MiB after it came back", (tx-atBack)>>20)
	if tx-atBack < 8<<20 {
		t.Fatalf("the first network carried %d bytes of the stream after it came back, want 8 MiB or more", tx-atBack)
	}
}

// failover runs one stream of TestNetnsFailover and reports whether the
// failure hit blocks in flight (either rank sent some again).
func failover(t *testing.T, kill func(a1, a2 *netns.Iface) error) bool {
	sb, a1, a2 := failoverBed(t)
	// Fail the first network once it carried a few MB of the stream.
	killed := make(chan error, 1)
	go func() {
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if _, tx, err := a1.Counters(); err != nil || tx > 4<<20 {
				if err == nil {
					err = kill(a1, a2)
				}
				killed <- err
				return
			}
		}
		killed <- nil
	}()
	start := time.Now()
	outs := sb.run(t, []int{0, 1}, 0, "stream", envBytes+"="+strconv.Itoa(32<<20),
		envTable+"="+filepath.Join(sb.dir, "table.json"))
	if err := <-killed; err != nil {
		t.Fatal(err)
	}
	if _, tx, _ := a1.Counters(); tx <= 4<<20 {
		t.Fatalf("the first network carried %d bytes: the stream did not use it, the test proves nothing", tx)
	}
	if !strings.Contains(outs[1], "ok received=") {
		t.Fatalf("destination did not finish: %q", outs[1])
	}
	t.Logf("job done in %v", time.Since(start).Round(time.Millisecond))
	return statsOf(t, outs[0], "resent")+statsOf(t, outs[1], "resent") > 0
}

// failoverBed builds TestNetnsFailover's two hosts and two networks, with
// the first four times as fast as the second, and writes plugins.hcl and
// table.json into the bed's directory. The bed is settled: interfaces are
// up, and they may be changed from another goroutine while a job runs.
func failoverBed(t *testing.T) (sb *siteBed, a1, a2 *netns.Iface) {
	bed := netns.New(t)
	h1, h2 := bed.Host("f1"), bed.Host("f2")
	a1, a2 = bed.Wire(h1, "etha", h2, "etha", []string{"10.31.0.1/24"}, []string{"10.31.0.2/24"})
	b1, b2 := bed.Wire(h1, "ethb", h2, "ethb", []string{"10.32.0.1/24"}, []string{"10.32.0.2/24"})
	// Slow enough that the stream still runs when the network fails.
	for nic, rate := range map[*netns.Iface]string{a1: "200mbit", a2: "200mbit", b1: "50mbit", b2: "50mbit"} {
		if err := nic.Limit(rate); err != nil {
			t.Fatal(err)
		}
	}
	sb = &siteBed{bed: bed, dir: t.TempDir(), hosts: []*netns.Host{h1, h2}, names: []string{"f1", "f2"}}
	plugins := `subdevice "tcp" {
  config {
    include      = ["10.31.0.0/24"]
    link_timeout = "2s"
  }
}
subdevice "tcpb" {
  builtin = "tcp"
  config {
    include      = ["10.32.0.0/24"]
    link_timeout = "2s"
  }
}
`
	table := `{"version": 1, "peers": [{"to": "*", "failover": true, "routes": {"*": [{"subdevice": "tcp"}, {"subdevice": "tcpb"}]}}]}`
	for name, content := range map[string]string{"plugins.hcl": plugins, "table.json": table} {
		if err := os.WriteFile(filepath.Join(sb.dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bed.Settle()
	return sb, a1, a2
}
