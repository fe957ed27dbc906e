package main

import (
	"bytes"
	"io"
	"slices"
	"sync"
)

// maxLine bounds how much of one line is held back waiting for its newline;
// a longer line is forwarded in pieces.
const maxLine = 64 << 10

// syncWriter serialises whole lines onto one destination, so lines of
// different ranks (and mdrun's own messages) never mix. It is safe for
// concurrent use.
type syncWriter struct {
	mu  sync.Mutex
	w   io.Writer
	err error // the first failed write's: EPIPE when the reader went away (mdrun ... | head)
	// lost, if not nil, is closed when a write first fails, so that the
	// job ends as a program whose output is gone does.
	lost chan struct{}
}

// failure returns the error of the write that failed, nil before.
func (s *syncWriter) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Write writes p in one call; hclog writes whole lines through it. Once a
// write has failed it drops what comes, and reports success: the ranks'
// pipes must keep draining, or ranks would block on a full pipe instead
// of ending with the job.
func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return len(p), nil
	}
	if _, err := s.w.Write(p); err != nil {
		s.err = err
		if s.lost != nil {
			close(s.lost)
		}
	}
	return len(p), nil
}

// panicMarks start the lines with which the Go runtime reports a panic or
// a fatal error.
var panicMarks = [][]byte{[]byte("panic: "), []byte("fatal error: ")}

// markRoom is more than the longest of panicMarks.
const markRoom = 16

// isPanic reports whether line starts as a panic report does.
func isPanic(line []byte) bool {
	return slices.ContainsFunc(panicMarks, func(m []byte) bool { return bytes.HasPrefix(line, m) })
}

// lineWriter receives one output stream of one rank (os/exec copies into
// it from a single goroutine) and forwards it line by line with a prefix,
// or, raw, as it comes. It is not safe for concurrent use.
type lineWriter struct {
	out    *syncWriter
	prefix string
	// raw passes the output on unchanged (-prefix=false): not cut into
	// lines, nor a newline added, so that binary output arrives whole.
	// Each piece read from the rank is still written in one call, so
	// ranks mix only between pieces.
	raw bool
	buf []byte
	// mid says a full piece of a long line went out last, without its
	// newline: the next piece does not start a line, and is no panic
	// report, whatever it starts with. cut says that piece ended the last
	// write: a newline right after it ends that line, and is no empty
	// line of its own.
	mid, cut bool
	// start holds the beginning of the current line when raw, at most
	// markRoom bytes, to find a panic mark written in pieces.
	start []byte
	// panicked records a line starting the way the Go runtime reports a
	// panic or fatal error, to tell a panic from a plain exit status 2.
	panicked bool
}

func (w *lineWriter) Write(p []byte) (int, error) {
	n := len(p)
	if w.raw {
		w.notePanics(p)
		_, err := w.out.Write(p)
		return n, err
	}
	// A line goes out in pieces of maxLine bytes, its last piece at its
	// newline. Cut only once a write left maxLine bytes waiting, a line
	// of up to maxLine plus a read's bytes once came out whole.
	if w.cut && len(p) > 0 {
		if p[0] == '\n' {
			p = p[1:]
		}
		w.cut = false
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		end := i
		if i < 0 {
			end = len(p)
		}
		take := min(end, maxLine-len(w.buf))
		w.buf = append(w.buf, p[:take]...)
		p = p[take:]
		piece := false
		switch {
		case take == end && i >= 0: // the line ends here
			p = p[1:]
		case len(w.buf) < maxLine: // the rest of the line is to come
			return n, nil
		default: // a full piece; the newline may be the next write's
			piece, w.cut = true, len(p) == 0
		}
		err := w.emit()
		w.mid = piece
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// Flush forwards a last line that had no newline.
func (w *lineWriter) Flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	err := w.emit()
	w.mid = false
	return err
}

// notePanics looks for a panic report in raw output, p being the next
// piece of it.
func (w *lineWriter) notePanics(p []byte) {
	for !w.panicked {
		line, rest, more := bytes.Cut(p, []byte("\n"))
		if room := markRoom - len(w.start); room > 0 {
			w.start = append(w.start, line[:min(room, len(line))]...)
		}
		w.panicked = isPanic(w.start)
		if !more {
			return
		}
		w.start, p = w.start[:0], rest
	}
}

func (w *lineWriter) emit() error {
	if !w.mid && isPanic(w.buf) {
		w.panicked = true
	}
	line := make([]byte, 0, len(w.prefix)+len(w.buf)+1)
	line = append(line, w.prefix...)
	line = append(line, w.buf...)
	line = append(line, '\n')
	w.buf = w.buf[:0]
	_, err := w.out.Write(line)
	return err
}
