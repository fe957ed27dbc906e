package plugin

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// TestErrorsCrossTheBoundary: every sentinel a plugin's subdevice wraps
// comes out of the host side still matching errors.Is, with the plugin's
// message kept.
func TestErrorsCrossTheBoundary(t *testing.T) {
	for _, k := range errorKinds {
		t.Run(k.err.Error(), func(t *testing.T) {
			orig := fmt.Errorf("fab: connect to rank 3: %w", k.err)
			st := toStatus(orig)
			if status.Code(st) != k.code {
				t.Errorf("code %v, want %v", status.Code(st), k.code)
			}
			back := fromStatus("connect", st)
			if !errors.Is(back, k.err) {
				t.Errorf("fromStatus(toStatus(%v)) = %v, which does not wrap the sentinel", orig, back)
			}
			if back.Error() != "connect: "+orig.Error() {
				t.Errorf("message %q, want the plugin's %q after the operation", back, orig)
			}
		})
	}
	for _, tc := range []struct {
		name string
		in   error
		want error
	}{
		{"deadline", status.Error(codes.DeadlineExceeded, "slow"), context.DeadlineExceeded},
		{"canceled", status.Error(codes.Canceled, "gone"), context.Canceled},
		{"old plugin without the call", status.Error(codes.Unimplemented, "unknown method"), sdi.ErrUnsupported},
		{"connection lost", status.Error(codes.Unavailable, "transport is closing"), ErrPluginExited},
		{"context through toStatus", toStatus(fmt.Errorf("wait: %w", context.DeadlineExceeded)), context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fromStatus("op", tc.in); !errors.Is(got, tc.want) {
				t.Errorf("fromStatus(%v) = %v, want it to wrap %v", tc.in, got, tc.want)
			}
		})
	}
	if err := fromStatus("op", status.Error(codes.Internal, "boom")); err == nil || errors.Unwrap(err) != nil {
		t.Errorf("an unknown error = %v, want a plain error", err)
	}
	if toStatus(nil) != nil || fromStatus("op", nil) != nil {
		t.Error("nil errors must stay nil")
	}
}

func TestCapsCrossTheBoundary(t *testing.T) {
	c := sdi.Caps{MaxHeader: 256, MaxEager: 65536, MaxFrame: 1 << 20, Exclusivity: 20, Latency: 25 * time.Microsecond,
		Bandwidth: 1e9, Reach: sdi.ReachHost, Flags: sdi.FlagReliable | sdi.FlagOrdered | sdi.FlagPoll | sdi.FlagJobCards}
	if got := capsFromProto(capsToProto(c)); got != c {
		t.Fatalf("round trip: %+v, want %+v", got, c)
	}
	p := capsToProto(c)
	p.Flags |= 1 << 30 // a capability from a newer plugin
	p.MaxFrame = 1 << 50
	got := capsFromProto(p)
	if got.Flags != c.Flags {
		t.Errorf("flags %v: unknown bits must be masked off", got.Flags)
	}
	if got.Validate() == nil {
		t.Errorf("caps with an absurd MaxFrame validate: %+v", got)
	}
}
