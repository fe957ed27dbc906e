package verbs

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
)

func TestParseConfig(t *testing.T) {
	defaults := config{settings: rdma.Settings{Exclusivity: defaultExclusivity}}
	tests := []struct {
		name string
		in   string
		want config
	}{
		{"empty", "", defaults},
		{"blank", " \n\t", defaults},
		{"empty object", "{}", defaults},
		{"null", "null", defaults},
		{"device and port", `{"device": "mlx5_0", "port": 2}`,
			config{device: "mlx5_0", port: 2, settings: defaults.settings}},
		{"ipv4 address", `{"address": "10.1.0.7"}`,
			config{address: netip.MustParseAddr("10.1.0.7"), settings: defaults.settings}},
		{"mapped address is unmapped", `{"address": "::ffff:10.1.0.7"}`,
			config{address: netip.MustParseAddr("10.1.0.7"), settings: defaults.settings}},
		{"ipv6 address", `{"address": "fd00::7"}`,
			config{address: netip.MustParseAddr("fd00::7"), settings: defaults.settings}},
		{"engine keys", `{"eager_bytes": 16384, "recv_slots": 64, "exclusivity": 30}`,
			config{settings: rdma.Settings{EagerBytes: 16384, RecvSlots: 64, Exclusivity: 30}}},
		{"engine zeros mean defaults", `{"eager_bytes": 0, "recv_slots": 0}`, defaults},
		{"largest port", `{"port": 255}`, config{port: 255, settings: defaults.settings}},
		{"odd but valid device name", `{"device": "rxe-eth0.1"}`,
			config{device: "rxe-eth0.1", settings: defaults.settings}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseConfig([]byte(tt.in))
			if err != nil {
				t.Fatalf("parseConfig(%q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Fatalf("parseConfig(%q) = %+v, want %+v", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string // in the error
	}{
		{"unknown key", `{"devcie": "mlx5_0"}`, `unknown field "devcie"`},
		{"known keys listed", `{"gid_index": 3}`, "known keys: device, port, address"},
		{"not an object", `[1]`, "verbs: config:"},
		{"trailing data", `{} {}`, "trailing data"},
		{"bad json", `{"port": }`, "verbs: config:"},
		{"empty device", `{"device": ""}`, `device ""`},
		{"device with slash", `{"device": "../mlx5_0"}`, `character '/'`},
		{"dot device", `{"device": ".."}`, "not a device name"},
		{"long device", `{"device": "` + strings.Repeat("m", 65) + `"}`, "1 to 64 characters"},
		{"device not a string", `{"device": 5}`, "verbs: config:"},
		{"port zero", `{"port": 0}`, "port 0 must be in [1, 255]"},
		{"port too big", `{"port": 256}`, "port 256 must be in [1, 255]"},
		{"port fraction", `{"port": 1.5}`, "verbs: config:"},
		{"address not ip", `{"address": "ib0"}`, `address "ib0": want an IP address`},
		{"address with port", `{"address": "10.0.0.1:7000"}`, "want an IP address"},
		{"address unspecified", `{"address": "0.0.0.0"}`, "unspecified"},
		{"address multicast", `{"address": "ff02::1"}`, "multicast"},
		{"address loopback", `{"address": "127.0.0.1"}`, "loopback"},
		{"address link-local v6", `{"address": "fe80::1"}`, "link-local"},
		{"address zone", `{"address": "fd00::1%ib0"}`, "zones"},
		{"eager too small", `{"eager_bytes": 100}`, "eager_bytes 100: must be in"},
		{"eager too large", `{"eager_bytes": 2097152}`, "eager_bytes 2097152"},
		{"eager negative", `{"eager_bytes": -1}`, "eager_bytes -1"},
		{"recv slots too few", `{"recv_slots": 2}`, "recv_slots 2"},
		{"recv slots too many", `{"recv_slots": 4096}`, "recv_slots 4096"},
		{"exclusivity zero", `{"exclusivity": 0}`, "exclusivity 0 must be in [1, 4294967295]"},
		{"exclusivity negative", `{"exclusivity": -3}`, "exclusivity -3"},
		{"exclusivity too big", `{"exclusivity": 4294967296}`, "exclusivity 4294967296"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseConfig([]byte(tt.in))
			if err == nil {
				t.Fatalf("parseConfig(%q) succeeded, want an error saying %q", tt.in, tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "verbs: config: ") {
				t.Fatalf("parseConfig(%q) = %q, want \"verbs: config: ...%s...\"", tt.in, err, tt.want)
			}
			if errors.Is(err, rdma.ErrNoDevice) {
				t.Fatalf("parseConfig(%q) = %q wraps ErrNoDevice; config errors must not", tt.in, err)
			}
		})
	}
}

// FuzzParseConfig feeds parseConfig arbitrary config blocks (plugins.hcl's
// JSON for verbs): it must never panic, every refusal must say it is the
// verbs config's, and what it accepts must be settings the engine takes.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{"", "{}", `{"port": 1}`, `{"eager_bytes": 4096, "recv_slots": 64}`, `{"exclusivity": 0}`, `{"port": 1} {}`, `{"nope": 1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := parseConfig(b)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "verbs: config: ") {
				t.Fatalf("parseConfig(%q): %q does not say whose config", b, err)
			}
			return
		}
		if err := c.settings.Validate(); err != nil {
			t.Fatalf("parseConfig(%q) accepted settings the engine refuses: %v", b, err)
		}
	})
}
