package tcp

import "github.com/hpc-multidevice/multidevice/sdi"

func init() { sdi.Register("tcp", New) }
