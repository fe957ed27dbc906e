package loglevel

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// TestFromEnv: a known level is taken, unset or empty is the default, and
// a typo keeps the default and says so (hclog alone logged at Info).
func TestFromEnv(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  hclog.Level
		warns bool
	}{
		{"", hclog.Warn, false},
		{"debug", hclog.Debug, false},
		{"ERROR", hclog.Error, false},
		{"off", hclog.Off, false},
		{"warning", hclog.Warn, true},
		{"verbose", hclog.Warn, true},
	} {
		t.Setenv("MD_TEST_LEVEL", tc.value)
		var out bytes.Buffer
		if got := FromEnv("MD_TEST_LEVEL", hclog.Warn, &out); got != tc.want {
			t.Errorf("%q: level %s, want %s", tc.value, got, tc.want)
		}
		if warned := strings.Contains(out.String(), "is not a log level"); warned != tc.warns {
			t.Errorf("%q: warned %v (%q), want %v", tc.value, warned, out.String(), tc.warns)
		}
	}
}
