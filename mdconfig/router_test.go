package mdconfig

import "testing"

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
