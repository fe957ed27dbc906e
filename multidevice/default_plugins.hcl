# Built-in subdevices, loaded when no plugins.hcl is given.
subdevice "shm" {}
subdevice "tcp" {}
