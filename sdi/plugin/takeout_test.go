package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/plugin"
)

// ownTimeout's Connect gives up after a timeout of its own, as a subdevice
// that bounds its handshake with a peer does, well within the host's.
type ownTimeout struct{ sdi.SubDevice }

func (ownTimeout) Connect(ctx context.Context, peer sdi.Rank, _ []byte) error {
	ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	<-ctx.Done()
	return fmt.Errorf("handshake with rank %d: %w", peer, ctx.Err())
}

// TestOwnTimeoutFailsOnlyThatCall: a subdevice's own timeout (a deadline
// error from inside the plugin) fails that call only. The host once took
// it for its own per-call timeout: it took the whole plugin out, reporting
// every peer down with a false "connect did not answer within 5s".
func TestOwnTimeoutFailsOnlyThatCall(t *testing.T) {
	c, err := startHelperTimeout(t, "own-timeout", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	h := &downHandler{ch: make(chan struct{}, 1)}
	if _, err := c.Open(ctx, sdi.OpenParams{Rank: 0, Size: 3, Host: "h", JobID: "own-timeout", Secret: []byte("s"),
		APIVersion: sdi.APIVersion, Handler: h, Config: []byte(`{"listen": "127.0.0.1:0"}`)}); err != nil {
		t.Fatal(err)
	}
	err = c.Connect(ctx, 2, []byte("card"))
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, plugin.ErrPluginExited) || !strings.Contains(err.Error(), "handshake with rank 2") {
		t.Errorf("Connect(2) = %v; want the subdevice's own deadline error, not ErrPluginExited", err)
	}
	if _, err := c.Info(ctx); err != nil {
		t.Fatalf("Info after one peer's Connect timed out inside the plugin = %v", err)
	}
}

// badRank delivers, at Connect to rank 1, a frame that claims to come from
// a rank outside the job (a stray or misconfigured peer), then a good one
// from rank 1.
type badRank struct {
	sdi.SubDevice
	h sdi.Handler
}

func (b *badRank) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	b.h = p.Handler
	return b.SubDevice.Open(ctx, p)
}

func (b *badRank) Connect(_ context.Context, peer sdi.Rank, _ []byte) error {
	if peer == 1 {
		go func() {
			b.h.Deliver(7, []byte("hdr"), []byte("stray"))
			b.h.Deliver(1, []byte("hdr"), []byte("good"))
		}()
	}
	return nil
}

// deliverHandler records PeerDown calls, and hands delivered payloads to got.
type deliverHandler struct {
	downHandler
	got chan string
}

func (h *deliverHandler) Deliver(from sdi.Rank, _, payload []byte) {
	h.got <- fmt.Sprintf("%d:%s", from, payload)
}

// TestOutOfRangeDeliverDropped: a frame from a rank outside [0, size) is
// dropped on the plugin's side, as a built-in subdevice's is by the
// multidevice, on both data planes. It once went into the data plane, where
// the host took it for a protocol violation and took the whole plugin out,
// every connected peer with it.
func TestOutOfRangeDeliverDropped(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stream bool
	}{{"ring", false}, {"stream", true}} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := startHelperConfig(t, "bad-rank", func(cfg *plugin.Config) { cfg.Stream = tc.stream })
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			h := &deliverHandler{downHandler: downHandler{ch: make(chan struct{}, 1)}, got: make(chan string, 2)}
			if _, err := c.Open(ctx, sdi.OpenParams{Rank: 0, Size: 2, Host: "h", JobID: "bad-rank", Secret: []byte("s"),
				APIVersion: sdi.APIVersion, Handler: h, Config: []byte(`{"listen": "127.0.0.1:0"}`)}); err != nil {
				t.Fatal(err)
			}
			if err := c.Connect(ctx, 1, []byte("card")); err != nil {
				t.Fatal(err)
			}
			// The good frame follows the stray one: once it is here, the
			// stray one has been dealt with.
			select {
			case got := <-h.got:
				if got != "1:good" {
					t.Fatalf("delivered %q, want only 1:good", got)
				}
			case <-h.ch:
				h.mu.Lock()
				why := h.downs[0]
				h.mu.Unlock()
				t.Fatalf("peer 1 reported down after a stray frame: %v", why)
			case <-time.After(5 * time.Second):
				t.Fatal("the good frame after the stray one did not arrive within 5s")
			}
			if _, err := c.Info(ctx); err != nil {
				t.Fatalf("Info after a stray frame = %v", err)
			}
		})
	}
}
