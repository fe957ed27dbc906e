// Command sdi-udapl serves the udapl subdevice (DAT 2.0 through libdat2) as
// a plugin binary. Built on a cluster with libdapl,
//
//	go build -tags udapl -o plugins/ ./cmd/sdi-udapl
//
// it gives every application there uDAPL without rebuilding the
// applications: name it in plugins.hcl,
//
//	subdevice "udapl" {
//	  command = "sdi-udapl"
//	}
//
// and the multidevice starts it. Built without the tag, its Open says so.
package main

import (
	"github.com/hpc-multidevice/multidevice/sdi/plugin"
	"github.com/hpc-multidevice/multidevice/subdevices/udapl"
)

func main() { plugin.Serve(udapl.New) }
