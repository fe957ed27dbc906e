package adi

// The built-in subdevices register themselves with sdi when linked; adi
// links them so that a program needs no import besides adi. verbs and
// udapl are registered in every build, but carry their RDMA code only in
// builds with -tags verbs or -tags udapl; otherwise their Open says so.
import (
	_ "github.com/hpc-multidevice/multidevice/subdevices/shm"
	_ "github.com/hpc-multidevice/multidevice/subdevices/tcp"
	_ "github.com/hpc-multidevice/multidevice/subdevices/udapl"
	_ "github.com/hpc-multidevice/multidevice/subdevices/verbs"
)
