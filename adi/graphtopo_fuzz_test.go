package adi

import (
	"context"
	"slices"
	"strings"
	"testing"
)

// fuzzGraph decodes a graph's index and edges from data: n = data[0]%17
// nodes, then a step of index per node (0 to 7, or down 1 to 16 for a
// byte from 0xF0 up, so that index falls now and then and may go
// negative), then the edges, node numbers from -1 to n (n and -1 being
// no node). With fit, edges is cut or padded with zeros to the length
// index asks for, so that most inputs are graphs.
func fuzzGraph(data []byte, fit bool) (index, edges []int) {
	if len(data) == 0 {
		return nil, nil
	}
	n := int(data[0] % 17)
	data = data[1:]
	at := 0
	for i := 0; i < n; i++ {
		var b byte
		if i < len(data) {
			b = data[i]
		}
		if b >= 0xF0 {
			at -= int(b&0x0F) + 1
		} else {
			at += int(b % 8)
		}
		index = append(index, at)
	}
	data = data[min(n, len(data)):]
	for _, b := range data {
		e := int(b % byte(n+2))
		edges = append(edges, e-1)
	}
	if fit && at >= 0 {
		for len(edges) < at {
			edges = append(edges, 0)
		}
		edges = edges[:at]
	}
	return index, edges
}

// graphValid says, the plain way, whether index and edges are a graph of
// at most size nodes.
func graphValid(index, edges []int, size int) bool {
	if len(index) > size {
		return false
	}
	prev := 0
	for _, x := range index {
		if x < prev { // also catches x < 0: prev starts at 0
			return false
		}
		prev = x
	}
	if prev != len(edges) {
		return false
	}
	for _, e := range edges {
		if e < 0 || e >= len(index) {
			return false
		}
	}
	return true
}

// FuzzGraphCreateArgs: checkGraph, which GraphCreate and GraphMap call on
// their index and edges, never panics, accepts exactly the graphs, and
// names the argument it refuses; on what it accepts, the Graph's queries,
// its symmetry check and the reordering work and agree with the plain
// reading of the lists.
func FuzzGraphCreateArgs(f *testing.F) {
	f.Add(uint8(4), true, []byte{4, 2, 2, 2, 2, 4, 2, 1, 3, 2, 4, 3, 1})          // ring of 4
	f.Add(uint8(5), true, []byte{5, 3, 1, 1, 1, 0, 2, 3, 4, 1, 1, 1})             // star and a lonely node
	f.Add(uint8(4), true, []byte{4, 5, 5, 5, 3, 2, 1, 4, 2, 3, 2, 1, 3, 2, 1, 2}) // loops and multi-edges
	f.Add(uint8(3), false, []byte{3, 1, 0xF1, 2, 1, 0})                           // falling index
	f.Add(uint8(4), false, []byte{4, 1, 1, 0xF1, 0})                              // falling, never negative
	f.Add(uint8(2), false, []byte{3, 1, 1, 1, 1, 2, 3})                           // more nodes than ranks
	f.Add(uint8(0), false, []byte{})
	f.Fuzz(func(t *testing.T, size uint8, fit bool, data []byte) {
		index, edges := fuzzGraph(data, fit)
		ranks := int(size % 20)
		err := checkGraph("graph create", index, edges, ranks)
		valid := graphValid(index, edges, ranks)
		if (err == nil) != valid {
			t.Fatalf("index %v edges %v on %d ranks: checkGraph says %v, but valid is %v", index, edges, ranks, err, valid)
		}
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "adi: graph create: index") && !strings.HasPrefix(msg, "adi: graph create: edges") {
				t.Fatalf("index %v edges %v: %q names neither index nor edges first", index, edges, msg)
			}
			return
		}
		g := &Graph{index: index, edges: edges}
		if n, m := g.Dims(); n != len(index) || m != len(edges) {
			t.Fatalf("dims %d %d of %v %v", n, m, index, edges)
		}
		var all []int
		count := make(map[[2]int]int)
		for r := range index {
			nb, err := g.Neighbors(r)
			if err != nil {
				t.Fatal(err)
			}
			if k, err := g.NeighborsCount(r); err != nil || k != len(nb) {
				t.Fatalf("node %d: count %d (%v) for %v", r, k, err, nb)
			}
			for _, u := range nb {
				count[[2]int{r, u}]++
			}
			all = append(all, nb...)
		}
		if !slices.Equal(all, edges) {
			t.Fatalf("neighbours %v, edges %v", all, edges)
		}
		symmetric := true
		for p, k := range count {
			if count[[2]int{p[1], p[0]}] != k {
				symmetric = false
			}
		}
		if asym := g.asymmetry(); (asym == nil) != symmetric {
			t.Fatalf("index %v edges %v: asymmetry %v, symmetric %v", index, edges, asym, symmetric)
		}
		// Reordering on two hosts, round-robin, gives each node a process.
		hosts, sites := make([]string, len(index)), make([]string, len(index))
		for p := range hosts {
			hosts[p] = string(rune('a' + p%2))
		}
		procOf, err := newPlacement(hosts, sites).mapGraph(context.Background(), index, edges)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(slices.Sorted(slices.Values(procOf)), identity(len(index))) {
			t.Fatalf("index %v edges %v: reordered onto %v, no permutation", index, edges, procOf)
		}
	})
}
