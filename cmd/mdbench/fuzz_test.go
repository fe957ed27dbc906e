package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"8", "4K", "64KiB", "1M", "1mib", "0", "-1", "K", "999999999999M"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseSize(s)
		if err == nil && (n < 1 || n > 256<<20) {
			t.Fatalf("parseSize(%q) = %d, outside [1, 256 MiB]", s, n)
		}
	})
}

func FuzzParseOSU(f *testing.F) {
	f.Add([]byte("lat 8 0.5623\nlat 65536 6.4683\n"))
	f.Add([]byte("bw 8 47.7\nwarning: something\nmr 8 1e7\n"))
	f.Add([]byte("lat x 1\n"))
	f.Add([]byte("idle 1 NaN\n"))
	f.Add([]byte("allreduce 8 0.41\nbcast 1048576 43.02\nbarrier 0 0.25\nalltoall 65536 6.2\n"))
	f.Fuzz(func(t *testing.T, out []byte) {
		samples, err := parseOSU(out)
		if err != nil {
			return
		}
		for _, s := range samples {
			if s.Size < 0 || s.Value != s.Value {
				t.Fatalf("accepted %+v", s)
			}
		}
	})
}

func FuzzReadSamples(f *testing.F) {
	f.Add([]byte(resultPrefix + `{"test":"lat","size":8,"value":1.5}` + "\n"))
	f.Add([]byte(resultPrefix + "{\n"))
	f.Add([]byte(linksPrefix + `{"rank":1,"host":"mdbench-h0","links":[{"peer":0,"subdevice":"shm","frames":3,"bytes":24}]}` + "\n"))
	f.Fuzz(func(t *testing.T, out []byte) {
		_, _ = readRankOutput(bytes.NewReader(out), io.Discard)
	})
}

// FuzzLinks feeds arbitrary links lines of a launch of 1 to 8 ranks on 1
// to 4 pretend hosts: parsing and classifying them never panics, and what
// is classified adds up to what the ranks reported to other ranks.
func FuzzLinks(f *testing.F) {
	f.Add(`{"rank":1,"host":"mdbench-h0","links":[{"peer":0,"subdevice":"shm","frames":3,"bytes":24},{"peer":3,"subdevice":"tcp","frames":1,"bytes":8}]}`, uint8(4), uint8(2))
	f.Add(`{"rank":9,"host":"x","links":null}`, uint8(2), uint8(2))
	f.Add(`{"rank":0,"host":"mdbench-h0","links":[{"peer":-1}]}`, uint8(2), uint8(1))
	f.Fuzz(func(t *testing.T, line string, ranks, hosts uint8) {
		rl, err := parseLinks(line)
		if err != nil {
			return
		}
		p := placement{ranks: 1 + int(ranks)%8}
		p.hosts = 1 + int(hosts)%p.ranks
		fl, err := p.flows([]rankLinks{rl})
		if err != nil {
			return
		}
		var want, got uint64
		for _, l := range rl.Links {
			if l.Peer != rl.Rank {
				want += l.Frames
			}
		}
		for _, x := range fl {
			got += x.Frames
		}
		if got != want {
			t.Fatalf("flows %+v count %d frames, the ranks reported %d to others", fl, got, want)
		}
	})
}

// FuzzParseCPUTimes feeds arbitrary /proc/stat contents: no panic, and
// the steal ticks never exceed the total.
func FuzzParseCPUTimes(f *testing.F) {
	f.Add("cpu  10 1 5 100 2 0 3 40 0 0\n")
	f.Add("cpu 1 2 3\n")
	f.Fuzz(func(t *testing.T, stat string) {
		if c, ok := parseCPUTimes(stat); ok && c.steal > c.total {
			t.Fatalf("steal %d > total %d", c.steal, c.total)
		}
	})
}

// FuzzParseEnvSeries: a -vs-env value is refused or gives a named series
// of VAR=VALUE entries, each with a non-empty name.
func FuzzParseEnvSeries(f *testing.F) {
	for _, s := range []string{"ring:MD_SHM_SINGLE_COPY=0", "a:B=1,C=", ":A=1", "x:", "x:A", "md:A=1", "x:A=1,,B=2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		e, err := parseEnvSeries(v)
		if err != nil {
			return
		}
		if e.name == "" || slices.Contains(reservedSeries, e.name) || len(e.env) == 0 {
			t.Fatalf("parseEnvSeries(%q) accepted %+v", v, e)
		}
		for _, kv := range e.env {
			if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsRune(kv, 0) {
				t.Fatalf("parseEnvSeries(%q) accepted entry %q", v, kv)
			}
		}
	})
}

// FuzzParseBuildSeries: a -vs-build value is refused or names a series
// run by an executable file, given by its absolute path.
func FuzzParseBuildSeries(f *testing.F) {
	for _, s := range []string{"old:/bin/sh", "old:/etc/passwd", "old:/", ":/bin/sh", "x:", "md:/bin/sh", "a b:/bin/sh", "x:rel/path"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		e, err := parseBuildSeries(v)
		if err != nil {
			return
		}
		if e.name == "" || slices.Contains(reservedSeries, e.name) || !filepath.IsAbs(e.exe) || len(e.env) != 0 {
			t.Fatalf("parseBuildSeries(%q) accepted %+v", v, e)
		}
		if fi, err := os.Stat(e.exe); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			t.Fatalf("parseBuildSeries(%q) accepted %q, which is not an executable file", v, e.exe)
		}
	})
}
