package adi

import (
	"context"
	"fmt"

	"github.com/hpc-multidevice/multidevice/multidevice"
)

// Hooks into partitioned requests for the tests of package adi_test.

// SendPartitionedSetup sends setup as the setup of this rank's first
// partitioned send init on c to dest with tag, followed by empties empty
// messages on its channel (tags 0 up), as a sender of another build
// could, and waits until they are sent.
func SendPartitionedSetup(ctx context.Context, c *Comm, dest, tag int, setup []byte, empties int) error {
	world, err := c.dest(dest)
	if err != nil {
		return err
	}
	id := partitionContext(c.context, c.rank, dest, tag, 1)
	send := func(b []byte, tag int, id uint64) error {
		r, err := c.w.dev.Isend(b, world, tag, id, false)
		if err != nil {
			return err
		}
		_, err = r.Wait(ctx)
		return err
	}
	if err := send(setup, 0, id|1); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	for i := range empties {
		if err := send(nil, i, id); err != nil {
			return fmt.Errorf("empty message %d: %w", i, err)
		}
	}
	return nil
}

// OccupyPartitioned makes the request of message k of q's channel (a
// send's, or a receive's once its setup came) busy with a receive from
// this rank itself that nothing else matches, so that the channel's next
// use of it fails to start with ErrRequestBusy, as one a lost peer left
// unreusable does. release completes that receive.
func OccupyPartitioned(q *Request, k int) (release func(context.Context) error, err error) {
	p := q.part
	r := &p.recvs
	if p.send {
		r = &p.sends
	}
	if k >= len(*r) {
		return nil, fmt.Errorf("message %d of %d", k, len(*r))
	}
	self, err := p.c.dest(p.c.rank)
	if err != nil {
		return nil, err
	}
	req := &(*r)[k]
	// The setup's id with tag 1: the setup is tag 0, nothing sends 1.
	if err := p.c.w.dev.IrecvRequest(req, nil, self, 1, p.id|1); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		var s multidevice.Request
		if err := p.c.w.dev.IsendRequest(&s, nil, self, 1, p.id|1, false); err != nil {
			return err
		}
		if _, err := s.Wait(ctx); err != nil {
			return err
		}
		_, err := req.Wait(ctx)
		return err
	}, nil
}
