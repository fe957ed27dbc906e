package adi_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/bootstrap"
	"github.com/hpc-multidevice/multidevice/subdevices/shm"
)

// Multi-process jobs: the test binary re-executes itself as the ranks of a
// job launched by a freshly built mdrun; ADI_E2E_ROLE picks what a rank does.
func TestMain(m *testing.M) {
	if role := os.Getenv("ADI_E2E_ROLE"); role != "" {
		os.Exit(rankMain(role))
	}
	os.Exit(m.Run())
}

func rankMain(role string) int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := adi.Init(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "init:", err)
		return 1
	}
	c := w.Comm()
	switch role {
	case "order":
		if err := allToAllOrder(ctx, c); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("rank %d of %d: order ok\n", c.Rank(), c.Size())
	case "collectives":
		if err := collectivesCheck(ctx, c); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("rank %d of %d: collectives ok\n", c.Rank(), c.Size())
	case "sharedwin":
		if err := sharedWindowCheck(ctx, c); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("rank %d of %d: shared window ok\n", c.Rank(), c.Size())
	case "partitioned":
		if err := partitionedAcrossProcesses(ctx, c); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("rank %d of %d: partitioned ok\n", c.Rank(), c.Size())
	case "exit3", "panic":
		// The failing rank dies only once rank 0 printed the job id the
		// test needs, and says so: mdrun ends the job at once.
		failing := map[string]int{"exit3": 2, "panic": 1}[role]
		switch c.Rank() {
		case 0:
			fmt.Printf("jobid=%s\n", os.Getenv(bootstrap.EnvJobID))
			if err := c.Send(ctx, []byte{1}, failing, 7); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		case failing:
			if _, err := c.Recv(ctx, make([]byte, 1), 0, 7); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			if role == "exit3" {
				os.Exit(3)
			}
			panic("rank 1 gives up")
		}
		// The others wait for a message that never comes; mdrun must end them.
		_, err := c.Recv(ctx, make([]byte, 1), adi.AnySource, adi.AnyTag)
		fmt.Fprintln(os.Stderr, "unexpected return from Recv:", err)
		return 1
	}
	if err := w.Finalize(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "finalize:", err)
		return 1
	}
	return 0
}

// allToAllOrder: every rank sends numbered messages of random sizes (eager
// and rendezvous) to every other and checks each source's order.
func allToAllOrder(ctx context.Context, c *adi.Comm) error {
	const per = 100
	var reqs []*adi.Request
	rng := rand.New(rand.NewPCG(uint64(c.Rank()), 1))
	for i := range per {
		for peer := range c.Size() {
			if peer == c.Rank() {
				continue
			}
			msg := make([]byte, 8+rng.IntN(100<<10))
			binary.LittleEndian.PutUint64(msg, uint64(i))
			r, err := c.Isend(msg, peer, rng.IntN(3))
			if err != nil {
				return err
			}
			reqs = append(reqs, r)
		}
	}
	next := make([]uint64, c.Size())
	buf := make([]byte, 101<<10)
	for range per * (c.Size() - 1) {
		st, err := c.Recv(ctx, buf, adi.AnySource, adi.AnyTag)
		if err != nil {
			return err
		}
		if got := binary.LittleEndian.Uint64(buf); got != next[st.Source] {
			return fmt.Errorf("rank %d: message %d from rank %d, want %d", c.Rank(), got, st.Source, next[st.Source])
		}
		next[st.Source]++
	}
	_, err := adi.WaitAll(ctx, reqs...)
	return err
}

// collectivesCheck runs each collective across processes, at sizes that go
// eager and by rendezvous, and checks what every rank gets.
func collectivesCheck(ctx context.Context, c *adi.Comm) error {
	n, me := c.Size(), c.Rank()
	for _, elems := range []int{3, 40000} {
		want := contribution(0, elems)
		for r := 1; r < n; r++ {
			affine(want, contribution(r, elems))
		}
		got := make([]uint64, elems)
		if err := adi.Allreduce(ctx, c, contribution(me, elems), got, affine); err != nil {
			return err
		}
		if !equal(got, want) {
			return fmt.Errorf("rank %d: allreduce of %d elements differs", me, elems)
		}
		clear(got)
		if err := adi.Reduce(ctx, c, contribution(me, elems), got, affine, n-1); err != nil {
			return err
		}
		if me == n-1 && !equal(got, want) {
			return fmt.Errorf("rank %d: reduce of %d elements differs", me, elems)
		}
		size := 8 * elems
		b := make([]byte, size)
		if me == 1 {
			copy(b, pattern(1, 0, size))
		}
		if err := c.Bcast(ctx, b, 1); err != nil {
			return err
		}
		if !bytes.Equal(b, pattern(1, 0, size)) {
			return fmt.Errorf("rank %d: bcast of %d bytes differs", me, size)
		}
		all := make([]byte, n*size)
		if err := c.Allgather(ctx, pattern(me, 0, size), all); err != nil {
			return err
		}
		send, recv := make([]byte, n*size), make([]byte, n*size)
		for r := range n {
			if !bytes.Equal(all[r*size:(r+1)*size], pattern(r, 0, size)) {
				return fmt.Errorf("rank %d: allgather of %d bytes: rank %d's block differs", me, size, r)
			}
			copy(send[r*size:], pattern(me, r, size))
		}
		if err := c.Alltoall(ctx, send, recv); err != nil {
			return err
		}
		for r := range n {
			if !bytes.Equal(recv[r*size:(r+1)*size], pattern(r, me, size)) {
				return fmt.Errorf("rank %d: alltoall of %d bytes: rank %d's block differs", me, size, r)
			}
		}
	}
	return c.Barrier(ctx)
}

func buildMdrun(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "mdrun")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/hpc-multidevice/multidevice/cmd/mdrun").CombinedOutput()
	if err != nil {
		t.Fatalf("build mdrun: %v\n%s", err, out)
	}
	return bin
}

func TestJobsThroughMdrun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds mdrun and starts processes")
	}
	mdrun := buildMdrun(t)
	for _, tc := range []struct {
		role       string
		n          int
		extra      []string
		wantStatus int
		wantOut    []string
	}{
		{"order", 4, nil, 0, []string{"[3] rank 3 of 4: order ok", "[0] rank 0 of 4: order ok"}},
		{"order", 3, []string{"-plugins", "tcp-only.hcl"}, 0, []string{"[2] rank 2 of 3: order ok"}},
		{"collectives", 5, nil, 0, []string{"[0] rank 0 of 5: collectives ok", "[4] rank 4 of 5: collectives ok"}},
		{"collectives", 3, []string{"-plugins", "tcp-only.hcl"}, 0, []string{"[2] rank 2 of 3: collectives ok"}},
		{"sharedwin", 3, nil, 0, []string{"[0] rank 0 of 3: shared window ok", "[2] rank 2 of 3: shared window ok"}},
		{"partitioned", 2, nil, 0, []string{"[0] rank 0 of 2: partitioned ok", "[1] rank 1 of 2: partitioned ok"}},
		{"exit3", 4, nil, 3, []string{"mdrun: rank 2", "exited with status 3"}},
		{"panic", 4, nil, 2, []string{"mdrun: rank 1", "panic", "[1] panic: rank 1 gives up"}},
	} {
		t.Run(fmt.Sprintf("%s-%d%s", tc.role, tc.n, strings.Join(tc.extra, "")), func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "tcp-only.hcl"), []byte("subdevice \"tcp\" {}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			args := append(append([]string{}, tc.extra...), "-n", fmt.Sprint(tc.n), os.Args[0], "-test.run=^$")
			cmd := exec.Command(mdrun, args...)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "ADI_E2E_ROLE="+tc.role)
			done := make(chan struct{})
			var out []byte
			var err error
			go func() { out, err = cmd.CombinedOutput(); close(done) }()
			select {
			case <-done:
			case <-time.After(2 * time.Minute):
				cmd.Process.Kill()
				<-done
				t.Fatalf("job did not end:\n%s", out)
			}
			status := 0
			if ee, ok := err.(*exec.ExitError); ok {
				status = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if status != tc.wantStatus {
				t.Fatalf("mdrun exited %d, want %d:\n%s", status, tc.wantStatus, out)
			}
			for _, w := range tc.wantOut {
				if !strings.Contains(string(out), w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			// Ranks that died never closed their shm segments; mdrun
			// must have removed them, so a second sweep finds none.
			if _, id, ok := strings.Cut(string(out), "[0] jobid="); ok {
				id, _, _ = strings.Cut(id, "\n")
				if n, err := shm.RemoveJobSegments(id); n != 0 || err != nil {
					t.Errorf("%d shared-memory segments of job %q were left in /dev/shm (%v)", n, id, err)
				}
			} else if tc.wantStatus != 0 {
				t.Errorf("rank 0 did not print its job id:\n%s", out)
			}
		})
	}
}
