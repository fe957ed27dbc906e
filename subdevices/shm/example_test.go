package shm_test

import (
	"context"
	"fmt"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/subdevices/shm"
)

// printer is a Handler that hands frames to a channel; a Handler must not
// block or call back into the subdevice.
type printer chan string

func (p printer) Deliver(from sdi.Rank, header, payload []byte) {
	p <- fmt.Sprintf("rank %d sent %s: %s", from, header, payload)
}
func (p printer) SendDone(uint64, error)   {}
func (p printer) PeerDown(sdi.Rank, error) {}

// Two ranks of one job in one process: rank 0 sends a frame to rank 1.
func Example() {
	ctx := context.Background()
	got := make(printer, 1)
	var sds [2]sdi.SubDevice
	var cards [2][]byte
	for r := range sds {
		sds[r] = shm.New(nil)
		defer sds[r].Close(ctx)
		l, err := sds[r].Open(ctx, sdi.OpenParams{Rank: sdi.Rank(r), Size: 2, Host: "node1", JobID: "example", Handler: got})
		if err != nil {
			fmt.Println(err)
			return
		}
		cards[r] = l.Addr // a launcher would publish this
	}
	if err := sds[0].Connect(ctx, 1, cards[1]); err != nil {
		fmt.Println(err)
		return
	}
	done, err := sds[0].Send(&sdi.Frame{Peer: 1, Header: []byte("hdr"), Payload: []byte("hello")})
	fmt.Println(done, err)
	fmt.Println(<-got)
	// Output:
	// true <nil>
	// rank 0 sent hdr: hello
}
