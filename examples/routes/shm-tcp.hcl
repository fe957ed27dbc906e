# shm and tcp, tcp on loopback only: a one-host stand-in for a host
# that reaches its peers over both.
subdevice "shm" {}

subdevice "tcp" {
  config { include = ["127.0.0.0/8"] }
}
