// Package mdconfig turns a description of a network, written in HCL, into
// one connection table per host (package conntable's format): for every
// other host and every message-size class, the subdevice to use and, where
// no direct link exists or an indirect one is cheaper, the next host that
// forwards. It follows mdconfig of Schindler and Rehm's multidevice: network
// description, weighted graph, a modified Dijkstra, per-host files, three
// message-size ranges and a penalty for forwarding on a gateway.
//
// Everything here is a pure function of the description except
// [WriteTables]; a [Description] is immutable and safe for concurrent use.
//
// # Usage
//
//	d, diags := mdconfig.Parse(src, "network.hcl")
//	fmt.Fprint(os.Stderr, mdconfig.FormatDiagnostics(diags, src)) // file:line:col: error: ...
//	if diags.HasErrors() { ... }
//	n, err := mdconfig.WriteTables(d, "tables") // tables/<host>.json
//	reports, err := d.Route("a03", "b11", 1<<20) // hop by hop, with alternatives
//
// The command cmd/mdconfig wraps these as check, generate, route, graph
// and bench.
//
// # Description format
//
// A full example (examples/networks/ has more):
//
//	# Three classes as in the paper; this block is optional and these are
//	# the defaults. Each class holds messages of at most max bytes (the last
//	# class is unbounded); routes for a class are chosen by the cost of a
//	# message of typical bytes (default: max; for the last class 8 times
//	# the previous max, at least 1MiB).
//	size_class "small"  {
//	  max     = "1KiB"
//	  typical = "256B"
//	}
//	size_class "medium" {
//	  max     = "128KiB"
//	  typical = "16KiB"
//	}
//	size_class "large"  {
//	  typical = "1MiB"
//	}
//
//	penalty      = "20us" # what forwarding costs on an intermediate host; "off" forbids it (default "0us")
//	alternatives = "5%"   # keep routes within this much of the best as alternatives (default "5%")
//	max_routes   = 4      # at most this many routes per destination and class (default 4; 1 = no alternatives)
//	failover     = true   # entries with alternatives ask for failover over them (default false; see conntable)
//
//	# A subdevice and its cost. reach = "host" marks a subdevice that joins
//	# only ranks on one host (shm); it may be limited to some hosts with
//	# hosts = [...]. Costs per class may differ: a class block overrides.
//	subdevice "shm" {
//	  reach     = "host"
//	  latency   = "0.5us"
//	  bandwidth = "5GB/s"
//	}
//	subdevice "tcp" {
//	  latency   = "50us"
//	  bandwidth = "1Gbit/s"
//	  class "large" {
//	    bandwidth = "940Mbit/s"
//	  }
//	}
//	subdevice "verbs" {
//	  latency   = "1.5us"
//	  bandwidth = "12GB/s"
//	}
//
//	# A network: hosts that reach each other directly over one subdevice.
//	# Host patterns expand bracket groups: "a[01-16]", "n[1-4,8]",
//	# "r[1-2]n[01-32]". Host names are letters, digits, '.', '-', '_' and
//	# '#' (under PMI a rank's host is "<hostname>#<node>", e.g. "n01#0").
//	# Latency, bandwidth and class blocks here override the subdevice's for
//	# this network only.
//	network "eth" {
//	  subdevice = "tcp"
//	  hosts     = ["a[01-16]", "b[01-16]"]
//	}
//	network "ib-a" {
//	  subdevice = "verbs"
//	  hosts     = ["a[01-16]"]
//	}
//	network "wan" {
//	  subdevice = "tcp"
//	  hosts     = ["a01", "c01"]
//	  latency   = "2ms"
//	}
//
//	# A spare (needs failover = true): routes leave it out while they can,
//	# and two hosts on it get a direct route over it on standby, which
//	# carries nothing until their other routes fail. Hosts that reach
//	# each other only through spares route over them as over any network.
//	network "mgmt" {
//	  subdevice = "tcp"
//	  hosts     = ["a[01-16]", "b[01-16]"]
//	  standby   = true
//	}
//
//	# Per-host penalty, replacing the global one: here only a01 forwards.
//	host "a[02-16]" {
//	  penalty = "off"
//	}
//
// Units: latencies and penalties are durations ("800ns", "5us", "1.5ms");
// bandwidths are a number and a unit in bytes ("B/s", "KB/s", "MB/s",
// "GB/s", "KiB/s", "MiB/s", "GiB/s") or bits ("bit/s", "Mbit/s",
// "Gbit/s", "Mbps", "Gbps") per second, at least 1bit/s; sizes are bytes
// or a number and "B", "KB", "KiB", "MB", "MiB", "GB", "GiB", from 1 byte
// to 2^62.
//
// Latency and bandwidth of a network for a class are taken from the first
// of: the network's class block, the network, the subdevice's class block,
// the subdevice.
//
// # Cost model
//
// A message of n bytes costs latency + n/bandwidth on one link (at least
// 1ns, so that every link costs something), computed per class at the
// class's typical size. A path costs the sum of its links plus the penalty
// of every intermediate host (the source and the destination pay none).
//
// The penalty is charged at every host that forwards, whether or not the
// subdevice changes there. The paper's penalty is for passing a message
// from one subdevice to another on a gateway; here a forwarded message
// always passes from one network to another (crossing one network twice is
// never cheaper than its direct link), and forwarding costs a receive, a
// system-message handler and a send even from tcp to tcp, as on a relay
// between private-address clusters. A penalty that depends only on the
// forwarding host also keeps the rest of a path independent of how the
// message arrived, which is what lets each table hold one next hop per
// destination and still be exact when the message is forwarded hop by hop:
// a host's cost to a destination is always its next hop's link and penalty
// plus the next hop's own cost. A large penalty turns indirect routes off
// where a direct link exists; "off" forbids a host to forward at all.
//
// # Graph and routes
//
// Hosts and networks are both vertices; each host is joined to the networks
// it is on, so a network of n hosts costs n edges rather than the n²
// of a clique. Dijkstra runs per source host and class. A second search
// finds, per destination, up to max_routes paths with distinct first steps
// within the alternatives fraction of the best (for striping and trunking);
// an alternative through a next hop is kept only if that next hop is
// strictly closer to the destination than the source, so that following
// any mix of best and alternative routes never loops. Hosts on the same
// networks with the same penalty are interchangeable, so their routes are
// computed once: 100 clusters of 100 hosts take one routing run per
// cluster and gateway group, not per host.
//
// # Tables
//
// A host's table has an "@local" entry (its host-local subdevices, cheapest
// first; if it has none, the subdevices of its networks) and one entry per
// other host, keyed by host name, with routes per class ("*" when all
// classes agree): subdevice, via (the next host; empty for a direct link)
// and cost in microseconds. A table grows with the number of hosts. Hosts
// in another island (no chain of networks joins them) get no entry, so that
// a job spanning islands fails when its tables are resolved rather than
// sending into the void.
//
// # Checks
//
// [Parse] reports every problem it finds, each with file, line and column
// and what to change: syntax and unknown attributes (HCL's own diagnostics),
// unknown or duplicate names, bad units, bandwidths below 1bit/s, bad
// host patterns, hosts named outside every network, size classes out of
// order, and hosts that a chain of networks joins but only through hosts
// whose penalty is "off" (unreachable). Separate islands and one-host
// networks are warnings.
package mdconfig
