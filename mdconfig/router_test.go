package mdconfig

import (
	"reflect"
	"testing"
)

// TestAlternativeBehindRefusedOnes: s reaches d directly over eth; through
// each of g1..g4 (on eth and ib with s) it reaches d for 1% more, but none
// of them is closer to d than s, so routes refuses them; through h (its
// own links) it is 3% more and h is closer. With two places per vertex the
// refused candidates once took both, and the table had no alternative.
func TestAlternativeBehindRefusedOnes(t *testing.T) {
	d := mustParse(t, []byte(`
max_routes = 2
subdevice "tcp" {
  latency   = "100us"
  bandwidth = "1000GB/s"
}
subdevice "verbs" {
  latency   = "1us"
  bandwidth = "1000GB/s"
}
network "eth" {
  subdevice = "tcp"
  hosts     = ["s", "d", "g[1-4]"]
}
network "ib" {
  subdevice = "verbs"
  hosts     = ["s", "g[1-4]"]
}
network "left" {
  subdevice = "verbs"
  hosts     = ["s", "h"]
  latency   = "50us"
}
network "right" {
  subdevice = "verbs"
  hosts     = ["h", "d"]
  latency   = "53us"
}
`))
	reps, err := d.Route("s", "d", 1)
	if err != nil {
		t.Fatal(err)
	}
	if alt := reps[0].Alternatives; len(alt) != 1 || alt[0].Hops[0].To != "h" {
		t.Errorf("alternatives %+v, want one through h", alt)
	}
	tab, err := d.Table("s")
	if err != nil {
		t.Fatal(err)
	}
	if rs := routesTo(tab, "d", "small"); len(rs) != 2 || rs[0].Via != "" || rs[1].Via != "h" {
		t.Errorf("table of s, routes to d: %+v, want tcp direct, then verbs via h", rs)
	}
}

// TestGroupedTablesEqualCostPrimary: h1 and h5 are interchangeable, so
// h5's table is h1's patched. h5 reaches h6 for the same cost through h3
// and through h0, and the shortest pass picks the primary. Its heap broke
// ties by push order, which follows the host numbering, so h5's own table
// and the grouped one disagreed on which was first.
func TestGroupedTablesEqualCostPrimary(t *testing.T) {
	d := mustParse(t, []byte(`
max_routes = 3
alternatives = 0.1
subdevice "tcp" {
  latency   = "1us"
  bandwidth = "1000GB/s"
}
subdevice "verbs" {
  latency   = "1us"
  bandwidth = "1000GB/s"
}
network "n0" {
  subdevice = "verbs"
  hosts     = ["h1", "h3", "h5"]
  latency   = "5us"
}
network "n1" {
  subdevice = "tcp"
  hosts     = ["h0", "h2", "h4", "h6"]
  latency   = "2us"
}
network "n2" {
  subdevice = "tcp"
  hosts     = ["h3", "h6"]
  latency   = "2us"
}
network "n3" {
  subdevice = "verbs"
  hosts     = ["h0", "h1", "h2", "h3", "h5"]
  latency   = "5us"
}
`))
	for tab := range d.Tables() {
		own, err := d.Table(tab.Host)
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range tab.Peers {
			if !reflect.DeepEqual(own.Peers[i], e) {
				t.Errorf("%s->%s: grouped %+v, alone %+v", tab.Host, e.To, e.Routes["small"], own.Peers[i].Routes["small"])
			}
		}
	}
}
