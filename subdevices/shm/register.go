package shm

import "github.com/hpc-multidevice/multidevice/sdi"

func init() { sdi.Register("shm", New) }
