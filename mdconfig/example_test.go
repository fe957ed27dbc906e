package mdconfig_test

import (
	"fmt"

	"github.com/hpc-multidevice/multidevice/mdconfig"
)

func Example() {
	src := []byte(`
penalty = "10us"

subdevice "tcp" {
  latency   = "50us"
  bandwidth = "1Gbit/s"
}

subdevice "verbs" {
  latency   = "2us"
  bandwidth = "10GB/s"
}

network "eth" {
  subdevice = "tcp"
  hosts     = ["a[1-2]", "gw"]
}

network "ib" {
  subdevice = "verbs"
  hosts     = ["gw", "b[1-2]"]
}
`)
	d, diags := mdconfig.Parse(src, "network.hcl")
	if diags.HasErrors() {
		fmt.Print(mdconfig.FormatDiagnostics(diags, src))
		return
	}
	reports, err := d.Route("a1", "b2", 64)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print(reports[0])

	t, _ := d.Table("a1")
	for _, e := range t.Peers {
		if e.To == "b2" {
			fmt.Println("a1's table, to b2:", e.Routes["small"][0].SubDevice, "via", e.Routes["small"][0].Via)
		}
	}
	// Output:
	// a1 -> b2, class small (up to 1KiB; costs for 256B)
	//     1. a1         -> gw         tcp    on eth        52.048us
	//     2. gw         -> b2         verbs  on ib         2.026us + penalty 10us at gw
	//     cost 64.074us (62.518us for 64B), 2 hop(s)
	//   no alternatives within the alternatives fraction
	// a1's table, to b2: tcp via gw
}
