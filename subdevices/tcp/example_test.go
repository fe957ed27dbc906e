package tcp_test

import (
	"context"
	"fmt"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/subdevices/tcp"
)

// printer is a minimal Handler: it hands each arrival to a channel.
type printer struct{ got chan string }

func (p printer) Deliver(from sdi.Rank, header, payload []byte) {
	p.got <- fmt.Sprintf("from rank %d: %s %s", from, header, payload)
}
func (printer) SendDone(uint64, error)   {}
func (printer) PeerDown(sdi.Rank, error) {}

// Two ranks of one job in one process, over IPv4 loopback.
func Example() {
	ctx := context.Background()
	h := printer{got: make(chan string, 1)}
	sds := []sdi.SubDevice{tcp.New(nil), tcp.New(nil)}
	cards := make([][]byte, 2)
	for i, sd := range sds {
		local, err := sd.Open(ctx, sdi.OpenParams{
			Rank: sdi.Rank(i), Size: 2, Host: "example", JobID: "job-1", Secret: []byte("job secret"),
			Config: []byte(`{"listen": "127.0.0.1:0"}`), Handler: h,
		})
		if err != nil {
			fmt.Println(err)
			return
		}
		defer sd.Close(ctx)
		cards[i] = local.Addr
	}
	if err := sds[0].Connect(ctx, 1, cards[1]); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := sds[0].Send(&sdi.Frame{Peer: 1, Header: []byte("hello"), Payload: []byte("world")}); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(<-h.got)
	// Output: from rank 0: hello world
}
