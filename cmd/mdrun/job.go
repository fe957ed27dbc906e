package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/bootstrap"
	"github.com/hpc-multidevice/multidevice/internal/sched"
	"github.com/hpc-multidevice/multidevice/subdevices/shm"
)

// killGrace is how long ranks get to act on SIGTERM (or a forwarded
// signal) before mdrun sends SIGKILL.
const killGrace = 3 * time.Second

// pipeGrace bounds how long mdrun keeps reading a rank's output after the
// rank exited, in case a process it left behind still holds the pipe.
const pipeGrace = 2 * time.Second

// blameWait bounds how long mdrun waits, when a rank fails, for the
// rendezvous service to read the end of the connections of that rank and
// of the ranks it lost: their ends come at once when the processes died,
// but not in any order, and a rank's reports of the ranks it lost come
// before the end of its connection. A rank reported lost whose
// connection is still open after it was cut off from the reporter, not
// dead.
const blameWait = 2 * time.Second

// groupPoll is how often a terminating job whose ranks were all reaped
// looks whether their process groups emptied: nothing reports it.
const groupPoll = 20 * time.Millisecond

// job is one run of mdrun. Only its run goroutine touches its fields; the
// per-rank goroutines report through channels.
type job struct {
	cfg    config
	logger hclog.Logger
	stdout *syncWriter
	stderr *syncWriter

	ranks   []*rank
	running int

	srv    *bootstrap.Server
	self   string   // this machine's host name, with -hosts
	hostOf []string // per rank, with -hosts
	remote bool     // some rank runs on another host
	// siteOf is the site of each host that -hosts or -hostfile put in
	// one, by host name; the ranks on it get MD_SITE.
	siteOf map[string]string

	status      int // exit status, decided by the first failure
	terminating bool

	// departures is srv.Departures(), nil once closed; left is, per
	// rank, its departure from the service, nil while it has not left or
	// if it never joined. firstLost is the first rank seen leaving
	// without finalizing or aborting, -1 until one does: the culprit of a
	// failure when the failing rank lost no rank (see culprit).
	departures <-chan bootstrap.Departure
	left       []*bootstrap.Departure
	firstLost  int
	// blamed is the rank a failure was charged to before it was reaped,
	// -1 if none: its exit makes the job's message and status, and
	// followed, the failure that came after it, is told then.
	blamed   int
	followed string
	// exiting is the rank whose exit is being handled, -1 if none: reaped
	// already, but its exit not yet told, so that a failure charged to it
	// meanwhile (an abort of a rank that lost it) is told with it.
	exiting   int
	killTimer <-chan time.Time
	// killed says the ranks' groups got SIGKILL: nothing is left to wait
	// for.
	killed bool
}

// rank is one started process.
type rank struct {
	id     int
	remote bool   // started through the launcher
	host   string // the remote host, for messages
	prog   string // the program's name in an MPMD job, for messages
	cmd    *exec.Cmd
	out    *lineWriter
	errOut *lineWriter
	// reaped is set once the rank's process was waited for, and
	// groupGone if its process group was empty then: see signalAll.
	reaped, groupGone bool
}

// exitEvent reports that rank's process was reaped.
type exitEvent struct {
	rank  *rank
	state *os.ProcessState
	err   error
}

func (j *job) run(ctx context.Context, sigs <-chan os.Signal) int {
	srv, err := j.newServer()
	if err != nil {
		fmt.Fprintf(j.stderr, "mdrun: %v\n", err)
		var ue *usageError
		if errors.As(err, &ue) {
			return exitUsage
		}
		return exitFailed
	}
	serveCtx, stopServe := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(serveCtx) }()
	defer func() {
		stopServe()
		if err := <-served; err != nil {
			j.logger.Warn("rendezvous service failed", "error", err)
		}
	}()
	j.logger.Debug("rendezvous service listening", "addr", srv.Addr(), "job", srv.JobID())

	j.srv = srv
	j.departures = srv.Departures()
	j.left = make([]*bootstrap.Departure, j.size())
	j.firstLost, j.blamed, j.exiting = -1, -1, -1
	if err := j.checkWdirs(); err != nil {
		fmt.Fprintf(j.stderr, "mdrun: %v\n", err)
		return exitUsage
	}
	binds, err := j.placeBindings()
	if err != nil {
		fmt.Fprintf(j.stderr, "mdrun: %v\n", err)
		return exitFailed
	}
	exits := make(chan exitEvent, j.size())
	for r := range j.size() {
		rk, err := j.start(r, srv, binds[r])
		if err != nil {
			j.fail(exitFailed, fmt.Sprintf("mdrun: starting rank %d: %v; terminating the job", r, err))
			break
		}
		j.ranks = append(j.ranks, rk)
		j.running++
		go func() {
			err := rk.cmd.Wait()
			exits <- exitEvent{rank: rk, state: rk.cmd.ProcessState, err: err}
		}()
	}

	var deadline <-chan time.Time
	if j.cfg.timeout > 0 {
		t := time.NewTimer(j.cfg.timeout)
		defer t.Stop()
		deadline = t.C
	}
	aborts := srv.Aborts()
	done := ctx.Done()
	lost := j.stdout.lost
	var poll <-chan time.Time
	for j.running > 0 || j.lingering() {
		if j.running == 0 && poll == nil {
			tick := time.NewTicker(groupPoll)
			defer tick.Stop()
			poll = tick.C
		}
		select {
		case e := <-exits:
			aborts = j.exited(e, aborts)
			if j.running == 0 && lost != nil {
				// The last ranks' last lines were written as they were
				// reaped; a failed write must still fail the job.
				select {
				case <-lost:
					lost = nil
					j.outputLost()
				default:
				}
			}
		case <-poll:
		case a, ok := <-aborts:
			if !ok {
				aborts = nil // the service stopped; the ranks' exits end the job
				continue
			}
			j.aborted(a)
		case sig := <-sigs:
			j.signalled(sig)
		case <-lost:
			lost = nil
			j.outputLost()
		case <-deadline:
			j.fail(exitTimeout, fmt.Sprintf("mdrun: the job ran longer than -timeout %v; terminating the job", j.cfg.timeout))
		case <-done:
			done = nil
			j.fail(exitFailed, fmt.Sprintf("mdrun: %v; terminating the job", context.Cause(ctx)))
		case <-j.killTimer:
			j.killTimer = nil
			j.logger.Debug("grace period over, killing the remaining ranks")
			j.signalAll(syscall.SIGKILL)
			j.killed = true
		}
	}
	j.removeSegments(srv.JobID())
	return j.status
}

// outputLost fails the job because writing its standard output failed.
func (j *job) outputLost() {
	if err := j.stdout.failure(); errors.Is(err, syscall.EPIPE) {
		// As a program writing into a closed pipe ends, by SIGPIPE.
		j.fail(128+int(syscall.SIGPIPE), "mdrun: standard output is closed (its reader went away); terminating the job")
	} else {
		j.fail(exitFailed, fmt.Sprintf("mdrun: writing standard output: %v; terminating the job", err))
	}
}

// lingering reports whether a terminating job must still wait for the
// grace period's SIGKILL: a rank's process group has a member left,
// typically something the rank started that ignores the signal the job
// got (sh starts background jobs with SIGINT ignored). A job that ends
// well leaves what its ranks started alone, as mpirun does: a rank may
// start a daemon on purpose.
func (j *job) lingering() bool {
	if !j.terminating || j.killed {
		return false
	}
	return slices.ContainsFunc(j.ranks, (*rank).populated)
}

// removeSegments unlinks the shared-memory segments of ranks that died
// before their Close; on other hosts that is left to the host.
func (j *job) removeSegments(jobID string) {
	n, err := shm.RemoveJobSegments(jobID)
	if err != nil {
		j.logger.Warn("could not remove the job's shared-memory segments", "error", err)
	}
	if n > 0 {
		j.logger.Debug("removed shared-memory segments left by ranks that did not close", "count", n)
	}
}

// size is the number of ranks of the job: the application's and the relays.
func (j *job) size() int { return j.cfg.n + len(j.cfg.relays) }

// newServer starts the rendezvous service: on a private unix socket when
// every rank runs here, otherwise on TCP where the remote ranks reach it.
func (j *job) newServer() (*bootstrap.Server, error) {
	logger := j.logger.Named("rendezvous")
	if j.cfg.hosts == nil && j.cfg.relays == nil {
		return bootstrap.NewServer(j.size(), logger)
	}
	self, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("host name: %w", err)
	}
	j.self = self
	// The ranks placed here, through "localhost" or the host name, are on
	// one host, and the library tells hosts apart by MDRUN_HOST: all of
	// them get one name, the first of this machine's in -hosts.
	local, site := self, ""
	if i := slices.IndexFunc(j.cfg.hosts, func(h hostSpec) bool { return isLocal(h.name, self) }); i >= 0 {
		local, site = j.cfg.hosts[i].name, j.cfg.hosts[i].site
	}
	here := func(host string) string {
		if isLocal(host, self) {
			return local
		}
		return host
	}
	j.siteOf = map[string]string{}
	if j.cfg.hosts != nil {
		j.hostOf = place(j.cfg.n, j.cfg.hosts, j.cfg.mapBy)
		for _, h := range j.cfg.hosts {
			if isLocal(h.name, self) && h.site != site {
				return nil, &usageError{fmt.Sprintf("-hosts: %s and %s are both this machine, %s and %s: a host is in one site or in none", local, h.name, inSite(site), inSite(h.site))}
			}
			if h.site != "" {
				j.siteOf[here(h.name)] = h.site
			}
		}
	} else {
		for range j.cfg.n {
			j.hostOf = append(j.hostOf, self)
		}
	}
	if err := j.relaySites(here); err != nil {
		return nil, err
	}
	j.hostOf = append(j.hostOf, j.cfg.relays...)
	for r, h := range j.hostOf {
		j.hostOf[r] = here(h)
	}
	remote := ""
	for _, h := range j.hostOf {
		if !isLocal(h, self) {
			remote = h
			break
		}
	}
	if remote == "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("rendezvous service: %w", err)
		}
		return bootstrap.NewServerListener(ln, j.size(), logger)
	}
	addr, err := listenAddr(j.cfg.listen, remote)
	if err != nil {
		return nil, fmt.Errorf("rendezvous service: %w", err)
	}
	// The service listens on the network; the job secret, checked in
	// each rank's hello, keeps strangers out.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rendezvous service: %w", err)
	}
	j.remote = true
	return bootstrap.NewServerListener(ln, j.size(), logger)
}

// relaySites adds the sites -relay names to siteOf, after -hosts' (here
// gives a host's name in siteOf). A host that -hosts lists keeps the site
// -hosts gives it: a relay's entry may name that one, or none to take it.
// The ranks of one host are in one site, and a relay's site is its host's,
// so any other is a usage error; without -hosts the ranks run on this
// machine in no site. Entries for a host only relays are on must name one
// site, or none, as -hosts' must, this machine's names being one host.
func (j *job) relaySites(here func(string) string) error {
	type entry struct{ name, site string }
	fromHosts := map[string]entry{}
	for _, h := range j.cfg.hosts {
		if _, ok := fromHosts[here(h.name)]; !ok {
			fromHosts[here(h.name)] = entry{h.name, h.site}
		}
	}
	fromRelays := map[string]entry{}
	for _, h := range j.cfg.relayHosts {
		key := here(h.name)
		if e, ok := fromHosts[key]; ok {
			if h.site != "" && h.site != e.site {
				return &usageError{fmt.Sprintf("-relay: %s is %s, and -hosts has %s %s: a host is in one site or in none", h.name, inSite(h.site), e.name, inSite(e.site))}
			}
			continue
		}
		if j.cfg.hosts == nil && h.site != "" && isLocal(h.name, j.self) {
			return &usageError{fmt.Sprintf("-relay: %s is %s, and without -hosts the programs' ranks run there, in no site: a host is in one site or in none", h.name, inSite(h.site))}
		}
		if e, ok := fromRelays[key]; ok && e.site != h.site {
			// parseRelays let only different names of one host through.
			return &usageError{fmt.Sprintf("-relay: %s and %s are both this machine, %s and %s: a host is in one site or in none", e.name, h.name, inSite(e.site), inSite(h.site))}
		}
		fromRelays[key] = entry{h.name, h.site}
		if h.site != "" {
			j.siteOf[key] = h.site
		}
	}
	return nil
}

// rankEnv is what a rank gets on top of the launcher's own variables.
func (j *job) rankEnv(r int, srv *bootstrap.Server, remote bool) []string {
	var env []string
	switch {
	case j.hostOf == nil:
		env = srv.Env(r)
	case remote:
		env = srv.RemoteEnv(r, j.hostOf[r])
	default:
		env = srv.HostEnv(r, j.hostOf[r])
	}
	// Its program's index (MPI_APPNUM); a relay is in no program.
	appNum, a := j.appOf(r)
	if a != nil {
		env = append(env, "MD_APPNUM="+strconv.Itoa(appNum))
	}
	// A flag's path wins over -x; mdrun's own variable, made absolute,
	// comes after -x, which replaces it.
	var inherited []string
	for _, v := range []struct{ name, path string }{{"MD_PLUGINS", j.cfg.plugins}, {"MD_CONNTABLE", j.cfg.conntable}} {
		switch {
		case v.path == "":
		case j.cfg.inherited[v.name]:
			inherited = append(inherited, v.name+"="+v.path)
		default:
			env = append(env, v.name+"="+v.path)
		}
	}
	// The site is the host's, and it replaces mdrun's own MD_SITE: a
	// local rank's variables come after mdrun's environment, and the last
	// of a name counts. A relay on the host gets it too.
	site := ""
	if j.hostOf != nil {
		site = j.siteOf[j.hostOf[r]]
	}
	if site != "" {
		env = append(env, "MD_SITE="+site)
	}
	// Then -x, the job's and its program's, each name once, except where
	// mdrun set the name itself above (from a flag, the host's site, the
	// job), which wins. MD_APPNUM is always mdrun's to give: a relay
	// gets none. A remote rank sees only what the command line carries:
	// -x NAME with mdrun's value, -x NAME=VALUE, then the MD_* variables
	// of mdrun's environment. A local rank starts with mdrun's
	// environment, so it needs only the values -x gives; they come after
	// that environment and win over it.
	set := map[string]bool{"MD_APPNUM": true}
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		set[name] = true
	}
	exports := j.cfg.exports
	if a != nil {
		exports = append(slices.Clone(exports), a.exports...)
	}
	for _, x := range resolveExports(exports) {
		if !set[x.name] && (remote || x.given) {
			env = append(env, x.name+"="+x.value)
			set[x.name] = true
		}
	}
	for _, kv := range inherited {
		if name, _, _ := strings.Cut(kv, "="); !set[name] {
			env = append(env, kv)
			set[name] = true
		}
	}
	if remote {
		for _, kv := range os.Environ() {
			if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "MD_") && !set[name] {
				env = append(env, kv)
				set[name] = true
			}
		}
	}
	return env
}

// export is what the -x words of one name come to.
type export struct {
	name, value string
	// given says the value is -x NAME=VALUE's; otherwise it is mdrun's
	// own.
	given bool
}

// resolveExports reads -x words (checkExports passed them) in order: for
// each name, in the order names first appear, the last word of it
// counts, as a later assignment does in a shell. NAME is mdrun's own
// value, and nothing if mdrun has none; NAME=VALUE is VALUE, which may
// hold '=' and spaces.
func resolveExports(words []string) []export {
	var names []string
	last := map[string]string{} // by name, its last word
	for _, w := range words {
		name, _, _ := strings.Cut(w, "=")
		if _, ok := last[name]; !ok {
			names = append(names, name)
		}
		last[name] = w
	}
	out := make([]export, 0, len(names))
	for _, name := range names {
		_, v, given := strings.Cut(last[name], "=")
		if !given {
			var ok bool
			if v, ok = os.LookupEnv(name); !ok {
				continue
			}
		}
		out = append(out, export{name: name, value: v, given: given})
	}
	return out
}

// localEnv is the environment of a rank started here: mdrun's, without
// its own MD_APPNUM (a relay is in no program; a rank of one gets its
// own in add), then add, whose variables win.
func localEnv(add []string) []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "MD_APPNUM=") })
	return append(env, add...)
}

// ordinal spells n as "1st", "2nd", "3rd", "4th"...
func ordinal(n int) string {
	suffix := "th"
	switch {
	case n%100 >= 11 && n%100 <= 13:
	case n%10 == 1:
		suffix = "st"
	case n%10 == 2:
		suffix = "nd"
	case n%10 == 3:
		suffix = "rd"
	}
	return strconv.Itoa(n) + suffix
}

// checkWdirs checks the -wdir of every rank placed here, before any
// starts, as parseArgs does when every rank is: a missing one is the
// user's mistake, to be named as such, not a program that failed to
// start.
func (j *job) checkWdirs() error {
	checked := map[string]bool{}
	for r := range j.size() {
		if j.hostOf != nil && !isLocal(j.hostOf[r], j.self) {
			continue
		}
		wdir, set := j.cfg.wdir, j.cfg.wdirSet
		if _, a := j.appOf(r); a != nil {
			wdir, set = a.wdir, a.wdirSet
		}
		if !set || checked[wdir] {
			continue
		}
		checked[wdir] = true
		if _, err := absWdir(wdir, true); err != nil {
			return err
		}
	}
	return nil
}

// start starts one rank, here or through the launcher, bound as b says.
func (j *job) start(r int, srv *bootstrap.Server, b binding) (*rank, error) {
	remote := j.hostOf != nil && !isLocal(j.hostOf[r], j.self)
	env := j.rankEnv(r, srv, remote)
	var prog, wdir string
	var args []string
	wdirSet := false
	if _, a := j.appOf(r); a != nil {
		prog, args, wdir, wdirSet = a.prog, a.args, a.wdir, a.wdirSet
	} else {
		prog, args, wdir, wdirSet = j.cfg.relayCmd[0], j.cfg.relayCmd[1:], j.cfg.wdir, j.cfg.wdirSet
	}
	var cmd *exec.Cmd
	if remote {
		argv := remoteCommand(j.cfg.launcher, j.hostOf[r], wdir, wdirSet, b.remote, env, prog, args)
		cmd = exec.Command(argv[0], argv[1:]...)
		cmd.Env = localEnv(nil) // a launcher that passes it on passes no stale MD_APPNUM
		// The secret goes through the launcher's standard input: its
		// command line is visible to every user of both hosts.
		cmd.Stdin = bytes.NewReader(srv.SecretLine())
	} else {
		cmd = exec.Command(prog, args...)
		cmd.Env = localEnv(env)
		cmd.Dir = wdir
	}
	prefix := ""
	if j.cfg.prefix {
		prefix = "[" + strconv.Itoa(r) + "] "
	}
	rk := &rank{
		id:     r,
		remote: remote,
		cmd:    cmd,
		out:    &lineWriter{out: j.stdout, prefix: prefix, raw: !j.cfg.prefix},
		errOut: &lineWriter{out: j.stderr, prefix: prefix, raw: !j.cfg.prefix},
	}
	cmd.Stdout, cmd.Stderr = rk.out, rk.errOut
	cmd.WaitDelay = pipeGrace
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own process group, so a terminal's Ctrl-C reaches the rank
		// once (through mdrun) and a signal reaches whatever the rank
		// started.
		Setpgid: true,
		// A rank must not outlive an mdrun that was killed outright.
		Pdeathsig: syscall.SIGKILL,
	}
	if remote {
		rk.host = j.hostOf[r]
	}
	if len(j.cfg.apps) > 1 {
		// Which program failed matters as much as which rank.
		rk.prog = filepath.Base(prog)
	}
	start := cmd.Start
	if b.cpus != nil && !remote {
		start = func() error { return sched.StartOn(cmd, b.cpus) }
	}
	if err := start(); err != nil {
		if remote {
			return nil, fmt.Errorf("launcher %q for host %s: %w", j.cfg.launcher[0], rk.host, err)
		}
		return nil, err
	}
	j.logger.Debug("rank started", "rank", r, "pid", cmd.Process.Pid, "host", rk.host)
	return rk, nil
}

// exited handles the exit of a rank, and returns the channel of aborts to
// keep receiving from (see drainAborts).
func (j *job) exited(e exitEvent, aborts <-chan *bootstrap.AbortError) <-chan *bootstrap.AbortError {
	rk := e.rank
	j.running--
	rk.reaped = true
	// Once empty, the group's number is free for another process.
	rk.groupGone = errors.Is(syscall.Kill(-rk.cmd.Process.Pid, 0), syscall.ESRCH)
	// A rank that joined leaves when the service reads the end of its
	// connection, which a dead process has closed: then whether it
	// finalized, and whom it lost, is known.
	joined := j.srv.Exited(rk.id)
	if joined {
		j.awaitDeparture(rk.id, time.Now().Add(blameWait))
	} else {
		j.noteDepartures()
	}
	// A rank that aborted usually exits right after; its abort is the
	// better explanation. The service queues it before the departure, so
	// it is in now even if it came while the departure was awaited (the
	// rank exited as its Abort was being written). An abort of a rank
	// that lost this one is charged to this one's exit, told below.
	j.exiting = rk.id
	aborts = j.drainAborts(aborts)
	j.exiting = -1
	rk.out.Flush()
	rk.errOut.Flush()
	ws, ok := e.state.Sys().(syscall.WaitStatus)
	j.logger.Debug("rank exited", "rank", rk.id, "pid", e.state.Pid(), "state", e.state.String(), "wait_error", e.err)
	if !ok {
		return aborts
	}
	status, what := j.exitFailure(rk, ws, e.state.Pid(), joined)
	switch {
	case rk.id == j.blamed:
		j.blamed = -1
		fmt.Fprintf(j.stderr, "mdrun: %s; terminating the job\n", what)
		fmt.Fprintln(j.stderr, j.followed)
		j.status = status
	case status != 0:
		j.failRank(rk.id, status, what)
	}
	return aborts
}

// exitFailure is the job's exit status that rk's exit (ws, of process
// pid) gives, and what to say of it, or 0 if the exit is no failure: a
// rank that joined the job and exits 0 without finalizing fails it, since
// the others cannot finish theirs; one that never joined does not (the
// others' fences fail naming it, see Server.Exited). A rank that
// finalized has left by the time its Close returns; one whose departure
// is still missing did not.
func (j *job) exitFailure(rk *rank, ws syscall.WaitStatus, pid int, joined bool) (int, string) {
	who := rk.describe(pid)
	switch {
	case ws.Signaled():
		return 128 + int(ws.Signal()), fmt.Sprintf("%s was killed by signal %d (%v)", who, int(ws.Signal()), ws.Signal())
	case ws.ExitStatus() != 0 && rk.errOut.panicked:
		return ws.ExitStatus(), fmt.Sprintf("%s panicked and exited with status %d", who, ws.ExitStatus())
	case ws.ExitStatus() != 0:
		return ws.ExitStatus(), fmt.Sprintf("%s exited with status %d", who, ws.ExitStatus())
	case joined && (j.left[rk.id] == nil || !j.left[rk.id].Finalized):
		return exitFailed, fmt.Sprintf("%s exited with status 0 without finalizing", who)
	}
	return 0, ""
}

// noteDepartures records the departures the service has queued.
func (j *job) noteDepartures() {
	for {
		select {
		case d, ok := <-j.departures:
			j.noteDeparture(d, ok)
		default:
			return
		}
	}
}

// noteDeparture records departure d, received from j.departures with ok.
func (j *job) noteDeparture(d bootstrap.Departure, ok bool) {
	if !ok {
		j.departures = nil
		return
	}
	j.left[d.Rank] = &d
	if j.firstLost < 0 && !d.Finalized && !d.Aborted {
		j.firstLost = d.Rank
	}
}

// awaitDeparture records departures until rank r's is in, or until
// deadline, and reports whether it is.
func (j *job) awaitDeparture(r int, deadline time.Time) bool {
	j.noteDepartures()
	if j.left[r] != nil || j.departures == nil {
		return j.left[r] != nil
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for j.left[r] == nil && j.departures != nil {
		select {
		case d, ok := <-j.departures:
			j.noteDeparture(d, ok)
		case <-t.C:
			return false
		}
	}
	return j.left[r] != nil
}

// culprit is the rank whose loss the failure of rank r most likely
// follows, r if none: the first rank r lost (its device saw the rank's
// links end, or a fence of it failed because the rank left; see
// bootstrap.Departure.Lost) that is gone without finalizing, then the
// first such rank that one lost, and so on. The ranks' own reports make
// this the same whichever of them mdrun reaps first, and whichever
// connection to the service it sees end first. A rank that lost none
// (it failed on its own, or by a loss nothing reported) falls back to
// the first rank seen leaving without finalizing, followed the same way,
// which may lead back to r. Call it once r's departure is in, if r
// joined.
func (j *job) culprit(r int) int {
	deadline := time.Now().Add(blameWait)
	if c := j.lostChain(r, deadline); c != r || j.firstLost < 0 {
		return c
	}
	return j.lostChain(j.firstLost, deadline)
}

// lostChain follows, from rank r, the first rank each lost that is gone
// (see culprit), and returns the last.
func (j *job) lostChain(r int, deadline time.Time) int {
	// A rank is gone once reaped (then, had it joined, its departure came
	// or its exit failed the job), or once the service saw its
	// connection end; one that is connected after blameWait was cut off
	// from the rank that lost it, not dead, and is no culprit. Finalizing
	// is no loss.
	gone := func(x int) bool {
		if x >= len(j.ranks) || (!j.ranks[x].reaped && !j.awaitDeparture(x, deadline)) {
			return false
		}
		return j.left[x] == nil || !j.left[x].Finalized
	}
	seen := map[int]bool{r: true}
	for {
		next := -1
		if d := j.left[r]; d != nil {
			for _, l := range d.Lost {
				if !seen[l.Rank] && gone(l.Rank) {
					next = l.Rank
					break
				}
			}
		}
		if next < 0 {
			return r
		}
		seen[next] = true
		r = next
	}
}

// failRank fails the job because rank r failed as what says. If r lost
// another rank before (culprit), r most likely failed because of it, as
// a rank whose peer died does: the failure is charged to that rank, whose
// own exit, once reaped, makes the job's message and status (it was not
// reaped yet, or its exit would have failed the job), and r's is told
// after it.
func (j *job) failRank(r, status int, what string) {
	d := r
	if !j.terminating {
		d = j.culprit(r)
	}
	if d == r || j.ranks[d].reaped && d != j.exiting {
		j.fail(status, "mdrun: "+what+"; terminating the job")
		return
	}
	j.logger.Debug("failure after a rank was lost", "failure", what, "lost", d)
	j.blamed = d
	j.followed = fmt.Sprintf("mdrun: after rank %d left the job, %s", d, what)
	j.terminate(status)
}

// drainAborts handles the aborts already reported and returns the channel
// to keep receiving from (nil once it is closed).
func (j *job) drainAborts(aborts <-chan *bootstrap.AbortError) <-chan *bootstrap.AbortError {
	for {
		select {
		case a, ok := <-aborts:
			if !ok {
				return nil
			}
			j.aborted(a)
		default:
			return aborts
		}
	}
}

func (j *job) aborted(a *bootstrap.AbortError) {
	status := a.Code
	if status < 1 || status > 255 {
		status = exitFailed
	}
	who := fmt.Sprintf("rank %d", a.Rank)
	if a.Rank < len(j.ranks) {
		rk := j.ranks[a.Rank]
		who = rk.describe(rk.cmd.Process.Pid)
	}
	// The rank left as it aborted: its departure, with whom it lost,
	// follows at once.
	j.awaitDeparture(a.Rank, time.Now().Add(blameWait))
	j.failRank(a.Rank, status, fmt.Sprintf("%s aborted with code %d: %s", who, a.Code, a.Reason))
}

// signalled passes a signal mdrun received on to the ranks. A second one
// means the user is out of patience: SIGKILL at once. A second SIGHUP
// does not: a closing terminal sends it twice (the shell to its jobs,
// then the kernel to the foreground group as the shell exits), and the
// ranks keep their grace to clean up.
func (j *job) signalled(sig os.Signal) {
	if j.terminating && sig == syscall.SIGHUP {
		j.logger.Debug("hangup again; the ranks keep their grace", "signal", sig)
		return
	}
	if j.terminating {
		j.logger.Debug("second signal, killing the ranks", "signal", sig)
		j.signalAll(syscall.SIGKILL)
		j.killed = true
		return
	}
	s, ok := sig.(syscall.Signal)
	if !ok {
		s = syscall.SIGTERM
	}
	fmt.Fprintf(j.stderr, "mdrun: received %v; passing it on to the ranks\n", sig)
	j.status = 128 + int(s)
	j.terminating = true
	j.signalAll(s)
	j.endRemote()
	j.killTimer = time.After(killGrace)
}

// describe names a rank in messages.
func (rk *rank) describe(pid int) string {
	prog := ""
	if rk.prog != "" {
		prog = rk.prog + ", "
	}
	if rk.remote {
		return fmt.Sprintf("rank %d on %s (%slauncher pid %d)", rk.id, rk.host, prog, pid)
	}
	return fmt.Sprintf("rank %d (%spid %d)", rk.id, prog, pid)
}

// fail ends the job because of the first failure; later ones, often caused
// by the termination itself, are only logged.
func (j *job) fail(status int, msg string) {
	if j.terminating {
		j.logger.Debug("while terminating", "event", msg)
		return
	}
	fmt.Fprintln(j.stderr, msg)
	j.terminate(status)
}

// terminate ends the job with status: SIGTERM now, SIGKILL after the
// grace period.
func (j *job) terminate(status int) {
	j.status = status
	j.terminating = true
	j.signalAll(syscall.SIGTERM)
	j.endRemote()
	j.killTimer = time.After(killGrace)
}

// endRemote closes the rendezvous service when ranks run on other hosts: a
// signal to the local launcher (ssh) does not reach them, but each ends
// itself when its connection to the service breaks.
func (j *job) endRemote() {
	if j.remote && j.srv != nil {
		j.logger.Debug("closing the rendezvous service to end the remote ranks")
		j.srv.Close()
	}
}

// signalAll signals the process group of every rank, also of one that
// has exited and been reaped while what it started still ran in its
// group (see populated).
func (j *job) signalAll(sig syscall.Signal) {
	for _, rk := range j.ranks {
		if !rk.populated() {
			continue
		}
		pid := rk.cmd.Process.Pid
		if err := syscall.Kill(-pid, sig); err != nil {
			j.logger.Debug("cannot signal rank", "rank", rk.id, "pid", pid, "signal", sig, "error", err)
		}
	}
}

// populated reports whether the rank's process group may have a member
// to signal: always while the rank runs. Once the rank is reaped its pid
// is free, but the kernel gives no process the group's number while the
// group has a member; once the group empties, the number is free too. So
// a group that was empty at the reap, or found empty since (or holding
// only processes mdrun may not signal), is gone for good, as is one
// whose number a process has now (a new process that got the pid after
// the group emptied, and leads a group of its own).
func (rk *rank) populated() bool {
	if !rk.reaped {
		return true
	}
	if rk.groupGone {
		return false
	}
	pid := rk.cmd.Process.Pid
	if syscall.Kill(pid, 0) == nil || syscall.Kill(-pid, 0) != nil {
		rk.groupGone = true
	}
	return !rk.groupGone
}
