package sched

import (
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestCPUSet(t *testing.T) {
	tests := []struct {
		s     CPUSet
		str   string
		count int
	}{
		{nil, "unknown", 0},
		{CPUSet{0}, "none", 0},
		{CPUs(0), "0", 1},
		{CPUs(0, 1, 2, 3, 8), "0-3,8", 5},
		{CPUs(1, 3, 5), "1,3,5", 3},
		{CPUs(62, 63, 64, 65, 200), "62-65,200", 5},
		{CPUs(127), "127", 1},
	}
	for _, tt := range tests {
		if got := tt.s.String(); got != tt.str {
			t.Errorf("%#v.String() = %q, want %q", tt.s, got, tt.str)
		}
		if got := tt.s.Count(); got != tt.count {
			t.Errorf("%v.Count() = %d, want %d", tt.s, got, tt.count)
		}
		d, err := DecodeCPUSet(tt.s.Encode())
		if err != nil {
			t.Errorf("decode %v: %v", tt.s, err)
		}
		if d.String() != tt.str && tt.count > 0 {
			t.Errorf("%v came back as %v", tt.s, d)
		}
	}
}

func TestCPUSetList(t *testing.T) {
	s := CPUs(2, 3, 70)
	if got := s.List(); !slices.Equal(got, []int{2, 3, 70}) {
		t.Errorf("List() = %v", got)
	}
	for cpu, want := range map[int]bool{-1: false, 2: true, 4: false, 70: true, 128: false} {
		if s.Has(cpu) != want {
			t.Errorf("Has(%d) = %v", cpu, !want)
		}
	}
	if got := CPUSet(nil).List(); len(got) != 0 {
		t.Errorf("the unknown set lists %v", got)
	}
}

func TestCPUSetOverlapUnion(t *testing.T) {
	tests := []struct {
		a, b               CPUSet
		overlap            bool
		union, both, aOnly string
	}{
		{CPUs(0), CPUs(1), false, "0-1", "none", "0"},
		{CPUs(0, 1), CPUs(1), true, "0-1", "1", "0"},
		{CPUs(1), CPUs(0, 1, 70), true, "0-1,70", "1", "none"},
		{CPUs(1, 70), CPUs(1), true, "1,70", "1", "70"},
		{CPUs(70), CPUs(3), false, "3,70", "none", "70"},
		{nil, CPUs(3), false, "3", "none", "unknown"},
	}
	for _, tt := range tests {
		if got := tt.a.Intersect(tt.b).String(); got != tt.both {
			t.Errorf("%v.Intersect(%v) = %s, want %s", tt.a, tt.b, got, tt.both)
		}
		if got := tt.a.Without(tt.b).String(); got != tt.aOnly {
			t.Errorf("%v.Without(%v) = %s, want %s", tt.a, tt.b, got, tt.aOnly)
		}
		if got := tt.a.Overlaps(tt.b); got != tt.overlap {
			t.Errorf("%v.Overlaps(%v) = %v", tt.a, tt.b, got)
		}
		if got := tt.b.Overlaps(tt.a); got != tt.overlap {
			t.Errorf("%v.Overlaps(%v) = %v", tt.b, tt.a, got)
		}
		a := slices.Clone(tt.a)
		if got := tt.a.Union(tt.b).String(); got != tt.union {
			t.Errorf("%v.Union(%v) = %s, want %s", tt.a, tt.b, got, tt.union)
		}
		if !slices.Equal(a, tt.a) {
			t.Errorf("Union changed its receiver to %v", tt.a)
		}
	}
}

func TestDecodeCPUSetErrors(t *testing.T) {
	for _, n := range []int{1, 7, 9, 8*maxCPUWords + 8} {
		_, err := DecodeCPUSet(make([]byte, n))
		if err == nil || !strings.Contains(err.Error(), "CPU set of") {
			t.Errorf("%d bytes: %v, want an error naming the length", n, err)
		}
	}
}

func FuzzDecodeCPUSet(f *testing.F) {
	f.Add([]byte{})
	f.Add(CPUs(0, 5, 64).Encode())
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeCPUSet(b)
		if err != nil {
			return
		}
		again, err := DecodeCPUSet(s.Encode())
		if err != nil {
			t.Fatalf("re-decoding %v: %v", s, err)
		}
		if again.String() != s.String() || again.Count() != s.Count() {
			t.Fatalf("%v came back as %v", s, again)
		}
	})
}

func TestAffinity(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("affinity is read on Linux only")
	}
	s, err := Affinity()
	if err != nil {
		t.Fatal(err)
	}
	// The runtime counts the same set at start, and nothing here pins
	// the test's threads.
	if s.Count() != runtime.NumCPU() {
		t.Errorf("Affinity() = %v, %d CPUs; runtime.NumCPU() = %d", s, s.Count(), runtime.NumCPU())
	}
	restore, err := PinThread(0)
	if err != nil {
		t.Fatal(err)
	}
	defer restore()
	if s, err := Affinity(); err != nil || s.String() != "0" {
		t.Errorf("pinned to CPU 0, Affinity() = %v, %v", s, err)
	}
}
