package bootstrap

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// countingReader counts the bytes read from it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// FuzzReadSecret checks that readSecret returns the first line of its
// input, or an error, and never takes a byte past that line: what follows
// belongs to the application.
func FuzzReadSecret(f *testing.F) {
	for _, s := range []string{"abcd\nrest", "abcd\r\n", "", "\n", "\r\nx", strings.Repeat("a", maxSecretLine+1) + "\n", "no newline"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		cr := &countingReader{r: bytes.NewReader(in)}
		s, err := readSecret(cr)
		line, _, found := bytes.Cut(in, []byte("\n"))
		if limit := len(line) + 1; cr.n > limit {
			t.Fatalf("read %d bytes of %q, past its first line", cr.n, in)
		}
		if err != nil {
			return
		}
		if s == "" || len(s) > maxSecretLine || s != strings.TrimSuffix(string(line), "\r") {
			t.Fatalf("readSecret(%q) = %q", in, s)
		}
		if found && cr.n != len(line)+1 {
			t.Fatalf("read %d bytes of %q, want the first line and its newline", cr.n, in)
		}
	})
}
