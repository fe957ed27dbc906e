# plugins.hcl: which subdevices a job loads and how (docs/plugins.hcl.md).
#
# Built-in subdevices need only a block. A config block is handed to the
# subdevice as JSON when it opens; the subdevice validates it. builtin runs
# a built-in under another name, e.g. tcp a second time on a second
# network, for a connection table's failover routes (README, "Failover"):
#
#   subdevice "tcp2" {
#     builtin = "tcp"
#     config { include = ["10.2.0.0/16"] }
#   }
#
# External subdevices are plugin binaries (found in plugin_dir, by default
# this file's directory) started through go-plugin: command, args,
# checksum = "sha256:...", timeout, shared_memory. cmd/sdi-tcp and
# cmd/sdi-shm serve the built-ins that way, e.g.
#
#   subdevice "tcp" {
#     command = "sdi-tcp"
#   }

# plugin_dir = "./plugins"

subdevice "shm" {
  # config {
  #   ring_bytes      = 1048576  # data bytes per inbound ring: a power of two, the same on every rank
  #   single_copy     = true     # read payloads from the sender's memory with process_vm_readv; false: never;
  #                              # unset: senders pick that or the ring per payload, by how the ring's copies run
  #   single_copy_min = 16384    # the smallest payload read that way
  # }
}

subdevice "tcp" {
  # config {
  #   connect_timeout = "10s"
  #   include = ["eth*", "10.1.0.0/16"]  # interfaces (names, patterns) or CIDRs to publish; default all that are up
  #   exclude = ["docker0", "virbr*"]    # never publish these
  #   max_connections = 0                # per peer; 0: one per matched interface pair, 1: one ordered connection
  #   congestion_control = "auto"        # cubic (else reno) over loopback, the system's default elsewhere;
  #                                      # "system": the default everywhere; or a name ("cubic", "bbr", ...)
  #   link_timeout = "30s"               # a connection whose peer acknowledges nothing this long is dead
  #                                      # (its peer is reported down, failover routes take over); "0s": the system's
  # }
}

# RDMA subdevices, in binaries built with -tags verbs / -tags udapl (README,
# "RDMA"); as plugin binaries (cmd/sdi-verbs, cmd/sdi-udapl) they are
# skipped with a warning on hosts where they cannot open.
#
# subdevice "verbs" {
#   config {
#     device = "mlx5_0"   # default: the first device with an ACTIVE port
#     port   = 1          # default: its first ACTIVE port
#     # address     = "10.0.0.5"   # default: the first address of the port's network interface
#     # eager_bytes = 8192         # frames up to this are sent into posted slots, larger ones read
#     # recv_slots  = 32           # slots each connection keeps posted (the peer's credits)
#   }
# }
#
# subdevice "udapl" {
#   config { ia = "ofa-v2-ib0" }   # default: the first entry of /etc/dat.conf
# }
