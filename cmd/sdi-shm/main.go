// Command sdi-shm serves the built-in shm subdevice as a plugin binary, for
// running it out of process. It is not meant to be run by hand: name it in
// plugins.hcl,
//
//	subdevice "shm" {
//	  command = "sdi-shm"
//	}
//
// and the multidevice starts it.
package main

import (
	"github.com/hpc-multidevice/multidevice/sdi/plugin"
	"github.com/hpc-multidevice/multidevice/subdevices/shm"
)

func main() { plugin.Serve(shm.New) }
