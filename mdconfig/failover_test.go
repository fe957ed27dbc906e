package mdconfig

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/hpc-multidevice/multidevice/conntable"
)

// With failover = true, an entry whose routes have an alternative asks
// for failover; one without, or a description without the setting, does
// not.
func TestFailoverEntries(t *testing.T) {
	const twoRails = `
subdevice "tcp" {
  latency   = "20us"
  bandwidth = "10Gbit/s"
}
subdevice "tcp2" {
  latency   = "20us"
  bandwidth = "10Gbit/s"
}
network "rail1" {
  subdevice = "tcp"
  hosts     = ["a[01-02]"]
}
network "rail2" {
  subdevice = "tcp2"
  hosts     = ["a[01-02]"]
}
network "mgmt" {
  subdevice = "tcp"
  hosts     = ["a01", "m01"]
}
`
	for _, tc := range []struct {
		setting  string
		failover map[string]bool // per peer of a01
	}{
		{"", map[string]bool{"a02": false, "m01": false}},
		{"failover = false\n", map[string]bool{"a02": false, "m01": false}},
		{"failover = true\n", map[string]bool{"a02": true, "m01": false}},
	} {
		t.Run(tc.setting, func(t *testing.T) {
			d, diags := Parse([]byte(tc.setting+twoRails), "net.hcl")
			if diags.HasErrors() {
				t.Fatal(FormatDiagnostics(diags, nil))
			}
			tab, err := d.Table("a01")
			if err != nil {
				t.Fatal(err)
			}
			seen := 0
			for _, e := range tab.Peers {
				want, ok := tc.failover[e.To]
				if !ok {
					continue
				}
				seen++
				if e.Failover != want {
					t.Errorf("entry for %s: failover %v, want %v (routes %v)", e.To, e.Failover, want, e.Routes)
				}
				for class, rs := range e.Routes {
					if e.To == "a02" && (len(rs) != 2 || rs[0].SubDevice == rs[1].SubDevice) {
						t.Errorf("a02 has routes %v for class %s, want one over each rail", rs, class)
					}
				}
			}
			if seen != len(tc.failover) {
				t.Fatalf("table of a01 has entries for %d of %v: %+v", seen, tc.failover, tab.Peers)
			}
		})
	}
}

// A network on standby: two hosts on it get a direct route over it after
// their others, marked standby, in an entry asking for failover; routes
// otherwise avoid it, even where it is as good as another network; a host
// that only a spare reaches routes over it as usual.
func TestStandbyNetworks(t *testing.T) {
	const desc = `
failover = true
subdevice "verbs" {
  latency   = "1.5us"
  bandwidth = "12GB/s"
}
subdevice "tcp" {
  latency   = "1.5us"
  bandwidth = "12GB/s"
}
network "ib" {
  subdevice = "verbs"
  hosts     = ["c[01-03]"]
}
network "eth" {
  subdevice = "tcp"
  hosts     = ["c[01-03]", "login"]
  standby   = true
}
`
	d, diags := Parse([]byte(desc), "spare.hcl")
	if diags.HasErrors() {
		t.Fatal(FormatDiagnostics(diags, nil))
	}
	tab, err := d.Table("c01")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		routes   []conntable.Route // every class alike
		failover bool
	}{
		"@local": {routes: []conntable.Route{{SubDevice: "verbs"}}},
		"c02":    {routes: []conntable.Route{{SubDevice: "verbs"}, {SubDevice: "tcp", Standby: true}}, failover: true},
		"login":  {routes: []conntable.Route{{SubDevice: "tcp"}}},
	}
	for _, e := range tab.Peers {
		w, ok := want[e.To]
		if !ok {
			continue
		}
		delete(want, e.To)
		if e.Failover != w.failover {
			t.Errorf("entry for %s: failover %v, want %v", e.To, e.Failover, w.failover)
		}
		for class, rs := range e.Routes {
			for i := range rs {
				rs[i].Cost = 0
			}
			if !slices.Equal(rs, w.routes) {
				t.Errorf("entry for %s, class %s: %+v, want %+v", e.To, class, rs, w.routes)
			}
		}
	}
	if len(want) != 0 {
		t.Errorf("no entries for %v", want)
	}
	reps, err := d.Route("c01", "c02", 8)
	if err != nil {
		t.Fatal(err)
	}
	if s := reps[0].Standby; s == nil || len(s.Hops) != 1 || s.Hops[0].Network != "eth" {
		t.Errorf("route report c01 -> c02 shows standby %+v, want the direct link over eth", s)
	}
	if reps[0].Best.Hops[0].Network != "ib" || len(reps[0].Alternatives) != 0 {
		t.Errorf("route report c01 -> c02: best %+v, alternatives %+v; want ib alone", reps[0].Best, reps[0].Alternatives)
	}
}

func TestStandbyErrors(t *testing.T) {
	const nets = `
subdevice "tcp" {
  latency   = "30us"
  bandwidth = "10Gbit/s"
}
network "eth" {
  subdevice = "tcp"
  hosts     = ["c[01-03]"]
  standby   = %s
}
`
	for _, tc := range []struct{ top, standby, want string }{
		{"", "true", "standby without failover"},
		{"failover = false\n", "true", "standby without failover"},
		{"failover = true\n", `"yes"`, "invalid standby"},
	} {
		src := tc.top + fmt.Sprintf(nets, tc.standby)
		at := fmt.Sprintf("net.hcl:%d:", strings.Count(src[:strings.Index(src, "standby")], "\n")+1)
		_, diags := Parse([]byte(src), "net.hcl")
		if got := FormatDiagnostics(diags, []byte(src)); !diags.HasErrors() || !strings.Contains(got, tc.want) || !strings.Contains(got, at) {
			t.Errorf("%q with standby = %s: %s, want an error %q at %s", tc.top, tc.standby, got, tc.want, at)
		}
	}
	// Without spares, standby = false changes nothing.
	if _, diags := Parse([]byte(fmt.Sprintf(nets, "false")), "net.hcl"); diags.HasErrors() {
		t.Error(FormatDiagnostics(diags, nil))
	}
}
