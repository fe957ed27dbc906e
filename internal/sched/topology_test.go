package sched

import (
	"strings"
	"testing"
	"testing/fstest"
)

func TestParseCPUList(t *testing.T) {
	tests := []struct {
		in, want, err string
	}{
		{in: "0", want: "0"},
		{in: "0-3,8\n", want: "0-3,8"},
		{in: " 1,3,5 ", want: "1,3,5"},
		{in: "0-7:2", want: "0,2,4,6"},
		{in: "62-65,200", want: "62-65,200"},
		{in: "3,1,2", want: "1-3"},
		{in: "8191", want: "8191"},
		// A stride past the range's end takes its first CPU only; one
		// near MaxInt once wrapped the loop negative and panicked.
		{in: "1-1:9223372036854775807", want: "1"},
		{in: "0-8191:8192", want: "0"},
		{in: "", err: "empty CPU list"},
		{in: "\n", err: "empty CPU list"},
		{in: "a", err: `"a" is not a CPU number`},
		{in: "1,,2", err: `"" is not a CPU number`},
		{in: "-1", err: `"" is not a CPU number`},
		{in: "+1", err: `"+1" is not a CPU number`},
		{in: "3-1", err: `range "3-1" runs backwards`},
		{in: "1-", err: `"" is not a CPU number`},
		{in: "4:2", err: `stride in "4:2" without a range`},
		{in: "0-4:0", err: `stride in "0-4:0" is not a positive number`},
		{in: "8192", err: "CPU 8192 is beyond Linux's 8191"},
		{in: "0-99999999999999999999", err: "is not a CPU number"},
	}
	for _, tt := range tests {
		s, err := ParseCPUList(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("ParseCPUList(%q) = %v, %v; want an error with %q", tt.in, s, err, tt.err)
			}
			continue
		}
		if err != nil || s.String() != tt.want {
			t.Errorf("ParseCPUList(%q) = %v, %v; want %s", tt.in, s, err, tt.want)
		}
	}
}

// FuzzParseCPUList: no panic, and what parses prints as a list that
// parses back to the same CPUs.
func FuzzParseCPUList(f *testing.F) {
	for _, s := range []string{"0", "0-3,8\n", "0-7:2", "1,3,5", "62-65,200", "3-1", "0-8191:4096", "1-1:9223372036854775807"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := ParseCPUList(in)
		if err != nil {
			return
		}
		again, err := ParseCPUList(s.String())
		if err != nil || again.String() != s.String() {
			t.Fatalf("%q parsed as %v, which parses as %v, %v", in, s, again, err)
		}
	})
}

// sysfs builds a /sys/devices/system/cpu tree from each CPU's list of
// its core's threads, under the given file name.
func sysfs(file string, threads map[int]string) fstest.MapFS {
	fsys := fstest.MapFS{}
	for cpu, list := range threads {
		fsys["cpu"+itoa(cpu)+"/topology/"+file] = &fstest.MapFile{Data: []byte(list + "\n")}
	}
	return fsys
}

func itoa(i int) string { return CPUs(i).String() }

func TestCores(t *testing.T) {
	adjacent := map[int]string{0: "0-1", 1: "0-1", 2: "2-3", 3: "2-3"}
	apart := map[int]string{0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"}
	tests := []struct {
		name    string
		fsys    fstest.MapFS
		allowed CPUSet
		want    string
	}{
		{"threads side by side", sysfs("core_cpus_list", adjacent), CPUs(0, 1, 2, 3), "[0-1 2-3]"},
		{"threads far apart", sysfs("core_cpus_list", apart), CPUs(0, 1, 2, 3), "[0,2 1,3]"},
		{"kernel before 5.5", sysfs("thread_siblings_list", adjacent), CPUs(0, 1, 2, 3), "[0-1 2-3]"},
		{"part of a core allowed", sysfs("core_cpus_list", adjacent), CPUs(1, 2, 3), "[1 2-3]"},
		{"one thread of each core", sysfs("core_cpus_list", apart), CPUs(2, 3), "[2 3]"},
		{"no threads", sysfs("core_cpus_list", map[int]string{0: "0", 1: "1"}), CPUs(0, 1), "[0 1]"},
		{"no sysfs", fstest.MapFS{}, CPUs(0, 5), "[0 5]"},
		{"unreadable list", sysfs("core_cpus_list", map[int]string{0: "zero", 1: "0-1"}), CPUs(0, 1), "[0 1]"},
		{"list without its CPU", sysfs("core_cpus_list", map[int]string{0: "1", 1: "1"}), CPUs(0, 1), "[0 1]"},
		{"nothing allowed", sysfs("core_cpus_list", adjacent), nil, "[]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, c := range coresIn(tt.fsys, tt.allowed) {
				got = append(got, c.String())
			}
			if s := "[" + strings.Join(got, " ") + "]"; s != tt.want {
				t.Errorf("cores of %v = %s, want %s", tt.allowed, s, tt.want)
			}
		})
	}
}

// On this machine the cores cover the CPUs this process may use, each
// once, in ascending order of their first CPU.
func TestCoresHere(t *testing.T) {
	allowed, err := Affinity()
	if err != nil {
		t.Skip(err)
	}
	var all CPUSet
	last := -1
	for _, c := range Cores(allowed) {
		if c.Overlaps(all) {
			t.Errorf("core %v overlaps the cores before it (%v)", c, all)
		}
		if first := c.List()[0]; first <= last {
			t.Errorf("core %v after a core starting at CPU %d", c, last)
		} else {
			last = first
		}
		all = all.Union(c)
	}
	if all.String() != allowed.String() {
		t.Errorf("cores cover %v, want %v", all, allowed)
	}
	t.Logf("%d cores in CPUs %v", len(Cores(allowed)), allowed)
}
