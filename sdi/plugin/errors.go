package plugin

import "errors"

// Sentinel errors of the plugin glue; callers test them with errors.Is.
var (
	// ErrPluginExited is wrapped by every error of a subdevice whose plugin
	// process exited, crashed, stopped answering or was killed. Sends to its
	// peers also wrap sdi.ErrPeerUnreachable.
	ErrPluginExited = errors.New("sdi/plugin: subdevice plugin exited")
	// ErrStart is wrapped by the error of a plugin that could not be
	// started: a missing binary, a checksum mismatch, a failed handshake or
	// an unsupported protocol version.
	ErrStart = errors.New("sdi/plugin: subdevice plugin did not start")
	// ErrProtocol is wrapped when the other side breaks the plugin
	// protocol: a malformed record, a wrong first message.
	ErrProtocol = errors.New("sdi/plugin: protocol violation")
)
