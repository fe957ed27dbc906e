package mdconfig

import "errors"

// Errors returned by the methods of [Description]; problems in a description
// itself come back as HCL diagnostics from [Parse] instead.
var (
	// ErrUnknownHost: a host name that the description does not contain.
	ErrUnknownHost = errors.New("mdconfig: unknown host")
	// ErrUnreachable: two hosts in separate islands.
	ErrUnreachable = errors.New("mdconfig: no route")
)
