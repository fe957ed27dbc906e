package mdconfig

import (
	"testing"
)

func benchDescription(b *testing.B, clusters, hosts int) *Description {
	b.Helper()
	src := SyntheticClusters(clusters, hosts)
	d, diags := Parse(src, "synthetic.hcl")
	if diags.HasErrors() {
		b.Fatal(FormatDiagnostics(diags, src))
	}
	return d
}

// BenchmarkTable computes the routes and table of one host of a
// 10-cluster, 1000-host description from scratch.
func BenchmarkTable(b *testing.B) {
	d := benchDescription(b, 10, 100)
	t := newTableBuilder(d)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h := int32(i % len(d.hosts))
		t.table(h, t.peers(h))
	}
}

// BenchmarkTables generates every table of the same description, sharing
// work between interchangeable hosts; the full-scale run (10,000 hosts) is
// "go run ./cmd/mdconfig bench".
func BenchmarkTables(b *testing.B) {
	d := benchDescription(b, 10, 100)
	b.ReportAllocs()
	for b.Loop() {
		n := 0
		for range d.Tables() {
			n++
		}
		if n != len(d.hosts) {
			b.Fatalf("%d tables for %d hosts", n, len(d.hosts))
		}
	}
}

// BenchmarkLookup is the run-time cost of choosing a route: a resolved
// table's Lookup, to compare with BenchmarkMapAccess.
func BenchmarkLookup(b *testing.B) {
	d := benchDescription(b, 10, 100)
	t, err := d.Table(d.hosts[150])
	if err != nil {
		b.Fatal(err)
	}
	res, err := t.Resolve(150, d.hosts)
	if err != nil {
		b.Fatal(err)
	}
	sizes := []int{64, 8192, 1 << 20}
	n := len(d.hosts)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if res.Lookup(i%n, sizes[i%3]) == nil && i%n != 150 {
			b.Fatal("no route")
		}
	}
}

// BenchmarkMapAccess is the yardstick for BenchmarkLookup.
func BenchmarkMapAccess(b *testing.B) {
	m := make(map[int][]int, 1000)
	for i := range 1000 {
		m[i] = []int{i}
	}
	for i := 0; b.Loop(); i++ {
		if m[i%1000] == nil {
			b.Fatal("missing")
		}
	}
}
