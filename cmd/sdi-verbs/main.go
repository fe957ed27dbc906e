// Command sdi-verbs serves the verbs subdevice (InfiniBand and RoCE through
// librdmacm and libibverbs) as a plugin binary. Built on a cluster with the
// RDMA libraries,
//
//	go build -tags verbs -o plugins/ ./cmd/sdi-verbs
//
// it gives every application there RDMA without rebuilding the
// applications, which need no C libraries of their own: name it in
// plugins.hcl,
//
//	subdevice "verbs" {
//	  command = "sdi-verbs"
//	}
//
// and the multidevice starts it. Built without the tag, its Open says so.
package main

import (
	"github.com/hpc-multidevice/multidevice/sdi/plugin"
	"github.com/hpc-multidevice/multidevice/subdevices/verbs"
)

func main() { plugin.Serve(verbs.New) }
