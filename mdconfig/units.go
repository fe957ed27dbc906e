package mdconfig

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Costs are kept in microseconds and bandwidths in bytes per microsecond
// (which is the same number as MB/s), so a link's cost for n bytes is
// latency + n/bandwidth with no further conversion.

// parseLatency reads a duration such as "5us", "1.5ms" or "800ns" and returns
// microseconds.
func parseLatency(s string) (float64, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration; write a number and a unit, e.g. \"5us\", \"1.2ms\", \"800ns\"", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("%q is negative; a latency is zero or more", s)
	}
	return float64(d) / float64(time.Microsecond), nil
}

// parsePenalty is parseLatency that also accepts "off": +Inf, a host that
// never forwards.
func parsePenalty(s string) (float64, error) {
	if strings.TrimSpace(s) == "off" {
		return math.Inf(1), nil
	}
	v, err := parseLatency(s)
	if err != nil {
		return 0, fmt.Errorf("%w, or \"off\" to forbid forwarding", err)
	}
	return v, nil
}

var byteUnits = map[string]float64{
	"": 1, "B": 1,
	"KB": 1e3, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
	"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
}

// bandwidthUnits maps every accepted bandwidth unit to bytes per second:
// a byte unit or "bit" unit per second, or bps. "1Gbit" (no "/s"),
// "1Mbps/s" and "100/s" are refused rather than guessed at.
var bandwidthUnits = func() map[string]float64 {
	m := map[string]float64{}
	for _, p := range []struct {
		name string
		f    float64
	}{{"", 1}, {"K", 1e3}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}} {
		m[p.name+"bit/s"] = p.f / 8
		m[p.name+"bps"] = p.f / 8
	}
	for u, f := range byteUnits {
		if u != "" {
			m[u+"/s"] = f
		}
	}
	return m
}()

// splitNumber separates "12.5MB/s" into 12.5 and "MB/s".
func splitNumber(s string) (float64, string, bool) {
	s = strings.TrimSpace(s)
	i := strings.IndexFunc(s, func(r rune) bool {
		return (r < '0' || r > '9') && r != '.'
	})
	if i < 0 {
		i = len(s)
	}
	v, err := strconv.ParseFloat(s[:i], 64)
	if err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, "", false
	}
	return v, strings.TrimSpace(s[i:]), true
}

// parseBandwidth reads "100Mbit/s", "1.25GB/s", "10Gbps", "900MiB/s" and
// returns bytes per microsecond.
func parseBandwidth(s string) (float64, error) {
	const hint = "write a positive number and a unit, e.g. \"100Mbit/s\", \"1.25GB/s\", \"10Gbps\", \"900MiB/s\""
	v, unit, ok := splitNumber(s)
	if !ok {
		return 0, fmt.Errorf("%q is not a bandwidth; %s", s, hint)
	}
	f, ok := bandwidthUnits[unit]
	if !ok {
		return 0, fmt.Errorf("%q has no known unit; write a number and one of B/s, KB/s, MB/s, GB/s, TB/s, KiB/s, MiB/s, GiB/s, TiB/s, bit/s, Kbit/s, Mbit/s, Gbit/s, Tbit/s, bps, Kbps, Mbps, Gbps or Tbps", s)
	}
	bytesPerSec := v * f
	if bytesPerSec <= 0 {
		return 0, fmt.Errorf("%q is not positive; a bandwidth must be greater than zero", s)
	}
	if bytesPerSec < 1.0/8 {
		// Below that the cost of a large message overflows to +Inf,
		// which would make the link unusable without saying so.
		return 0, fmt.Errorf("%q is too small; a bandwidth is at least 1bit/s", s)
	}
	if math.IsInf(bytesPerSec, 1) {
		// It would make every transfer free but for the latency.
		return 0, fmt.Errorf("%q is too large; %s", s, hint)
	}
	return bytesPerSec / 1e6, nil
}

// maxSize is the largest message size, far above any real message and far
// enough below the int64 limit that rounding cannot overflow.
const maxSize = 1 << 62

// ParseSize reads a message size such as "1MiB", "64KiB", "1500B" or "512"
// (bytes).
func ParseSize(s string) (int64, error) {
	v, unit, ok := splitNumber(s)
	f, known := byteUnits[unit]
	if !ok || !known {
		return 0, fmt.Errorf("%q is not a size; write bytes or a number and a unit, e.g. \"512\", \"64KiB\", \"1MiB\", \"1.5MB\"", s)
	}
	n := v * f
	if n < 1 {
		return 0, fmt.Errorf("%q is too small; a size is at least 1 byte", s)
	}
	if n > maxSize {
		return 0, fmt.Errorf("%q is too large; a size is at most %s (2^62 bytes)", s, FormatSize(maxSize))
	}
	return int64(math.Round(n)), nil
}

// parseFraction reads "5%" or a plain fraction such as "0.05".
func parseFraction(s string) (float64, error) {
	t := strings.TrimSpace(s)
	pct := strings.HasSuffix(t, "%")
	v, err := strconv.ParseFloat(strings.TrimSuffix(t, "%"), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, fmt.Errorf("%q is not a percentage; write e.g. \"5%%\" (or \"0%%\" for equal-cost routes only)", s)
	}
	if pct {
		v /= 100
	}
	if v > 1 {
		return 0, fmt.Errorf("%q is more than 100%%; alternatives that much worse are not alternatives", s)
	}
	return v, nil
}

// FormatSize prints a byte count with the largest binary unit that divides it.
func FormatSize(n int64) string {
	for _, u := range []struct {
		name string
		size int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.size && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// formatMicros prints a cost in microseconds with three decimals trimmed.
func formatMicros(us float64) string {
	if math.IsInf(us, 1) {
		return "off"
	}
	return strconv.FormatFloat(round3(us), 'f', -1, 64) + "us"
}

// round3 rounds to nanoseconds so that tables and golden files do not carry
// floating-point noise.
func round3(v float64) float64 { return math.Round(v*1000) / 1000 }
