package softrdma

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
)

// connected returns two connected endpoints with their providers.
func connected(t *testing.T, f *Fabric) (a, b *Provider, ea, eb rdma.Endpoint) {
	t.Helper()
	a, b = f.Open(), f.Open()
	t.Cleanup(func() { a.Close(); b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	accepted := make(chan rdma.Endpoint, 1)
	go func() {
		req := <-b.Requests()
		e, err := req.Accept(2, func(rdma.Endpoint) error { return nil })
		if err != nil {
			t.Error(err)
		}
		accepted <- e
	}()
	ea, err := a.Dial(ctx, b.Card(), []byte("hi"), 1, func(rdma.Endpoint) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	eb = <-accepted
	return a, b, ea, eb
}

func poll(p *Provider) []rdma.Completion {
	cs := make([]rdma.Completion, 16)
	n, _ := p.Poll(cs)
	return cs[:n]
}

// TestRules: each breach of the hardware's rules fails the connection and
// is counted, so a test of the engine over the fabric can see it.
func TestRules(t *testing.T) {
	for _, tc := range []struct {
		name string
		do   func(t *testing.T, a, b *Provider, ea, eb rdma.Endpoint) error
	}{
		{"send with no receive posted", func(t *testing.T, a, b *Provider, ea, eb rdma.Endpoint) error {
			r, _ := a.Register(make([]byte, 8))
			return ea.PostSend(1, r, 0, 8)
		}},
		{"send larger than the receive", func(t *testing.T, a, b *Provider, ea, eb rdma.Endpoint) error {
			rb, _ := b.Register(make([]byte, 8))
			eb.PostRecv(1, rb, 0, 4)
			r, _ := a.Register(make([]byte, 8))
			return ea.PostSend(1, r, 0, 8)
		}},
		{"read of a deregistered region", func(t *testing.T, a, b *Provider, ea, eb rdma.Endpoint) error {
			src, _ := b.Register(make([]byte, 64))
			src.Close()
			dst, _ := a.Register(make([]byte, 64))
			return ea.PostRead(1, dst, 0, 64, src.Addr(), src.RKey())
		}},
		{"read beyond the region", func(t *testing.T, a, b *Provider, ea, eb rdma.Endpoint) error {
			src, _ := b.Register(make([]byte, 64))
			dst, _ := a.Register(make([]byte, 128))
			return ea.PostRead(1, dst, 0, 65, src.Addr(), src.RKey())
		}},
		{"read of the reader's own region", func(t *testing.T, a, b *Provider, ea, eb rdma.Endpoint) error {
			src, _ := a.Register(make([]byte, 64))
			dst, _ := a.Register(make([]byte, 64))
			return ea.PostRead(1, dst, 0, 64, src.Addr(), src.RKey())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := New(rdma.Limits{})
			a, b, ea, eb := connected(t, f)
			if err := tc.do(t, a, b, ea, eb); err != nil {
				t.Fatalf("post: %v", err)
			}
			if f.Violations.Load() != 1 {
				t.Fatalf("%d violations counted, want 1", f.Violations.Load())
			}
			cs := poll(a)
			if len(cs) == 0 || cs[len(cs)-1].Err == nil {
				t.Fatalf("completions %+v: want the work failed", cs)
			}
			// The connection is down: the peer's receives flush.
			rb, _ := b.Register(make([]byte, 8))
			eb.PostRecv(7, rb, 0, 8)
			if cs := poll(b); len(cs) == 0 || !errors.Is(cs[len(cs)-1].Err, rdma.ErrFlushed) {
				t.Fatalf("peer's completions %+v: want flushed", cs)
			}
		})
	}
}

// TestTransfers: a send lands in the first posted receive and a read
// copies remote bytes, each completing on the right side.
func TestTransfers(t *testing.T) {
	f := New(rdma.Limits{})
	a, b, ea, eb := connected(t, f)
	rbuf := make([]byte, 16)
	rb, _ := b.Register(rbuf)
	eb.PostRecv(5, rb, 0, 8)
	eb.PostRecv(6, rb, 8, 8)
	sbuf := []byte("hello")
	sr, _ := a.Register(sbuf)
	ea.PostSend(9, sr, 0, 5)
	if cs := poll(b); len(cs) != 1 || cs[0].WR != 5 || cs[0].Len != 5 || cs[0].Endpoint != 2 || string(rbuf[:5]) != "hello" {
		t.Fatalf("receive side: %+v, %q", cs, rbuf)
	}
	if cs := poll(a); len(cs) != 1 || cs[0].WR != 9 || cs[0].Op != rdma.OpSend || cs[0].Err != nil {
		t.Fatalf("send side: %+v", cs)
	}
	dst := make([]byte, 3)
	dr, _ := b.Register(dst)
	eb.PostRead(11, dr, 0, 3, sr.Addr()+1, sr.RKey())
	if cs := poll(b); len(cs) != 1 || cs[0].Op != rdma.OpRead || cs[0].Err != nil || string(dst) != "ell" {
		t.Fatalf("read: %+v, %q", cs, dst)
	}
	if f.Violations.Load() != 0 {
		t.Fatal(f.Errs())
	}
}
