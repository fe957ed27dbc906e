package adi

// The built-in subdevices register themselves with sdi when linked; adi
// links them so that a program needs no import besides adi.
import (
	_ "github.com/hpc-multidevice/multidevice/subdevices/shm"
	_ "github.com/hpc-multidevice/multidevice/subdevices/tcp"
)
