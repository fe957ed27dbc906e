# An InfiniBand cluster whose hosts also share an Ethernet. The Ethernet is
# far slower: on standby, it carries nothing between two compute nodes
# while their fabric lives and takes over when the fabric fails between
# them (failover = true makes each such entry a failover route: verbs, then
# tcp on standby). The login node is on the Ethernet alone, so the
# Ethernet is its only way and carries its traffic as any network would.
failover = true

subdevice "verbs" {
  latency   = "1.5us"
  bandwidth = "12GB/s"
}

subdevice "tcp" {
  latency   = "30us"
  bandwidth = "10Gbit/s"
}

network "ib" {
  subdevice = "verbs"
  hosts     = ["c[01-16]"]
}

network "eth" {
  subdevice = "tcp"
  hosts     = ["c[01-16]", "login"]
  standby   = true
}
