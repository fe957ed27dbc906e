# OSCAR IV from Schindler & Rehm, "Multiple devices under MPICH": every node
# on Fast Ethernet, one partial cluster on SCI and one on Myrinet. SCI is
# mapped to udapl and Myrinet to verbs; oscar08 carries both cards.
#
# With a 100us forwarding penalty, small messages between the SCI and the
# Myrinet halves go straight over Ethernet, while medium and large ones are
# faster over SCI to oscar08 and Myrinet from there.

penalty = "100us"

subdevice "shm" {
  reach     = "host"
  latency   = "1us"
  bandwidth = "800MB/s"
}

subdevice "tcp" {
  latency   = "60us"
  bandwidth = "100Mbit/s"
  class "large" {
    bandwidth = "92Mbit/s" # TCP/IP over Fast Ethernet never reaches line rate
  }
}

subdevice "udapl" { # SCI
  latency   = "5us"
  bandwidth = "80MB/s"
}

subdevice "verbs" { # Myrinet
  latency   = "10us"
  bandwidth = "120MB/s"
}

network "ethernet" {
  subdevice = "tcp"
  hosts     = ["oscar[01-16]"]
}

network "sci" {
  subdevice = "udapl"
  hosts     = ["oscar[01-08]"]
}

network "myrinet" {
  subdevice = "verbs"
  hosts     = ["oscar[08-16]"]
}
