package bootstrap

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// fakePMI is a process manager for tests: it serves the ranks of one job
// over socketpairs, in PMI-1 or PMI-2 as each rank's init line asks, with a
// store whose puts become visible at the barrier, like Hydra and Slurm.
type fakePMI struct {
	t       *testing.T
	size    int
	noV2    bool   // answer a PMI-2 init with a PMI-1 refusal, like a PMI-1-only manager
	lazy    bool   // PMI-2 kvs-fence answers at once and gets wait, like Hydra
	missRC  bool   // PMI-2 kvs-get of a missing key answers rc=1, not found=FALSE, like current Hydra
	keyMax  int    // longest key; 64 if 0
	valMax  int    // longest value, longer ones are cut like Hydra does; 1024 if 0
	mapping string // PMI_process_mapping; none if ""
	garbage string // sent instead of the answer to init, when set
	hangUp  bool   // close the connection instead of answering init

	mu      sync.Mutex
	cond    *sync.Cond
	kvs     map[string]string
	pending map[string]string
	arrived int
	epoch   int
	fences  []int // per rank, lazy mode: kvs-fences done
	aborts  []string
	conns   []io.Closer
	wg      sync.WaitGroup
}

func newFakePMI(t *testing.T, size int, opts func(*fakePMI)) *fakePMI {
	f := &fakePMI{t: t, size: size, kvs: map[string]string{}, pending: map[string]string{}, fences: make([]int, size)}
	if opts != nil {
		opts(f)
	}
	if f.keyMax == 0 {
		f.keyMax = 64
	}
	if f.valMax == 0 {
		f.valMax = 1024
	}
	f.cond = sync.NewCond(&f.mu)
	t.Cleanup(f.kill)
	return f
}

// env makes rank's connection and returns the environment the manager
// would give it.
func (f *fakePMI) env(rank int) []string {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		f.t.Fatal(err)
	}
	// Non-blocking, so that kill's Close interrupts a pending Read.
	if err := syscall.SetNonblock(fds[0], true); err != nil {
		f.t.Fatal(err)
	}
	srv := os.NewFile(uintptr(fds[0]), "fake-pmi")
	f.mu.Lock()
	f.conns = append(f.conns, srv)
	f.mu.Unlock()
	f.wg.Add(1)
	go f.serve(srv, rank)
	return []string{"PMI_FD=" + strconv.Itoa(fds[1]), "PMI_RANK=" + strconv.Itoa(rank), "PMI_SIZE=" + strconv.Itoa(f.size)}
}

// kill closes every connection, as a dying manager does, and waits for the
// serving goroutines.
func (f *fakePMI) kill() {
	f.mu.Lock()
	for _, c := range f.conns {
		c.Close()
	}
	f.epoch = -1 // releases every waiter
	f.cond.Broadcast()
	f.mu.Unlock()
	f.wg.Wait()
}

func (f *fakePMI) abortsSeen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.aborts...)
}

// barrier waits until every rank arrived; puts become visible then.
func (f *fakePMI) barrier() {
	f.mu.Lock()
	defer f.mu.Unlock()
	epoch := f.epoch
	f.arrived++
	if f.arrived == f.size {
		for k, v := range f.pending {
			f.kvs[k] = v
		}
		clear(f.pending)
		f.arrived = 0
		f.epoch++
		f.cond.Broadcast()
		return
	}
	for f.epoch == epoch {
		f.cond.Wait()
	}
}

func (f *fakePMI) put(k, v string) string {
	if len(k) > f.keyMax {
		return "key too long"
	}
	if len(v) > f.valMax {
		v = v[:f.valMax]
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, dup := f.kvs[k]; dup {
		return "duplicate key"
	}
	f.pending[k] = v
	return ""
}

// get looks k up; in lazy mode a missing key waits until every rank has
// fenced as often as rank.
func (f *fakePMI) get(rank int, k string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		v, ok := f.kvs[k]
		if ok || !f.lazy || f.epoch < 0 {
			return v, ok
		}
		all := true
		for _, n := range f.fences {
			if n < f.fences[rank] {
				all = false
			}
		}
		if all {
			return v, ok
		}
		f.cond.Wait()
	}
}

// lazyFence is Hydra's PMI-2 fence: it counts and publishes, and does not
// wait.
func (f *fakePMI) lazyFence(rank int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fences[rank]++
	for k, v := range f.pending {
		f.kvs[k] = v
	}
	clear(f.pending)
	f.cond.Broadcast()
}

func (f *fakePMI) serve(c *os.File, rank int) {
	defer f.wg.Done()
	defer c.Close()
	r := bufio.NewReader(c)
	m, err := readPMI1(r)
	if err != nil || m.cmd != "init" {
		return
	}
	if f.hangUp {
		return
	}
	if f.garbage != "" {
		io.WriteString(c, f.garbage)
		return
	}
	if v, _ := m.get("pmi_version"); v == "2" {
		if !f.noV2 {
			io.WriteString(c, "cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n")
			f.serve2(c, r, rank)
			return
		}
		io.WriteString(c, "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=-1\n")
		if m, err = readPMI1(r); err != nil || m.cmd != "init" {
			return
		}
	}
	io.WriteString(c, "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n")
	f.serve1(c, r)
}

func (f *fakePMI) serve1(c *os.File, r *bufio.Reader) {
	for {
		m, err := readPMI1(r)
		if err != nil {
			return
		}
		var out string
		switch m.cmd {
		case "get_maxes":
			out = fmt.Sprintf("cmd=maxes kvsname_max=256 keylen_max=%d vallen_max=%d\n", f.keyMax+1, f.valMax+1)
		case "get_my_kvsname":
			out = "cmd=my_kvsname kvsname=kvs_fake/1\n"
		case "put":
			k, _ := m.get("key")
			v, _ := m.get("value")
			if e := f.put(k, v); e != "" {
				out = "cmd=put_result rc=-1 msg=" + strings.ReplaceAll(e, " ", "_") + "\n"
			} else {
				out = "cmd=put_result rc=0 msg=success\n"
			}
		case "barrier_in":
			f.barrier()
			out = "cmd=barrier_out\n"
		case "get":
			k, _ := m.get("key")
			if k == mappingKey && f.mapping != "" {
				out = "cmd=get_result rc=0 msg=success value=" + f.mapping + "\n"
			} else if v, ok := f.get(0, k); ok {
				out = "cmd=get_result rc=0 msg=success value=" + v + "\n"
			} else {
				out = "cmd=get_result rc=-1 msg=key_" + k + "_not_found value=unknown\n"
			}
		case "abort":
			code, _ := m.get("exitcode")
			f.mu.Lock()
			f.aborts = append(f.aborts, code)
			f.mu.Unlock()
			return
		case "finalize":
			io.WriteString(c, "cmd=finalize_ack\n")
			return
		default:
			out = "cmd=" + m.cmd + "_response rc=-1 msg=unknown\n"
		}
		if _, err := io.WriteString(c, out); err != nil {
			return
		}
	}
}

func (f *fakePMI) serve2(c *os.File, r *bufio.Reader, rank int) {
	reply := func(cmd string, kv ...string) bool {
		_, err := io.WriteString(c, formatPMI2(cmd, kv...))
		return err == nil
	}
	for {
		m, err := readPMI2(r)
		if err != nil {
			return
		}
		ok := true
		switch m.cmd {
		case "fullinit":
			ok = reply("fullinit-response", "pmi-version", "2", "pmi-subversion", "0", "rank", strconv.Itoa(rank), "size", strconv.Itoa(f.size), "appnum", "0", "rc", "0")
		case "job-getid":
			ok = reply("job-getid-response", "jobid", "fake;job 7", "rc", "0")
		case "info-getjobattr":
			if k, _ := m.get("key"); k == mappingKey && f.mapping != "" {
				ok = reply("info-getjobattr-response", "found", "TRUE", "value", f.mapping, "rc", "0")
			} else {
				ok = reply("info-getjobattr-response", "found", "FALSE", "rc", "0")
			}
		case "kvs-put":
			k, _ := m.get("key")
			v, _ := m.get("value")
			if e := f.put(k, v); e != "" {
				ok = reply("kvs-put-response", "rc", "-1", "errmsg", e)
			} else {
				ok = reply("kvs-put-response", "rc", "0")
			}
		case "kvs-fence":
			if f.lazy {
				f.lazyFence(rank)
			} else {
				f.barrier()
			}
			ok = reply("kvs-fence-response", "rc", "0")
		case "kvs-get":
			k, _ := m.get("key")
			if v, found := f.get(rank, k); found {
				ok = reply("kvs-get-response", "found", "TRUE", "value", v, "rc", "0")
			} else if f.missRC {
				ok = reply("kvs-get-response", "rc", "1", "errmsg", "key_not_found")
			} else {
				ok = reply("kvs-get-response", "found", "FALSE", "rc", "0")
			}
		case "abort":
			// Slurm ends the job only for isworld=TRUE and otherwise
			// leaves the other ranks running; MPICH's parser drops a
			// message with an empty value. Hydra's exit code is exitcode,
			// 1 if missing. Recorded as "code: message".
			world, _ := m.get("isworld")
			msg, _ := m.get("message")
			if world != "TRUE" || msg == "" {
				continue
			}
			code, ok := m.get("exitcode")
			if !ok {
				code = "1"
			}
			f.mu.Lock()
			f.aborts = append(f.aborts, code+": "+msg)
			f.mu.Unlock()
			return
		case "finalize":
			reply("finalize-response", "rc", "0")
			return
		default:
			ok = reply(m.cmd+"-response", "rc", "-1")
		}
		if !ok {
			return
		}
	}
}

// scriptedPMI2 is a one-rank PMI-2 manager whose answers come from reply
// ("" sends none), for pinning how the client reads one manager's exact
// wording, which fakePMI's store would hide. It returns the rank's
// environment.
func scriptedPMI2(t *testing.T, reply func(m *pmiMsg) string) []string {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Non-blocking, so that the cleanup's Close interrupts a pending Read.
	if err := syscall.SetNonblock(fds[0], true); err != nil {
		t.Fatal(err)
	}
	srv := os.NewFile(uintptr(fds[0]), "scripted-pmi2")
	var wg sync.WaitGroup
	t.Cleanup(func() {
		srv.Close()
		wg.Wait()
	})
	wg.Go(func() {
		r := bufio.NewReader(srv)
		if m, err := readPMI1(r); err != nil || m.cmd != "init" {
			return
		}
		io.WriteString(srv, "cmd=response_to_init rc=0 pmi_version=2 pmi_subversion=0\n")
		for {
			m, err := readPMI2(r)
			if err != nil {
				return
			}
			if s := reply(m); s != "" {
				if _, err := io.WriteString(srv, s); err != nil {
					return
				}
			}
		}
	})
	return []string{"PMI_FD=" + strconv.Itoa(fds[1]), "PMI_RANK=0", "PMI_SIZE=1", "PMI_JOBID=7.0"}
}

// slurmPMI2 answers a one-rank job as Slurm's mpi/pmi2 plugin words it,
// except that a kvs-get of a missing key is answered with missing. Each
// abort is sent to aborts, if not nil, and gets no answer, as under Slurm.
func slurmPMI2(missing string, aborts chan<- *pmiMsg) func(m *pmiMsg) string {
	kvs := map[string]string{}
	return func(m *pmiMsg) string {
		k, _ := m.get("key")
		switch m.cmd {
		case "fullinit":
			return formatPMI2("fullinit-response", "rc", "0", "rank", "0", "size", "1", "appnum", "0")
		case "job-getid":
			return formatPMI2("job-getid-response", "rc", "0", "jobid", "7.0")
		case "info-getjobattr":
			return formatPMI2("info-getjobattr-response", "rc", "0", "found", "FALSE")
		case "kvs-put":
			v, _ := m.get("value")
			kvs[k] = v
			return formatPMI2("kvs-put-response", "rc", "0")
		case "kvs-fence":
			return formatPMI2("kvs-fence-response", "rc", "0")
		case "kvs-get":
			if v, ok := kvs[k]; ok {
				return formatPMI2("kvs-get-response", "rc", "0", "found", "TRUE", "value", v)
			}
			return missing
		case "abort":
			if aborts != nil {
				aborts <- m
			}
		case "finalize":
			return formatPMI2("finalize-response", "rc", "0")
		}
		return ""
	}
}
