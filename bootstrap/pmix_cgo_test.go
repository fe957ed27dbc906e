//go:build pmix && cgo

package bootstrap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// The tests here run this test binary as the ranks of a job under Open
// MPI's mpirun: a test named in pmixHelperEnv runs as a rank, and is
// skipped otherwise.

const pmixHelperEnv = "MD_PMIX_TEST_HELPER"

// pmixWatchdog turns a hung job into a failure; it asserts nothing about
// speed.
const pmixWatchdog = 2 * time.Minute

// mpirunEach runs n ranks of the test helper under mpirun.openmpi and
// fails unless mpirun exits 0 and every rank printed mark.
func mpirunEach(t *testing.T, n int, helper, mark string, args ...string) {
	t.Helper()
	status, out := mpirunJob(t, n, helper, args...)
	if status != 0 {
		t.Fatalf("mpirun exited %d", status)
	}
	if got := strings.Count(out, mark); got != n {
		t.Errorf("%d of %d ranks printed %q", got, n, mark)
	}
}

// mpirunJob runs n ranks of the test helper under mpirun.openmpi and
// returns mpirun's exit status and output. It skips when mpirun.openmpi is
// not installed.
func mpirunJob(t *testing.T, n int, helper string, args ...string) (int, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts jobs under mpirun.openmpi")
	}
	mpirun, err := exec.LookPath("mpirun.openmpi")
	if err != nil {
		t.Skip("Open MPI's mpirun.openmpi is not installed; apt-get install openmpi-bin")
	}
	ctx, cancel := context.WithTimeout(context.Background(), pmixWatchdog)
	defer cancel()
	// --bind-to none: Open MPI binds ranks to cores by default, and this
	// machine may have fewer cores than ranks.
	args = append([]string{"--allow-run-as-root", "--oversubscribe", "--bind-to", "none"}, args...)
	args = append(args, "-n", strconv.Itoa(n), os.Args[0], "-test.run=^"+helper+"$", "-test.count=1", "-test.v")
	cmd := exec.CommandContext(ctx, mpirun, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MDRUN_") && !strings.HasPrefix(kv, "PMI_") && !strings.HasPrefix(kv, "PMIX_") && !strings.HasPrefix(kv, "MD_PMI=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, pmixHelperEnv+"="+helper)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%s did not end within %v:\n%s", cmd, pmixWatchdog, out)
	}
	t.Logf("%s\n%s", cmd, out)
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	return 0, string(out)
}

// asRank skips the test unless mpirunJob started it as a rank.
func asRank(t *testing.T) context.Context {
	t.Helper()
	if os.Getenv(pmixHelperEnv) != t.Name() {
		t.Skip("runs as a rank under mpirun.openmpi, started by another test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), pmixWatchdog)
	t.Cleanup(cancel)
	return ctx
}

// openAborter opens a rank of a job whose rank 1 aborts: rank 1 gets its
// Bootstrap, the others nil once they waited for the abort to end them.
func openAborter(t *testing.T, ctx context.Context) Bootstrap {
	t.Helper()
	bs, err := Open(ctx, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if bs.Rank() != 1 {
		// The abort ends the job, this rank with it.
		time.Sleep(pmixWatchdog)
		return nil
	}
	return bs
}

// inOwnProcess runs the calling test again in a process of its own and
// reports whether the caller is that process, which then runs the test's
// body: a PMIx_Init, even one that failed, uses up the process's PMIx
// client, so each test that calls one needs a new process.
func inOwnProcess(t *testing.T) bool {
	t.Helper()
	if os.Getenv(pmixHelperEnv) == t.Name() {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), pmixWatchdog)
	defer cancel()
	args := []string{"-test.run=^" + t.Name() + "$", "-test.count=1", "-test.v"}
	if testing.Short() {
		args = append(args, "-test.short")
	}
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), pmixHelperEnv+"="+t.Name())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s in a process of its own: %v\n%s", t.Name(), err, out)
	}
	t.Logf("%s in a process of its own:\n%s", t.Name(), out)
	return false
}

// TestPMIxInitFails: a PMIx environment whose server is not there makes
// Open fail, naming the call and the variable; and a PMIx_Init that
// failed uses up the process's client (libpmix keeps state from it, under
// which a later PMIx_Init joins a world of its own): a second Open fails
// without one, naming the first failure.
func TestPMIxInitFails(t *testing.T) {
	if !inOwnProcess(t) {
		return
	}
	for _, kv := range openMPIEnv {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PMIX_SERVER_URI") {
			v = "1.0;tcp4://127.0.0.1:1" // nobody listens on port 1
		}
		t.Setenv(k, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), pmixWatchdog)
	defer cancel()
	bs, err := open(ctx, testLogger(t), os.LookupEnv, nil)
	if err == nil {
		bs.Close()
		t.Fatal("open succeeded")
	}
	for _, want := range []string{"bootstrap: pmix: PMIx_Init: PMIX_ERR_", "PMIX_RANK=1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("open error %q lacks %q", err, want)
		}
	}
	bs, err2 := open(ctx, testLogger(t), os.LookupEnv, nil)
	if err2 == nil {
		bs.Close()
		t.Fatal("a second open succeeded")
	}
	if !errors.Is(err2, errPMIxJoinedOnce) || !strings.Contains(err2.Error(), err.Error()) {
		t.Errorf("second open: %v, want errPMIxJoinedOnce naming the first failure %q", err2, err)
	}
}

var pmixRankLine = regexp.MustCompile(`(?m)^pmix rank (\d+) of (\d+) on (\S+) job (\S+) secret ([0-9a-f]*)$`)

// TestPMIxJob: three ranks under mpirun open the bootstrap through the
// pmix backend, agree on who they are and exchange keys; once with the
// store Open MPI picks (shared memory, "ds21") and once with each client
// keeping its own ("hash"), where a Get must ask the server.
func TestPMIxJob(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"default", nil},
		{"hash", []string{"-x", "PMIX_MCA_gds=hash"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			const n = 3
			status, out := mpirunJob(t, n, "TestPMIxJobRank", tt.args...)
			if status != 0 {
				t.Fatalf("mpirun exited %d", status)
			}
			checkPMIxRanks(t, out, n)
		})
	}
}

// checkPMIxRanks checks the lines of the n ranks of TestPMIxJobRank.
func checkPMIxRanks(t *testing.T, out string, n int) {
	t.Helper()
	lines := pmixRankLine.FindAllStringSubmatch(out, -1)
	if len(lines) != n {
		t.Fatalf("%d of %d ranks reported success", len(lines), n)
	}
	var ranks []int
	for _, m := range lines {
		r, _ := strconv.Atoi(m[1])
		ranks = append(ranks, r)
		if m[2] != strconv.Itoa(n) {
			t.Errorf("rank %s: size %s, want %d", m[1], m[2], n)
		}
		for i, what := range []string{"", "", "", "host", "job", "secret"} {
			if what != "" && m[i] != lines[0][i] {
				t.Errorf("rank %s's %s is %q, rank %s's %q", m[1], what, m[i], lines[0][1], lines[0][i])
			}
		}
		if !strings.Contains(m[3], "#") {
			t.Errorf("rank %s: host %q has no node id", m[1], m[3])
		}
		if len(m[5]) != 64 {
			t.Errorf("rank %s: secret of %d hex digits, want 64", m[1], len(m[5]))
		}
	}
	slices.Sort(ranks)
	if want := slices.Collect(func(yield func(int) bool) {
		for r := range n {
			yield(r)
		}
	}); !slices.Equal(ranks, want) {
		t.Errorf("ranks %v, want %v", ranks, want)
	}
}

// pmixValue is what rank r puts under key in round i.
func pmixValue(key string, r, round int) []byte {
	switch key {
	case "empty":
		return nil
	case "big":
		return bytes.Repeat([]byte{byte(r), byte(round), 0}, maxValue/3)
	}
	return fmt.Appendf(nil, "%q of rank %d, round %d", key, r, round)
}

var pmixKeys = []string{"card", "big", "empty", "bin\x00key é", "bootstrap.x"}

func TestPMIxJobRank(t *testing.T) {
	ctx := asRank(t)
	nspace := os.Getenv(EnvPMIxNamespace) // Open takes it out of the environment
	bs, err := Open(ctx, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Close()
	r, n := bs.Rank(), bs.Size()
	// What a child would inherit: no way to join as this rank, and the
	// mark of a rank's child.
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k == EnvPMIxRank || k == EnvPMIxNamespace || k == "PMIX_ID" || strings.HasPrefix(k, "PMIX_SERVER_URI") {
			t.Errorf("%s is still in the environment after Open", kv)
		}
	}
	if got, want := os.Getenv(EnvPMIxParent), nspace+"."+strconv.Itoa(r); got != want {
		t.Errorf("%s=%q after Open, want %q", EnvPMIxParent, got, want)
	}
	// The launcher's own view of the job, to check the backend's against.
	for _, v := range [][3]string{
		{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"},
		{"SLURM_PROCID", "SLURM_NTASKS", "Slurm"},
	} {
		if want, ok := os.LookupEnv(v[0]); ok && strconv.Itoa(r) != want {
			t.Errorf("rank %d, %s says %s", r, v[2], want)
		}
		if want, ok := os.LookupEnv(v[1]); ok && strconv.Itoa(n) != want {
			t.Errorf("size %d, %s says %s", n, v[2], want)
		}
	}
	if want := cleanJobID(nspace); bs.JobID() != want {
		t.Errorf("job id %q, want %q", bs.JobID(), want)
	}
	// Round 1 puts every key ("card" twice: the second value counts),
	// round 2 a new one; a key published in round 1 cannot be put again.
	if err := bs.Put("card", []byte("overwritten before the fence")); err != nil {
		t.Fatal(err)
	}
	for round, keys := range [][]string{1: pmixKeys, 2: {"late"}} {
		if round == 0 {
			continue
		}
		for _, k := range keys {
			if err := bs.Put(k, pmixValue(k, r, round)); err != nil {
				t.Fatal(err)
			}
		}
		if err := bs.Fence(ctx); err != nil {
			t.Fatal(err)
		}
		if err := bs.Put("card", nil); err == nil || !strings.Contains(err.Error(), "published once") {
			t.Errorf("round %d: a second put of a published key: %v, want an error", round, err)
		}
		for q := range n {
			for _, k := range append(pmixKeys, "late") {
				want, wantRound := pmixValue(k, q, 1), 1
				if k == "late" {
					want, wantRound = pmixValue(k, q, 2), 2
				}
				if round < wantRound {
					// Not checked: PMIx may show a put once its
					// rank has committed it, before the fence.
					continue
				}
				got, err := bs.Get(ctx, q, k)
				switch {
				case err != nil:
					t.Errorf("round %d: get %q of rank %d: %v", round, k, q, err)
				case !bytes.Equal(got, want):
					t.Errorf("round %d: get %q of rank %d = %.40q, want %.40q", round, k, q, got, want)
				}
			}
			if _, err := bs.Get(ctx, q, "never put"); !errors.Is(err, ErrNotFound) {
				t.Errorf("get of a key rank %d never put: %v, want ErrNotFound", q, err)
			}
		}
	}
	// A Fence whose ctx ends stays under way: the next Fence joins the
	// same barrier. Rank 0 comes late, so the others' first try usually
	// ends first; either way every rank takes part in one barrier.
	if r == 0 {
		time.Sleep(200 * time.Millisecond)
	}
	if err := bs.Put("slow", pmixValue("slow", r, 3)); err != nil {
		t.Fatal(err)
	}
	short, stopShort := context.WithTimeout(ctx, 10*time.Millisecond)
	err = bs.Fence(short)
	stopShort()
	if errors.Is(err, context.DeadlineExceeded) {
		t.Logf("rank %d: the first fence ended with its ctx; joining it again", r)
		err = bs.Fence(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	for q := range n {
		if got, err := bs.Get(ctx, q, "slow"); err != nil || !bytes.Equal(got, pmixValue("slow", q, 3)) {
			t.Errorf("get \"slow\" of rank %d after a resumed fence = %q, %v", q, got, err)
		}
	}
	cancelled, stop := context.WithCancel(ctx)
	stop()
	if _, err := bs.Get(cancelled, (r+1)%n, "card"); !errors.Is(err, context.Canceled) {
		t.Errorf("get with a cancelled ctx: %v", err)
	}
	if _, err := bs.Get(ctx, n, "card"); err == nil {
		t.Errorf("get of rank %d succeeded", n)
	}
	if t.Failed() {
		return
	}
	fmt.Printf("pmix rank %d of %d on %s job %s secret %x\n", r, n, bs.Host(), bs.JobID(), bs.Secret())
	if err := bs.Close(); err != nil {
		t.Fatal(err)
	}
	if err := bs.Fence(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("fence after close: %v, want ErrClosed", err)
	}
	if err := bs.Put("k", nil); !errors.Is(err, ErrClosed) {
		t.Errorf("put after close: %v, want ErrClosed", err)
	}
}

// TestPMIxAbort: a rank's Abort ends the job under mpirun, with a failing
// status and the reason in the output.
func TestPMIxAbort(t *testing.T) {
	status, out := mpirunJob(t, 3, "TestPMIxAbortRank")
	if status == 0 {
		t.Errorf("mpirun exited 0 after an abort")
	}
	if !strings.Contains(out, "rank 1 gives up") || !strings.Contains(out, "aborting the job") {
		t.Errorf("output does not give the abort's reason")
	}
}

func TestPMIxAbortRank(t *testing.T) {
	ctx := asRank(t)
	// The reason reaches the output through the logger: Open MPI's mpirun
	// does not print PMIx_Abort's message.
	logger := hclog.New(&hclog.LoggerOptions{Output: os.Stderr, Level: hclog.Error})
	bs, err := Open(ctx, logger)
	if err != nil {
		t.Fatal(err)
	}
	if bs.Rank() == 1 {
		// Abort returns only if PMIx_Abort failed.
		err := bs.Abort(3, "rank 1 gives up")
		t.Fatalf("abort returned: %v", err)
	}
	// Not in a Fence: Open MPI 4.1.4's mpirun, killing ranks that wait in
	// one after an abort, now and then deadlocks in PMIx_server_finalize
	// once every rank has exited (1 launch in 40 under load, even with
	// the aborting rank exiting at once; a C client of libpmix alone
	// shows it too), which is mpirun's defect and not this test's
	// subject. Sleeping ranks never did (0 in 40, 0 in 30 in C).
	time.Sleep(pmixWatchdog)
	t.Errorf("rank %d outlived the abort", bs.Rank())
}

// TestPMIxChild: a process a rank starts inherits the rank's environment,
// yet cannot join the job as a second copy of the rank (it took the
// rank's place in the barrier, and the rank's own Fence never ended): its
// Open fails naming EnvPMIxParent, as a rank's child's does under mdrun
// and PMI, and without EnvPMIxParent it is a singleton.
func TestPMIxChild(t *testing.T) {
	mpirunEach(t, 2, "TestPMIxChildRank", "pmix child rank fenced")
}

// pmixChildEnv tells TestPMIxChildRank that it runs as a rank's child.
const pmixChildEnv = "MD_PMIX_TEST_CHILD"

func TestPMIxChildRank(t *testing.T) {
	ctx := asRank(t)
	if os.Getenv(pmixChildEnv) != "" {
		// A child that joins the job waits in Open's fence for ranks
		// that have moved on; the ctx turns that hang into a failure.
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		bs, err := Open(ctx, testLogger(t))
		if err != nil {
			fmt.Printf("child open: %v\n", err)
			return
		}
		fmt.Printf("child opened: rank %d of %d\n", bs.Rank(), bs.Size())
		bs.Close()
		return
	}
	bs, err := Open(ctx, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Close()
	if bs.Rank() == 0 {
		parent := EnvPMIxParent + "=" + os.Getenv(EnvPMIxParent)
		for _, tt := range []struct {
			name string
			env  []string
			want string
		}{
			{"inherited", os.Environ(), "child open: bootstrap: pmix: " + parent + ": this process was started by that rank"},
			{"without " + EnvPMIxParent, slices.DeleteFunc(os.Environ(), func(kv string) bool {
				return strings.HasPrefix(kv, EnvPMIxParent+"=")
			}), "child opened: rank 0 of 1"},
		} {
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1")
			cmd.Env = append(tt.env, pmixChildEnv+"=1")
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), tt.want) {
				t.Errorf("%s: child (%v) said %q, want %q", tt.name, err, out, tt.want)
			}
		}
	}
	// A child that joined as rank 0 took rank 0's place in this barrier,
	// which then never ends; the ctx turns that hang into a failure.
	fenceCtx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	if err := bs.Fence(fenceCtx); err != nil {
		t.Fatalf("rank %d: fence after the child: %v", bs.Rank(), err)
	}
	fmt.Printf("pmix child rank fenced: %d\n", bs.Rank())
}

// TestPMIxAbortBeforeRelease: a rank's Fence, waiting in its main
// goroutine while another goroutine aborts, does not return before the
// abort reached the server: a program that exits on a failed Fence does
// not end the job with its own status before the abort's.
func TestPMIxAbortBeforeRelease(t *testing.T) {
	status, _ := mpirunJob(t, 3, "TestPMIxAbortBeforeReleaseRank")
	if status != 3 {
		t.Errorf("mpirun exited %d, want the abort's 3", status)
	}
}

func TestPMIxAbortBeforeReleaseRank(t *testing.T) {
	ctx := asRank(t)
	bs := openAborter(t, ctx)
	if bs == nil {
		return
	}
	go func() {
		// Usually after the Fence below has begun; either way the
		// Fence must not return before the abort went out, and then
		// Abort ends the process.
		time.Sleep(100 * time.Millisecond)
		bs.Abort(3, "rank 1 gives up")
	}()
	err := bs.Fence(ctx)
	fmt.Fprintf(os.Stderr, "rank 1: fence: %v; exiting 1\n", err)
	os.Exit(1)
}

// TestPMIxCallAfterAbort: a Fence, Get or second Abort called after
// Abort began, in Abort's pause before PMIx_Abort, does not return before
// the abort went out: a program that exits on the failed call does not
// end the job with its own status before the abort's.
func TestPMIxCallAfterAbort(t *testing.T) {
	for _, call := range []string{"fence", "get", "abort"} {
		t.Run(call, func(t *testing.T) {
			status, out := mpirunJob(t, 3, "TestPMIxCallAfterAbortRank", "-x", pmixCallEnv+"="+call)
			if status != 3 {
				t.Errorf("mpirun exited %d, want the abort's 3", status)
			}
			if !strings.Contains(out, "rank 1: "+call+" after abort began") {
				t.Errorf("rank 1 made no %s after the abort began", call)
			}
			if strings.Contains(out, "rank 1: "+call+" after abort: ") {
				t.Errorf("rank 1's %s returned, and Abort did not end the process", call)
			}
		})
	}
}

// TestPMIxClosedJobCalls: on a closed job Fence and Get fail with
// ErrClosed at once; on an aborting one they wait until PMIx_Abort has
// returned, or a Fence's ctx has ended, whose error it then wraps too.
func TestPMIxClosedJobCalls(t *testing.T) {
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	calls := []struct {
		name string
		call func(j *pmixJob, ctx context.Context) error
	}{
		{"fence", (*pmixJob).Fence},
		{"get", func(j *pmixJob, ctx context.Context) error { _, err := j.Get(ctx, 1, "k"); return err }},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			closed := &pmixJob{size: 2, dead: make(chan struct{}), closing: true}
			close(closed.dead)
			if err := c.call(closed, ctx); !errors.Is(err, ErrClosed) {
				t.Errorf("closed job: %v, want ErrClosed", err)
			}
			aborting := &pmixJob{size: 2, dead: make(chan struct{}), closing: true, aborted: true}
			done := make(chan error, 1)
			go func() { done <- c.call(aborting, ctx) }()
			// Not a bound on speed: a call that returned before
			// dead closed is wrong whenever it is seen.
			runtime.Gosched()
			select {
			case err := <-done:
				t.Fatalf("aborting job: returned before the abort went out: %v", err)
			default:
			}
			close(aborting.dead)
			if err := <-done; !errors.Is(err, ErrClosed) {
				t.Errorf("aborting job, once the abort went out: %v, want ErrClosed", err)
			}
		})
	}
	// A Get checks its ctx before the job, so the ctx's end while it
	// waits for the abort is a Fence's case only.
	aborting := &pmixJob{size: 2, dead: make(chan struct{}), closing: true, aborted: true}
	if err := aborting.Fence(cancelled); !errors.Is(err, ErrClosed) || !errors.Is(err, context.Canceled) {
		t.Errorf("fence of an aborting job with an ended ctx: %v, want ErrClosed and context.Canceled", err)
	}
}

// pmixCallEnv names the call TestPMIxCallAfterAbortRank makes.
const pmixCallEnv = "MD_PMIX_TEST_CALL"

// startAbort starts bs.Abort(3, ...) on a goroutine of its own and
// returns once the abort has begun.
func startAbort(bs Bootstrap) {
	go bs.Abort(3, "rank 1 gives up")
	j := bs.(*pmixJob)
	for {
		j.mu.Lock()
		closing := j.closing
		j.mu.Unlock()
		if closing {
			return
		}
		runtime.Gosched()
	}
}

func TestPMIxCallAfterAbortRank(t *testing.T) {
	ctx := asRank(t)
	bs := openAborter(t, ctx)
	if bs == nil {
		return
	}
	// The call below then starts while Abort pauses before PMIx_Abort.
	startAbort(bs)
	call := os.Getenv(pmixCallEnv)
	fmt.Fprintf(os.Stderr, "rank 1: %s after abort began\n", call)
	var err error
	switch call {
	case "fence":
		err = bs.Fence(ctx)
	case "get":
		_, err = bs.Get(ctx, 0, secretKey)
	case "abort": // a second one
		err = bs.Abort(3, "rank 1 gives up again")
	default:
		t.Fatalf("%s=%q", pmixCallEnv, call)
	}
	fmt.Fprintf(os.Stderr, "rank 1: %s after abort: %v; exiting 1\n", call, err)
	os.Exit(1)
}

// TestPMIxAbortCode: an Abort whose code is no failing exit status (0,
// or 256, whose low 8 bits are 0) still fails the job, with status 1, as
// mdrun's does: PMIx_Abort's code becomes mpirun's status and the rank's
// own exit status, and either would report the aborted job a success.
func TestPMIxAbortCode(t *testing.T) {
	for _, tt := range []struct{ code, want int }{{0, 1}, {256, 1}} {
		t.Run(strconv.Itoa(tt.code), func(t *testing.T) {
			status, _ := mpirunJob(t, 2, "TestPMIxAbortCodeRank", "-x", pmixCodeEnv+"="+strconv.Itoa(tt.code))
			if status != tt.want {
				t.Errorf("Abort(%d, ...): mpirun exited %d, want %d", tt.code, status, tt.want)
			}
		})
	}
}

// pmixCodeEnv is the code TestPMIxAbortCodeRank aborts with.
const pmixCodeEnv = "MD_PMIX_TEST_CODE"

func TestPMIxAbortCodeRank(t *testing.T) {
	ctx := asRank(t)
	bs := openAborter(t, ctx)
	if bs == nil {
		return
	}
	code, err := strconv.Atoi(os.Getenv(pmixCodeEnv))
	if err != nil {
		t.Fatalf("%s: %v", pmixCodeEnv, err)
	}
	// Abort returns only if PMIx_Abort failed.
	err = bs.Abort(code, "rank 1 gives up")
	t.Fatalf("abort returned: %v", err)
}

// TestPMIxCloseDuringAbort: a Close (a main that returns, say) while
// another goroutine aborts does not return before the abort went out: a
// program that exits once Close returned must not end the job with its
// own status, 0, before the abort's, losing its code and reason.
func TestPMIxCloseDuringAbort(t *testing.T) {
	status, _ := mpirunJob(t, 3, "TestPMIxCloseDuringAbortRank")
	if status != 3 {
		t.Errorf("mpirun exited %d, want the abort's 3", status)
	}
}

func TestPMIxCloseDuringAbortRank(t *testing.T) {
	ctx := asRank(t)
	bs := openAborter(t, ctx)
	if bs == nil {
		return
	}
	// The Close below then comes while Abort pauses before PMIx_Abort.
	startAbort(bs)
	err := bs.Close()
	fmt.Fprintf(os.Stderr, "rank 1: close during abort: %v; exiting 0\n", err)
	os.Exit(0)
}

// TestPMIxCloseWaitsForAbort: Close on an aborting job returns only once
// the abort went out (dead closed: PMIx_Abort returned), and then nil.
func TestPMIxCloseWaitsForAbort(t *testing.T) {
	aborting := &pmixJob{size: 2, dead: make(chan struct{}), closing: true, aborted: true}
	done := make(chan error, 1)
	go func() { done <- aborting.Close() }()
	// Not a bound on speed: a Close that returned before dead closed is
	// wrong whenever it is seen.
	runtime.Gosched()
	select {
	case err := <-done:
		t.Fatalf("returned before the abort went out: %v", err)
	default:
	}
	close(aborting.dead)
	if err := <-done; err != nil {
		t.Errorf("close once the abort went out: %v, want nil", err)
	}
}

// TestPMIxReopenAfterFailedInit: after an Open whose PMIx_Init failed,
// an Open under a reachable server fails too, naming the first failure:
// libpmix keeps state from the failed PMIx_Init, under which a second one
// succeeds into a job that is not the launcher's (rank 0 of 1 while
// mpirun started 2, a world split without a word; or a fence that never
// ends). Rank 1 does not open, as rank 0 never joins; it waits until rank
// 0 is done, since mpirun ends the job when a rank that never called
// PMIx_Init exits while another has.
func TestPMIxReopenAfterFailedInit(t *testing.T) {
	done := filepath.Join(t.TempDir(), "done")
	mpirunEach(t, 2, "TestPMIxReopenAfterFailedInitRank", "pmix reopen after failed init refused", "-x", pmixDoneEnv+"="+done)
}

// pmixDoneEnv names the file whose creation tells
// TestPMIxReopenAfterFailedInitRank's rank 1 that rank 0 is done.
const pmixDoneEnv = "MD_PMIX_TEST_DONE"

func TestPMIxReopenAfterFailedInitRank(t *testing.T) {
	ctx := asRank(t)
	done := os.Getenv(pmixDoneEnv)
	if os.Getenv("OMPI_COMM_WORLD_RANK") != "0" {
		for {
			if _, err := os.Stat(done); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("rank 0 was not done within %v", pmixWatchdog)
			case <-time.After(10 * time.Millisecond):
			}
		}
		fmt.Println("pmix reopen after failed init refused")
		return
	}
	defer os.WriteFile(done, nil, 0o600)
	var first error
	func() {
		for _, kv := range os.Environ() {
			if k, v, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "PMIX_SERVER_URI") {
				if err := os.Setenv(k, "1.0;tcp4://127.0.0.1:1"); err != nil { // nobody listens on port 1
					t.Fatal(err)
				}
				defer os.Setenv(k, v)
			}
		}
		bs, err := Open(ctx, testLogger(t))
		if err == nil {
			bs.Close()
			t.Fatal("open with an unreachable server succeeded")
		}
		first = err
	}()
	// Bounded: an Open that joins waits in its fence for rank 1.
	retryCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	bs, err := Open(retryCtx, testLogger(t))
	if err == nil {
		defer bs.Close()
		t.Fatalf("open after a failed PMIx_Init succeeded: rank %d of %d, where mpirun started %s ranks",
			bs.Rank(), bs.Size(), os.Getenv("OMPI_COMM_WORLD_SIZE"))
	}
	if !errors.Is(err, errPMIxJoinedOnce) || !strings.Contains(err.Error(), first.Error()) {
		t.Fatalf("open after a failed PMIx_Init: %v, want errPMIxJoinedOnce naming the first failure %q", err, first)
	}
	fmt.Println("pmix reopen after failed init refused")
}

// TestPMIxOneClient: a process has one PMIx Bootstrap at a time (a PMIx
// server admits a process once), and joins the job once: a second Open
// while the first is open fails, and so does an Open after Close (the
// launch variables never come back into the environment, where a child
// started meanwhile would inherit them), also after a Close that dropped
// a Fence under way (which a server refused to admit again with
// PMIX_ERR_PARTIAL_SUCCESS). A rank that inherited a stale PMI_FD (from a
// PMI rank above mpirun) joins all the same, and takes it out of its
// environment, where its children would write a PMI handshake into
// whatever file has the number.
func TestPMIxOneClient(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"closed", nil},
		{"hash store", []string{"-x", "PMIX_MCA_gds=hash"}},
		{"closed mid fence", []string{"-x", pmixMidFenceEnv + "=1"}},
		{"stale PMI_FD", []string{"-x", EnvPMIFD + "=99999"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mpirunEach(t, 3, "TestPMIxOneClientRank", "pmix open after close refused", tt.args...)
		})
	}
}

// TestPMIxConcurrentOpen: Opens racing in one rank never make it a
// singleton: while one joins, the others find the launch variables or the
// variable that replaces them in the environment, never neither.
func TestPMIxConcurrentOpen(t *testing.T) {
	mpirunEach(t, 2, "TestPMIxConcurrentOpenRank", "pmix concurrent opens: one joined")
}

func TestPMIxConcurrentOpenRank(t *testing.T) {
	ctx := asRank(t)
	var stop atomic.Bool
	var singletons, opens atomic.Int64
	joined := make(chan Bootstrap, 1)
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			for !stop.Load() && ctx.Err() == nil {
				opens.Add(1)
				b, err := Open(ctx, testLogger(t))
				switch {
				case err != nil:
				case b.Size() == 1:
					singletons.Add(1)
					b.Close()
				default:
					joined <- b
					stop.Store(true)
				}
			}
		})
	}
	wg.Wait()
	select {
	case b := <-joined:
		defer b.Close()
	default:
		t.Fatal("no Open joined the job")
	}
	if n := singletons.Load(); n > 0 {
		t.Fatalf("%d of %d Opens became singletons", n, opens.Load())
	}
	fmt.Println("pmix concurrent opens: one joined")
}

// pmixMidFenceEnv makes TestPMIxOneClientRank's rank 1 close while a
// Fence is under way.
const pmixMidFenceEnv = "MD_PMIX_TEST_MID_FENCE"

func TestPMIxOneClientRank(t *testing.T) {
	ctx := asRank(t)
	a, err := Open(ctx, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := os.LookupEnv(EnvPMIFD); ok {
		t.Errorf("%s=%s still in the environment of a PMIx rank", EnvPMIFD, v)
	}
	b, err := Open(ctx, testLogger(t))
	if err == nil {
		b.Close()
		a.Close()
		t.Fatalf("a second Open while the first is open succeeded")
	}
	if want := fmt.Sprintf("this process is already rank %d of namespace", a.Rank()); !errors.Is(err, errPMIxInUse) || !strings.Contains(err.Error(), want) {
		t.Errorf("second open: %v, want errPMIxInUse saying %q", err, want)
	}
	if os.Getenv(pmixMidFenceEnv) != "" {
		// Rank 1 fences alone, so its Fence is still under way when
		// its ctx ends and it closes; the others wait a little (not an
		// assertion: either way rank 1 closes with or after a Fence)
		// and close without one.
		if a.Rank() == 1 {
			short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
			err := a.Fence(short)
			stop()
			t.Logf("rank 1: fence alone: %v", err)
		} else {
			time.Sleep(time.Second)
		}
	}
	if err := a.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	// Watch the environment while the next Open runs: the launch
	// variables must not come back, even for a moment.
	stop := make(chan struct{})
	seen := make(chan []string)
	go func() {
		var leaked []string
		for {
			select {
			case <-stop:
				seen <- leaked
				return
			default:
			}
			if vars := pmixLaunchVars(os.Environ()); len(vars) > 0 && leaked == nil {
				leaked = vars
			}
			runtime.Gosched()
		}
	}()
	c, err := Open(ctx, testLogger(t))
	close(stop)
	if leaked := <-seen; leaked != nil {
		t.Errorf("the launch variables were back in the environment during the Open after Close: %q", leaked)
	}
	if err == nil {
		c.Close()
		t.Fatalf("open after close succeeded")
	}
	want := fmt.Sprintf("bootstrap: pmix: this process was rank %d of namespace %s and closed its PMIx client; a process joins a PMIx job once",
		a.Rank(), a.(*pmixJob).nspace)
	if !errors.Is(err, errPMIxJoinedOnce) || err.Error() != want {
		t.Fatalf("open after close: %v, want %q", err, want)
	}
	fmt.Printf("pmix open after close refused: rank %d\n", a.Rank())
}

// TestPMIxClientState: the process's PMIx client goes to one Open at a
// time; an Open that failed before PMIx_Init gives it back, and once a
// client was finalized, or a PMIx_Init failed, no Open gets it again.
func TestPMIxClientState(t *testing.T) {
	j := &pmixJob{nspace: "389349377", rank: 2}
	tests := []struct {
		name    string
		steps   func(c *pmixClientState)
		wantErr error // of the next acquire; nil for none
		want    string
	}{
		{"new", func(c *pmixClientState) {}, nil, ""},
		{"open", func(c *pmixClientState) { c.acquire(); c.opened(j) }, errPMIxInUse, "already rank 2 of namespace 389349377"},
		{"joining", func(c *pmixClientState) { c.acquire() }, errPMIxInUse, "another Open of this process is joining"},
		{"open failed before joining", func(c *pmixClientState) { c.acquire(); c.opened(nil) }, nil, ""},
		{"closed", func(c *pmixClientState) { c.acquire(); c.opened(j); c.closed(j) }, errPMIxJoinedOnce,
			"bootstrap: pmix: this process was rank 2 of namespace 389349377 and closed its PMIx client; a process joins a PMIx job once"},
		{"open failed after joining", func(c *pmixClientState) { c.acquire(); c.closed(j); c.opened(nil) }, errPMIxJoinedOnce, "was rank 2"},
		{"abandoned init finalized", func(c *pmixClientState) { c.acquire(); c.finalized("389349377", 2); c.opened(nil) }, errPMIxJoinedOnce, "was rank 2"},
		{"init failed", func(c *pmixClientState) {
			c.acquire()
			c.initFailed(errors.New("PMIx_Init: PMIX_ERR_UNREACH"))
			c.opened(nil)
		},
			errPMIxJoinedOnce, "an earlier Open's PMIx_Init failed (PMIx_Init: PMIX_ERR_UNREACH)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &pmixClientState{}
			tt.steps(c)
			err := c.acquire()
			switch {
			case tt.wantErr == nil && err != nil:
				t.Errorf("acquire: %v, want nil", err)
			case tt.wantErr != nil && (!errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("acquire: %v, want %v saying %q", err, tt.wantErr, tt.want)
			}
		})
	}
}

// TestPMIxInitCtx: Open's ctx bounds PMIx_Init, which blocks in C while a
// server that accepted the connection says nothing; while that PMIx_Init
// still runs, another Open fails saying so, and once it has failed, it
// has used up the client as any failed PMIx_Init does: a later Open fails
// naming that failure.
func TestPMIxInitCtx(t *testing.T) {
	if !inOwnProcess(t) {
		return
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conns := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(conns)
				return
			}
			conns <- c // held open, silent
		}
	}()
	uri := fmt.Sprintf("389349376.0;tcp4://%s", ln.Addr())
	for _, kv := range openMPIEnv {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PMIX_SERVER_URI") {
			v = uri
		}
		t.Setenv(k, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		bs, err := open(ctx, testLogger(t), os.LookupEnv, nil)
		if err == nil {
			bs.Close()
		}
		done <- err
	}()
	// A watchdog for a hang, not a bound on speed.
	const hung = 30 * time.Second
	select {
	case err = <-done:
	case <-time.After(hung):
		t.Fatalf("open still blocked in PMIx_Init %v after start, with a ctx of 1s", hung)
	}
	for _, want := range []string{"bootstrap: pmix: PMIx_Init", "PMIX_SERVER_URI41=" + uri} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("open: %v, want an error saying %q", err, want)
		}
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("open: %v, want context.DeadlineExceeded", err)
	}
	// The abandoned PMIx_Init holds the process's client. (Were it let
	// through, this Open's PMIx_Init would meet the same silent server;
	// the ctx bounds it.)
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	bs, err := open(ctx2, testLogger(t), os.LookupEnv, nil)
	if err == nil {
		bs.Close()
		t.Fatal("open while the abandoned PMIx_Init runs succeeded")
	}
	if !errors.Is(err, errPMIxInUse) || !strings.Contains(err.Error(), "abandoned") {
		t.Errorf("open while the abandoned PMIx_Init runs: %v, want errPMIxInUse naming it", err)
	}
	// Hang up: the abandoned PMIx_Init fails and lets go of the client,
	// used up.
	ln.Close()
	for c := range conns {
		c.Close()
	}
	for deadline := time.Now().Add(pmixWatchdog); ; {
		pmixClient.mu.Lock()
		busy := pmixClient.opening || pmixClient.abandoned
		pmixClient.mu.Unlock()
		if !busy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the abandoned PMIx_Init still holds the client %v after the server hung up", pmixWatchdog)
		}
		time.Sleep(10 * time.Millisecond)
	}
	bs, err = open(context.Background(), testLogger(t), os.LookupEnv, nil)
	if err == nil {
		bs.Close()
		t.Fatal("open after the abandoned PMIx_Init failed succeeded")
	}
	if !errors.Is(err, errPMIxJoinedOnce) || !strings.Contains(err.Error(), "PMIx_Init failed (bootstrap: pmix: PMIx_Init: PMIX_ERR_") {
		t.Errorf("open after the abandoned PMIx_Init failed: %v, want errPMIxJoinedOnce naming that failure", err)
	}
}
