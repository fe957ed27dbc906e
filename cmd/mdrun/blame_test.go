package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/bootstrap"
)

// The helper behaviours of the ranks in this file.
const (
	leaveInInit    = "leave-in-init"
	dieKilled      = "die-killed"
	dieExit0       = "die-exit0"
	abortLate      = "abort-late"
	abortAfterLoss = "abort-after-loss"
)

// leavingRank is a rank of a library job whose rank 1 joins it and exits
// 0 while the others are in Init: their fence fails naming it, and Init
// aborts the job.
func leavingRank() int {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if os.Getenv(bootstrap.EnvRank) == "1" {
		if _, err := bootstrap.Open(ctx, nil); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 9
		}
		return 0
	}
	if _, err := adi.Init(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "init:", err)
		return 1
	}
	return 0 // unreached: the fence cannot complete
}

// TestRankLeavingInInitNamed: a rank that leaves while the others are
// in Init makes their Init abort the job; mdrun must name the rank that
// left, with its exit status, not the first to abort (whose reason only
// named the culprit). The service queues the departure before it fails
// the fence, so this holds every time, whichever mdrun reaps first; a
// few jobs check that.
func TestRankLeavingInInitNamed(t *testing.T) {
	headline := regexp.MustCompile(`^mdrun: rank 1 \(pid \d+\) exited with status 0 without finalizing; terminating the job$`)
	for range 3 {
		status, _, stderr := runMdrun(t, []string{"-n", "4", helper, leaveInInit}, nil, nil)
		if got := firstMdrunLine(stderr); !headline.MatchString(got) {
			t.Errorf("mdrun's first word on the job is %q, want one matching %v", got, headline)
		}
		if status != exitFailed {
			t.Errorf("exit status %d, want %d", status, exitFailed)
		}
	}
}

// firstMdrunLine is the first line mdrun itself wrote to stderr.
func firstMdrunLine(stderr string) string {
	for l := range strings.Lines(stderr) {
		if strings.HasPrefix(l, "mdrun: ") {
			return strings.TrimSuffix(l, "\n")
		}
	}
	return "(none)"
}

// dyingRank is a rank of a library job whose last rank dies after a
// Barrier, by SIGKILL (how is dieKilled) or by exiting 0 without
// Finalize (dieExit0), while the others wait in a Recv from it: they fail
// with its ErrPeerDown and exit 1, as a program that checks errors does.
func dyingRank(how string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	w, err := adi.Init(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "init:", err)
		return 9
	}
	c := w.Comm()
	last := c.Size() - 1
	if err := c.Barrier(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "barrier:", err)
		return 9
	}
	if c.Rank() == last {
		time.Sleep(100 * time.Millisecond)
		if how == dieKilled {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		return 0
	}
	_, err = c.Recv(ctx, make([]byte, 8), last, 1)
	fmt.Fprintln(os.Stderr, "recv:", err)
	return 1
}

// TestDeadRankNamed: when one rank dies and the others then fail with its
// ErrPeerDown, mdrun must name the rank that died, as its doc says, not a
// survivor. Which of them mdrun reaps first, and which connections to the
// rendezvous service it sees end first, is up to the kernel (the dying
// process may close its connection after the survivors exited), so mdrun
// once named a survivor in about one job in six; the survivors' reports
// of the peer they lost make it deterministic. Over tcp, where a peer's
// death is a connection's end, as on a cluster.
func TestDeadRankNamed(t *testing.T) {
	table := filepath.Join(t.TempDir(), "tcp.json")
	if err := os.WriteFile(table, []byte(`{"version": 1, "peers": [{"to": "*", "routes": {"*": [{"subdevice": "tcp"}]}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	const jobs = 8
	for _, tc := range []struct {
		how      string
		headline *regexp.Regexp
		status   int
	}{
		{dieKilled, regexp.MustCompile(`^mdrun: rank 3 \(pid \d+\) was killed by signal 9 \(killed\); terminating the job$`), 128 + 9},
		{dieExit0, regexp.MustCompile(`^mdrun: rank 3 \(pid \d+\) exited with status 0 without finalizing; terminating the job$`), exitFailed},
	} {
		t.Run(tc.how, func(t *testing.T) {
			wrong := 0
			for range jobs {
				status, _, stderr := runMdrun(t, []string{"-conntable", table, "-n", "4", helper, tc.how}, nil, nil)
				if got := firstMdrunLine(stderr); !tc.headline.MatchString(got) || status != tc.status {
					wrong++
					t.Logf("mdrun named %q, exit status %d", got, status)
				}
			}
			if wrong > 0 {
				t.Errorf("in %d of %d jobs mdrun did not name rank 3, which died first, with its status %d", wrong, jobs, tc.status)
			}
		})
	}
}

// lateAbortingRank is a rank that joins the job and exits 0, and whose
// abort (code 3) reaches the service only after its exit: a child it
// leaves holding the connection (args[0] == "child", on descriptor 3)
// sends it. So it is, in a real job, when main closes and exits while
// another goroutine's Abort is still being written. It speaks the
// service's protocol itself, as the library cannot hand its connection
// to another process.
func lateAbortingRank(args []string) int {
	if len(args) > 0 && args[0] == "child" {
		conn := os.NewFile(3, "service")
		time.Sleep(300 * time.Millisecond) // mdrun has reaped the rank by now
		if err := sendToService(conn, map[string]any{"op": "abort", "id": 2, "code": 3, "reason": "late"}); err != nil {
			return 9
		}
		conn.Read(make([]byte, 4096))
		return 0
	}
	conn, _, err := joinService()
	if err == nil {
		err = handOff(conn, abortLate)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 9
	}
	return 0
}

// lossAbortingRank: rank 1 joins and exits 0 without finalizing, a child
// holding its connection a while (args[0] == "child"), so that mdrun
// awaits its departure; meanwhile rank 0 reports rank 1 lost and aborts
// with code 3.
func lossAbortingRank(args []string) int {
	if len(args) > 0 && args[0] == "child" {
		time.Sleep(800 * time.Millisecond)
		return 0
	}
	conn, rank, err := joinService()
	if err == nil && rank == 1 {
		err = handOff(conn, abortAfterLoss)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 9
	}
	if rank == 1 {
		return 0
	}
	time.Sleep(300 * time.Millisecond) // rank 1 has exited; mdrun awaits its departure
	if err := sendToService(conn, map[string]any{"op": "lost", "rank": 1, "reason": "its links ended"}); err != nil {
		return 9
	}
	if err := sendToService(conn, map[string]any{"op": "abort", "id": 2, "code": 3, "reason": "lost rank 1"}); err != nil {
		return 9
	}
	conn.Read(make([]byte, 4096))
	time.Sleep(2 * time.Second) // mdrun ends the job meanwhile
	return 3
}

// joinService connects to mdrun's service and says hello, for a rank
// that speaks the protocol itself, as the library cannot hand its
// connection to another process; it returns the connection and the rank.
func joinService() (net.Conn, int, error) {
	conn, err := net.Dial("unix", strings.TrimPrefix(os.Getenv(bootstrap.EnvAddr), "unix:"))
	if err != nil {
		return nil, 0, err
	}
	rank, _ := strconv.Atoi(os.Getenv(bootstrap.EnvRank))
	size, _ := strconv.Atoi(os.Getenv(bootstrap.EnvSize))
	hello := map[string]any{"op": "hello", "id": 1, "version": 2, "rank": rank, "size": size,
		"jobid": os.Getenv(bootstrap.EnvJobID), "secret": os.Getenv(bootstrap.EnvSecret)}
	if err := sendToService(conn, hello); err != nil {
		return nil, 0, err
	}
	if _, err := conn.Read(make([]byte, 4096)); err != nil {
		return nil, 0, fmt.Errorf("hello: %w", err)
	}
	return conn, rank, nil
}

// handOff starts this helper as behaviour's child with conn on its
// descriptor 3, to outlive the rank on it. The child's output goes to
// /dev/null: mdrun must not wait for it to reap the rank.
func handOff(conn net.Conn, behaviour string) error {
	f, err := conn.(*net.UnixConn).File()
	if err != nil {
		return err
	}
	child := exec.Command(os.Args[0], behaviour, "child")
	child.ExtraFiles = []*os.File{f}
	return child.Start()
}

// sendToService writes m as one message of the rendezvous protocol.
func sendToService(w io.Writer, m map[string]any) error {
	body, err := json.Marshal(m)
	if err != nil {
		return err
	}
	_, err = w.Write(binary.BigEndian.AppendUint32(nil, uint32(len(body))))
	if err == nil {
		_, err = w.Write(body)
	}
	return err
}

// TestAbortDuringDepartureWaitNamed: a rank that exits 0 while its abort
// is not yet out (main closed and exited as another goroutine's Abort
// was written) is reaped first; the abort then reaches the service while
// mdrun waits for the rank's departure (up to blameWait). The abort is
// the cause, and its code the job's status: mdrun once reported "exited
// with status 0 without finalizing" and exited 1, logging the abort only
// as an event while terminating.
func TestAbortDuringDepartureWaitNamed(t *testing.T) {
	headline := regexp.MustCompile(`^mdrun: rank 0 \(pid \d+\) aborted with code 3: late; terminating the job$`)
	status, _, stderr := runMdrun(t, []string{"-n", "1", helper, abortLate}, nil, nil)
	if got := firstMdrunLine(stderr); !headline.MatchString(got) || status != 3 {
		t.Errorf("mdrun said %q and exited %d; want a line matching %v and 3", got, status, headline)
	}
}

// TestAbortAfterLossBlamesLostRank: rank 0 reports rank 1 lost and
// aborts while mdrun awaits rank 1's departure, rank 1 having exited 0
// without finalizing. The loss is the cause: mdrun names rank 1, as it
// does whichever it reaps first. Draining the abort there once charged it
// to rank 0, rank 1 being marked reaped already.
func TestAbortAfterLossBlamesLostRank(t *testing.T) {
	headline := regexp.MustCompile(`^mdrun: rank 1 \(pid \d+\) exited with status 0 without finalizing; terminating the job$`)
	status, _, stderr := runMdrun(t, []string{"-n", "2", helper, abortAfterLoss}, nil, nil)
	if got := firstMdrunLine(stderr); !headline.MatchString(got) || status != exitFailed {
		t.Errorf("mdrun said %q and exited %d; want a line matching %v and %d", got, status, headline, exitFailed)
	}
}
