package tcp

import (
	"bufio"
	"errors"
	"fmt"
	"io"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Limits published in Caps. MaxFrame bounds the one buffer each inbound
// connection keeps, so memory per connection stays at about
// MaxHeader+MaxFrame plus the read buffer.
const (
	maxHeader = 256
	maxEager  = 64 << 10
	maxFrame  = 1 << 20
	// readBufSize batches small frames into few read syscalls; frames at
	// least this large are read straight into the frame buffer.
	readBufSize = 64 << 10
)

// frameReader parses frames from one inbound stream. It is not safe for
// concurrent use: one reader goroutine owns it.
type frameReader struct {
	r         *bufio.Reader
	maxHeader int
	maxFrame  int
	wire      [sdi.WireHeaderSize]byte
	buf       []byte // reused for every frame; grows up to maxHeader+maxFrame
}

func newFrameReader(r io.Reader, maxHeader, maxFrame int) *frameReader {
	return &frameReader{r: bufio.NewReaderSize(r, readBufSize), maxHeader: maxHeader, maxFrame: maxFrame}
}

// next reads one frame. header and payload alias the reader's buffer and are
// valid until the next call. It returns io.EOF only for a stream that ended
// cleanly between frames; a malformed frame gives an error wrapping
// [sdi.ErrBadFrame], checked before any byte of the body is buffered.
func (fr *frameReader) next() (header, payload []byte, err error) {
	if _, err := io.ReadFull(fr.r, fr.wire[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, nil, fmt.Errorf("stream ended inside a wire header: %w", err)
		}
		return nil, nil, err
	}
	h, err := sdi.DecodeWireHeader(fr.wire[:], fr.maxHeader, fr.maxFrame)
	if err != nil {
		return nil, nil, err
	}
	if h.Flags != 0 {
		return nil, nil, fmt.Errorf("%w: flags %#x, tcp defines none", sdi.ErrBadFrame, h.Flags)
	}
	hl := int(h.HeaderLen)
	n := hl + int(h.PayloadLen)
	if cap(fr.buf) < n {
		// Grow geometrically so a stream of slowly growing frames does not
		// reallocate each time, but never past what a valid frame can need.
		fr.buf = make([]byte, min(max(n, 2*cap(fr.buf)), fr.maxHeader+fr.maxFrame))
	}
	b := fr.buf[:n]
	if _, err := io.ReadFull(fr.r, b); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, nil, fmt.Errorf("stream ended inside a %d-byte frame: %w", n, err)
	}
	// The header's capacity stops at its length, so a handler that appends
	// to it cannot overwrite the payload.
	return b[:hl:hl], b[hl:], nil
}
