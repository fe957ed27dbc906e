package tcp

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/hpc-multidevice/multidevice/sdi"
)

func encodeFrame(header, payload []byte) []byte {
	b := make([]byte, sdi.WireHeaderSize, sdi.WireHeaderSize+len(header)+len(payload))
	sdi.WireHeader{HeaderLen: uint16(len(header)), PayloadLen: uint32(len(payload))}.Put(b)
	b = append(b, header...)
	return append(b, payload...)
}

// trickle plays a non-blocking socket that receives stream in pieces of at
// most chunk bytes (all at once when chunk is 0), with nothing to read
// (errAgain) before each piece, and then the end of the stream.
func trickle(stream []byte, chunk int) func([]byte) (int, error) {
	again := true
	return func(p []byte) (int, error) {
		if len(stream) == 0 {
			return 0, io.EOF
		}
		if again {
			again = false
			return 0, errAgain
		}
		again = true
		n := len(p)
		if chunk > 0 {
			n = min(n, chunk)
		}
		n = copy(p[:n], stream)
		stream = stream[n:]
		return n, nil
	}
}

// nextFrame calls next until it returns something other than errAgain,
// rearming the reader after each errAgain.
// Between two errAgain a trickle hands over at least a byte, so more
// errAgain than any test stream has bytes means next lost track.
func nextFrame(t testing.TB, fr *frameReader) (header, payload []byte, err error) {
	for again := 0; ; again++ {
		header, payload, err = fr.next()
		if !errors.Is(err, errAgain) {
			return header, payload, err
		}
		fr.rearm() // as a poller coming back does
		if again > 4<<20 {
			t.Fatalf("next() said errAgain %d times in a row", again)
		}
	}
}

func TestFrameReader(t *testing.T) {
	frames := [][2][]byte{
		{nil, nil},
		{[]byte("h"), nil},
		{nil, []byte("payload")},
		{bytes.Repeat([]byte{1}, maxHeader), bytes.Repeat([]byte{2}, maxFrame)},
		{[]byte("after the big one"), []byte("x")},
		{nil, bytes.Repeat([]byte{3}, readBufSize-sdi.WireHeaderSize)}, // fills the read buffer exactly
		{nil, bytes.Repeat([]byte{4}, readBufSize-sdi.WireHeaderSize+1)},
		{[]byte("keep"), bytes.Repeat([]byte{5}, readBufSize)}, // the placer declines it
		{[]byte("last"), nil},
	}
	var stream []byte
	for _, f := range frames {
		stream = append(stream, encodeFrame(f[0], f[1])...)
	}
	for _, placing := range []bool{false, true} {
		for _, chunk := range []int{0, 1, 7, 4096, readBufSize + 3} {
			fr := newFrameReader(trickle(stream, chunk), maxHeader, maxFrame)
			// The placer, like sdi.Placer, is asked only for frames read
			// past the read buffer; it gives each a slice of its own,
			// except the frame whose header says "keep".
			var placed []byte
			asked := 0
			if placing {
				fr.place = func(header []byte, n int) []byte {
					asked++
					if string(header) == "keep" {
						return nil
					}
					placed = make([]byte, n)
					return placed
				}
			}
			for i, f := range frames {
				placed, asked = nil, 0
				h, p, err := nextFrame(t, fr)
				if err != nil {
					t.Fatalf("placing %v, chunk %d: frame %d: %v", placing, chunk, i, err)
				}
				if !bytes.Equal(h, f[0]) || !bytes.Equal(p, f[1]) {
					t.Fatalf("placing %v, chunk %d: frame %d: got %d+%d bytes, want %d+%d", placing, chunk, i, len(h), len(p), len(f[0]), len(f[1]))
				}
				if cap(h) != len(h) {
					t.Fatalf("placing %v, chunk %d: frame %d: header has spare capacity %d into the payload", placing, chunk, i, cap(h)-len(h))
				}
				large := sdi.WireHeaderSize+len(f[0])+len(f[1]) > readBufSize
				if want := placing && large; (asked == 1) != want || asked > 1 {
					t.Fatalf("placing %v, chunk %d: frame %d of %d bytes: the placer was asked %d times", placing, chunk, i, len(f[1]), asked)
				}
				if placed != nil && &p[0] != &placed[0] {
					t.Fatalf("chunk %d: frame %d: payload delivered from elsewhere than its place", chunk, i)
				}
			}
			if _, _, err := nextFrame(t, fr); err != io.EOF {
				t.Fatalf("placing %v, chunk %d: after the last frame: %v, want io.EOF", placing, chunk, err)
			}
		}
	}
}

func TestFrameReaderErrors(t *testing.T) {
	valid := encodeFrame([]byte("hdr"), []byte("payload"))
	big := encodeFrame(nil, make([]byte, readBufSize))
	tests := []struct {
		name     string
		in       []byte
		badFrame bool // wraps sdi.ErrBadFrame
	}{
		{"partial wire header", valid[:5], false},
		{"partial body", valid[:len(valid)-1], false},
		{"partial large body", big[:len(big)-1], false},
		{"bad magic", append([]byte{0, 0}, valid[2:]...), true},
		{"flags", func() []byte { b := bytes.Clone(valid); b[3] = 1; return b }(), true},
		{"payload beyond MaxFrame", encodeFrame(nil, make([]byte, maxFrame+1)), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fr := newFrameReader(trickle(tt.in, 0), maxHeader, maxFrame)
			_, _, err := nextFrame(t, fr)
			if err == nil || err == io.EOF {
				t.Fatalf("next() = %v, want an error", err)
			}
			if got := errors.Is(err, sdi.ErrBadFrame); got != tt.badFrame {
				t.Fatalf("next() = %v; wraps ErrBadFrame: %v, want %v", err, got, tt.badFrame)
			}
			if tt.badFrame && cap(fr.body) != 0 {
				t.Fatalf("allocated %d bytes for a frame it rejected", cap(fr.body))
			}
		})
	}
}

// FuzzFrameReader feeds arbitrary streams, in arbitrary pieces with pauses
// between them, to the frame reader: it must not panic, must return frames
// within the limits and exactly as they were on the stream, and must never
// grow its buffer beyond what a valid frame needs.
func FuzzFrameReader(f *testing.F) {
	f.Add(encodeFrame([]byte("hdr"), []byte("payload")), uint8(0))
	f.Add(append(encodeFrame(nil, nil), encodeFrame([]byte{1}, bytes.Repeat([]byte{9}, 300))...), uint8(5))
	f.Add(encodeFrame(bytes.Repeat([]byte{1}, maxHeader), nil), uint8(1))
	f.Add([]byte{0x4d, 0x44, 1, 0, 0xff, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff}, uint8(3))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"), uint8(0))
	f.Fuzz(func(t *testing.T, b []byte, chunk uint8) {
		// Small limits so the fuzzer reaches "too large" easily, and a
		// small read buffer so it reaches frames read past it.
		const maxH, maxP = 16, 64
		fr := newFrameReader(trickle(b, int(chunk)), maxH, maxP)
		fr.rbuf = make([]byte, 32)
		if chunk%2 == 1 {
			// Large frames go to a place of their own, except every
			// third one.
			asked := 0
			fr.place = func(_ []byte, n int) []byte {
				if asked++; asked%3 == 0 {
					return nil
				}
				return make([]byte, n)
			}
		}
		consumed := 0
		for {
			h, p, err := nextFrame(t, fr)
			if err != nil {
				if err == io.EOF && consumed != len(b) {
					t.Fatalf("clean EOF after %d of %d bytes", consumed, len(b))
				}
				break
			}
			if len(h) > maxH || len(p) > maxP {
				t.Fatalf("frame of %d+%d bytes beyond limits %d+%d", len(h), len(p), maxH, maxP)
			}
			if !bytes.Equal(encodeFrame(h, p), b[consumed:consumed+sdi.WireHeaderSize+len(h)+len(p)]) {
				t.Fatalf("frame at offset %d does not match its bytes", consumed)
			}
			consumed += sdi.WireHeaderSize + len(h) + len(p)
		}
		if cap(fr.body) > maxH+maxP {
			t.Fatalf("buffer grew to %d bytes, limit %d", cap(fr.body), maxH+maxP)
		}
	})
}

// TestFrameReaderLargeAfterLarge checks that a large frame following a
// large one is not read into the read buffer beyond its headers: what
// lands there is copied a second time, into the frame's place.
func TestFrameReaderLargeAfterLarge(t *testing.T) {
	big := bytes.Repeat([]byte{7}, 4*readBufSize)
	tests := []struct {
		name   string
		frames [][2][]byte
		// most bytes the last frame may take through the read buffer
		limit int
	}{
		{"large after large", [][2][]byte{{[]byte("a"), big}, {[]byte("b"), big}}, sdi.WireHeaderSize + maxHeader},
		{"small after large", [][2][]byte{{[]byte("a"), big}, {[]byte("b"), []byte("8 bytes!")}}, sdi.WireHeaderSize + maxHeader},
		{"small after small", [][2][]byte{{[]byte("a"), nil}, {[]byte("b"), big}}, readBufSize},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stream []byte
			for _, f := range tt.frames {
				stream = append(stream, encodeFrame(f[0], f[1])...)
			}
			var fr *frameReader
			src := trickle(stream, 0)
			buffered := 0 // bytes read into the read buffer
			fr = newFrameReader(func(p []byte) (int, error) {
				n, err := src(p)
				if intoReadBuffer(fr, p) {
					buffered += n
				}
				return n, err
			}, maxHeader, maxFrame)
			for i, f := range tt.frames {
				if i == len(tt.frames)-1 {
					buffered = fr.w - fr.r // already there counts too
				}
				h, p, err := nextFrame(t, fr)
				if err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
				if !bytes.Equal(h, f[0]) || !bytes.Equal(p, f[1]) {
					t.Fatalf("frame %d: got %d+%d bytes, not what was sent", i, len(h), len(p))
				}
			}
			if buffered > tt.limit {
				t.Errorf("the last frame took %d bytes through the read buffer, want at most %d", buffered, tt.limit)
			}
		})
	}
}

// intoReadBuffer reports whether p is a part of fr's read buffer: they
// end at the same array element.
func intoReadBuffer(fr *frameReader, p []byte) bool {
	return cap(p) > 0 && &p[:cap(p)][cap(p)-1] == &fr.rbuf[:cap(fr.rbuf)][cap(fr.rbuf)-1]
}

// TestFrameReaderAbandon: a frame whose place is given up halfway through
// (the peer was reported down, and the handler may reuse the place) gets
// no more bytes of its payload in that place and is not delivered; the
// frame after it is.
func TestFrameReaderAbandon(t *testing.T) {
	big := bytes.Repeat([]byte{7}, 3*readBufSize)
	stream := append(encodeFrame([]byte("placed"), big), encodeFrame([]byte("next"), []byte("ok"))...)
	fr := newFrameReader(trickle(stream, readBufSize/2), maxHeader, maxFrame)
	var place []byte
	fr.place = func(header []byte, n int) []byte {
		if string(header) != "placed" {
			return nil
		}
		place = make([]byte, n)
		return place
	}
	for place == nil || !bytes.Contains(place, []byte{7}) { // part of the payload is in its place
		if _, _, err := fr.next(); !errors.Is(err, errAgain) {
			t.Fatalf("before the placed frame was complete: %v", err)
		}
		fr.rearm()
	}
	fr.abandon()
	written := bytes.Count(place, []byte{7})
	h, p, err := nextFrame(t, fr)
	if err != nil || string(h) != "next" || string(p) != "ok" {
		t.Fatalf("after the abandoned frame: %q %q %v, want the next frame", h, p, err)
	}
	if n := bytes.Count(place, []byte{7}); n != written {
		t.Fatalf("%d bytes were written into the place after it was given up", n-written)
	}
	if written == len(big) {
		t.Fatal("the whole payload was in its place before abandon: the test proves nothing")
	}
}
