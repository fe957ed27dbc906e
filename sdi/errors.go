package sdi

import (
	"errors"
	"net"
)

// Sentinel errors. Subdevices wrap them with context
// (fmt.Errorf("tcp: connect to rank %d: %w", r, ErrPeerUnreachable)); callers
// test them with errors.Is.
var (
	// ErrClosed is returned by any call after Close, and passed to SendDone
	// for frames still pending when the subdevice closes.
	ErrClosed = net.ErrClosed
	// ErrWouldBlock is returned by Send when the subdevice cannot accept the
	// frame now; the caller retries after a SendDone or a short wait.
	ErrWouldBlock = errors.New("sdi: would block")
	// ErrTooLarge is returned by Send for a frame whose payload exceeds
	// Caps.MaxFrame or whose header exceeds Caps.MaxHeader.
	ErrTooLarge = errors.New("sdi: frame exceeds limits")
	// ErrPeerUnreachable is returned when a peer cannot be reached: a bad or
	// foreign business card, a refused or timed-out connection, a peer the
	// subdevice cannot reach by its nature (shm to another host).
	ErrPeerUnreachable = errors.New("sdi: peer unreachable")
	// ErrNotConnected is returned by Send for a peer that was never connected.
	ErrNotConnected = errors.New("sdi: peer not connected")
	// ErrBadFrame reports a malformed frame: wrong magic, wrong version,
	// lengths beyond limits. The connection or ring that carried it is dropped.
	ErrBadFrame = errors.New("sdi: malformed frame")
	// ErrUnsupported is returned by optional operations a subdevice does not
	// implement.
	ErrUnsupported = errors.ErrUnsupported
	// ErrUnknownSubDevice is returned by Lookup for a name nobody registered.
	ErrUnknownSubDevice = errors.New("sdi: unknown subdevice")
)
