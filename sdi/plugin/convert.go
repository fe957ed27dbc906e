package plugin

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/proto/sdiv1"
)

// Generated protobuf types stay in this file and the gRPC glue; callers see
// package sdi's types.

// errorKinds maps the sdi sentinels to the kinds that carry them across the
// process boundary, with the gRPC code used for them.
var errorKinds = []struct {
	err  error
	kind sdiv1.ErrorDetail_Kind
	code codes.Code
}{
	{sdi.ErrClosed, sdiv1.ErrorDetail_KIND_CLOSED, codes.FailedPrecondition},
	{sdi.ErrWouldBlock, sdiv1.ErrorDetail_KIND_WOULD_BLOCK, codes.ResourceExhausted},
	{sdi.ErrTooLarge, sdiv1.ErrorDetail_KIND_TOO_LARGE, codes.InvalidArgument},
	{sdi.ErrPeerUnreachable, sdiv1.ErrorDetail_KIND_PEER_UNREACHABLE, codes.Unavailable},
	{sdi.ErrNotConnected, sdiv1.ErrorDetail_KIND_NOT_CONNECTED, codes.FailedPrecondition},
	{sdi.ErrBadFrame, sdiv1.ErrorDetail_KIND_BAD_FRAME, codes.InvalidArgument},
	{sdi.ErrUnsupported, sdiv1.ErrorDetail_KIND_UNSUPPORTED, codes.Unimplemented},
}

// toStatus turns a subdevice's error into a gRPC status that names the sdi
// sentinel it wraps, if any. The plugin side calls it.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	for _, k := range errorKinds {
		if errors.Is(err, k.err) {
			st, derr := status.New(k.code, err.Error()).WithDetails(&sdiv1.ErrorDetail{Kind: k.kind})
			if derr != nil {
				return status.Error(k.code, err.Error())
			}
			return st.Err()
		}
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return status.FromContextError(err).Err()
	}
	return status.Error(codes.Unknown, err.Error())
}

// remoteError is an error that came from the plugin process. It keeps the
// plugin's message and unwraps to the sentinel the plugin named.
type remoteError struct {
	op       string
	msg      string
	sentinel error
}

func (e *remoteError) Error() string { return e.op + ": " + e.msg }
func (e *remoteError) Unwrap() error { return e.sentinel }

// fromStatus turns an error from a gRPC call back into one that wraps the
// sdi sentinel the plugin named, context errors for deadlines, and
// ErrPluginExited when the connection to the plugin is gone.
func fromStatus(op string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return &remoteError{op: op, msg: err.Error()}
	}
	for _, d := range st.Details() {
		if ed, ok := d.(*sdiv1.ErrorDetail); ok {
			for _, k := range errorKinds {
				if k.kind == ed.GetKind() {
					return &remoteError{op: op, msg: st.Message(), sentinel: k.err}
				}
			}
		}
	}
	switch st.Code() {
	case codes.DeadlineExceeded:
		return &remoteError{op: op, msg: st.Message(), sentinel: context.DeadlineExceeded}
	case codes.Canceled:
		return &remoteError{op: op, msg: st.Message(), sentinel: context.Canceled}
	case codes.Unimplemented:
		// An older plugin that lacks a call.
		return &remoteError{op: op, msg: st.Message(), sentinel: sdi.ErrUnsupported}
	case codes.Unavailable:
		return &remoteError{op: op, msg: st.Message(), sentinel: ErrPluginExited}
	}
	return &remoteError{op: op, msg: st.Message()}
}

// knownFlags are the sdi.Flag bits this build understands. A host masks off
// the rest, so a newer plugin's new capability is not claimed by a host
// that cannot use it.
const knownFlags = sdi.FlagReliable | sdi.FlagOrdered | sdi.FlagMatching | sdi.FlagPoll | sdi.FlagJobCards | sdi.FlagIdle

func capsToProto(c sdi.Caps) *sdiv1.Caps {
	return &sdiv1.Caps{
		MaxHeader:   uint32(max(c.MaxHeader, 0)),
		MaxEager:    uint64(max(c.MaxEager, 0)),
		MaxFrame:    uint64(max(c.MaxFrame, 0)),
		Exclusivity: c.Exclusivity,
		LatencyNs:   int64(c.Latency),
		Bandwidth:   c.Bandwidth,
		Reach:       sdiv1.Reach(c.Reach),
		Flags:       uint32(c.Flags),
	}
}

// capsFromProto converts caps from the plugin; values that do not fit an
// int become -1, which sdi.Caps.Validate refuses.
func capsFromProto(p *sdiv1.Caps) sdi.Caps {
	toInt := func(v uint64) int {
		if v > 1<<40 {
			return -1
		}
		return int(v)
	}
	return sdi.Caps{
		MaxHeader:   toInt(uint64(p.GetMaxHeader())),
		MaxEager:    toInt(p.GetMaxEager()),
		MaxFrame:    toInt(p.GetMaxFrame()),
		Exclusivity: p.GetExclusivity(),
		Latency:     time.Duration(p.GetLatencyNs()),
		Bandwidth:   p.GetBandwidth(),
		Reach:       sdi.Reach(min(uint32(p.GetReach()), 255)),
		Flags:       sdi.Flag(p.GetFlags()) & knownFlags,
	}
}
