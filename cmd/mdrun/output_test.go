package main

import (
	"slices"
	"strings"
	"testing"
)

// TestLineWriterNotesPanic: a rank's standard error tells a Go panic from
// a plain exit status 2, with prefixes and without, where the report's
// first line may come in pieces and output is not cut into lines.
func TestLineWriterNotesPanic(t *testing.T) {
	tests := []struct {
		name   string
		writes []string
		want   bool
	}{
		{"panic", []string{"panic: boom\n"}, true},
		{"fatal error", []string{"fatal error: all goroutines are asleep\n"}, true},
		{"in pieces", []string{"some output\npa", "n", "ic: boom\n"}, true},
		{"after unterminated output", []string{"no newline", "\npanic: boom"}, true},
		{"not at a line's start", []string{"no panic: here\n"}, false},
		{"a line cut short", []string{"pan\nic: no\n"}, false},
		{"a long line's second piece", []string{strings.Repeat("x", maxLine) + "panic: not at a line's start\n"}, false},
		{"after a long line", []string{strings.Repeat("x", maxLine+3) + "\npanic: boom\n"}, true},
	}
	for _, tt := range tests {
		for _, prefix := range []bool{true, false} {
			w := &lineWriter{out: &syncWriter{w: &lockedBuffer{}}, raw: !prefix}
			if prefix {
				w.prefix = "[0] "
			}
			for _, s := range tt.writes {
				w.Write([]byte(s))
			}
			w.Flush()
			if w.panicked != tt.want {
				t.Errorf("%s, prefix %v: panicked %v, want %v", tt.name, prefix, w.panicked, tt.want)
			}
		}
	}
}

// TestLineWriterSplitsLongLines: a line over maxLine bytes goes out in
// pieces of exactly maxLine, however the rank's writes cut it, and one of
// exactly maxLine whole. Cut only once a write left maxLine bytes
// waiting, a line of 70000 bytes once came out whole.
func TestLineWriterSplitsLongLines(t *testing.T) {
	tests := []struct {
		name  string
		out   string
		lines []int // the lengths of the lines forwarded, prefix excluded
	}{
		{"short", "abc\n", []int{3}},
		{"exactly maxLine", strings.Repeat("x", maxLine) + "\n", []int{maxLine}},
		{"one over", strings.Repeat("x", maxLine+1) + "\n", []int{maxLine, 1}},
		{"70000 then a line", strings.Repeat("x", 70000) + "\nab\n", []int{maxLine, 70000 - maxLine, 2}},
		{"unterminated", strings.Repeat("x", 3*maxLine+5), []int{maxLine, maxLine, maxLine, 5}},
	}
	for _, tt := range tests {
		for _, chunk := range []int{1, 4096, 50000, len(tt.out)} {
			out := &lockedBuffer{}
			w := &lineWriter{out: &syncWriter{w: out}, prefix: "[0] "}
			for p := tt.out; len(p) > 0; p = p[min(chunk, len(p)):] {
				w.Write([]byte(p[:min(chunk, len(p))]))
			}
			w.Flush()
			var got []int
			for _, l := range strings.SplitAfter(out.String(), "\n") {
				if l != "" {
					got = append(got, len(l)-len("[0] \n"))
				}
			}
			if !slices.Equal(got, tt.lines) {
				t.Errorf("%s, written %d bytes at a time: lines of %v bytes, want %v", tt.name, chunk, got, tt.lines)
			}
		}
	}
}
