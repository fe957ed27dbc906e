package tcp

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The idle waiter hands each armed socket's event to its channel, waits
// again, and ends on stop; while it waits it is parked in Go's netpoller,
// not blocked in a system call that would keep the processor from a rank
// bound to one CPU (see idleWaiter).
func TestIdleWaiter(t *testing.T) {
	w, err := newIdleWaiter()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run()
	}()
	defer func() {
		w.stop()
		<-done
		w.close()
	}()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	id, ch, err := w.add(fds[0])
	if err != nil {
		t.Fatal(err)
	}
	defer w.remove(fds[0], id)

	for round := range 3 {
		waitParked(t, "tcp.(*idleWaiter).run")
		if err := w.arm(fds[0], id); err != nil {
			t.Fatal(err)
		}
		if _, err := unix.Write(fds[1], []byte{byte(round)}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: no wake-up for an armed socket with data", round)
		}
		var b [8]byte
		unix.Read(fds[0], b[:]) // drain, so the next arm waits for new data
	}
	waitParked(t, "tcp.(*idleWaiter).run")
}

// waitParked waits until the goroutine running fn is blocked, and fails
// the test unless it is parked in the netpoller ("IO wait").
func waitParked(t *testing.T, fn string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		stacks := string(buf[:runtime.Stack(buf, true)])
		for _, g := range strings.Split(stacks, "\n\n") {
			if !strings.Contains(g, fn) {
				continue
			}
			state := g[strings.Index(g, "[")+1 : strings.Index(g, "]")]
			switch {
			case strings.HasPrefix(state, "IO wait"):
				return
			case strings.HasPrefix(state, "syscall"):
				t.Fatalf("%s waits in a system call, holding its processor:\n%s", fn, g)
			}
		}
	}
	t.Fatalf("%s never parked", fn)
}
