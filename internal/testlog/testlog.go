// Package testlog routes go-hclog output into a test's log, at the level
// named by MP_TEST_LOG_LEVEL (trace, debug, info, warn, error), so a failing
// test can be rerun with the library's logs beside its own.
package testlog

import (
	"os"
	"strings"
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
