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

// launched is what the ranks of one launch printed.
type launched struct {
	samples []sample
	// flows is what the subdevices carried between the ranks, within
	// pretend hosts and between them; nil unless the ranks ran on pretend
	// hosts and reported their traffic (-vs-build ranks of an older
	// mdbench, and direct mode, do not).
	flows []flow
}

// launch starts n ranks of this program for job j, with a rendezvous
// service of its own (as mdrun does), and returns what they printed. With
// hosts above 1 the ranks are placed on that many pretend hosts (see
// placement).
// With bind set and no more ranks than cores, rank r is bound to the r-th
// core mdbench may use (see rankCores):
// freshly started processes otherwise often share a CPU until the kernel
// balances them, which wrecks a ping-pong of spinning ranks. It is bound
// before it runs, as mpiexec and Slurm bind: the Go runtime then sizes
// GOMAXPROCS to that core from the start. A rank that bound itself
// would run its first second or so with a processor per CPU of the
// machine, until the runtime noticed, and would not see what a bound
// rank of a user's job sees.
func launch(ctx context.Context, n int, j childJob, bind bool, hosts int, logger hclog.Logger) (launched, error) {
	if hosts < 1 || hosts > n {
		return launched{}, fmt.Errorf("%d ranks on %d hosts: want from 1 to %d hosts", n, hosts, n)
	}
	place := placement{ranks: n, hosts: hosts}
	self := j.Exe
	if self == "" {
		exe, err := os.Executable()
		if err != nil {
			return launched{}, fmt.Errorf("find own executable: %w", err)
		}
		self = exe
	}
	cfg, err := json.Marshal(j)
	if err != nil {
		return launched{}, err
	}
	srv, err := bootstrap.NewServer(n, logger.Named("rendezvous"))
	if err != nil {
		return launched{}, err
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
		links   []rankLinks
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
		return launched{}, err
	}
	for r := range n {
		cmd := exec.CommandContext(ctx, self)
		// j.Env after ours: exec keeps the last of duplicate keys.
		env := srv.Env(r)
		if place.pretend() {
			env = srv.HostEnv(r, place.hostName(r))
		}
		cmd.Env = append(append(append(os.Environ(), j.Env...), env...), childEnv+"="+string(cfg))
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
			return launched{}, fmt.Errorf("start rank %d: %w", r, err)
		}
		cmds = append(cmds, cmd)
		go func() {
			got, perr := readRankOutput(out, os.Stderr)
			mu.Lock()
			samples = append(samples, got.samples...)
			links = append(links, got.links...)
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
		return launched{}, fmt.Errorf("%s (the ranks' messages are above)", strings.Join(errs, "; "))
	}
	res := launched{samples: samples}
	if place.pretend() && len(links) > 0 {
		if len(links) != n {
			return launched{}, fmt.Errorf("%d of %d ranks reported their traffic", len(links), n)
		}
		if res.flows, err = place.flows(links); err != nil {
			return launched{}, fmt.Errorf("placement on %d pretend hosts: %w", hosts, err)
		}
	}
	return res, nil
}

// rankOutput is what one rank printed for the launcher.
type rankOutput struct {
	samples []sample
	links   []rankLinks
}

// readRankOutput parses the result and links lines of a rank's stdout and
// passes other lines on to other.
func readRankOutput(r io.Reader, other io.Writer) (rankOutput, error) {
	var out rankOutput
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 16<<20) // a links line grows with the ranks
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, linksPrefix); ok {
			rl, err := parseLinks(rest)
			if err != nil {
				return out, fmt.Errorf("bad links line %q: %w", line, err)
			}
			out.links = append(out.links, rl)
			continue
		}
		rest, ok := strings.CutPrefix(line, resultPrefix)
		if !ok {
			fmt.Fprintln(other, line)
			continue
		}
		var s sample
		if err := json.Unmarshal([]byte(rest), &s); err != nil {
			return out, fmt.Errorf("bad result line %q: %w", line, err)
		}
		out.samples = append(out.samples, s)
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
