# Two shm subdevices, a one-host stand-in for two fast fabrics: failover
# between them shows what the failover protocol costs where the transport
# itself costs little.
subdevice "shm" {}

subdevice "shm2" {
  builtin = "shm"
}
