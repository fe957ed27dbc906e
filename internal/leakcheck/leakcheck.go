// Package leakcheck finds goroutines a package's tests left running, for
// the test binaries of packages that start goroutines of their own.
package leakcheck

import (
	"runtime"
	"strings"
	"time"
)

// Goroutines returns the stacks of running goroutines whose stack names
// one of markers (functions such as "tcp.(*lane).writeLoop"), or "" when
// there are none. It looks for up to a second, since a goroutine that has
// just been told to stop may still be unwinding.
func Goroutines(markers ...string) string {
	var found []string
	for range 100 {
		found = found[:0]
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		for _, g := range strings.Split(string(buf), "\n\n") {
			for _, m := range markers {
				if strings.Contains(g, m) {
					found = append(found, g)
					break
				}
			}
		}
		if len(found) == 0 {
			return ""
		}
		time.Sleep(10 * time.Millisecond)
	}
	return strings.Join(found, "\n\n")
}
