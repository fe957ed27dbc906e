package mdconfig

import (
	"testing"
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
