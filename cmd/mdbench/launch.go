package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/bootstrap"
	"github.com/hpc-multidevice/multidevice/internal/sched"
)

// launch starts n ranks of this program for job j, with a rendezvous
// service of its own (as mdrun does), and returns the samples they printed.
// With bind set and no more ranks than cores, rank r is bound to the r-th
// core mdbench may use (see rankCores):
// freshly started processes otherwise often share a CPU until the kernel
// balances them, which wrecks a ping-pong of spinning ranks. It is bound
// before it runs, as mpiexec and Slurm bind: the Go runtime then sizes
// GOMAXPROCS to that core from the start. A rank that bound itself
// would run its first second or so with a processor per CPU of the
// machine, until the runtime noticed, and would not see what a bound
// rank of a user's job sees.
func launch(ctx context.Context, n int, j childJob, bind bool, logger hclog.Logger) ([]sample, error) {
	self := j.Exe
	if self == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find own executable: %w", err)
		}
		self = exe
	}
	cfg, err := json.Marshal(j)
	if err != nil {
		return nil, err
	}
	srv, err := bootstrap.NewServer(n, logger.Named("rendezvous"))
	if err != nil {
		return nil, err
	}
	serveCtx, stopServe := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(serveCtx) }()
	defer func() {
		stopServe()
		<-served
	}()

	type exit struct {
		rank int
		err  error
	}
	var (
		mu      sync.Mutex
		samples []sample
	)
	exits := make(chan exit, n)
	cmds := make([]*exec.Cmd, 0, n)
	killAll := func() {
		for _, c := range cmds {
			_ = c.Process.Kill() // an exited rank just reports that
		}
	}
	cores, err := rankCores(n, bind)
	if err != nil {
		return nil, err
	}
	for r := range n {
		cmd := exec.CommandContext(ctx, self)
		// j.Env after ours: exec keeps the last of duplicate keys.
		cmd.Env = append(append(append(os.Environ(), j.Env...), srv.Env(r)...), childEnv+"="+string(cfg))
		cmd.Stderr = os.Stderr // ranks are quiet unless MD_LOG_LEVEL says otherwise
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		out, err := cmd.StdoutPipe()
		if err == nil {
			if cores != nil {
				err = sched.StartOn(cmd, cores[r])
			} else {
				err = cmd.Start()
			}
		}
		if err != nil {
			killAll()
			for range cmds {
				<-exits
			}
			return nil, fmt.Errorf("start rank %d: %w", r, err)
		}
		cmds = append(cmds, cmd)
		go func() {
			got, perr := readSamples(out, os.Stderr)
			mu.Lock()
			samples = append(samples, got...)
			mu.Unlock()
			err := cmd.Wait()
			if err == nil {
				err = perr
			}
			exits <- exit{r, err}
		}()
	}
	// A rank that fails leaves the others blocked in a receive: end them.
	var errs []string
	for range n {
		if e := <-exits; e.err != nil {
			if len(errs) == 0 {
				killAll()
			}
			errs = append(errs, fmt.Sprintf("rank %d: %v", e.rank, e.err))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s (the ranks' messages are above)", strings.Join(errs, "; "))
	}
	return samples, nil
}

// readSamples parses the result lines of a rank's stdout and passes other
// lines on to other.
func readSamples(r io.Reader, other io.Writer) ([]sample, error) {
	var out []sample
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, resultPrefix)
		if !ok {
			fmt.Fprintln(other, line)
			continue
		}
		var s sample
		if err := json.Unmarshal([]byte(rest), &s); err != nil {
			return out, fmt.Errorf("bad result line %q: %w", line, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

// rankCores returns the cores ranks 0 to n-1 are bound to, as mpiexec
// -bind-to core binds: for rank r the r-th of the cores mdbench may use,
// in the order of their lowest CPU (sched.Cores). It returns nil when
// bind is off or there are fewer cores than ranks, and then nobody binds,
// the MPIs neither.
func rankCores(n int, bind bool) ([]sched.CPUSet, error) {
	if !bind {
		return nil, nil
	}
	cores, err := allowedCores()
	if err != nil {
		return nil, err
	}
	if n <= len(cores) {
		return cores[:n], nil
	}
	return nil, nil
}

// allowedCores returns the cores mdbench may run on, in the order of
// their lowest CPU.
func allowedCores() ([]sched.CPUSet, error) {
	allowed, err := sched.Affinity()
	if err != nil {
		return nil, err
	}
	return sched.Cores(allowed), nil
}
