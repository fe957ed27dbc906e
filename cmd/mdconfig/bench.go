package main

import (
	"flag"
	"fmt"
	"io"
	"runtime"
	"syscall"
	"time"

	"github.com/hpc-multidevice/multidevice/conntable"
	"github.com/hpc-multidevice/multidevice/mdconfig"
)

// runBench generates every table of a synthetic cluster of clusters and
// reports time and memory. Tables are built one at a time and dropped (or
// encoded to JSON and dropped with -encode), so the numbers are those of
// the computation, not of the disk.
func runBench(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	clusters := fs.Int("clusters", 100, "number of clusters")
	hosts := fs.Int("hosts", 100, "hosts per cluster")
	encode := fs.Bool("encode", false, "also encode every table to JSON")
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
		return exitUsage
	}
	if *clusters < 1 || *hosts < 2 {
		fmt.Fprintln(stderr, "mdconfig bench: want -clusters >= 1 and -hosts >= 2")
		return exitUsage
	}
	src := mdconfig.SyntheticClusters(*clusters, *hosts)
	start := time.Now()
	d, diags := mdconfig.Parse(src, "synthetic.hcl")
	if diags.HasErrors() {
		fmt.Fprint(stderr, mdconfig.FormatDiagnostics(diags, src))
		return exitError
	}
	parsed := time.Since(start)
	fmt.Fprintf(stdout, "description: %d clusters x %d hosts = %d hosts, %d bytes of HCL, parsed and checked in %v\n",
		*clusters, *hosts, len(d.Hosts()), len(src), parsed.Round(time.Millisecond))

	start = time.Now()
	var tables, entries, bytes int
	for t := range d.Tables() {
		tables++
		entries += len(t.Peers)
		if *encode {
			data, err := t.Encode()
			if err != nil {
				fmt.Fprintf(stderr, "mdconfig bench: %v\n", err)
				return exitError
			}
			bytes += len(data)
		}
	}
	took := time.Since(start)
	fmt.Fprintf(stdout, "generated %d tables (%d entries) in %v: %v per table\n",
		tables, entries, took.Round(time.Millisecond), (took / time.Duration(tables)).Round(time.Microsecond))
	if *encode {
		fmt.Fprintf(stdout, "encoded %.1f MiB of JSON (%.1f KiB per table)\n", float64(bytes)/(1<<20), float64(bytes)/1024/float64(tables))
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	var ru syscall.Rusage
	rss := "unknown"
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		rss = fmt.Sprintf("%.1f MiB", float64(ru.Maxrss)/1024) // Linux reports KiB
	}
	fmt.Fprintf(stdout, "memory: peak RSS %s, heap obtained from the OS %.1f MiB, %.1f GiB allocated in total\n",
		rss, float64(ms.HeapSys)/(1<<20), float64(ms.TotalAlloc)/(1<<30))

	lookupBench(d, stdout)
	return exitOK
}

// lookupBench times the run-time side: resolving one host's table for a job
// with one rank per host, then Resolved.Lookup against a plain map access.
func lookupBench(d *mdconfig.Description, stdout io.Writer) {
	hostNames := d.Hosts()
	t, err := d.Table(hostNames[len(hostNames)/2])
	if err != nil {
		return
	}
	self := len(hostNames) / 2
	start := time.Now()
	res, err := t.Resolve(self, hostNames)
	if err != nil {
		fmt.Fprintf(stdout, "resolve: %v\n", err)
		return
	}
	resolveTook := time.Since(start)
	const n = 10_000_000
	sizes := []int{64, 8192, 1 << 20}
	sink := 0
	start = time.Now()
	for i := range n {
		sink += len(res.Lookup(i%len(hostNames), sizes[i%3]))
	}
	lookup := time.Since(start) / n
	m := make(map[int][]conntable.Hop, len(hostNames))
	for p := range hostNames {
		m[p] = res.Lookup(p, 64)
	}
	start = time.Now()
	for i := range n {
		sink += len(m[i%len(hostNames)])
	}
	mapAccess := time.Since(start) / n
	fmt.Fprintf(stdout, "run time: resolve one table for %d ranks %v; Lookup %v, map access %v (sink %d)\n",
		len(hostNames), resolveTook.Round(time.Microsecond), lookup, mapAccess, sink%7)
}
