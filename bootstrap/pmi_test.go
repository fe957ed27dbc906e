package bootstrap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// openPMIRanks opens every rank of f's job concurrently (the handshake
// includes a fence) with extra environment added.
func openPMIRanks(t *testing.T, f *fakePMI, extra ...string) []Bootstrap {
	t.Helper()
	ranks := make([]Bootstrap, f.size)
	errs := make([]error, f.size)
	envs := make([][]string, f.size)
	for r := range f.size {
		envs[r] = append(f.env(r), extra...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for r := range f.size {
		wg.Go(func() {
			ranks[r], errs[r] = open(ctx, testLogger(t).Named(fmt.Sprint("rank", r)), envSnapshot(envs[r]), nil)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("open rank %d: %v", r, err)
		}
		bs := ranks[r]
		t.Cleanup(func() { bs.Close() })
	}
	return ranks
}

// pmiExchange runs two rounds of put, fence and get-from-everyone, with
// values large enough to need several chunks.
func pmiExchange(bs Bootstrap, n int) error {
	ctx := context.Background()
	value := func(rank, round int) []byte {
		return bytes.Repeat([]byte{byte(rank), byte(round), 0, ' ', ';', '=', '\n', 0xff}, 300+rank*50)
	}
	for round := range 2 {
		key := fmt.Sprintf("card/%d", round)
		if err := bs.Put(key, value(bs.Rank(), round)); err != nil {
			return err
		}
		if err := bs.Put(key+"/empty", nil); err != nil {
			return err
		}
		if err := bs.Fence(ctx); err != nil {
			return fmt.Errorf("rank %d round %d: %w", bs.Rank(), round, err)
		}
		for peer := range n {
			got, err := bs.Get(ctx, peer, key)
			if err != nil {
				return fmt.Errorf("rank %d round %d: %w", bs.Rank(), round, err)
			}
			if !bytes.Equal(got, value(peer, round)) {
				return fmt.Errorf("rank %d round %d: card of %d has %d bytes, want %d", bs.Rank(), round, peer, len(got), len(value(peer, round)))
			}
			if got, err := bs.Get(ctx, peer, key+"/empty"); err != nil || len(got) != 0 {
				return fmt.Errorf("rank %d round %d: empty value of %d = %q, %v", bs.Rank(), round, peer, got, err)
			}
		}
	}
	return nil
}

func TestPMIJob(t *testing.T) {
	tests := []struct {
		name    string
		opts    func(*fakePMI)
		extra   []string
		wantJob string
	}{
		{"pmi2", nil, nil, "fake_job_7"},
		{"pmi2-lazy-fence", func(f *fakePMI) { f.lazy = true }, nil, "fake_job_7"},
		{"pmi2-hydra", func(f *fakePMI) { f.lazy, f.missRC = true, true }, nil, "fake_job_7"},
		{"pmi1-pinned", nil, []string{"MD_PMI=1"}, "kvs_fake_1"},
		{"pmi1-after-refused-pmi2", func(f *fakePMI) { f.noV2 = true }, nil, "kvs_fake_1"},
		{"pmi1-small-values", func(f *fakePMI) { f.valMax = 40 }, []string{"MD_PMI=1"}, "kvs_fake_1"},
		{"pmi1-short-keys", func(f *fakePMI) { f.keyMax = 32 }, []string{"MD_PMI=1"}, "kvs_fake_1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const n = 4
			f := newFakePMI(t, n, func(f *fakePMI) {
				f.mapping = "(vector,(0,2,2))"
				if tt.opts != nil {
					tt.opts(f)
				}
			})
			ranks := openPMIRanks(t, f, tt.extra...)
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for _, bs := range ranks {
				wg.Go(func() { errs <- pmiExchange(bs, n) })
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
			for r, bs := range ranks {
				if bs.Rank() != r || bs.Size() != n || bs.JobID() != tt.wantJob || len(bs.Secret()) != 32 || !bytes.Equal(bs.Secret(), ranks[0].Secret()) {
					t.Errorf("rank %d: identity rank=%d size=%d job=%q secret=%x", r, bs.Rank(), bs.Size(), bs.JobID(), bs.Secret())
				}
			}
			// The mapping puts ranks 0,1 on one node and 2,3 on another.
			h := func(r int) string { return ranks[r].Host() }
			if h(0) != h(1) || h(2) != h(3) || h(0) == h(2) {
				t.Errorf("hosts %q %q %q %q, want two pairs", h(0), h(1), h(2), h(3))
			}
			for r, bs := range ranks {
				if err := bs.Close(); err != nil {
					t.Errorf("rank %d: close: %v", r, err)
				}
			}
		})
	}
}

// TestPMIFenceIsBarrier: whatever the manager's kvs-fence does, no rank
// leaves Fence before every rank entered it.
func TestPMIFenceIsBarrier(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts func(*fakePMI)
		env  string
	}{
		{"pmi2-lazy-fence", func(f *fakePMI) { f.lazy = true }, "MD_PMI=2"},
		{"pmi2-hydra", func(f *fakePMI) { f.lazy, f.missRC = true, true }, "MD_PMI=2"},
		{"pmi2", nil, "MD_PMI=2"},
		{"pmi1", nil, "MD_PMI=1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			const n = 3
			f := newFakePMI(t, n, tt.opts)
			ranks := openPMIRanks(t, f, tt.env)
			var entered atomic.Int32
			var wg sync.WaitGroup
			for r, bs := range ranks {
				wg.Go(func() {
					for round := range 3 {
						if r == round%n {
							time.Sleep(50 * time.Millisecond) // the last to arrive
						}
						entered.Add(1)
						if err := bs.Fence(context.Background()); err != nil {
							t.Errorf("rank %d: %v", r, err)
							return
						}
						if got := entered.Load(); got < int32(n*(round+1)) {
							t.Errorf("rank %d left fence %d when only %d entries were made", r, round, got)
						}
					}
				})
			}
			wg.Wait()
		})
	}
}

// TestPMIManagerDies: a rank waiting in a fence when the manager goes away
// gets a clear error, not a hang.
func TestPMIManagerDies(t *testing.T) {
	for _, v := range []string{"1", "2"} {
		t.Run("pmi"+v, func(t *testing.T) {
			f := newFakePMI(t, 2, nil)
			ranks := openPMIRanks(t, f, "MD_PMI="+v)
			done := make(chan error, 1)
			go func() { done <- ranks[0].Fence(context.Background()) }()
			time.Sleep(20 * time.Millisecond)
			f.kill()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("fence did not return after the manager died")
			}
			if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "closed the connection") || !strings.Contains(err.Error(), "PMI_FD=") {
				t.Errorf("fence error = %v; want ErrClosed naming the connection", err)
			}
			if _, err := ranks[0].Get(context.Background(), 1, "x"); !errors.Is(err, ErrClosed) {
				t.Errorf("get after the manager died = %v, want ErrClosed", err)
			}
			if err := ranks[1].Fence(context.Background()); !errors.Is(err, ErrClosed) {
				t.Errorf("other rank's fence = %v, want ErrClosed", err)
			}
		})
	}
}

func TestPMIFenceCancelAndResume(t *testing.T) {
	f := newFakePMI(t, 2, nil)
	ranks := openPMIRanks(t, f)
	if err := ranks[0].Put("k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := ranks[0].Fence(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("fence alone = %v, want deadline exceeded", err)
	}
	done := make(chan error, 1)
	go func() { done <- ranks[0].Fence(context.Background()) }()
	if err := ranks[1].Fence(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("resumed fence: %v", err)
	}
	if v, err := ranks[1].Get(context.Background(), 0, "k"); err != nil || string(v) != "v" {
		t.Errorf("get = %q, %v", v, err)
	}
}

func TestPMIGetAndPutErrors(t *testing.T) {
	f := newFakePMI(t, 2, nil)
	ranks := openPMIRanks(t, f)
	ctx := context.Background()
	if _, err := ranks[0].Get(ctx, 1, "nothing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("get of a missing key = %v, want ErrNotFound", err)
	}
	if _, err := ranks[0].Get(ctx, 2, "k"); err == nil {
		t.Error("get from rank 2 of 2 succeeded")
	}
	if err := ranks[0].Put("k", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if err := ranks[0].Put(strings.Repeat("long key ", 20), []byte("1")); err != nil {
		t.Errorf("put of a long key: %v", err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { ranks[1].Fence(ctx) })
	if err := ranks[0].Fence(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if v, err := ranks[1].Get(ctx, 0, strings.Repeat("long key ", 20)); err != nil || string(v) != "1" {
		t.Errorf("get of a long key = %q, %v", v, err)
	}
	if err := ranks[0].Put("k", []byte("2")); err == nil || !strings.Contains(err.Error(), "published once") {
		t.Errorf("second put of a published key = %v, want a refusal", err)
	}
}

// TestPMIAbort: the manager hears the abort as one that ends the job with
// the rank's code (and, under PMI-2, its reason); fakePMI ignores a PMI-2
// abort that Slurm or Hydra would not act on. A code that is no failing
// exit status (0, or one whose low 8 bits are 0 such as 256) reaches the
// manager as 1: the manager ends the job with it, and the job would
// otherwise count as a success.
func TestPMIAbort(t *testing.T) {
	for _, tt := range []struct {
		name, env string
		code      int
		reason    string
		want      string
	}{
		{"pmi1", "MD_PMI=1", 7, "rank 0 gives up;\nreally", "7"},
		{"pmi1 code 0", "MD_PMI=1", 0, "", "1"},
		{"pmi1 code 256", "MD_PMI=1", 256, "", "1"},
		{"pmi2", "MD_PMI=2", 7, "rank 0 gives up;\nreally", "7: rank 0 gives up, really"},
		{"pmi2 without reason", "MD_PMI=2", 7, "", "7: " + noAbortReason},
		{"pmi2 code 0", "MD_PMI=2", 0, "why", "1: why"},
		{"pmi2 code 256", "MD_PMI=2", 256, "why", "1: why"},
		{"pmi2 code -1", "MD_PMI=2", -1, "why", "1: why"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakePMI(t, 2, nil)
			ranks := openPMIRanks(t, f, tt.env)
			if err := ranks[0].Abort(tt.code, tt.reason); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for len(f.abortsSeen()) == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if got := f.abortsSeen(); len(got) != 1 || got[0] != tt.want {
				t.Errorf("manager saw aborts %q, want [%q]", got, tt.want)
			}
			if err := ranks[0].Put("k", nil); !errors.Is(err, ErrClosed) {
				t.Errorf("put after abort = %v, want ErrClosed", err)
			}
		})
	}
}

// TestPMILateAbort: an Abort after Close fails with ErrClosed (the
// manager was not told), and an Abort or a Close while another Abort runs
// returns only once that one's abort is out: a caller who exits on its
// return must not end the job with its own status first.
func TestPMILateAbort(t *testing.T) {
	t.Run("after Close", func(t *testing.T) {
		f := newFakePMI(t, 1, nil)
		bs := openPMIRanks(t, f)[0]
		bs.Close()
		if err := bs.Abort(5, "late"); !errors.Is(err, ErrClosed) {
			t.Errorf("abort after close: %v, want ErrClosed", err)
		}
		if got := f.abortsSeen(); len(got) != 0 {
			t.Errorf("manager saw aborts %q", got)
		}
	})
	// A second Abort, or a Close (main returning, then exiting 0), while
	// an Abort is under way returns only once its abort is out.
	for _, tt := range []struct {
		name string
		late func(*pmiJob) error
	}{
		{"Abort during another", func(j *pmiJob) error { return j.Abort(8, "second") }},
		{"Close during Abort", (*pmiJob).Close},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakePMI(t, 2, nil)
			j := openPMIRanks(t, f)[0].(*pmiJob)
			go j.Abort(7, "first")
			for closing := false; !closing; runtime.Gosched() {
				j.mu.Lock()
				closing = j.closing
				j.mu.Unlock()
			}
			err := tt.late(j)
			select {
			case <-j.abortDone:
			default:
				t.Fatal("returned before the first Abort's abort went out")
			}
			if err != nil {
				t.Errorf("%v, want nil (the first abort's outcome)", err)
			}
		})
	}
}

// TestPMI2MissingKey: a kvs-get of a key nobody put is "not found"
// however the manager words it. Slurm's mpi/pmi2 answers found=FALSE;
// current MPICH Hydra answers rc=1 (PMIU_msg_set_response_fail(.., 1,
// "key_not_found")), which MPICH's own PMI-2 barrier ignores. Fence ends
// in such a get, so reading rc=1 as a refusal fails Open and every Fence
// under Hydra.
func TestPMI2MissingKey(t *testing.T) {
	for _, tt := range []struct{ name, missing string }{
		{"slurm found=FALSE", formatPMI2("kvs-get-response", "rc", "0", "found", "FALSE")},
		{"hydra rc=1", formatPMI2("kvs-get-response", "rc", "1", "errmsg", "key_not_found")},
		{"hydra rc=1 bare", formatPMI2("kvs-get-response", "rc", "1")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := scriptedPMI2(t, slurmPMI2(tt.missing, nil))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			bs, err := open(ctx, testLogger(t), envSnapshot(env), nil)
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			defer bs.Close()
			if err := bs.Fence(ctx); err != nil {
				t.Errorf("fence: %v", err)
			}
			if _, err := bs.Get(ctx, 0, "nothing"); !errors.Is(err, ErrNotFound) {
				t.Errorf("get of a missing key = %v, want ErrNotFound", err)
			}
		})
	}
}

// TestPMI2OpenFenceError: a refusal of Open's own fence names the backend
// and the variable, as doc.go promises for every error of Open.
func TestPMI2OpenFenceError(t *testing.T) {
	slurm := slurmPMI2(formatPMI2("kvs-get-response", "rc", "0", "found", "FALSE"), nil)
	env := scriptedPMI2(t, func(m *pmiMsg) string {
		if m.cmd == "kvs-fence" {
			return formatPMI2("kvs-fence-response", "rc", "-1", "errmsg", "out of memory")
		}
		return slurm(m)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bs, err := open(ctx, testLogger(t), envSnapshot(env), nil)
	if err == nil {
		bs.Close()
		t.Fatal("open succeeded, want the fence's refusal")
	}
	if want := "bootstrap: pmi2: " + env[0] + ": "; !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "out of memory") {
		t.Errorf("open error %q, want %q... with the manager's reason", err, want)
	}
}

// TestPMI2AbortKeys: a PMI-2 abort carries the keys that make each manager
// end the whole job with the rank's code. Slurm's mpi/pmi2 _handle_abort
// kills the step only for isworld=TRUE (the other ranks would otherwise
// wait in Fence forever); Hydra reads exitcode (1 if missing) and message,
// and MPICH's parser rejects an empty value, so an empty reason still
// sends a message.
func TestPMI2AbortKeys(t *testing.T) {
	for _, tt := range []struct{ name, reason, message string }{
		{"reason", "rank 0 gives up", "rank 0 gives up"},
		{"no reason", "", noAbortReason},
	} {
		t.Run(tt.name, func(t *testing.T) {
			aborts := make(chan *pmiMsg, 1)
			env := scriptedPMI2(t, slurmPMI2(formatPMI2("kvs-get-response", "rc", "0", "found", "FALSE"), aborts))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			bs, err := open(ctx, testLogger(t), envSnapshot(env), nil)
			if err != nil {
				t.Fatal(err)
			}
			bs.Abort(3, tt.reason)
			var m *pmiMsg
			select {
			case m = <-aborts:
			case <-ctx.Done():
				t.Fatal("the manager heard no abort")
			}
			for _, kv := range [][2]string{{"isworld", "TRUE"}, {"exitcode", "3"}, {"message", tt.message}} {
				if v, _ := m.get(kv[0]); v != kv[1] {
					t.Errorf("abort sent %v: %s=%q, want %q", m.attrs, kv[0], v, kv[1])
				}
			}
			for k, v := range m.attrs {
				if v == "" {
					t.Errorf("abort sent %v: %s is empty, which MPICH's parser rejects", m.attrs, k)
				}
			}
		})
	}
}

func TestPMIOpenErrors(t *testing.T) {
	// The manager says the job is of 2^46 ranks, in PMI_SIZE and in the
	// fullinit reply, and has a process mapping to expand.
	hugeJob := func(f *fakePMI) { f.size, f.mapping = 1<<46, "(vector,(0,1,1))" }
	tests := []struct {
		name string
		env  func(f *fakePMI) []string
		opts func(*fakePMI)
		want string
	}{
		{"fd not a number", func(*fakePMI) []string { return []string{"PMI_FD=seven"} }, nil, "PMI_FD=seven is not a file descriptor"},
		{"fd not open", func(*fakePMI) []string { return []string{"PMI_FD=9999", "PMI_RANK=0", "PMI_SIZE=1"} }, nil, "PMI_FD=9999 is not an open file descriptor"},
		{"port model", func(*fakePMI) []string { return []string{"PMI_PORT=host:1"} }, nil, "PMI_PORT=host:1: the PMI port model is not supported"},
		{"pmi1 without rank", func(f *fakePMI) []string { return append(f.env(0)[:1], "PMI_SIZE=1", "MD_PMI=1") }, nil, "bootstrap: pmi1: PMI_FD="},
		{"pmi1 rank out of range", func(f *fakePMI) []string { return append(f.env(0)[:1], "PMI_RANK=3", "PMI_SIZE=2", "MD_PMI=1") }, nil, "rank 3 of 2 ranks"},
		{"garbage", func(f *fakePMI) []string { return f.env(0) }, func(f *fakePMI) { f.garbage = "hello there\n" }, "bootstrap: pmi2: PMI_FD="},
		{"manager hangs up", func(f *fakePMI) []string { return f.env(0) }, func(f *fakePMI) { f.hangUp = true }, "closed the connection"},
		{"bad mapping", func(f *fakePMI) []string { return f.env(0) }, func(f *fakePMI) { f.mapping = "(vector,(0,1" }, "process mapping"},
		// No job has more ranks than an int32 holds; a manager that says
		// otherwise is refused by name, before anything is sized by it.
		{"pmi1 size too large", func(f *fakePMI) []string { return append(f.env(0), "MD_PMI=1") }, hugeJob, "PMI_RANK/PMI_SIZE: job of 70368744177664 ranks"},
		{"pmi2 size too large", func(f *fakePMI) []string { return f.env(0) }, hugeJob, "fullinit-response: job of 70368744177664 ranks"},
		{"no version left", func(f *fakePMI) []string { return append(f.env(0), "MD_PMI=3") }, nil, "no backend accepted the launcher: pmi2: MD_PMI=3, want 1 or 2; pmi1: MD_PMI=3, want 1 or 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakePMI(t, 1, tt.opts)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			bs, err := open(ctx, testLogger(t), envSnapshot(tt.env(f)), nil)
			if err == nil {
				bs.Close()
				t.Fatalf("open succeeded, want %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("open error %q lacks %q", err, tt.want)
			}
		})
	}
}

// TestPMIOpenCancelled: a manager that never answers the handshake does not
// hold Open past its context.
func TestPMIOpenCancelled(t *testing.T) {
	f := newFakePMI(t, 2, nil)
	env := f.env(0)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	// Rank 1 never comes, so the fence of the open never completes.
	_, err := open(ctx, testLogger(t), envSnapshot(env), nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("open = %v, want deadline exceeded", err)
	}
}

func TestParseProcessMapping(t *testing.T) {
	tests := []struct {
		in   string
		size int
		want []int
		err  string
	}{
		{"(vector,(0,2,2))", 4, []int{0, 0, 1, 1}, ""},
		{"(vector,(0,1,1))", 3, []int{0, 0, 0}, ""}, // Hydra, one node: the block repeats
		{"(vector,(0,2,1))", 4, []int{0, 1, 0, 1}, ""},
		{" ( vector , (0, 2, 1) , 3 ) ", 4, []int{0, 1, 3, 0}, ""},
		{"(vector,(0,1,2),(1,1,1))", 3, []int{0, 0, 1}, ""},
		{"(vector,[(0,2,1)]x2,(5,1,1))", 5, []int{0, 1, 0, 1, 5}, ""},
		{"(vector,[0,1]x3)", 6, []int{0, 1, 0, 1, 0, 1}, ""},
		{"(vector,[(0,0,0)]x1000000000,(1,1,1))", 2, []int{1, 1}, ""},
		{"", 1, nil, "want \"(\""},
		{"(list,(0,1,1))", 1, nil, "want \"vector\""},
		{"(vector)", 1, nil, "no blocks"},
		{"(vector,(0,1))", 1, nil, "want \",\""},
		{"(vector,(0,0,5))", 1, nil, "places no rank"},
		{"(vector,(0,1,1)) x", 1, nil, "trailing text"},
		{"(vector,(0,99999999999,1))", 1, nil, "too large"},
		{"(vector,[(0,1,1)x2)", 1, nil, "want \"]x\""},
	}
	for _, tt := range tests {
		var got []int
		var err error
		for r := 0; r < tt.size && err == nil; r++ {
			var node int
			node, err = processMappingNode(tt.in, r)
			got = append(got, node)
		}
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("parse %q = %v, %v; want error with %q", tt.in, got, err, tt.err)
			}
			continue
		}
		if err != nil || fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("parse %q = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

// TestProcessMappingLargeRank: the node of a rank far into a job is counted
// out, not listed, so neither a large job nor a manager's nonsense rank
// makes a rank allocate, and counts near the limits do not overflow.
func TestProcessMappingLargeRank(t *testing.T) {
	tests := []struct {
		in   string
		rank int
		want int
	}{
		{"(vector,(0,1,1))", math.MaxInt32 - 1, 0},
		{"(vector,(0,2,1))", math.MaxInt32 - 1, 0},
		{"(vector,(0,2,1))", math.MaxInt32, 1},
		{"(vector,[(0,2,1)]x2,(5,1,1))", 1_000_000_004, 5},
		{"(vector,(3,1073741824,1073741824))", math.MaxInt64, 3 + 1<<30 - 1},
		{"(vector,[(0,1073741824,1073741824)]x1073741824,(7,1,1))", math.MaxInt64, 1<<30 - 1},
		{"(vector,[(0,0,0)]x1000000000,(1,1,1))", math.MaxInt64, 1},
	}
	for _, tt := range tests {
		if got, err := processMappingNode(tt.in, tt.rank); err != nil || got != tt.want {
			t.Errorf("node of rank %d in %q = %d, %v; want %d", tt.rank, tt.in, got, err, tt.want)
		}
	}
}

// expandMapping lists the nodes of ranks 0 to n-1 the slow way, block by
// block: the reference that FuzzProcessMapping holds processMappingNode to.
func expandMapping(items []mapItem, n int) []int {
	var nodes []int
	for {
		before := len(nodes)
		for _, it := range items {
			for range min(it.repeat, n) {
				for _, b := range it.group {
					for i := 0; i < b.nodes && b.per > 0; i++ {
						for range b.per {
							if len(nodes) == n {
								return nodes
							}
							nodes = append(nodes, b.node+i)
						}
					}
				}
			}
		}
		if len(nodes) == before {
			return nil
		}
	}
}

func TestValueChunks(t *testing.T) {
	for _, size := range []int{0, 1, 2, 23, 24, 25, 100, 1000, maxValue} {
		for _, room := range []int{minChunkRoom, 40, 1023} {
			v := make([]byte, size)
			for i := range v {
				v[i] = byte(i * 7)
			}
			chunks, err := encodeValue(v, room)
			if err != nil {
				t.Fatalf("size %d room %d: %v", size, room, err)
			}
			for i, c := range chunks {
				if len(c) > room || strings.ContainsAny(c, " ;=\n") || (len(c) == 0 && i > 0) {
					t.Fatalf("size %d room %d: chunk %d = %q", size, room, i, c)
				}
			}
			n, head, err := chunkCount(chunks[0])
			if err != nil || n != len(chunks) {
				t.Fatalf("size %d room %d: count %d, %v; %d chunks", size, room, n, err, len(chunks))
			}
			got, err := decodeValue(append([]string{head}, chunks[1:]...))
			if err != nil || !bytes.Equal(got, v) {
				t.Fatalf("size %d room %d: round trip gave %d bytes, %v", size, room, len(got), err)
			}
		}
	}
	if _, err := encodeValue(nil, minChunkRoom-1); err == nil {
		t.Error("encode with a room below the minimum succeeded")
	}
}

func TestWireKeys(t *testing.T) {
	short, err := wireKey(3, "sdi/tcp", 0, 63)
	if err != nil || short != "md.3.kc2RpL3RjcA.0" {
		t.Errorf("wireKey = %q, %v", short, err)
	}
	long1, err1 := wireKey(3, strings.Repeat("a", 100)+"1", 12, 63)
	long2, err2 := wireKey(3, strings.Repeat("a", 100)+"2", 12, 63)
	if err1 != nil || err2 != nil || long1 == long2 || len(long1) > 63 || !strings.HasPrefix(long1, "md.3.h") {
		t.Errorf("long keys %q %q, %v %v", long1, long2, err1, err2)
	}
	if _, err := wireKey(3, "k", 0, 8); err == nil {
		t.Error("wireKey fits a key in 8 bytes")
	}
}

func TestPMIWire(t *testing.T) {
	m, err := parsePMI1("cmd=get_result rc=0 msg=success value=a=b")
	if err != nil || m.cmd != "get_result" || m.attrs["value"] != "a=b" {
		t.Errorf("parsePMI1 = %+v, %v", m, err)
	}
	for _, bad := range []string{"", "rc=0 cmd=x", "cmd=a cmd=b", "cmd=x novalue", "cmd=x =1", "cmd=x a=1 a=2", "cmd="} {
		if _, err := parsePMI1(bad); !errors.Is(err, errBadPMI) {
			t.Errorf("parsePMI1(%q) = %v, want errBadPMI", bad, err)
		}
	}
	msg := formatPMI2("kvs-put", "key", "k", "value", "a;b;;c")
	if msg != "34    cmd=kvs-put;key=k;value=a;;b;;;;c;" {
		t.Errorf("formatPMI2 = %q", msg)
	}
	m, err = readPMI2(strings.NewReader(msg))
	if err != nil || m.attrs["value"] != "a;b;;c" {
		t.Errorf("readPMI2 = %+v, %v", m, err)
	}
	for _, bad := range []string{"", "5     cmd=x", "0     ", "x     cmd=x;", "999999cmd=x;", "7     cmd=x;", "8     cmd=x;a=", "9     cmd=x;a;b;"} {
		if _, err := readPMI2(strings.NewReader(bad)); err == nil {
			t.Errorf("readPMI2(%q) succeeded", bad)
		}
	}
}

func FuzzParsePMI1(f *testing.F) {
	f.Add("cmd=get_result rc=0 msg=success value=x\n")
	f.Add("cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024\n")
	f.Add("cmd=barrier_out\n")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := parsePMI1(s)
		if err != nil {
			return
		}
		if m.cmd == "" {
			t.Fatalf("parsed %q without a command", s)
		}
		// What parses must survive a format and a second parse.
		var kv []string
		for k, v := range m.attrs {
			kv = append(kv, k, v)
		}
		m2, err := parsePMI1(strings.TrimSuffix(formatPMI1(m.cmd, kv...), "\n"))
		if err != nil || m2.cmd != m.cmd || len(m2.attrs) != len(m.attrs) {
			t.Fatalf("reparse of %q: %+v, %v", s, m2, err)
		}
	})
}

func FuzzReadPMI2(f *testing.F) {
	f.Add([]byte(formatPMI2("kvs-get-response", "found", "TRUE", "value", "a;b", "rc", "0")))
	f.Add([]byte("30    cmd=fullinit-response;rc=0;"))
	f.Add([]byte("4     a=;;"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := readPMI2(bytes.NewReader(b))
		if err != nil {
			return
		}
		var kv []string
		for k, v := range m.attrs {
			kv = append(kv, k, v)
		}
		m2, err := readPMI2(strings.NewReader(formatPMI2(m.cmd, kv...)))
		if err != nil || m2.cmd != m.cmd || fmt.Sprint(m2.attrs) != fmt.Sprint(m.attrs) {
			t.Fatalf("reparse of %q: %+v, %v; first %+v", b, m2, err, m)
		}
	})
}

func FuzzProcessMapping(f *testing.F) {
	f.Add("(vector,(0,2,2))", 4)
	f.Add("(vector,[(0,2,1),3]x4,(1,1,1))", 9)
	f.Add("(vector,(0,1,1))", math.MaxInt64)
	// Any rank, however large: the manager gives it, and a node is counted
	// out without listing the ranks before it. Small ranks are checked
	// against the slow listing.
	f.Fuzz(func(t *testing.T, s string, rank int) {
		node, err := processMappingNode(s, rank)
		if err != nil {
			return
		}
		if node < 0 {
			t.Fatalf("%q gave rank %d node %d", s, rank, node)
		}
		if rank >= 4096 {
			return
		}
		p := mapParser{s: s}
		items, err := p.parse()
		if err != nil {
			t.Fatalf("%q: node %d, but it does not parse: %v", s, node, err)
		}
		if nodes := expandMapping(items, rank+1); len(nodes) != rank+1 || nodes[rank] != node {
			t.Fatalf("%q gave rank %d node %d; listing the ranks gives %v", s, rank, node, nodes)
		}
	})
}

func FuzzValueChunks(f *testing.F) {
	f.Add([]byte("card"), 40, "2:abc")
	f.Fuzz(func(t *testing.T, v []byte, room int, first string) {
		// Arbitrary text from the store decodes or fails cleanly.
		if n, head, err := chunkCount(first); err == nil {
			if n < 1 || n > maxChunks {
				t.Fatalf("count %d from %q", n, first)
			}
			decodeValue([]string{head})
		}
		if room < minChunkRoom || room > 4096 || len(v) > maxValue {
			return
		}
		chunks, err := encodeValue(v, room)
		if err != nil {
			return
		}
		_, head, err := chunkCount(chunks[0])
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeValue(append([]string{head}, chunks[1:]...))
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("round trip of %d bytes in room %d: %v", len(v), room, err)
		}
	})
}

// TestPMIChildAndRejoin: a rank's Open takes PMI_FD out of its
// environment and puts MD_PMI_PARENT there. A second Open in the rank
// fails (a process joins once), and so does a child's, which no longer
// inherits the number of the manager's connection: the child writes no
// handshake into whatever file has that number in it.
func TestPMIChildAndRejoin(t *testing.T) {
	f := newFakePMI(t, 1, nil)
	env := f.env(0)
	ownPMIEnv(t, env)
	os.Setenv(EnvPMIxParent, "389349377.0") // a PMIx rank started the launcher
	fd, _ := strconv.Atoi(strings.TrimPrefix(env[0], EnvPMIFD+"="))

	openOwn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Not inherited by children either: the number is closed (the fake
	// manager's is close-on-exec; Hydra's is not).
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err == nil {
		t.Errorf("%s=%d still open after Open", EnvPMIFD, fd)
	}
	if v, ok := os.LookupEnv(EnvPMIFD); ok {
		t.Errorf("%s=%s still set after Open", EnvPMIFD, v)
	}
	if got, want := os.Getenv(EnvPMIParent), strconv.Itoa(os.Getpid()); got != want {
		t.Errorf("%s=%q after Open, want %q", EnvPMIParent, got, want)
	}
	if v, ok := os.LookupEnv(EnvPMIxParent); ok {
		t.Errorf("%s=%s still set after Open: this rank's children would take a PMIx rank for their parent", EnvPMIxParent, v)
	}
	wantJoinsOnce(t)

	// The child gets a pipe at the number PMI_FD had.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestPMIChildOpen$", "-test.count=1")
	cmd.Env = append(os.Environ(), pmiChildEnv+"=1")
	cmd.ExtraFiles = make([]*os.File, fd-2)
	cmd.ExtraFiles[fd-3] = pw
	out, err := cmd.CombinedOutput()
	pw.Close()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if want := EnvPMIParent + "=" + strconv.Itoa(os.Getpid()) + ": this process was started by a rank of a PMI job"; !strings.Contains(string(out), want) {
		t.Errorf("child's Open did not fail with %q:\n%s", want, out)
	}
	if b, _ := io.ReadAll(pr); len(b) > 0 {
		t.Errorf("the child wrote %q into its file number %d", b, fd)
	}
}

// wantJoinsOnce opens again in this process's environment, where an Open
// joined a PMI job: that fails.
func wantJoinsOnce(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := Open(ctx, testLogger(t)); err == nil || !strings.Contains(err.Error(), "a process joins a PMI job once") {
		t.Errorf("second Open: %v, want the joins-once error", err)
	}
}

// ownPMIEnv gives this process env as a PMI manager's rank's, for Open,
// with neither parent variable set and no PMI_FD taken before.
func ownPMIEnv(t *testing.T, env []string) {
	t.Helper()
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	for _, k := range []string{EnvPMIParent, EnvPMIxParent} {
		t.Setenv(k, "") // restored when the test ends
		os.Unsetenv(k)
	}
	pmiTaken.mu.Lock()
	pmiTaken.desc = ""
	pmiTaken.mu.Unlock()
}

// openOwn is Open, in this process's environment, for the rest of the test.
func openOwn(t *testing.T) Bootstrap {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bs, err := Open(ctx, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bs.Close() })
	return bs
}

// TestPMI1OverPMIxOwnEnv: a process with PMI_FD and PMIx variables whose
// manager refuses PMI-2 joins through PMI-1, in its own environment too,
// where the PMI-2 attempt took PMI_FD out: Open's backends look at the
// environment as it was when Open began. Then neither its children nor a
// second Open find the PMIx launcher's variables to join that job with.
func TestPMI1OverPMIxOwnEnv(t *testing.T) {
	f := newFakePMI(t, 1, func(f *fakePMI) { f.noV2 = true })
	ownPMIEnv(t, append(f.env(0), openMPIEnv...))
	bs := openOwn(t)
	if _, ok := bs.(*pmiJob); !ok {
		t.Errorf("opened a %T, want the PMI backend's", bs)
	}
	// What the rank's children inherit names no launcher they could join.
	if vars := pmixLaunchVars(os.Environ()); len(vars) > 0 {
		t.Errorf("the PMIx launch variables %q are left for this rank's children", vars)
	}
	wantJoinsOnce(t)
}

// TestPMIConcurrentOpen: of two Opens at once in a rank, one joins and
// the other fails, rather than both speaking on the manager's connection.
func TestPMIConcurrentOpen(t *testing.T) {
	for i := range 20 {
		f := newFakePMI(t, 1, nil)
		ownPMIEnv(t, f.env(0))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for k := range errs {
			wg.Go(func() {
				bs, err := Open(ctx, testLogger(t))
				if err == nil {
					err = bs.Close()
				}
				errs[k] = err
			})
		}
		wg.Wait()
		cancel()
		if (errs[0] == nil) == (errs[1] == nil) {
			t.Fatalf("round %d: Opens returned %v and %v, want one to join", i, errs[0], errs[1])
		}
		for _, err := range errs {
			if err != nil && !strings.Contains(err.Error(), "a process joins a PMI job once") {
				t.Fatalf("round %d: the other Open: %v, want the joins-once error", i, err)
			}
		}
	}
}

// TestPMIStaleFD: a PMI_FD that is not one end of a stream socketpair
// (the number a PMI rank's PMI_FD had, passed down through a program that
// is not ours and closed or reused there) is no manager's connection. Open writes nothing
// into it and leaves it open; beside a PMIx launcher's variables the PMI
// backends step aside for PMIx, and alone they fail saying what the
// number is.
func TestPMIStaleFD(t *testing.T) {
	kinds := []struct {
		name string
		open func(t *testing.T) (fd int, check func(t *testing.T)) // check: it is still open, and nothing was written into it
		what string
	}{
		{"pipe", func(t *testing.T) (int, func(*testing.T)) {
			pr, pw, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pr.Close(); pw.Close() })
			return int(pw.Fd()), func(t *testing.T) {
				if _, err := pw.Write([]byte("x")); err != nil {
					t.Fatalf("the pipe was closed: %v", err)
				}
				pw.Close()
				if b, _ := io.ReadAll(pr); string(b) != "x" {
					t.Errorf("read %q from the pipe, want just the test's own \"x\"", b)
				}
			}
		}, "is a pipe, not a socket"},
		{"closed number", func(t *testing.T) (int, func(*testing.T)) {
			return 99999, func(*testing.T) {} // far above what this process opens
		}, "is not an open file descriptor"},
		{"epoll", func(t *testing.T) (int, func(*testing.T)) {
			fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { syscall.Close(fd) })
			return fd, func(t *testing.T) {
				var st syscall.Stat_t
				if err := syscall.Fstat(fd, &st); err != nil {
					t.Fatalf("the epoll descriptor was closed: %v", err)
				}
			}
		}, "is an anonymous inode"},
		{"datagram socket", func(t *testing.T) (int, func(*testing.T)) {
			fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { syscall.Close(fds[0]); syscall.Close(fds[1]) })
			return fds[0], func(t *testing.T) {
				if _, err := syscall.Write(fds[0], []byte("x")); err != nil {
					t.Fatalf("the socket was closed: %v", err)
				}
				buf := make([]byte, 100)
				if n, err := syscall.Read(fds[1], buf); err != nil || string(buf[:n]) != "x" {
					t.Errorf("read %q, %v from the socket, want just the test's own \"x\"", buf[:n], err)
				}
			}
		}, "is a socket but not a stream socket"},
		{"tcp connection", func(t *testing.T) (int, func(*testing.T)) {
			return connectedFD(t, "tcp", "127.0.0.1:0")
		}, "is a network socket"},
		{"connection to a named unix socket", func(t *testing.T) (int, func(*testing.T)) {
			return connectedFD(t, "unix", filepath.Join(t.TempDir(), "s"))
		}, "is a connection to the Unix socket"},
	}
	for _, k := range kinds {
		for _, pmix := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/pmix=%v", k.name, pmix), func(t *testing.T) {
				fd, check := k.open(t)
				env := []string{fmt.Sprintf("%s=%d", EnvPMIFD, fd), "PMI_RANK=0", "PMI_SIZE=1"}
				if pmix {
					env = append(env, openMPIEnv...)
				}
				st := &openState{env: envSnapshot(env)}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				for _, open := range []func(context.Context, hclog.Logger, *openState) (Bootstrap, error){openPMI2, openPMI1} {
					_, err := open(ctx, testLogger(t), st)
					var ref *refusedError
					switch {
					case err == nil:
						t.Fatal("open succeeded")
					case !strings.Contains(err.Error(), k.what):
						t.Errorf("open: %v, want it to say %q", err, k.what)
					case pmix != errors.As(err, &ref):
						t.Errorf("open: %v; a refusal: %v, want %v", err, !pmix, pmix)
					}
				}
				runtime.GC() // an *os.File of the number would close it when collected
				runtime.GC()
				check(t)
			})
		}
	}
}

// connectedFD connects to a listener of its own on network and address
// and returns the connection's descriptor, and a check that it is still
// open and that the other end received only the check's own byte.
func connectedFD(t *testing.T, network, address string) (int, func(*testing.T)) {
	ln, err := net.Listen(network, address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	c, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	srv, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd int
	raw.Control(func(f uintptr) { fd = int(f) })
	return fd, func(t *testing.T) {
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatalf("the connection was closed: %v", err)
		}
		srv.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 100)
		if n, err := srv.Read(buf); err != nil || string(buf[:n]) != "x" {
			t.Errorf("the other end read %q, %v; want just the test's own \"x\"", buf[:n], err)
		}
	}
}

// TestPMIInheritedNumber: the number PMI_FD names is left open when it is
// a stream socketpair that does not answer as a manager: then it may be
// somebody else's. (Once a handshake succeeded it is closed:
// TestPMIChildAndRejoin.)
func TestPMIInheritedNumber(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fds[1])
	go func() { // answers nonsense, as a peer that is no manager would
		buf := make([]byte, 512)
		syscall.Read(fds[1], buf)
		syscall.Write(fds[1], []byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
	}()
	env := envSnapshot([]string{fmt.Sprintf("%s=%d", EnvPMIFD, fds[0]), "PMI_RANK=0", "PMI_SIZE=1"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if bs, err := open(ctx, testLogger(t), env, nil); err == nil {
		bs.Close()
		t.Fatal("open succeeded")
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fds[0], &st); err != nil {
		t.Errorf("%s=%d, not the manager's, was closed by the failed Open: %v", EnvPMIFD, fds[0], err)
	} else {
		syscall.Close(fds[0])
	}
}

// pmiChildEnv tells TestPMIChildOpen that TestPMIChildAndRejoin started it.
const pmiChildEnv = "MD_PMI_TEST_CHILD"

func TestPMIChildOpen(t *testing.T) {
	if os.Getenv(pmiChildEnv) == "" {
		t.Skip("runs as the child of TestPMIChildAndRejoin")
	}
	bs, err := Open(context.Background(), testLogger(t))
	if err == nil {
		bs.Close()
		t.Fatal("a rank's child joined the job")
	}
	fmt.Println("child open:", err)
}

func TestDetectPMI(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		want bool
	}{
		{"hydra", []string{"PMI_FD=6", "PMI_RANK=0", "PMI_SIZE=1"}, true},
		{"port model", []string{"PMI_PORT=host:1"}, true},
		{"rank's child", []string{EnvPMIParent + "=4242", "PMI_RANK=0", "PMI_SIZE=1"}, true},
		// A manager the child started (nested Hydra) is the child's own.
		{"rank's child under a manager", []string{EnvPMIParent + "=4242", "PMI_FD=6"}, true},
		// And so is a PMIx launcher it ran.
		{"rank's child under pmix", append([]string{EnvPMIParent + "=4242"}, openMPIEnv...), false},
		{"nothing", []string{"PMI_RANK=0", "PMI_SIZE=1"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := detectPMI(envSnapshot(tt.env)); got != tt.want {
				t.Errorf("detectPMI = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestPMI2FenceRefusedBarrierGet: a manager that refuses Fence's barrier
// kvs-get with an error that is not "key not found" (rc=-1, its own
// failure) must fail Fence: the get is what makes Fence a barrier under
// Hydra. Reading every rc!=0 as "not
// found", as Hydra's key_not_found is, let Fence return nil without a
// barrier.
func TestPMI2FenceRefusedBarrierGet(t *testing.T) {
	slurm := slurmPMI2(formatPMI2("kvs-get-response", "rc", "0", "found", "FALSE"), nil)
	fences := 0
	env := scriptedPMI2(t, func(m *pmiMsg) string {
		if m.cmd == "kvs-fence" {
			fences++
		}
		if k, _ := m.get("key"); m.cmd == "kvs-get" && k == barrierKey && fences > 1 {
			return formatPMI2("kvs-get-response", "rc", "-1", "errmsg", "PMI server lost the job's kvs")
		}
		return slurm(m)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bs, err := open(ctx, testLogger(t), envSnapshot(env), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Close()
	if err := bs.Fence(ctx); err == nil {
		t.Fatal("Fence = nil although the manager refused its barrier get (rc=-1, \"PMI server lost the job's kvs\")")
	}
}

// TestPMI2GetRefusedIsNotMissing: a kvs-get of a key that was put,
// refused by the manager for a reason of its own, fails with the
// manager's reason, not ErrNotFound.
func TestPMI2GetRefusedIsNotMissing(t *testing.T) {
	slurm := slurmPMI2(formatPMI2("kvs-get-response", "rc", "0", "found", "FALSE"), nil)
	mine, _ := wireKey(0, "mykey", 0, 64)
	env := scriptedPMI2(t, func(m *pmiMsg) string {
		if k, _ := m.get("key"); m.cmd == "kvs-get" && k == mine {
			return formatPMI2("kvs-get-response", "rc", "-1", "errmsg", "kvs daemon unreachable")
		}
		return slurm(m)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bs, err := open(ctx, testLogger(t), envSnapshot(env), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Close()
	if err := bs.Put("mykey", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := bs.Fence(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = bs.Get(ctx, 0, "mykey")
	if errors.Is(err, ErrNotFound) || err == nil || !strings.Contains(err.Error(), "kvs daemon unreachable") {
		t.Fatalf("get of a published key the manager refused: %v; want the manager's refusal, not ErrNotFound", err)
	}
}
