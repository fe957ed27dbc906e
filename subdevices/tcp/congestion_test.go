package tcp

import (
	"net/netip"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// TestCongestionControl: the connections a rank opens send with what
// congestion_control says, and Links shows it. Over loopback, auto takes
// the first of loopbackCongestion the kernel grants this process; system
// keeps the system's default; a name gets that algorithm.
func TestCongestionControl(t *testing.T) {
	raw, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	if err != nil {
		t.Skipf("no system congestion control to compare with: %v", err)
	}
	system := strings.TrimSpace(string(raw))
	auto := ""
	for _, name := range loopbackCongestion {
		if checkCongestion(name) == nil {
			auto = name
			break
		}
	}
	if auto == "" {
		auto = system
	}
	tests := []struct {
		setting string // "" leaves the key out
		want    string
	}{
		{"", auto},
		{congestionAuto, auto},
		{congestionSystem, system},
		{"reno", "reno"}, // every kernel lets every process choose reno
	}
	for _, tt := range tests {
		t.Run("setting="+tt.setting, func(t *testing.T) {
			nodes := newJob(t, 2, jobOpts{config: loopbackConfig("congestion_control", tt.setting)})
			for _, n := range nodes {
				links := Links(n.sd, 1-n.rank)
				if len(links) == 0 {
					t.Fatalf("rank %d has no links to rank %d", n.rank, 1-n.rank)
				}
				for _, l := range links {
					if l.Congestion != tt.want {
						t.Errorf("rank %d -> %d over %v: congestion control %q, want %q", n.rank, 1-n.rank, l.PeerAddr, l.Congestion, tt.want)
					}
				}
			}
			// The Link reports what the socket says, not the setting.
			p := nodes[0].sd.(*subDevice).peers[1].Load()
			if got := congestionOf(p.lanes[0].conn); got != tt.want {
				t.Errorf("socket says %q, want %q", got, tt.want)
			}
			send(t, nodes[0], &sdi.Frame{Peer: 1, Header: []byte("h"), Payload: make([]byte, 300<<10)})
			nodes[1].rec.waitFor(t, "the frame", func() bool { return len(nodes[1].rec.delivered[0]) == 1 })
		})
	}
}

// TestCongestionFor: only loopback peers get an algorithm of ours unless
// one is named, and only a named one is insisted on.
func TestCongestionFor(t *testing.T) {
	for _, tt := range []struct {
		setting, peer string
		want          []string
		strict        bool
	}{
		{"", "127.0.0.1", loopbackCongestion, false},
		{"auto", "::1", loopbackCongestion, false},
		{"auto", "10.1.2.3", nil, false},
		{"system", "127.0.0.1", nil, false},
		{"bbr", "10.1.2.3", []string{"bbr"}, true},
		{"bbr", "127.0.0.1", []string{"bbr"}, true},
	} {
		names, strict := config{congestion: tt.setting}.congestionFor(netip.MustParseAddr(tt.peer))
		if strings.Join(names, ",") != strings.Join(tt.want, ",") || strict != tt.strict {
			t.Errorf("congestion_control %q to %s: %v strict=%v, want %v strict=%v", tt.setting, tt.peer, names, strict, tt.want, tt.strict)
		}
	}
}

// TestCongestionRefused: a name the kernel refuses fails with the lists
// that say what would work; without CAP_NET_ADMIN, one not allowed says so.
func TestCongestionRefused(t *testing.T) {
	err := checkCongestion("nosuchcc")
	if err == nil || !strings.Contains(err.Error(), "not available in this kernel (available: ") {
		t.Fatalf("checkCongestion(nosuchcc) = %v, want not available with the list", err)
	}
	if got := congestionError("cubic", unix.EPERM).Error(); !strings.Contains(got, "not allowed for this process (allowed: ") {
		t.Errorf("EPERM explained as %q", got)
	}
}
