# Two clusters on private addresses (both use 10.0.0.0/24, so no host of one
# can reach a host of the other) joined by two relay hosts with public
# addresses, as GridMPI's IMPI relays do: p-relay is on cluster p's private
# network and the WAN, q-relay on cluster q's private network and the WAN.
# Every message between the clusters goes p -> p-relay -> q-relay -> q, tcp
# all the way: the penalty is charged at each relay although the subdevice
# never changes.
#
# The hosts must name their sites, relays included:
#   mdrun -hosts p01@P,p02@P,q01@Q -relay p-relay@P,q-relay@Q ...
# Both LANs number 10.0.0.0/24 and the clusters share no other network, so
# without sites tcp cannot tell which 10.0.0.x is on which cluster and
# refuses the LAN between any two hosts ("private network 10.0.0.0/24
# collides across the job"). With them it uses the LAN within each site.
# Across sites a private network is only a fallback, tried when a pair of
# hosts has nothing else (it may be routed between the clusters), and a
# colliding one is never tried: here p hosts reach q hosts only through
# the relays, and the relays use only the WAN between them.

penalty = "off"

subdevice "shm" {
  reach     = "host"
  latency   = "0.5us"
  bandwidth = "5GB/s"
}

subdevice "tcp" {
  latency   = "30us"
  bandwidth = "10Gbit/s"
}

network "p-private" {
  subdevice = "tcp"
  hosts     = ["p[01-32]", "p-relay"]
}

network "q-private" {
  subdevice = "tcp"
  hosts     = ["q[01-32]", "q-relay"]
}

network "wan" {
  subdevice = "tcp"
  hosts     = ["p-relay", "q-relay"]
  latency   = "5ms"
  bandwidth = "1Gbit/s"
}

host "p-relay" {
  penalty = "20us"
}

host "q-relay" {
  penalty = "20us"
}
