package tcp

import (
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
	// readBufSize batches small frames into few read syscalls; frames that
	// do not fit in it with their wire header are read straight into the
	// frame buffer, so a large payload is copied once, from the socket.
	readBufSize = 64 << 10
)

// errAgain is what a frameReader's read function returns when the socket
// has nothing to read right now (EAGAIN), and what next returns when no
// whole frame has arrived yet.
var errAgain = errors.New("tcp: no data yet")

// frameReader parses frames from one inbound stream with non-blocking
// reads: next returns errAgain when the frame is not complete yet and
// carries on where it left off at the next call. It is not safe for
// concurrent use: the inbound connection's lock guards it, held by its
// reader goroutine or by a poller.
type frameReader struct {
	// read reads what is there into p without blocking: n > 0, or
	// errAgain (never wrapped), io.EOF or another error.
	read func(p []byte) (int, error)
	// peek, when set, fills the read buffer instead of read: it reads
	// the same way but may leave the bytes in the socket until the next
	// read or the owner's consume (see rxfd.peek).
	peek      func(p []byte) (int, error)
	maxHeader int
	maxFrame  int

	rbuf []byte // batches small frames; rbuf[r:w] is read but not parsed
	r, w int

	// A frame too large for rbuf is read past it: need bytes of header
	// and payload, got of them so far, hl of them the header. The header
	// goes to body; the payload to dst, which is the handler's place for it
	// (placed) or the rest of body, once the header is complete.
	body          []byte // reused for every large frame; grows up to maxHeader+maxFrame
	need, got, hl int
	dst           []byte
	placed        bool
	// discard: the place was given up (abandon) and the frame is read
	// into body and dropped.
	discard bool

	// place, when set, asks the handler where a large frame's payload goes
	// ([sdi.Placer]); nil means "in body".
	place func(header []byte, n int) []byte

	// afterLarge is set while the last frame returned was read past the
	// read buffer: the next is likely large too, so reading for its wire
	// header asks only for the headers (see fill).
	afterLarge bool

	// short is set when a read returned less than it asked for: the
	// socket was most likely empty after it, so next says errAgain rather
	// than read again until the owner calls rearm. That saves a read which
	// would fail with EAGAIN after every message, on the message's path.
	short bool
}

func newFrameReader(read func([]byte) (int, error), maxHeader, maxFrame int) *frameReader {
	return &frameReader{read: read, maxHeader: maxHeader, maxFrame: maxFrame, rbuf: make([]byte, readBufSize)}
}

// buffered reports whether the read buffer holds bytes not yet parsed.
func (fr *frameReader) buffered() bool { return fr.w > fr.r }

// next returns the next frame, reading what the stream has as needed.
// header and payload alias the reader's buffers and are valid until the
// next call. It returns errAgain when the frame is not complete and the
// stream has nothing more right now; io.EOF only for a stream that ended
// cleanly between frames; and an error wrapping [sdi.ErrBadFrame] for a
// malformed frame, checked before any byte of its body is buffered beyond
// the read buffer. After any other error the reader is unusable.
func (fr *frameReader) next() (header, payload []byte, err error) {
	if fr.need > 0 {
		return fr.nextLarge()
	}
	for fr.w-fr.r < sdi.WireHeaderSize {
		if err := fr.fill(fr.headFill()); err != nil {
			// errAgain is returned as it is, and on every poll that
			// finds nothing: compare it plainly rather than unwrap it.
			if err != errAgain && errors.Is(err, io.EOF) && fr.w > fr.r {
				return nil, nil, fmt.Errorf("stream ended inside a wire header: %w", io.ErrUnexpectedEOF)
			}
			return nil, nil, err
		}
	}
	h, err := sdi.DecodeWireHeader(fr.rbuf[fr.r:fr.w], fr.maxHeader, fr.maxFrame)
	if err != nil {
		return nil, nil, err
	}
	if h.Flags != 0 {
		return nil, nil, fmt.Errorf("%w: flags %#x, tcp defines none", sdi.ErrBadFrame, h.Flags)
	}
	hl := int(h.HeaderLen)
	n := hl + int(h.PayloadLen)
	if sdi.WireHeaderSize+n > len(fr.rbuf) {
		// Too large to batch: read it past the read buffer, straight
		// into its place.
		fr.r += sdi.WireHeaderSize
		fr.need, fr.hl, fr.got = n, hl, 0
		fr.dst, fr.placed = nil, false
		return fr.nextLarge()
	}
	fr.afterLarge = false
	for fr.w-fr.r < sdi.WireHeaderSize+n {
		if err := fr.fill(len(fr.rbuf)); err != nil {
			if err != errAgain && errors.Is(err, io.EOF) {
				err = fmt.Errorf("stream ended inside a %d-byte frame: %w", n, io.ErrUnexpectedEOF)
			}
			return nil, nil, err
		}
	}
	b := fr.rbuf[fr.r+sdi.WireHeaderSize : fr.r+sdi.WireHeaderSize+n]
	fr.r += sdi.WireHeaderSize + n
	// The header's capacity stops at its length, so a handler that appends
	// to it cannot overwrite the payload.
	return b[:hl:hl], b[hl:], nil
}

// nextLarge reads the rest of a frame that did not fit in the read buffer:
// the header into body, then the payload into the handler's place for it,
// or after the header in body. Bytes the read buffer holds already are
// taken from there first.
func (fr *frameReader) nextLarge() (header, payload []byte, err error) {
	if fr.got < fr.hl {
		fr.grow(fr.hl)
		if err := fr.readInto(fr.body[:fr.hl], 0); err != nil {
			return nil, nil, err
		}
	}
	if fr.dst == nil {
		plen := fr.need - fr.hl
		if fr.place != nil {
			if p := fr.place(fr.body[:fr.hl:fr.hl], plen); len(p) == plen && plen > 0 {
				fr.dst, fr.placed = p, true
			}
		}
		if fr.dst == nil {
			fr.grow(fr.need)
			fr.dst = fr.body[fr.hl:fr.need]
		}
	}
	if err := fr.readInto(fr.dst, fr.hl); err != nil {
		return nil, nil, err
	}
	header, payload = fr.body[:fr.hl:fr.hl], fr.dst
	discard := fr.discard
	fr.need, fr.got, fr.dst, fr.placed, fr.discard = 0, 0, nil, false, false
	fr.afterLarge = true
	if discard {
		return fr.next()
	}
	return header, payload, nil
}

// abandon gives up the handler's place for the frame being read, if
// there is one: the rest of its payload goes into the reader's own
// buffer, and the frame is dropped once read, not delivered. The caller
// holds the stream's lock, so no read is writing into the place, and none
// will after.
func (fr *frameReader) abandon() {
	if !fr.placed {
		return
	}
	fr.grow(fr.need)
	fr.dst, fr.placed, fr.discard = fr.body[fr.hl:fr.need], false, true
}

// readInto fills b, the part of the frame from offset start on, reading
// until got reaches its end.
func (fr *frameReader) readInto(b []byte, start int) error {
	end := start + len(b)
	for fr.got < end {
		dst := b[fr.got-start:]
		if fr.r < fr.w {
			k := copy(dst, fr.rbuf[fr.r:fr.w])
			fr.r += k
			fr.got += k
			continue
		}
		n, err := fr.readSome(fr.read, dst)
		if err != nil {
			if err != errAgain && errors.Is(err, io.EOF) {
				err = fmt.Errorf("stream ended inside a %d-byte frame: %w", fr.need, io.ErrUnexpectedEOF)
			}
			return err
		}
		fr.got += n
	}
	return nil
}

// grow makes body hold at least n bytes, keeping the header read so far.
func (fr *frameReader) grow(n int) {
	if cap(fr.body) >= n {
		fr.body = fr.body[:cap(fr.body)]
		return
	}
	// Grow geometrically so a stream of slowly growing frames does not
	// reallocate each time, but never past what a valid frame can need.
	b := make([]byte, min(max(n, 2*cap(fr.body)), fr.maxHeader+fr.maxFrame))
	copy(b, fr.body[:min(fr.got, fr.hl, len(fr.body))])
	fr.body = b
}

// placing reports whether a frame is being read into the handler's place
// for it: if the stream ends now, the handler waits for a Deliver that
// never comes.
func (fr *frameReader) placing() bool { return fr.placed }

// headFill is how many bytes fill asks for when the next frame's wire
// header is needed. After a large frame it is only a wire header and the
// largest opaque header: a full read buffer would take in the first 64 KiB
// of the next large frame's payload, which then cost a second copy, from
// the read buffer to the frame's place; a stream of 1 MiB frames paid it
// on 6 % of its bytes, on the receiver, whose copying bounds the
// bandwidth. The price is a read per large frame, far less than that copy.
func (fr *frameReader) headFill() int {
	if fr.afterLarge {
		return sdi.WireHeaderSize + fr.maxHeader
	}
	return len(fr.rbuf)
}

// fill reads what the stream has into the read buffer, after moving the
// unparsed bytes to its start, asking for at most limit bytes.
func (fr *frameReader) fill(limit int) error {
	if fr.r > 0 {
		fr.w = copy(fr.rbuf, fr.rbuf[fr.r:fr.w])
		fr.r = 0
	}
	p := fr.rbuf[fr.w:]
	if len(p) > limit {
		p = p[:limit]
	}
	read := fr.read
	if fr.peek != nil {
		read = fr.peek
	}
	n, err := fr.readSome(read, p)
	fr.w += n
	return err
}

// readSome reads into p with read unless an earlier read came back short.
func (fr *frameReader) readSome(read func([]byte) (int, error), p []byte) (int, error) {
	if fr.short {
		return 0, errAgain
	}
	n, err := read(p)
	if err != nil {
		return 0, err
	}
	fr.short = n < len(p)
	return n, nil
}

// rearm lets next read from the stream again after a short read; callers
// do it when they come back to the connection (a new Poll, a wake-up).
func (fr *frameReader) rearm() { fr.short = false }
