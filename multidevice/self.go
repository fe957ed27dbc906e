package multidevice

import (
	"context"
	"math"
	"sync"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// selfName is self's name among the subdevices; plugins.hcl may not use
// it, and a connection table may name it only for the rank itself.
const selfName = "self"

// self is the built-in path from a rank to itself. Send copies the frame
// (so it completes at once, like MPICH's self device buffering) and a
// goroutine delivers it, so the handler is never entered from Send.
type self struct {
	mu      sync.Mutex
	queue   []selfFrame
	wake    chan struct{}
	quit    chan struct{}
	wg      sync.WaitGroup
	handler sdi.Handler
	rank    sdi.Rank
	closed  bool
}

type selfFrame struct{ hdr, payload []byte }

func newSelf() *self { return &self{wake: make(chan struct{}, 1), quit: make(chan struct{})} }

func (s *self) Info(context.Context) (sdi.Info, error) {
	return sdi.Info{Name: selfName, Version: "1", APIVersions: []string{sdi.APIVersion}}, nil
}

func (s *self) Open(_ context.Context, p sdi.OpenParams) (sdi.Local, error) {
	s.handler, s.rank = p.Handler, p.Rank
	s.wg.Add(1)
	go s.run()
	return sdi.Local{Caps: sdi.Caps{
		MaxHeader: headerSize, MaxEager: math.MaxInt32, MaxFrame: math.MaxInt32,
		Exclusivity: 100, Reach: sdi.ReachHost, Flags: sdi.FlagReliable | sdi.FlagOrdered,
	}}, nil
}

func (s *self) Connect(context.Context, sdi.Rank, []byte) error { return nil }
func (s *self) Disconnect(context.Context, sdi.Rank) error      { return nil }
func (s *self) Flush(context.Context, sdi.Rank) error           { return nil }

func (s *self) Send(f *sdi.Frame) (bool, error) {
	if f.Peer != s.rank {
		return false, sdi.ErrPeerUnreachable
	}
	fr := selfFrame{append([]byte(nil), f.Header...), append([]byte(nil), f.Payload...)}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false, sdi.ErrClosed
	}
	s.queue = append(s.queue, fr)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return true, nil
}

func (s *self) run() {
	defer s.wg.Done()
	for {
		select {
		case <-s.wake:
		case <-s.quit:
			return
		}
		s.mu.Lock()
		q := s.queue
		s.queue = nil
		s.mu.Unlock()
		for _, f := range q {
			s.handler.Deliver(s.rank, f.hdr, f.payload)
		}
	}
}

func (s *self) Close(context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	if s.handler != nil {
		close(s.quit)
		s.wg.Wait()
	}
	return nil
}
