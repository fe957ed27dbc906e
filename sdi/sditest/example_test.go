package sditest_test

import (
	"context"
	"fmt"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

// printer is a minimal Handler; a real one hands frames to its engine's
// queue instead of working inside the callback.
type printer chan string

func (p printer) Deliver(from sdi.Rank, header, payload []byte) {
	p <- fmt.Sprintf("from rank %d: %s %s", from, header, payload)
}
func (p printer) SendDone(token uint64, err error)  { p <- fmt.Sprintf("token %d done: %v", token, err) }
func (p printer) PeerDown(peer sdi.Rank, err error) {}

// Two loopback subdevices on one fabric exchange a frame; the sender learns
// of completion through SendDone because the frame has a payload.
func ExampleFabric() {
	ctx := context.Background()
	fabric := sditest.NewFabric(sditest.LoopbackOptions{})
	events := make(printer, 4)
	var sds [2]sdi.SubDevice
	var cards [2][]byte
	for r := range sds {
		sds[r] = fabric.New(nil)
		local, err := sds[r].Open(ctx, sdi.OpenParams{
			Rank: sdi.Rank(r), Size: 2, Host: "h", JobID: "job", APIVersion: sdi.APIVersion, Handler: events,
		})
		if err != nil {
			panic(err)
		}
		defer sds[r].Close(ctx)
		cards[r] = local.Addr
	}
	if err := sds[0].Connect(ctx, 1, cards[1]); err != nil {
		panic(err)
	}
	done, err := sds[0].Send(&sdi.Frame{Peer: 1, Header: []byte("hdr"), Payload: []byte("hello"), Token: 7})
	fmt.Println("done at Send:", done, err)
	fmt.Println(<-events)
	fmt.Println(<-events)
	// Output:
	// done at Send: false <nil>
	// from rank 0: hdr hello
	// token 7 done: <nil>
}
