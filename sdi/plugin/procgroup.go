package plugin

import (
	"bytes"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
)

// A plugins.hcl command is often a wrapper script that sets up the
// environment and runs the real plugin without exec. Killing the script
// alone would leave the plugin running, holding go-plugin's stdout and
// stderr pipes open, and go-plugin waits for those to close. So each
// plugin runs in a process group of its own, led by the process the host
// started, and is killed as a group.

// killGroup kills the process group led by pid. The group's id cannot
// name another group while a process of it lives, and the callers kill
// only before go-plugin has seen the leader exit, or moments after.
func killGroup(pid int) {
	if pid > 0 {
		syscall.Kill(-pid, syscall.SIGKILL)
	}
}

// within runs f and reports whether it returned within d; if not, f goes
// on in the background.
func within(d time.Duration, f func()) bool {
	done := make(chan struct{})
	go func() {
		f()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// envHostFD names the file descriptor of the plugin's end of a pipe whose
// other end only the host holds: the plugin reads EOF there when the host
// has died, even when its parent is a wrapper script that lives on.
const envHostFD = "MD_SDI_HOST_FD"

// lineLogger logs what a plugin writes to its os.Stderr or os.Stdout after
// go-plugin took them over, a line per entry.
type lineLogger struct {
	log   hclog.Logger
	level hclog.Level

	mu   sync.Mutex
	part []byte // an unfinished line
}

func (w *lineLogger) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.part = append(w.part, p...)
	for {
		i := bytes.IndexByte(w.part, '\n')
		if i < 0 {
			break
		}
		if line := bytes.TrimRight(w.part[:i], "\r"); len(line) > 0 {
			w.log.Log(w.level, string(line))
		}
		w.part = w.part[i+1:]
	}
	if len(w.part) > maxLogLine {
		w.log.Log(w.level, string(w.part))
		w.part = w.part[:0]
	}
	return len(p), nil
}

// maxLogLine bounds a line the plugin never ends.
const maxLogLine = 64 << 10
