// Package testlog routes go-hclog output into a test's log, at the level
// named by MP_TEST_LOG_LEVEL (trace, debug, info, warn, error), so a failing
// test can be rerun with the library's logs beside its own.
package testlog

import (
	"bytes"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// New returns a logger named name that writes to t.Log at the level in
// MP_TEST_LOG_LEVEL, or at def when that is unset (hclog.Off for silence).
func New(t testing.TB, name string, def hclog.Level) hclog.Logger {
	level := hclog.LevelFromString(os.Getenv("MP_TEST_LOG_LEVEL"))
	if level == hclog.NoLevel {
		level = def
	}
	return hclog.New(&hclog.LoggerOptions{Name: name, Level: level, Output: writer{t}})
}

type writer struct{ t testing.TB }

func (w writer) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// Buffer is a log destination a test reads while the code under test
// writes to it from its own goroutines; it is safe for concurrent use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
