// Command sdi-tcp serves the built-in tcp subdevice as a plugin binary, for
// running it out of process. It is not meant to be run by hand: name it in
// plugins.hcl,
//
//	subdevice "tcp" {
//	  command = "sdi-tcp"
//	}
//
// and the multidevice starts it.
package main

import (
	"github.com/hpc-multidevice/multidevice/sdi/plugin"
	"github.com/hpc-multidevice/multidevice/subdevices/tcp"
)

func main() { plugin.Serve(tcp.New) }
