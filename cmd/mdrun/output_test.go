package main

import "testing"

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
