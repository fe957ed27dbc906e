# plugins.hcl: which subdevices a job loads and how (see multidevice.ParsePlugins).
#
# Built-in subdevices need only a block. A config block is handed to the
# subdevice as JSON when it opens; the subdevice validates it.
#
# External subdevices (a binary in plugin_dir, started through go-plugin)
# use command, args and checksum; this build refuses them with a clear error
# until the plugin loader lands.

# plugin_dir = "./plugins"

subdevice "shm" {
  # config { ring_bytes = 1048576 }
}

subdevice "tcp" {
  # config {
  #   connect_timeout = "10s"
  #   include = ["eth*", "10.1.0.0/16"]  # interfaces (names, patterns) or CIDRs to publish; default all that are up
  #   exclude = ["docker0", "virbr*"]    # never publish these
  #   max_connections = 0                # per peer; 0: one per matched interface pair, 1: one ordered connection
  # }
}
