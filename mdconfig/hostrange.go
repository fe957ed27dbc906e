package mdconfig

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// maxExpand bounds what one host pattern may expand to, and maxHosts a
// whole description, so that a typo such as "n[1-1000000000]" is an error
// rather than an out-of-memory crash. Both are far above the 10,000 hosts
// the tables are designed for.
const (
	maxExpand = 1 << 17
	maxHosts  = 1 << 18
)

// expandHosts expands a host pattern: literal text with bracket groups of
// comma-separated numbers and ranges, e.g. "a[01-16]", "n[1-4,8]",
// "r[1-2]n[01-32]" (groups multiply). A range keeps the width of its first
// number, so "a[01-16]" gives a01 ... a16.
func expandHosts(pattern string) ([]string, error) {
	if pattern == "" {
		return nil, fmt.Errorf("empty host name")
	}
	out := []string{""}
	for i := 0; i < len(pattern); {
		c := pattern[i]
		switch {
		case c == '[':
			end := strings.IndexByte(pattern[i:], ']')
			if end < 0 {
				return nil, fmt.Errorf("%q: '[' at character %d is never closed; write e.g. \"a[01-16]\"", pattern, i+1)
			}
			nums, err := expandGroup(pattern[i+1 : i+end])
			if err != nil {
				return nil, fmt.Errorf("%q: %v", pattern, err)
			}
			if len(out)*len(nums) > maxExpand {
				return nil, fmt.Errorf("%q expands to more than %d hosts", pattern, maxExpand)
			}
			next := make([]string, 0, len(out)*len(nums))
			for _, p := range out {
				for _, n := range nums {
					next = append(next, p+n)
				}
			}
			out = next
			i += end + 1
		case c == ']':
			return nil, fmt.Errorf("%q: ']' at character %d has no matching '['", pattern, i+1)
		case isHostByte(c):
			j := i
			for j < len(pattern) && isHostByte(pattern[j]) {
				j++
			}
			for k := range out {
				out[k] += pattern[i:j]
			}
			i = j
		default:
			// One byte of a multi-byte character would print as
			// mojibake ('Ã' for 'ö'): name the whole character. Every
			// byte before it is ASCII, so i+1 counts characters.
			r, _ := utf8.DecodeRuneInString(pattern[i:])
			return nil, fmt.Errorf("%q: character %d (%q) cannot be part of a host name; use letters, digits, '.', '-', '_' and '#'", pattern, i+1, r)
		}
	}
	return out, nil
}

// isHostByte reports whether c may be part of a host name: a name's
// bytes and '#', which the PMI bootstrap puts between the machine's name
// and the node number in a rank's host ("<hostname>#<node>"); tables are
// looked up by that host.
func isHostByte(c byte) bool { return isNameByte(c) || c == '#' }

// isNameByte reports whether c may be part of a subdevice or network name.
func isNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_'
}

// expandGroup expands the inside of one bracket group: "01-16", "1,3,5-7".
func expandGroup(g string) ([]string, error) {
	if g == "" {
		return nil, fmt.Errorf("empty brackets; write numbers or ranges inside, e.g. [1-4,7]")
	}
	var out []string
	for _, item := range strings.Split(g, ",") {
		lo, hi, isRange := strings.Cut(item, "-")
		if !isRange {
			hi = lo
		}
		a, errA := parseDigits(lo)
		b, errB := parseDigits(hi)
		if errA != nil || errB != nil {
			return nil, fmt.Errorf("%q is not a number or a range of numbers such as 01-16", item)
		}
		if b < a {
			return nil, fmt.Errorf("range %q runs backwards; write the smaller number first", item)
		}
		if b-a >= maxExpand || len(out)+int(b-a) >= maxExpand {
			return nil, fmt.Errorf("range %q has more than %d numbers", item, maxExpand)
		}
		for n := a; n <= b; n++ {
			s := strconv.FormatInt(n, 10)
			if pad := len(lo) - len(s); pad > 0 {
				s = strings.Repeat("0", pad) + s
			}
			out = append(out, s)
		}
	}
	return out, nil
}

func parseDigits(s string) (int64, error) {
	if s == "" || len(s) > 9 {
		return 0, fmt.Errorf("bad number %q", s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("bad number %q", s)
		}
	}
	return strconv.ParseInt(s, 10, 64)
}

// compactHosts is the inverse of expandHosts for display: names sharing a
// prefix and a numeric suffix of one width collapse into "a[01-16]".
func compactHosts(names []string) string {
	type key struct {
		prefix string
		width  int
	}
	groups := map[key][]int64{}
	var order []key
	var plain []string
	for _, n := range names {
		j := len(n)
		for j > 0 && n[j-1] >= '0' && n[j-1] <= '9' {
			j--
		}
		if j == len(n) || len(n)-j > 9 {
			plain = append(plain, n)
			continue
		}
		k := key{n[:j], len(n) - j}
		v, _ := strconv.ParseInt(n[j:], 10, 64)
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], v)
	}
	parts := plain
	for _, k := range order {
		nums := groups[k]
		sort.Slice(nums, func(i, j int) bool { return nums[i] < nums[j] })
		num := func(v int64) string { return fmt.Sprintf("%0*d", k.width, v) }
		if len(nums) == 1 {
			parts = append(parts, k.prefix+num(nums[0]))
			continue
		}
		var items []string
		for i := 0; i < len(nums); {
			j := i
			for j+1 < len(nums) && nums[j+1] == nums[j]+1 {
				j++
			}
			if j > i {
				items = append(items, num(nums[i])+"-"+num(nums[j]))
			} else {
				items = append(items, num(nums[i]))
			}
			i = j + 1
		}
		parts = append(parts, k.prefix+"["+strings.Join(items, ",")+"]")
	}
	return strings.Join(parts, ",")
}
