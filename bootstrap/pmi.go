package bootstrap

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Environment variables of the PMI backends. The process manager sets the
// PMI_* ones; MD_PMI is for the user.
const (
	EnvPMIFD    = "PMI_FD"    // the inherited connection to the manager
	EnvPMIRank  = "PMI_RANK"  // this process's rank (PMI-1; PMI-2 asks the manager)
	EnvPMISize  = "PMI_SIZE"  // the number of ranks (PMI-1)
	EnvPMIID    = "PMI_ID"    // PMI-2: this process's id in fullinit, where set
	EnvPMIJobID = "PMI_JOBID" // PMI-2: the job id, sent in fullinit; used when the manager does not answer job-getid
	EnvPMIPort  = "PMI_PORT"  // the PMI port model, not supported
	// EnvPMIVersion pins the PMI version: "1" or "2". Unset, PMI-2 is tried
	// first and PMI-1 when the manager refuses it.
	EnvPMIVersion = "MD_PMI"
	// EnvPMIParent replaces PMI_FD in a rank's own environment once Open
	// has taken the manager's connection, set to the rank's process id.
	// PMI_FD is a descriptor number, which the manager's connection no
	// longer holds once taken (the rank keeps a close-on-exec duplicate):
	// a child process the rank starts, or a second Open in the rank,
	// would find some other file there and write the PMI handshake into
	// it. An Open that finds EnvPMIParent and no PMI_FD fails saying so,
	// as a rank's child does under mdrun and PMIx; removing it from a
	// child's environment makes the child a singleton.
	EnvPMIParent = "MD_PMI_PARENT"
)

// PMI limits where the manager does not say (PMI-2 has no get_maxes): the
// values of MPICH and Slurm.
const (
	pmi2KeyMax = 64
	pmi2ValMax = 1024
	// pmi1LineMax is the line length of MPICH's simple PMI client; servers
	// modelled on it read no more, so a put line stays within it.
	pmi1LineMax = 1024
)

// secretKey is the key under which rank 0 publishes the job secret.
const secretKey = "bootstrap.secret"

// abortGrace is how long Abort waits between logging its reason and
// telling the manager.
const abortGrace = 200 * time.Millisecond

// mappingKey is the job attribute telling which ranks share a node.
const mappingKey = "PMI_process_mapping"

// refusedError is a backend saying the environment is not its own after
// trying it; Open tries the next backend.
type refusedError struct{ reason string }

func (e *refusedError) Error() string { return e.reason }

func detectPMI(env lookupFunc) bool {
	_, fd := env(EnvPMIFD)
	_, port := env(EnvPMIPort)
	// A rank's child that a PMIx launcher of its own started is that
	// launcher's (mdrun's comes first anyway).
	_, child := env(EnvPMIParent)
	_, pmix := pmixMark(env)
	return fd || port || (child && !pmix)
}

// pmiTaken is the PMI_FD this process took the manager's connection from
// (see EnvPMIParent), "" until it did: a process takes it once, and
// holds mu from looking at it to taking it.
var pmiTaken struct {
	mu   sync.Mutex
	desc string
}

// takePMIFD opens the manager's connection that PMI_FD names, once per
// process: it takes PMI_FD out of this process's environment for good
// and puts EnvPMIParent in its place (and takes out EnvPMIxParent, which
// a PMIx rank above this one set, and a PMIx launcher's variables: this
// process's children have a PMI rank for their parent).
func takePMIFD(env lookupFunc) (*pmiConn, error) {
	pmiTaken.mu.Lock()
	defer pmiTaken.mu.Unlock()
	if pmiTaken.desc != "" {
		return nil, pmiTakenErr(pmiTaken.desc)
	}
	c, err := openPMIConn(env)
	if err != nil {
		return nil, err
	}
	pmiTaken.desc = c.desc
	// The PMIx launch variables go too, a launcher's above the PMI
	// manager: this rank's children would otherwise join that job.
	unsetenv := func(k string) error {
		if err := os.Unsetenv(k); err != nil {
			return fmt.Errorf("unsetting %s: %w", k, err)
		}
		return nil
	}
	if err := markRank(EnvPMIParent, strconv.Itoa(os.Getpid()), []string{EnvPMIFD, EnvPMIxParent}, unsetenv); err != nil {
		c.close()
		return nil, fmt.Errorf("bootstrap: pmi: %s: %w", c.desc, err)
	}
	return c, nil
}

func pmiTakenErr(desc string) error {
	return fmt.Errorf("bootstrap: pmi: this process took %s in an earlier Open: a process joins a PMI job once", desc)
}

// pmiParentErr is Open's error where EnvPMIParent is set and PMI_FD is
// not: in the process that took PMI_FD, or in one it started.
func pmiParentErr(st *openState) error {
	if st.own {
		pmiTaken.mu.Lock()
		desc := pmiTaken.desc
		pmiTaken.mu.Unlock()
		if desc != "" {
			return pmiTakenErr(desc)
		}
	}
	v, _ := st.env(EnvPMIParent)
	return fmt.Errorf("bootstrap: pmi: %s=%s: this process was started by a rank of a PMI job (process %s), not by the process manager; start it without %s to run it as a singleton", EnvPMIParent, v, v, EnvPMIParent)
}

// pmiConnOf returns the manager's connection, shared by the PMI backends of
// one Open, so PMI-1 can follow a refused PMI-2 handshake on the same fd.
func (st *openState) pmiConnOf() (*pmiConn, error) {
	if st.pmi != nil || st.pmiErr != nil {
		return st.pmi, st.pmiErr
	}
	if _, ok := st.env(EnvPMIFD); !ok {
		if v, ok := st.env(EnvPMIPort); ok {
			st.pmiErr = fmt.Errorf("%s=%s: the PMI port model is not supported; run the manager in its PMI_FD mode (Hydra: without -pmi-port)", EnvPMIPort, v)
		} else {
			st.pmiErr = pmiParentErr(st)
		}
		return nil, st.pmiErr
	}
	if st.own {
		st.pmi, st.pmiErr = takePMIFD(st.env)
	} else {
		st.pmi, st.pmiErr = openPMIConn(st.env)
	}
	// A stale PMI_FD beside a PMIx launcher's variables: a PMIx rank
	// whose parent (mpirun under Hydra, say) inherited it from a PMI rank.
	// The PMIx backend takes it out of the environment once it joins.
	var stale *staleFDError
	if errors.As(st.pmiErr, &stale) && detectPMIx(st.env) {
		st.pmiErr = &refusedError{fmt.Sprintf("%s is %s", stale.desc, stale.what)}
	}
	return st.pmi, st.pmiErr
}

// pinned reports whether MD_PMI excludes version v.
func pinned(env lookupFunc, v string) (string, bool) {
	want, ok := env(EnvPMIVersion)
	if !ok || want == "" || want == v {
		return "", false
	}
	if want != "1" && want != "2" {
		return fmt.Sprintf("%s=%s, want 1 or 2", EnvPMIVersion, want), true
	}
	return fmt.Sprintf("%s=%s", EnvPMIVersion, want), true
}

// pmiSetup is what a handshake learned.
type pmiSetup struct {
	name    string // "pmi1" or "pmi2"
	proto   pmiProto
	rank    int
	size    int
	jobID   string
	mapping string // PMI_process_mapping, "" if the manager gave none
	keyMax  int
	valMax  int
}

func openPMI2(ctx context.Context, logger hclog.Logger, st *openState) (Bootstrap, error) {
	if why, ok := pinned(st.env, "2"); ok {
		return nil, &refusedError{why}
	}
	c, err := st.pmiConnOf()
	if err != nil {
		return nil, err
	}
	var s *pmiSetup
	err = c.during(ctx, func() error {
		var err error
		s, err = handshake2(c, st.env)
		return err
	})
	var ref *refusedError
	if errors.As(err, &ref) {
		return nil, &refusedError{fmt.Sprintf("%s: handshake: %s", c.desc, ref.reason)}
	}
	if err != nil {
		return nil, fmt.Errorf("bootstrap: pmi2: %s: handshake: %w", c.desc, err)
	}
	c.closeInherited()
	return startPMIJob(ctx, logger, c, s)
}

func handshake2(c *pmiConn, env lookupFunc) (*pmiSetup, error) {
	m, err := c.initPMI(2, 0)
	if err != nil {
		return nil, err
	}
	rc, _ := m.rc()
	if v, _ := m.get("pmi_version"); v != "2" || rc != 0 {
		return nil, &refusedError{fmt.Sprintf("the manager answered pmi_version=%s rc=%d", v, rc)}
	}
	p := &pmi2{c: c}
	// Slurm insists on pmijobid and pmirank; Hydra needs neither.
	var kv []string
	if id, ok := env(EnvPMIJobID); ok {
		kv = append(kv, "pmijobid", id)
	}
	if id, ok := env(EnvPMIID); ok {
		kv = append(kv, "pmiid", id)
	} else if r, ok := env(EnvPMIRank); ok {
		kv = append(kv, "pmirank", r)
	}
	kv = append(kv, "threaded", "FALSE")
	m, err = p.roundTrip("fullinit-response", "fullinit", kv...)
	if err != nil {
		return nil, fmt.Errorf("fullinit: %w", err)
	}
	s := &pmiSetup{name: "pmi2", proto: p, keyMax: pmi2KeyMax - 1, valMax: pmi2ValMax - 1}
	if s.rank, err = m.num("rank"); err != nil {
		return nil, err
	}
	if s.size, err = m.num("size"); err != nil {
		return nil, err
	}
	if err := checkRankSize(s.rank, s.size, "fullinit-response"); err != nil {
		return nil, err
	}
	m, err = p.roundTrip("job-getid-response", "job-getid")
	var rc2 *rcError
	switch {
	case err == nil:
		s.jobID, _ = m.get("jobid")
	case errors.As(err, &rc2):
		s.jobID, _ = env(EnvPMIJobID)
	default:
		return nil, fmt.Errorf("job-getid: %w", err)
	}
	if s.mapping, _, err = p.jobAttr(mappingKey); err != nil && !errors.As(err, &rc2) {
		return nil, fmt.Errorf("info-getjobattr %s: %w", mappingKey, err)
	}
	return s, nil
}

func openPMI1(ctx context.Context, logger hclog.Logger, st *openState) (Bootstrap, error) {
	if why, ok := pinned(st.env, "1"); ok {
		return nil, &refusedError{why}
	}
	c, err := st.pmiConnOf()
	if err != nil {
		return nil, err
	}
	var s *pmiSetup
	err = c.during(ctx, func() error {
		var err error
		s, err = handshake1(c, st.env)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("bootstrap: pmi1: %s: handshake: %w", c.desc, err)
	}
	c.closeInherited()
	return startPMIJob(ctx, logger, c, s)
}

func handshake1(c *pmiConn, env lookupFunc) (*pmiSetup, error) {
	s := &pmiSetup{name: "pmi1"}
	// Rank and size come from the environment in PMI-1; check them before
	// talking, as they name what is wrong most precisely.
	var err error
	if s.size, err = envInt(env, EnvPMISize); err != nil {
		return nil, err
	}
	if s.rank, err = envInt(env, EnvPMIRank); err != nil {
		return nil, err
	}
	if err := checkRankSize(s.rank, s.size, EnvPMIRank+"/"+EnvPMISize); err != nil {
		return nil, err
	}
	m, err := c.initPMI(1, 1)
	if err != nil {
		return nil, err
	}
	if rc, _ := m.rc(); rc != 0 {
		v, _ := m.get("pmi_version")
		return nil, fmt.Errorf("the manager refused PMI-1 (answered pmi_version=%s rc=%d)", v, rc)
	}
	p := &pmi1{c: c}
	if m, err = p.roundTrip(formatPMI1("get_maxes"), "maxes"); err != nil {
		return nil, fmt.Errorf("get_maxes: %w", err)
	}
	kvsMax, err := m.num("kvsname_max")
	if err != nil {
		return nil, err
	}
	if s.keyMax, err = m.num("keylen_max"); err != nil {
		return nil, err
	}
	vallen, err := m.num("vallen_max")
	if err != nil {
		return nil, err
	}
	if m, err = p.roundTrip(formatPMI1("get_my_kvsname"), "my_kvsname"); err != nil {
		return nil, fmt.Errorf("get_my_kvsname: %w", err)
	}
	if p.kvsname, _ = m.get("kvsname"); p.kvsname == "" || len(p.kvsname) >= max(kvsMax, 1) {
		return nil, fmt.Errorf("%w: kvsname %.40q", errBadPMI, p.kvsname)
	}
	s.jobID = p.kvsname
	s.keyMax--
	// A put line holds the command, the kvsname, a key and a value.
	line := len(formatPMI1("put", "kvsname", p.kvsname, "key", "", "value", "")) + s.keyMax
	s.valMax = min(vallen-1, pmi1LineMax-1-line)
	v, ok, err := p.get(mappingKey)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", mappingKey, err)
	}
	if ok {
		s.mapping = v
	}
	s.proto = p
	return s, nil
}

func envInt(env lookupFunc, k string) (int, error) {
	v, ok := env(k)
	if !ok {
		return 0, fmt.Errorf("%s is not set", k)
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q is not a number", k, v)
	}
	return n, nil
}

// checkRankSize checks the rank and size that the manager (where) gave.
// Ranks are int32 on the wire of the subdevices (sdi.Rank), so no job is
// larger.
func checkRankSize(rank, size int, where string) error {
	if size > math.MaxInt32 {
		return fmt.Errorf("%s: job of %d ranks, more than %d", where, size, math.MaxInt32)
	}
	if size < 1 || rank < 0 || rank >= size {
		return fmt.Errorf("%s: rank %d of %d ranks", where, rank, size)
	}
	return nil
}

// cleanJobID keeps what is safe in file and socket names.
func cleanJobID(id string) string {
	b := []byte(id)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '_'
		}
	}
	if len(b) > 64 {
		b = b[:64]
	}
	return string(b)
}

// hostOf names this rank's node. The process mapping says which ranks share
// a node; the host name alone does not (network namespaces, containers
// share it), so the name is "<hostname>#<node>".
func hostOf(logger hclog.Logger, s *pmiSetup) (string, error) {
	hn, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("host name: %w", err)
	}
	if s.mapping == "" {
		logger.Debug("the process manager gave no process mapping; ranks are placed by host name alone")
		return hn, nil
	}
	node, err := processMappingNode(s.mapping, s.rank)
	if err != nil {
		return "", err
	}
	return hn + "#" + strconv.Itoa(node), nil
}

// startPMIJob turns a finished handshake into a Bootstrap: it starts the
// worker and exchanges the job secret.
func startPMIJob(ctx context.Context, logger hclog.Logger, c *pmiConn, s *pmiSetup) (Bootstrap, error) {
	logger = logger.With("rank", s.rank)
	fail := func(err error) (Bootstrap, error) {
		return nil, fmt.Errorf("bootstrap: %s: %s: %w", s.name, c.desc, err)
	}
	host, err := hostOf(logger, s)
	if err != nil {
		return fail(err)
	}
	if s.jobID = cleanJobID(s.jobID); s.jobID == "" {
		return fail(errors.New("the process manager named no job id"))
	}
	if s.valMax < minChunkRoom {
		return fail(fmt.Errorf("values of at most %d bytes are too short (need %d)", s.valMax, minChunkRoom))
	}
	j := &pmiJob{
		logger: logger, name: s.name, conn: c, proto: s.proto,
		rank: s.rank, size: s.size, host: host, jobID: s.jobID,
		keyMax: s.keyMax, valMax: s.valMax,
		ops: make(chan *pmiOp), dead: make(chan struct{}),
		puts: map[string][]string{}, sent: map[string]bool{},
	}
	j.wg.Add(1)
	go j.loop()
	// The job secret travels through the manager's store, which is as
	// trusted as the manager itself: anyone who can read it can also
	// start processes as this user.
	if j.rank == 0 {
		secret := make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			j.shutdown()
			return fail(fmt.Errorf("job secret: %w", err))
		}
		j.secret = secret
		if err := j.Put(secretKey, secret); err != nil {
			j.shutdown()
			return fail(err)
		}
	}
	if err := j.Fence(ctx); err != nil {
		j.shutdown()
		return fail(err)
	}
	if j.rank != 0 {
		if j.secret, err = j.Get(ctx, 0, secretKey); err != nil {
			j.shutdown()
			return fail(err)
		}
	}
	logger.Debug("joined the job", "version", s.name, "size", s.size, "host", host, "job", s.jobID)
	return j, nil
}

// pmiJob is a rank of a job run by a PMI process manager. It is safe for
// concurrent use.
//
// The PMI protocols answer one request at a time, so a worker goroutine
// owns the connection and runs requests in order; callers wait for theirs
// and may stop waiting when their context ends.
type pmiJob struct {
	logger hclog.Logger
	name   string
	conn   *pmiConn
	proto  pmiProto
	rank   int
	size   int
	host   string
	jobID  string
	secret []byte
	keyMax int
	valMax int

	ops  chan *pmiOp
	dead chan struct{} // closed, with err set, when the connection is unusable
	wg   sync.WaitGroup

	mu      sync.Mutex
	err     error
	puts    map[string][]string // key -> encoded chunks, for the next fence
	sent    map[string]bool     // keys published at an earlier fence
	fence   *pmiOp              // the fence submitted and not yet done
	closing bool
	// abortDone is made when Abort closes it, and closed once abortErr
	// holds its outcome (see lateFinish).
	abortDone chan struct{}
	abortErr  error
}

// pmiOp is one request for the worker.
type pmiOp struct {
	ctx  context.Context // nil: run even if the caller gave up
	run  func() ([]byte, error)
	done chan struct{}
	val  []byte
	err  error
}

func (j *pmiJob) Rank() int      { return j.rank }
func (j *pmiJob) Size() int      { return j.size }
func (j *pmiJob) Host() string   { return j.host }
func (j *pmiJob) JobID() string  { return j.jobID }
func (j *pmiJob) Secret() []byte { return j.secret }

func (j *pmiJob) loop() {
	defer j.wg.Done()
	for {
		select {
		case op := <-j.ops:
			if op.ctx != nil && op.ctx.Err() != nil {
				op.err = op.ctx.Err()
			} else {
				op.val, op.err = op.run()
			}
			var ce *connError
			if errors.As(op.err, &ce) {
				j.fail(op.err)
				op.err = j.err
			}
			close(op.done)
		case <-j.dead:
			return
		}
	}
}

// fail marks the connection unusable and releases every waiter; the first
// reason wins.
func (j *pmiJob) fail(err error) {
	j.mu.Lock()
	if j.err == nil {
		j.err = fmt.Errorf("%s: %s: %v: %w", j.name, j.conn.desc, err, ErrClosed)
		close(j.dead)
	}
	j.mu.Unlock()
	j.conn.close()
}

func (j *pmiJob) shutdown() {
	j.fail(errors.New("closed by this rank"))
	j.wg.Wait()
}

// do runs op on the worker and waits for it. When ctx ends first, do returns
// ctx's error and op may still run.
func (j *pmiJob) do(ctx context.Context, op *pmiOp) ([]byte, error) {
	select {
	case j.ops <- op:
	case <-j.dead:
		return nil, j.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return j.wait(ctx, op)
}

func (j *pmiJob) wait(ctx context.Context, op *pmiOp) ([]byte, error) {
	select {
	case <-op.done:
	case <-j.dead:
		select {
		case <-op.done: // finished just before the end
		default:
			return nil, j.err
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return op.val, op.err
}

// Put encodes the value at once, so a key or value the manager cannot hold
// fails here rather than in the Fence of every rank.
func (j *pmiJob) Put(key string, value []byte) error {
	if err := checkPut(key, value); err != nil {
		return err
	}
	chunks, err := encodeValue(value, j.valMax)
	if err != nil {
		return fmt.Errorf("bootstrap: put %q: %w", key, err)
	}
	if _, err := wireKey(j.rank, key, len(chunks)-1, j.keyMax); err != nil {
		return fmt.Errorf("bootstrap: put %q: %w", key, err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closing || j.err != nil {
		return fmt.Errorf("bootstrap: put: %w", ErrClosed)
	}
	if j.sent[key] {
		// The managers' stores do not all replace a value, and one that
		// kept the old chunk count would corrupt it.
		return fmt.Errorf("bootstrap: put %q: published at an earlier fence; under a PMI process manager a key is published once", key)
	}
	j.puts[key] = chunks
	return nil
}

// Fence publishes this rank's puts and waits at the manager's barrier. As
// with the mdrun backend, a Fence whose ctx ended stays under way and the
// next Fence call waits for that same barrier.
func (j *pmiJob) Fence(ctx context.Context) error {
	j.mu.Lock()
	op := j.fence
	if op == nil {
		if j.err != nil {
			j.mu.Unlock()
			return fmt.Errorf("bootstrap: fence: %w", j.err)
		}
		puts := j.puts
		j.puts = map[string][]string{}
		op = &pmiOp{run: func() ([]byte, error) { return nil, j.publish(puts) }, done: make(chan struct{})}
		j.fence = op
		j.mu.Unlock()
		select {
		case j.ops <- op:
		case <-j.dead:
		case <-ctx.Done():
			j.unsendFence(op, puts, ctx.Err())
			return fmt.Errorf("bootstrap: fence: %w", ctx.Err())
		}
	} else {
		j.mu.Unlock()
	}
	_, err := j.wait(ctx, op)
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return fmt.Errorf("bootstrap: fence: %w", err)
	}
	j.mu.Lock()
	if j.fence == op {
		j.fence = nil
	}
	j.mu.Unlock()
	if err != nil {
		return fmt.Errorf("bootstrap: fence: %w", err)
	}
	return nil
}

// unsendFence undoes a fence that never reached the worker: its puts go
// back (behind any made since) and callers that joined it are released.
func (j *pmiJob) unsendFence(op *pmiOp, puts map[string][]string, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.fence = nil
	for k, v := range j.puts {
		puts[k] = v
	}
	j.puts = puts
	op.err = err
	close(op.done)
}

// publish runs on the worker: the puts, then the barrier.
func (j *pmiJob) publish(puts map[string][]string) error {
	keys := make([]string, 0, len(puts))
	for k := range puts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		for i, chunk := range puts[k] {
			wk, err := wireKey(j.rank, k, i, j.keyMax)
			if err != nil {
				return err
			}
			if err := j.proto.put(wk, chunk); err != nil {
				return fmt.Errorf("put %q: %w", k, err)
			}
		}
		j.mu.Lock()
		j.sent[k] = true
		j.mu.Unlock()
	}
	return j.proto.fence()
}

func (j *pmiJob) Get(ctx context.Context, rank int, key string) ([]byte, error) {
	if rank < 0 || rank >= j.size {
		return nil, fmt.Errorf("bootstrap: get %q: rank %d not in [0, %d)", key, rank, j.size)
	}
	if err := checkKey("get", key); err != nil {
		return nil, err
	}
	j.mu.Lock()
	err := j.err
	j.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("bootstrap: get %q of rank %d: %w", key, rank, err)
	}
	v, err := j.do(ctx, &pmiOp{ctx: ctx, run: func() ([]byte, error) { return j.fetch(rank, key) }, done: make(chan struct{})})
	if err != nil {
		return nil, fmt.Errorf("bootstrap: get %q of rank %d: %w", key, rank, err)
	}
	return v, nil
}

// fetch runs on the worker: chunk 0, then the rest.
func (j *pmiJob) fetch(rank int, key string) ([]byte, error) {
	get := func(i int) (string, bool, error) {
		wk, err := wireKey(rank, key, i, j.keyMax)
		if err != nil {
			return "", false, err
		}
		return j.proto.get(wk)
	}
	first, ok, err := get(0)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, ErrNotFound
	}
	n, head, err := chunkCount(first)
	if err != nil {
		return nil, err
	}
	chunks := []string{head}
	for i := 1; i < n; i++ {
		c, ok, err := get(i)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("%w: chunk %d of %d is missing", errBadChunk, i, n)
		}
		chunks = append(chunks, c)
	}
	return decodeValue(chunks)
}

// Abort reports the reason through the logger (PMI-1 carries none, and the
// managers do not all print PMI-2's), then asks the manager to end the job.
func (j *pmiJob) Abort(code int, reason string) error {
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	j.logger.Error("aborting the job", "code", code, "reason", reason)
	j.mu.Lock()
	if j.closing {
		done := j.abortDone
		j.mu.Unlock()
		return lateFinish(opAbort, done, &j.abortErr)
	}
	j.closing, j.abortDone = true, make(chan struct{})
	err := j.err
	j.mu.Unlock()
	if err != nil {
		return j.aborted(fmt.Errorf("bootstrap: abort: %w", err))
	}
	// Managers kill the job as soon as they read the abort, sometimes
	// before forwarding what the rank wrote just before; give the reason
	// logged above a moment to get out.
	time.Sleep(abortGrace)
	// Written beside the worker, which may be waiting in a barrier.
	// Slurm's PMI-2 takes no ';' in a value, escaped or not.
	err = j.proto.abort(exitCode(code), strings.NewReplacer("\n", " ", ";", ",").Replace(reason))
	if err != nil {
		err = fmt.Errorf("bootstrap: %s: abort: %w", j.name, err)
	}
	return j.aborted(err)
}

// aborted records Abort's outcome for an Abort waiting on it, and shuts
// the job down.
func (j *pmiJob) aborted(err error) error {
	j.abortErr = err
	close(j.abortDone)
	j.shutdown()
	return err
}

// Close finalizes with the manager (waiting at most ackTimeout) and
// releases the connection. It is idempotent; during an Abort (from
// another goroutine) it returns once the abort is out (see lateFinish).
func (j *pmiJob) Close() error {
	j.mu.Lock()
	if j.closing {
		done := j.abortDone
		j.mu.Unlock()
		return lateFinish(opFinalize, done, &j.abortErr)
	}
	j.closing = true
	j.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
	defer cancel()
	_, err := j.do(ctx, &pmiOp{run: func() ([]byte, error) { return nil, j.proto.finalize() }, done: make(chan struct{})})
	j.shutdown()
	if err != nil {
		return fmt.Errorf("bootstrap: finalize: %w", err)
	}
	return nil
}
