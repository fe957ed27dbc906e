// Command subdevice-plugin is a complete third-party subdevice served as a
// plugin binary: package uds moves frames between ranks on one host over
// Unix-domain sockets, and this main hands it to the multidevice. See
// README.md for building it, naming it in plugins.hcl and running a job.
package main

import (
	"github.com/hpc-multidevice/multidevice/examples/subdevice-plugin/uds"
	"github.com/hpc-multidevice/multidevice/sdi/plugin"
)

func main() { plugin.Serve(uds.New) }
