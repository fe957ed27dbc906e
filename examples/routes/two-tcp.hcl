# Two tcp subdevices, a one-host stand-in for two networks. On real hosts
# each would include its own network's addresses, e.g. 10.1.0.0/16 and
# 10.2.0.0/16.
subdevice "tcp" {
  config { include = ["127.0.0.0/8"] }
}

subdevice "tcp2" {
  builtin = "tcp"
  config { include = ["127.0.0.0/8"] }
}
