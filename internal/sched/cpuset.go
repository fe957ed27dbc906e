package sched

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// A CPUSet is a set of CPU numbers: CPU i is bit i%64 of word i/64. The
// nil set stands for "unknown" (a system that does not tell).
type CPUSet []uint64

// maxCPUWords bounds a decoded set: 8192 CPUs, Linux's own limit.
const maxCPUWords = 8192 / 64

// CPUs returns the set of the given CPU numbers.
func CPUs(cpus ...int) CPUSet {
	var s CPUSet
	for _, c := range cpus {
		s.Add(c)
	}
	return s
}

// Add puts cpu (>= 0) into s, growing it as needed.
func (s *CPUSet) Add(cpu int) {
	for len(*s) <= cpu/64 {
		*s = append(*s, 0)
	}
	(*s)[cpu/64] |= 1 << (cpu % 64)
}

// List returns the CPUs of s in ascending order.
func (s CPUSet) List() []int {
	var l []int
	for i, w := range s {
		for w != 0 {
			b := bits.TrailingZeros64(w)
			l = append(l, i*64+b)
			w &^= 1 << b
		}
	}
	return l
}

// Has reports whether cpu is in s.
func (s CPUSet) Has(cpu int) bool { return cpu >= 0 && cpu/64 < len(s) && s.has(cpu) }

// Count is the number of CPUs in s.
func (s CPUSet) Count() int {
	n := 0
	for _, w := range s {
		n += bits.OnesCount64(w)
	}
	return n
}

// Overlaps reports whether s and o have a CPU in common.
func (s CPUSet) Overlaps(o CPUSet) bool {
	for i := range min(len(s), len(o)) {
		if s[i]&o[i] != 0 {
			return true
		}
	}
	return false
}

// Union returns the CPUs in s or o.
func (s CPUSet) Union(o CPUSet) CPUSet {
	if len(s) < len(o) {
		s, o = o, s
	}
	u := append(CPUSet(nil), s...)
	for i, w := range o {
		u[i] |= w
	}
	return u
}

// Intersect returns the CPUs in both s and o.
func (s CPUSet) Intersect(o CPUSet) CPUSet {
	x := make(CPUSet, min(len(s), len(o)))
	for i := range x {
		x[i] = s[i] & o[i]
	}
	return x
}

// Without returns the CPUs in s but not in o.
func (s CPUSet) Without(o CPUSet) CPUSet {
	x := append(CPUSet(nil), s...)
	for i := range min(len(x), len(o)) {
		x[i] &^= o[i]
	}
	return x
}

// String gives s in the kernel's list form ("0-3,8"), as taskset -c and
// /sys/devices/system/cpu print it.
func (s CPUSet) String() string {
	if s == nil {
		return "unknown"
	}
	var b strings.Builder
	n := len(s) * 64
	for i := 0; i < n; i++ {
		if !s.has(i) {
			continue
		}
		j := i
		for j+1 < n && s.has(j+1) {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(i))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(j))
		}
		i = j
	}
	if b.Len() == 0 {
		return "none"
	}
	return b.String()
}

func (s CPUSet) has(i int) bool { return s[i/64]&(1<<(i%64)) != 0 }

// Encode gives s as the little-endian words that DecodeCPUSet reads,
// without trailing zero words; nil encodes as no bytes.
func (s CPUSet) Encode() []byte {
	n := len(s)
	for n > 0 && s[n-1] == 0 {
		n--
	}
	b := make([]byte, 8*n)
	for i := range n {
		binary.LittleEndian.PutUint64(b[8*i:], s[i])
	}
	return b
}

// DecodeCPUSet reads what Encode wrote. A set without CPUs decodes as nil:
// a rank that could not read its CPUs says so by publishing nothing.
func DecodeCPUSet(b []byte) (CPUSet, error) {
	if len(b)%8 != 0 || len(b) > 8*maxCPUWords {
		return nil, fmt.Errorf("sched: CPU set of %d bytes, want a multiple of 8 up to %d", len(b), 8*maxCPUWords)
	}
	s := make(CPUSet, len(b)/8)
	for i := range s {
		s[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	if s.Count() == 0 {
		return nil, nil
	}
	return s, nil
}
