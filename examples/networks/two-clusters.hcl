# Two clusters, each with InfiniBand inside, joined by a 10 Gbit/s link
# between two gateway hosts per cluster. Only the gateways forward; the two
# gateway pairs are equal-cost alternatives (trunking).

penalty = "off" # compute nodes never forward

size_class "small" {
  max     = "4KiB"
  typical = "512B"
}
size_class "medium" {
  max = "256KiB"
}
size_class "large" {
  typical = "4MiB"
}

subdevice "shm" {
  reach     = "host"
  latency   = "0.3us"
  bandwidth = "10GB/s"
}

subdevice "tcp" {
  latency   = "25us"
  bandwidth = "1Gbit/s"
}

subdevice "verbs" {
  latency   = "1.5us"
  bandwidth = "12GB/s"
}

network "a-ib" {
  subdevice = "verbs"
  hosts     = ["a[01-16]"]
}

network "a-eth" {
  subdevice = "tcp"
  hosts     = ["a[01-16]"]
}

network "b-ib" {
  subdevice = "verbs"
  hosts     = ["b[01-16]"]
}

network "b-eth" {
  subdevice = "tcp"
  hosts     = ["b[01-16]"]
}

network "campus" {
  subdevice = "tcp"
  hosts     = ["a[15-16]", "b[15-16]"]
  latency   = "80us"
  bandwidth = "10Gbit/s"
}

host "a[15-16]" {
  penalty = "8us"
}

host "b[15-16]" {
  penalty = "8us"
}
