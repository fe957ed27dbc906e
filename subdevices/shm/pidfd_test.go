package shm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/hpc-multidevice/multidevice/internal/testlog"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// exitedPidfd starts a short-lived child, opens a pidfd for it, and
// returns the pidfd once the child has exited and been reaped, so that
// its pid is free for reuse. It skips where pidfd_open is unavailable.
func exitedPidfd(t *testing.T) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err != nil {
		t.Skipf("pidfd_open is unavailable here, the kill fallback is all there is: %v", err)
	}
	return fd
}

// reusedPid returns the process of a peer that exited and whose pid now
// names this test process: memory the test can see, so a copy the guard
// failed to stop would show up as bytes read or written. Its pidfd is
// released at cleanup if the device has not released it before.
func reusedPid(t *testing.T) *peerProc {
	pr := &peerProc{pid: os.Getpid(), fd: exitedPidfd(t), refs: 1}
	t.Cleanup(func() { _ = pr.release() })
	return pr
}

// TestPeerProcCheck checks the liveness checks themselves: a running
// process passes, an exited one fails with ErrPeerUnreachable, by pidfd
// and by the kill fallback alike (the copy guard asks only a pidfd), and a
// released one fails too.
func TestPeerProcCheck(t *testing.T) {
	self, unavail, err := openPeerProc(os.Getpid(), unix.PidfdOpen)
	if err != nil {
		t.Fatal(err)
	}
	if unavail != nil {
		t.Skipf("pidfd_open is unavailable here: %v", unavail)
	}
	if err := self.check(); err != nil {
		t.Fatalf("check of this process: %v", err)
	}
	if err := self.guard(); err != nil {
		t.Fatalf("guard of this process: %v", err)
	}
	reused := reusedPid(t)
	if err := reused.check(); !errors.Is(err, sdi.ErrPeerUnreachable) {
		t.Fatalf("check of an exited process by pidfd = %v, want ErrPeerUnreachable", err)
	}
	if err := reused.guard(); !errors.Is(err, sdi.ErrPeerUnreachable) {
		t.Fatalf("guard of an exited process by pidfd = %v, want ErrPeerUnreachable", err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	child, _, err := openPeerProc(cmd.Process.Pid, unix.PidfdOpen)
	if err != nil {
		t.Fatal(err)
	}
	byPid := &peerProc{pid: cmd.Process.Pid, fd: -1, refs: 1}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err := child.check(); !errors.Is(err, sdi.ErrPeerUnreachable) {
		t.Errorf("check by pidfd after the child was reaped = %v, want ErrPeerUnreachable", err)
	}
	if err := byPid.check(); !errors.Is(err, sdi.ErrPeerUnreachable) {
		t.Errorf("check by pid after the child was reaped = %v, want ErrPeerUnreachable", err)
	}
	// Without a pidfd the copy's own ESRCH is all a guard could add.
	if err := byPid.guard(); err != nil {
		t.Errorf("guard by pid = %v, want nil", err)
	}
	if _, _, err := openPeerProc(cmd.Process.Pid, unix.PidfdOpen); !errors.Is(err, sdi.ErrPeerUnreachable) {
		t.Errorf("opening a reaped process = %v, want ErrPeerUnreachable", err)
	}
	if err := child.release(); err != nil {
		t.Fatal(err)
	}

	self.acquire()
	for i := range 2 {
		if err := self.release(); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}
	if err := self.check(); !errors.Is(err, sdi.ErrPeerUnreachable) {
		t.Errorf("check after the last release = %v, want ErrPeerUnreachable", err)
	}
}

// recordingPlacer places every payload in a fresh buffer and hands the
// buffers to the test.
type recordingPlacer struct {
	*recorder
	placed chan []byte
}

func (p *recordingPlacer) Place(_ sdi.Rank, _ []byte, n int) []byte {
	b := make([]byte, n)
	p.placed <- b
	return b
}

// TestNoReadFromExitedPeer gives the receiver, in place of rank 0's
// process, one that exited and whose pid this test process now has: a
// descriptor from rank 0 must not be read (reading this process would
// succeed, the payload lies here) but report rank 0 down with
// ErrPeerUnreachable, without a byte in the place the Handler gave.
func TestNoReadFromExitedPeer(t *testing.T) {
	requireSingleCopy(t)
	j := openJob(t, 2, jobOpts{})
	rx := j.sds[1].(*device)
	if old := rx.srcProc[0].Swap(reusedPid(t)); old != nil {
		if err := old.release(); err != nil {
			t.Fatal(err)
		}
	}
	// Whoever receives holds rxMu, so it sees the new Handler.
	pl := &recordingPlacer{recorder: j.hs[1], placed: make(chan []byte, 1)}
	rx.rxMu.Lock()
	rx.handler, rx.placer = pl, pl
	rx.rxMu.Unlock()
	done, err := j.sds[0].Send(&sdi.Frame{Peer: 1, Header: []byte("large"), Payload: pattern(3, defaultSingleCopyMin)})
	if err != nil || done {
		t.Fatalf("Send = %v, %v; want a descriptor in flight", done, err)
	}
	d := j.hs[1].nextDown(t)
	if d.peer != 0 || !errors.Is(d.err, sdi.ErrPeerUnreachable) {
		t.Fatalf("PeerDown(%d, %v), want rank 0 with ErrPeerUnreachable", d.peer, d.err)
	}
	t.Log(d.err)
	select {
	case m := <-j.hs[1].msgs:
		t.Fatalf("delivered %q, %d bytes, read from a process that is not the peer", m.header, len(m.payload))
	case b := <-pl.placed:
		if !bytes.Equal(b, make([]byte, len(b))) {
			t.Fatal("the payload was read into the Handler's place from a process that is not the peer")
		}
	default:
	}
}

// TestNoWriteToExitedPeer gives a sender asked for help, in place of the
// receiver's process, one that exited and whose pid this test process now
// has: it must write nothing (writing would succeed here), take no chunk,
// and consider the receiver gone.
func TestNoWriteToExitedPeer(t *testing.T) {
	const n = 3 * assistChunk
	g := newAssistRig(t, n)
	g.tx.mu.Lock()
	old := g.tx.proc
	g.tx.proc = reusedPid(t) // released by detach at Close
	g.tx.mu.Unlock()
	if err := old.release(); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, n)
	g.request(1, fakeAt, dst, n)
	before := g.tx.ring.assist.claim.Load()
	checked := false
	if g.tx.assistOne(&checked) {
		t.Fatal("assistOne copied a chunk into a process that exited")
	}
	if c := g.tx.ring.assist.claim.Load(); c != before {
		t.Fatalf("claim word moved from %#x to %#x", before, c)
	}
	for i, b := range dst {
		if b != 0 {
			t.Fatalf("byte %d of the destination was written", i)
		}
	}
	if err := g.tx.alive(); !errors.Is(err, sdi.ErrPeerUnreachable) {
		t.Fatalf("alive = %v, want ErrPeerUnreachable", err)
	}
}

// TestPidfdUnavailable has pidfd_open fail as an old kernel (ENOSYS) or a
// seccomp filter (EPERM) makes it: ranks still connect and exchange large
// payloads, watching peers by pid, and each says so once in its debug log.
func TestPidfdUnavailable(t *testing.T) {
	for _, errno := range []unix.Errno{unix.ENOSYS, unix.EPERM} {
		t.Run(errno.Error(), func(t *testing.T) {
			ctx := context.Background()
			id := fmt.Sprintf("nopidfd-%d-%s", os.Getpid(), t.Name())
			hs := []*recorder{newRecorder(t), newRecorder(t)}
			logs := []*testlog.Buffer{{}, {}}
			var sds []*device
			var cards [][]byte
			for r := range 2 {
				log := hclog.New(&hclog.LoggerOptions{Output: logs[r], Level: hclog.Debug})
				sd := New(log).(*device)
				sd.pidfdOpen = func(int, int) (int, error) { return -1, errno }
				l, err := sd.Open(ctx, sdi.OpenParams{Rank: sdi.Rank(r), Size: 2, Host: "h", JobID: id, Handler: hs[r], Logger: log})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { sd.Close(context.Background()) })
				sds, cards = append(sds, sd), append(cards, l.Addr)
			}
			for a := range 2 {
				for b := range 2 {
					if err := sds[a].Connect(ctx, sdi.Rank(b), cards[b]); err != nil {
						t.Fatal(err)
					}
				}
			}
			if p := sds[0].peers[1].Load(); p.proc.fd >= 0 {
				t.Fatal("a pidfd is held although pidfd_open failed")
			}
			payload := pattern(5, defaultSingleCopyMin)
			if err := sendRetry(sds[0], &sdi.Frame{Peer: 1, Header: []byte("large"), Payload: payload}); err != nil {
				t.Fatal(err)
			}
			if m := hs[1].next(t); !bytes.Equal(m.payload, payload) {
				t.Fatal("payload differs")
			}
			for r := range 2 {
				if err := sds[r].Close(ctx); err != nil {
					t.Fatal(err)
				}
				if n := strings.Count(logs[r].String(), "pidfd_open unavailable"); n != 1 {
					t.Errorf("rank %d logged the missing pidfd_open %d times, want once:\n%s", r, n, logs[r].String())
				}
			}
		})
	}
}

// pidfds counts this process's open pidfds.
func pidfds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot list open descriptors: %v", err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && l == "anon_inode:[pidfd]" {
			n++
		}
	}
	return n
}

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot list open descriptors: %v", err)
	}
	return len(ents)
}

// TestPidfdsReleased connects three ranks to each other, disconnects and
// closes them, and checks that each connection holds one pidfd, that
// Disconnect releases it unless the receiver may still read that peer's
// memory, and that after Close no descriptor is left open.
func TestPidfdsReleased(t *testing.T) {
	if pr, unavail, _ := openPeerProc(os.Getpid(), unix.PidfdOpen); unavail != nil {
		t.Skipf("pidfd_open is unavailable here: %v", unavail)
	} else if err := pr.release(); err != nil {
		t.Fatal(err)
	}
	const n = 3
	for _, tt := range []struct {
		name, config string
		keep         int // pidfds held after every rank disconnected every other
	}{
		{"single copy", "", n * (n - 1)},
		{"ring only", `{"single_copy": false}`, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.keep > 0 {
				requireSingleCopy(t)
			}
			// A first cycle opens what the runtime opens once (the
			// netpoller's descriptors, say).
			cycle := func(t *testing.T, check bool) {
				pids := pidfds(t)
				j := openJob(t, n, jobOpts{config: []byte(tt.config)})
				if got := pidfds(t) - pids; check && got != n*n {
					t.Errorf("%d pidfds with %d ranks connected to each other, want %d", got, n, n*n)
				}
				ctx := context.Background()
				for a := range n {
					for b := range n {
						if a != b {
							if err := j.sds[a].Disconnect(ctx, sdi.Rank(b)); err != nil {
								t.Fatal(err)
							}
						}
					}
				}
				if got := pidfds(t) - pids; check && got != n+tt.keep {
					t.Errorf("%d pidfds after disconnecting, want %d", got, n+tt.keep)
				}
			}
			t.Run("warm-up", func(t *testing.T) { cycle(t, false) })
			before := openFDs(t)
			for range 3 {
				t.Run("cycle", func(t *testing.T) { cycle(t, true) })
			}
			if after := openFDs(t); after != before {
				t.Fatalf("%d descriptors open before connect/close cycles, %d after", before, after)
			}
		})
	}
}

// BenchmarkPidfdGuard measures what the guard adds to a payload copy:
// the pidfd poll (once per payload read, once per assisted write), the
// kill(pid, 0) it replaces as the liveness check, and for scale the
// smallest payload copy it guards (single_copy_min bytes, read from this
// process with process_vm_readv).
func BenchmarkPidfdGuard(b *testing.B) {
	pr, unavail, err := openPeerProc(os.Getpid(), unix.PidfdOpen)
	if err != nil || unavail != nil {
		b.Skipf("pidfd_open: %v %v", err, unavail)
	}
	b.Cleanup(func() { _ = pr.release() })
	byPid := &peerProc{pid: os.Getpid(), fd: -1, refs: 1}
	b.Run("pidfd_poll", func(b *testing.B) {
		for b.Loop() {
			if err := pr.guard(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("kill", func(b *testing.B) {
		for b.Loop() {
			if err := byPid.check(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("process_vm_readv_min", func(b *testing.B) {
		src := pattern(1, defaultSingleCopyMin)
		dst := make([]byte, len(src))
		var v vmReader
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			if err := v.read(os.Getpid(), dst, descriptorOf(src).addr); err != nil {
				b.Skipf("process_vm_readv is not allowed here: %v", err)
			}
		}
	})
}

// TestGuardTrustsARecentPoll: the copy guard polls the pidfd only when no
// poll found the process running within guardFresh, which no pid reuse
// can beat; check always polls.
func TestGuardTrustsARecentPoll(t *testing.T) {
	pr := reusedPid(t) // exited: every poll fails
	pr.seen.Store(procClock())
	if err := pr.guard(); err != nil {
		t.Errorf("guard right after a poll found the process = %v, want nil", err)
	}
	if err := pr.check(); !errors.Is(err, sdi.ErrPeerUnreachable) {
		t.Errorf("check = %v, want ErrPeerUnreachable: it always polls", err)
	}
	pr.seen.Store(procClock() - int64(2*guardFresh))
	if err := pr.guard(); !errors.Is(err, sdi.ErrPeerUnreachable) {
		t.Errorf("guard after guardFresh = %v, want ErrPeerUnreachable", err)
	}

	self, unavail, err := openPeerProc(os.Getpid(), unix.PidfdOpen)
	if err != nil || unavail != nil {
		t.Skipf("pidfd_open: %v %v", err, unavail)
	}
	defer self.release()
	before := procClock()
	if err := self.guard(); err != nil {
		t.Fatal(err)
	}
	if self.seen.Load() < before {
		t.Errorf("a poll that found the process running did not record when")
	}
}
