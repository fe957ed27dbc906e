package sditest

import (
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/sdi"
)

func TestLoopbackConformance(t *testing.T) {
	fabric := NewFabric(LoopbackOptions{})
	Run(t, Harness{New: func(testing.TB) sdi.SubDevice { return fabric.New(hclog.NewNullLogger()) }})
}

// Tiny caps and queues put every frame near a limit and make Send return
// ErrWouldBlock all the time; three peers exercise fan-in and fan-out.
func TestLoopbackConformanceTiny(t *testing.T) {
	fabric := NewFabric(LoopbackOptions{
		Caps: sdi.Caps{
			MaxHeader: headerSize + 4,
			MaxEager:  64,
			MaxFrame:  200,
			Reach:     sdi.ReachHost,
			Flags:     sdi.FlagReliable | sdi.FlagOrdered,
		},
		QueueLimit: 2,
	})
	Run(t, Harness{New: func(testing.TB) sdi.SubDevice { return fabric.New(hclog.NewNullLogger()) }, Peers: 3})
}
