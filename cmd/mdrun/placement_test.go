package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// hostList reads "a:2,b,c:3" into hosts, failing t on a bad list.
func hostList(t testing.TB, s string) []hostSpec {
	t.Helper()
	hosts, err := parseHosts(s)
	if err != nil {
		t.Fatal(err)
	}
	return hosts
}

// TestPlace pins where each policy puts the ranks: uneven slots, fewer
// ranks than hosts, more ranks than slots (both start over), and a host
// listed twice (one host under node, two entries under slot).
func TestPlace(t *testing.T) {
	tests := []struct {
		name  string
		hosts string
		n     int
		slot  string // want, -map-by slot
		node  string // want, -map-by node
	}{
		{"one slot each", "a,b", 4, "a b a b", "a b a b"},
		{"even", "a:2,b:2", 4, "a a b b", "a b a b"},
		{"uneven", "a:3,b:1,c:2", 6, "a a a b c c", "a b c a c a"},
		{"uneven, fewer ranks", "a:3,b:1,c:2", 4, "a a a b", "a b c a"},
		{"fewer ranks than hosts", "a:3,b:1,c:2", 2, "a a", "a b"},
		{"one rank", "a:3,b", 1, "a", "a"},
		{"more ranks than slots", "a:2,b:1", 7, "a a b a a b a", "a b a a b a a"},
		{"twice the slots", "a:3,b:1", 8, "a a a b a a a b", "a b a a a b a a"},
		{"a host listed twice", "a,b:2,a", 5, "a b b a a", "a b a b a"},
		{"a host listed twice in a row", "a,a,b", 3, "a a b", "a b a"},
		{"a host listed twice, more ranks than slots", "a:1,b:1,a:1", 5, "a b a a b", "a b a a b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hosts := hostList(t, tt.hosts)
			for _, c := range []struct {
				m    mapBy
				want string
			}{{mapBySlot, tt.slot}, {mapByNode, tt.node}} {
				if got := strings.Join(place(tt.n, hosts, c.m), " "); got != c.want {
					t.Errorf("-map-by %v: %d ranks on %s: %s, want %s", c.m, tt.n, tt.hosts, got, c.want)
				}
			}
		})
	}
}

// TestParsePlacement checks what -map-by and -ppn make of the hosts.
func TestParsePlacement(t *testing.T) {
	hostfile := slotsFile(t) // a, b slots=4
	tests := []struct {
		name  string
		flags []string
		mapBy mapBy
		hosts string // show's form
	}{
		{"default", []string{"-hosts", "a,b:2"}, mapBySlot, "a:1 b:2"},
		{"slot", []string{"-hosts", "a,b:2", "-map-by", "slot"}, mapBySlot, "a:1 b:2"},
		{"node", []string{"-hosts", "a,b:2", "--map-by=node"}, mapByNode, "a:1 b:2"},
		{"node without hosts", []string{"-map-by", "node"}, mapByNode, ""},
		{"ppn", []string{"-hosts", "a,b@S,[fd00::1]", "-ppn", "3"}, mapBySlot, "a:3 b:3@S fd00::1:3"},
		{"ppn 1", []string{"-hosts", "a,b", "-ppn", "1"}, mapBySlot, "a:1 b:1"},
		{"ppn and node", []string{"-ppn", "2", "-map-by", "node", "-hosts", "a,b"}, mapByNode, "a:2 b:2"},
		{"hostfile", []string{"-hostfile", hostfile, "-map-by", "node"}, mapByNode, "a:1 b:4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append(append([]string{}, tt.flags...), "-n", "1", helper)
			cfg, err := parseArgs(args, io.Discard)
			if err != nil {
				t.Fatalf("parseArgs(%q): %v", args, err)
			}
			if cfg.mapBy != tt.mapBy || show(cfg.hosts) != tt.hosts {
				t.Errorf("parseArgs(%q): -map-by %v, hosts %q; want %v, %q", args, cfg.mapBy, show(cfg.hosts), tt.mapBy, tt.hosts)
			}
		})
	}
}

// TestPlaceJob checks the whole job's placement: the ranks of every
// program placed as one list by the policy, then the relays on their
// hosts as without one.
func TestPlaceJob(t *testing.T) {
	self, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"a", "b", "c", "gw"} {
		if self == h {
			t.Skipf("this machine is called %s, a remote host of this test", self)
		}
	}
	tests := []struct {
		name   string
		m      mapBy
		apps   []app
		relays []string
		want   string
	}{
		{"one program by slot", mapBySlot, []app{{n: 5}}, nil, "a a b c c"},
		{"one program by node", mapByNode, []app{{n: 5}}, nil, "a b c a c"},
		{"two programs by slot", mapBySlot, []app{{n: 2}, {n: 4}}, nil, "a a b c c a"},
		{"two programs by node", mapByNode, []app{{n: 2}, {n: 4}}, nil, "a b c a c a"},
		{"relays by slot", mapBySlot, []app{{n: 3}}, []string{"gw", "gw", "c"}, "a a b gw gw c"},
		{"relays by node", mapByNode, []app{{n: 3}}, []string{"gw", "gw", "c"}, "a b c gw gw c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := 0
			for _, a := range tt.apps {
				n += a.n
			}
			j := &job{
				cfg: config{
					n: n, apps: tt.apps, hosts: hostList(t, "a:2,b:1,c:2"), mapBy: tt.m, relays: tt.relays,
					launcher: []string{"ssh"}, listen: "127.0.0.1:0",
				},
				logger: hclog.NewNullLogger(),
			}
			serve(t, j)
			if got := strings.Join(j.hostOf, " "); got != tt.want {
				t.Errorf("ranks on %s, want %s", got, tt.want)
			}
		})
	}
}

// TestPlaceBindingsByNode checks that -bind counts the ranks of each
// host in rank order whatever the placement: the k-th rank on a host
// gets its k-th CPU there.
func TestPlaceBindingsByNode(t *testing.T) {
	self, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if self == "far" || self == "near" {
		t.Skipf("this machine is called %s, a remote host of this test", self)
	}
	tests := []struct {
		m    mapBy
		want []int // per rank, the k of its host; -1: on this machine
	}{
		// localhost far far near  /  localhost far near far
		{mapBySlot, []int{-1, 0, 1, 0}},
		{mapByNode, []int{-1, 0, 0, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.m.String(), func(t *testing.T) {
			j := &job{
				cfg: config{
					n: 4, apps: []app{{n: 4}}, hosts: hostList(t, "localhost:1,far:2,near:1"), mapBy: tt.m, bind: bindHWThread,
					launcher: []string{"ssh"}, listen: "127.0.0.1:0",
				},
				logger: hclog.NewNullLogger(),
			}
			serve(t, j)
			bs, err := j.placeBindings()
			if err != nil {
				t.Fatal(err)
			}
			for r, k := range tt.want {
				if k < 0 {
					if bs[r].cpus.Count() != 1 || bs[r].remote != nil {
						t.Errorf("rank %d on %s: bound to %v and %q, want one CPU here", r, j.hostOf[r], bs[r].cpus, bs[r].remote)
					}
					continue
				}
				if want := remoteBind(bindHWThread, k); !slices.Equal(bs[r].remote, want) {
					t.Errorf("rank %d on %s: bound by %q, want %q", r, j.hostOf[r], bs[r].remote, want)
				}
			}
		})
	}
}

// FuzzPlace checks both policies on any hosts and count: every rank has
// a host of the list; a round of as many ranks as slots puts as many on
// each host under either policy, the ranks beyond the rounds at most a
// host's slots on it; and under node the first ranks of a round go to
// distinct hosts, in the order they are first listed. The input is the
// slots of each host (a byte each, the host's name its byte's index mod
// 4, so hosts repeat) and the ranks.
func FuzzPlace(f *testing.F) {
	f.Add([]byte{2, 1, 3}, uint16(7))
	f.Add([]byte{1, 1, 1, 1, 1, 5}, uint16(40))
	f.Add([]byte{0}, uint16(1))
	f.Fuzz(func(t *testing.T, slots []byte, n16 uint16) {
		n := int(n16%2000) + 1
		var hosts []hostSpec
		for i, s := range slots {
			if len(hosts) == 8 {
				break
			}
			hosts = append(hosts, hostSpec{name: fmt.Sprintf("h%d", i%4), slots: int(s%16) + 1})
		}
		if len(hosts) == 0 {
			return
		}
		merged := mergeHosts(hosts)
		total := 0
		for _, h := range merged {
			total += h.slots
		}
		rounds := n / total
		for _, m := range []mapBy{mapBySlot, mapByNode} {
			got := place(n, hosts, m)
			if len(got) != n {
				t.Fatalf("-map-by %v: %d hosts for %d ranks", m, len(got), n)
			}
			count := map[string]int{}
			for _, h := range got[:rounds*total] {
				count[h]++
			}
			tail := map[string]int{}
			for _, h := range got[rounds*total:] {
				tail[h]++
			}
			for _, h := range merged {
				if count[h.name] != rounds*h.slots || tail[h.name] > h.slots {
					t.Fatalf("-map-by %v, %v, %d ranks: %s has %d in %d full rounds and %d after: %v", m, hosts, n, h.name, count[h.name], rounds, tail[h.name], got)
				}
				delete(count, h.name)
				delete(tail, h.name)
			}
			if len(count)+len(tail) > 0 {
				t.Fatalf("-map-by %v: hosts not in the list: %v", m, got)
			}
			if m != mapByNode {
				continue
			}
			for start := 0; start < n; start += total {
				for i, h := range merged {
					if start+i < n && got[start+i] != h.name {
						t.Fatalf("%v, %d ranks: rank %d on %s, want %s, the %s host: %v", hosts, n, start+i, got[start+i], h.name, ordinal(i+1), got)
					}
				}
			}
		}
	})
}
