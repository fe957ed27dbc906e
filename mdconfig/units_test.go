package mdconfig

import (
	"math"
	"slices"
	"strings"
	"testing"
)

func TestParseBandwidth(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want float64 // bytes per microsecond
		err  string
	}{
		{in: "100Mbit/s", want: 12.5},
		{in: "1.25GB/s", want: 1250},
		{in: "10Gbps", want: 1250},
		{in: "1MiB/s", want: 1.048576},
		{in: "8bit/s", want: 1e-6},
		{in: "0Mbit/s", err: "not positive"},
		{in: "-5MB/s", err: "not a bandwidth"},
		{in: "100", err: "no known unit"},
		{in: "100MB", err: "no known unit"},
		{in: "fast", err: "not a bandwidth"},
		{in: "1" + strings.Repeat("0", 300) + "TB/s", err: "is too large"}, // +Inf
		// So small that a message's cost overflowed to +Inf (or, divided
		// into bytes per microsecond, the bandwidth underflowed to 0): an
		// unusable link, silently.
		{in: "0." + strings.Repeat("0", 318) + "1bit/s", err: "is too small"},
		{in: "0.1bit/s", err: "at least 1bit/s"},
		// Units that were guessed at rather than refused.
		{in: "1Gbit", err: "one of B/s"},
		{in: "1Mbps/s", err: "one of B/s"},
		{in: "100/s", err: "one of B/s"},
		{in: "1kB/s", want: 1e-3},
		{in: "1kbps", want: 1.25e-4},
		{in: "1bit/s", want: 1.25e-7},
	} {
		got, err := parseBandwidth(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("parseBandwidth(%q) = %v, %v; want error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || math.Abs(got-tc.want) > 1e-9*tc.want {
			t.Errorf("parseBandwidth(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseLatencyAndPenalty(t *testing.T) {
	if v, err := parseLatency("1.5ms"); err != nil || v != 1500 {
		t.Errorf("parseLatency(1.5ms) = %v, %v", v, err)
	}
	if v, err := parseLatency("800ns"); err != nil || v != 0.8 {
		t.Errorf("parseLatency(800ns) = %v, %v", v, err)
	}
	for _, bad := range []string{"5", "-1us", "soon"} {
		if _, err := parseLatency(bad); err == nil {
			t.Errorf("parseLatency(%q) succeeded", bad)
		}
	}
	if v, err := parsePenalty("off"); err != nil || !math.IsInf(v, 1) {
		t.Errorf("parsePenalty(off) = %v, %v", v, err)
	}
	if _, err := parsePenalty("never"); err == nil || !strings.Contains(err.Error(), `"off"`) {
		t.Errorf("parsePenalty(never) error %v should mention off", err)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"512": 512, "64KiB": 65536, "1MiB": 1 << 20, "1.5MB": 1500000, "1 KiB": 1024} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for bad, msg := range map[string]string{
		"": "not a size", "-1": "not a size", "1MiB/s": "not a size", "lots": "not a size",
		"0": "too small; a size is at least 1 byte", "0.1": "too small",
		// It once said "a size is at least 1 byte".
		"8388608TiB": "too large; a size is at most 4294967296GiB",
	} {
		if _, err := ParseSize(bad); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseSize(%q) error %v, want one containing %q", bad, err, msg)
		}
	}
	for _, n := range []int64{1, 1000, 1024, 3 << 20, 1 << 30} {
		if got, err := ParseSize(FormatSize(n)); err != nil || got != n {
			t.Errorf("ParseSize(FormatSize(%d)) = %v, %v", n, got, err)
		}
	}
}

func TestParseFraction(t *testing.T) {
	for in, want := range map[string]float64{"5%": 0.05, "0%": 0, "0.1": 0.1} {
		if got, err := parseFraction(in); err != nil || math.Abs(got-want) > 1e-12 {
			t.Errorf("parseFraction(%q) = %v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"-1%", "150%", "x"} {
		if _, err := parseFraction(bad); err == nil {
			t.Errorf("parseFraction(%q) succeeded", bad)
		}
	}
}

func TestExpandHosts(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		err  string
	}{
		{in: "gw1", want: []string{"gw1"}},
		{in: "a[01-03]", want: []string{"a01", "a02", "a03"}},
		{in: "a[8-10]", want: []string{"a8", "a9", "a10"}},
		{in: "n[1,3,5-6].site", want: []string{"n1.site", "n3.site", "n5.site", "n6.site"}},
		{in: "r[1-2]n[1-2]", want: []string{"r1n1", "r1n2", "r2n1", "r2n2"}},
		// PMI ranks' hosts are "<hostname>#<node>" (bootstrap/pmi.go).
		{in: "node1#0", want: []string{"node1#0"}},
		{in: "node[1-2]#[0-1]", want: []string{"node1#0", "node1#1", "node2#0", "node2#1"}},
		{in: "", err: "empty"},
		{in: "a[01-16", err: "never closed"},
		{in: "a01]", err: "no matching"},
		{in: "a[]", err: "empty brackets"},
		{in: "a[16-01]", err: "backwards"},
		{in: "a[x-y]", err: "not a number"},
		{in: "a[1-]", err: "not a number"},
		{in: "a b", err: "cannot be part of a host name"},
		{in: "a@b", err: "cannot be part of a host name"},
		// A non-ASCII character is named whole: the message once
		// quoted its first byte, 'Ã' for 'ö', 'ä' and many more.
		{in: "knötchen", err: "character 3 ('ö') cannot"},
		{in: "ä", err: "character 1 ('ä') cannot"},
		{in: "a[1-2]€", err: "character 7 ('€') cannot"},
		{in: "n[1-999999999]", err: "more than"},
		{in: "a[1-1000]b[1-1000]", err: "more than"},
	} {
		got, err := expandHosts(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("expandHosts(%q) = %v, %v; want error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("expandHosts(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestCompactHosts(t *testing.T) {
	for _, pattern := range []string{"a[01-16]", "n[1,3,5-6]", "gw", "node7#[0-3]"} {
		names, err := expandHosts(pattern)
		if err != nil {
			t.Fatal(err)
		}
		if got := compactHosts(names); got != pattern {
			t.Errorf("compactHosts(expand(%q)) = %q", pattern, got)
		}
	}
}
