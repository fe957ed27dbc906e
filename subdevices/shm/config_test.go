package shm

import (
	"strings"
	"testing"
)

func TestParseConfig(t *testing.T) {
	tests := []struct {
		in   string
		ring uint64
		err  string
	}{
		{"", defaultRingBytes, ""},
		{" \n", defaultRingBytes, ""},
		{`{"ring_bytes": 65536}`, 65536, ""},
		{`{"ring_bytes": 65537}`, 0, "ring_bytes 65537 must be a power of two"},
		{`{"ring_bytes": 32768}`, 0, "must be a power of two in"},
		{`{"ring_bytes": -1}`, 0, "want {"},
		{`{"single_copy_min": -4}`, 0, "single_copy_min -4 must be positive"},
		{`{"ring": 65536}`, 0, `unknown field "ring"`},
		{`{} {}`, 0, "trailing data"},
		{`{"ring_bytes": 65536}}`, 0, "trailing data"},
		{`{}]`, 0, "trailing data"},
		{`[1]`, 0, "shm: config:"},
	}
	for _, tt := range tests {
		c, err := parseConfig([]byte(tt.in))
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("parseConfig(%q) = %+v, %v; want error %q", tt.in, c, err, tt.err)
			}
			continue
		}
		if err != nil || c.RingBytes != tt.ring || c.SingleCopyMin <= 0 {
			t.Errorf("parseConfig(%q) = %+v, %v; want ring_bytes %d and every default filled", tt.in, c, err, tt.ring)
		}
	}
}

// FuzzParseConfig checks that any config block either fails with an error
// that says it is shm's config, or gives one the subdevice can open with.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{"", `{"ring_bytes": 1048576, "single_copy": true, "single_copy_min": 16384}`, `{"ring_bytes": 3}`, `{"single_copy": null}`, `{} x`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		c, err := parseConfig(raw)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "shm: config: ") {
				t.Fatalf("error %q does not say where", err)
			}
			return
		}
		if c.RingBytes < minRingBytes || c.RingBytes > maxRingBytes || c.RingBytes&(c.RingBytes-1) != 0 ||
			c.SingleCopyMin < 1 || maxFrame(c.RingBytes) < 1 {
			t.Fatalf("parseConfig(%q) accepted %+v", raw, c)
		}
	})
}
