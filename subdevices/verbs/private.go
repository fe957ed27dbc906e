package verbs

import (
	"errors"
	"fmt"
)

// maxPrivate is the engine's share of a connection request's private data.
// An RC connection request over InfiniBand or RoCE has 56 bytes of private
// data after the connection manager's header, and the listening side always
// sees all 56, zero-padded, whatever the dialer sent. One length byte in
// front lets Private return exactly what Dial was given.
const maxPrivate = 55

// encodePrivate prefixes the engine's private data with its length.
func encodePrivate(p []byte) ([]byte, error) {
	if len(p) > maxPrivate {
		return nil, fmt.Errorf("private data of %d bytes exceeds Limits.MaxPrivate (%d)", len(p), maxPrivate)
	}
	b := make([]byte, 1+len(p))
	b[0] = byte(len(p))
	copy(b[1:], p)
	return b, nil
}

// decodePrivate undoes encodePrivate on the padded bytes a request carries.
func decodePrivate(b []byte) ([]byte, error) {
	if len(b) == 0 {
		return nil, errors.New("no private data")
	}
	n := int(b[0])
	if n > maxPrivate || n > len(b)-1 {
		return nil, fmt.Errorf("private data length %d exceeds the %d bytes received", n, len(b)-1)
	}
	return append([]byte(nil), b[1:1+n]...), nil
}
