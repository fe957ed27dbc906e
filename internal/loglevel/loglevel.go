// Package loglevel reads the log level a user sets in the environment
// (MD_LOG_LEVEL). hclog takes a name it does not know, "warning" say,
// for its default, Info, and logs far more than asked without a word;
// here such a name is reported and the default kept.
package loglevel

import (
	"fmt"
	"io"
	"os"

	"github.com/hashicorp/go-hclog"
)

// FromEnv returns the level the environment variable name gives, or def
// when it is unset or empty. A value that names no level is reported on
// warn, naming the levels, and def is used.
func FromEnv(name string, def hclog.Level, warn io.Writer) hclog.Level {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	l := hclog.LevelFromString(v)
	if l == hclog.NoLevel {
		fmt.Fprintf(warn, "multidevice: %s=%q is not a log level (trace, debug, info, warn, error, off); logging at %s\n", name, v, def)
		return def
	}
	return l
}
