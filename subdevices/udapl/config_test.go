package udapl

import (
	"strings"
	"testing"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
)

func TestParseConfig(t *testing.T) {
	defaults := config{settings: rdma.Settings{Exclusivity: defaultExclusivity}}
	tests := []struct {
		name    string
		in      string
		want    config
		wantErr string // substring of the error; empty for success
	}{
		{name: "empty", in: "", want: defaults},
		{name: "blank", in: " \n\t", want: defaults},
		{name: "empty object", in: "{}", want: defaults},
		{name: "all keys", in: `{"ia": "ofa-v2-ib1", "port": 7000, "eager_bytes": 4096, "recv_slots": 64, "exclusivity": 12}`,
			want: config{ia: "ofa-v2-ib1", port: 7000, settings: rdma.Settings{EagerBytes: 4096, RecvSlots: 64, Exclusivity: 12}}},
		{name: "zero engine keys mean defaults", in: `{"eager_bytes": 0, "recv_slots": 0}`, want: defaults},
		{name: "port bounds", in: `{"port": 65535}`, want: config{port: 65535, settings: defaults.settings}},
		{name: "unknown key", in: `{"device": "mlx5_0"}`, wantErr: `unknown field "device"`},
		{name: "unknown key lists known", in: `{"device": "mlx5_0"}`, wantErr: "known keys: ia, port, eager_bytes, recv_slots, exclusivity"},
		{name: "not an object", in: `[1]`, wantErr: "udapl: config:"},
		{name: "trailing data", in: `{} {}`, wantErr: "trailing data"},
		{name: "wrong type", in: `{"port": "7000"}`, wantErr: "port"},
		{name: "empty ia", in: `{"ia": ""}`, wantErr: `ia ""`},
		{name: "ia with NUL", in: `{"ia": "ofa\u0000"}`, wantErr: "ia"},
		{name: "ia too long", in: `{"ia": "` + strings.Repeat("x", maxIANameLen+1) + `"}`, wantErr: "1 to 255 bytes"},
		{name: "port zero", in: `{"port": 0}`, wantErr: "port 0 must be in [1, 65535]"},
		{name: "port too big", in: `{"port": 65536}`, wantErr: "port 65536"},
		{name: "eager too small", in: `{"eager_bytes": 100}`, wantErr: "eager_bytes 100: must be in [256, 1048576]"},
		{name: "eager negative", in: `{"eager_bytes": -1}`, wantErr: "eager_bytes -1"},
		{name: "eager beyond int32", in: `{"eager_bytes": 4294967296}`, wantErr: "eager_bytes 4294967296"},
		{name: "slots too many", in: `{"recv_slots": 2000}`, wantErr: "recv_slots 2000: must be in [4, 1024]"},
		{name: "slots beyond int32", in: `{"recv_slots": -4294967296}`, wantErr: "recv_slots -4294967296"},
		{name: "exclusivity zero", in: `{"exclusivity": 0}`, wantErr: "exclusivity 0 must be in [1, 4294967295]"},
		{name: "exclusivity too big", in: `{"exclusivity": 4294967296}`, wantErr: "exclusivity 4294967296"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseConfig([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("parseConfig(%q) = %+v, want an error containing %q", tt.in, got, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.wantErr) || !strings.HasPrefix(err.Error(), "udapl: config: ") {
					t.Fatalf("parseConfig(%q) error %q, want it to start with \"udapl: config: \" and contain %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseConfig(%q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Fatalf("parseConfig(%q) = %+v, want %+v", tt.in, got, tt.want)
			}
		})
	}
}

// TestDefaultExclusivity guards the ordering the package doc promises.
func TestDefaultExclusivity(t *testing.T) {
	const tcp, verbs = 10, 20
	if defaultExclusivity <= tcp || defaultExclusivity >= verbs {
		t.Fatalf("default exclusivity %d is not between tcp's %d and verbs' %d", defaultExclusivity, tcp, verbs)
	}
}

// FuzzParseConfig feeds parseConfig arbitrary config blocks (plugins.hcl's
// JSON for udapl): it must never panic, every refusal must say it is the
// udapl config's, and what it accepts must be settings the engine takes.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{"", "{}", `{"port": 1}`, `{"eager_bytes": 4096, "recv_slots": 64}`, `{"exclusivity": 0}`, `{"port": 1} {}`, `{"nope": 1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := parseConfig(b)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "udapl: config: ") {
				t.Fatalf("parseConfig(%q): %q does not say whose config", b, err)
			}
			return
		}
		if err := c.settings.Validate(); err != nil {
			t.Fatalf("parseConfig(%q) accepted settings the engine refuses: %v", b, err)
		}
	})
}
