package mdconfig

import (
	"fmt"
	"strings"
)

// SyntheticClusters writes the description of a cluster of clusters for
// benchmarks and tests: clusters c001, c002, ... of hostsPer hosts each
// (c001n001, ...), each cluster with its own InfiniBand (verbs) and
// Ethernet (tcp), shm on every host, and the first two hosts of every
// cluster acting as gateways on one wide-area tcp network. Only gateways
// forward.
func SyntheticClusters(clusters, hostsPer int) []byte {
	var b strings.Builder
	b.WriteString(`penalty = "off"

subdevice "shm" {
  reach     = "host"
  latency   = "0.3us"
  bandwidth = "10GB/s"
}

subdevice "tcp" {
  latency   = "25us"
  bandwidth = "10Gbit/s"
}

subdevice "verbs" {
  latency   = "1.5us"
  bandwidth = "12GB/s"
}

network "wan" {
  subdevice = "tcp"
  latency   = "500us"
  bandwidth = "1Gbit/s"
  hosts     = [
`)
	gws := min(2, hostsPer)
	w := len(fmt.Sprint(hostsPer))
	for c := 1; c <= clusters; c++ {
		fmt.Fprintf(&b, "    \"c%03dn[%0*d-%0*d]\",\n", c, w, 1, w, gws)
	}
	b.WriteString("  ]\n}\n")
	for c := 1; c <= clusters; c++ {
		all := fmt.Sprintf("c%03dn[%0*d-%0*d]", c, w, 1, w, hostsPer)
		fmt.Fprintf(&b, "\nnetwork \"c%03d-ib\" {\n  subdevice = \"verbs\"\n  hosts     = [%q]\n}\n", c, all)
		fmt.Fprintf(&b, "\nnetwork \"c%03d-eth\" {\n  subdevice = \"tcp\"\n  hosts     = [%q]\n}\n", c, all)
		fmt.Fprintf(&b, "\nhost \"c%03dn[%0*d-%0*d]\" {\n  penalty = \"10us\"\n}\n", c, w, 1, w, gws)
	}
	return []byte(b.String())
}
