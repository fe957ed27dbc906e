package bootstrap

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestMain fails the run if a test leaves a goroutine of this package
// behind: every Server and client must stop what it started.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := checkGoroutines(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

func checkGoroutines() error {
	// Goroutines that were told to stop may still be on their way out; this
	// waits for them rather than asserting anything about time.
	deadline := time.Now().Add(10 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var leaked []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "multidevice/bootstrap.") && !strings.Contains(g, "bootstrap.TestMain") {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("leaked goroutines:\n\n%s", strings.Join(leaked, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
