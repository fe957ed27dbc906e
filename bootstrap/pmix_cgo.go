//go:build pmix && cgo

package bootstrap

/*
#cgo pkg-config: pmix
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <pmix.h>

// mdPMIxFenceDone is in pmix_callback.go.
extern void mdPMIxFenceDone(int status, uintptr_t id);

static void md_fence_cb(pmix_status_t status, void *cbdata) {
	mdPMIxFenceDone(status, (uintptr_t)cbdata);
}

// md_collect is the info of every fence: collect the puts of all ranks.
// PMIx_Fence_nb may read it until the callback, so it lives as long as the
// process; PMIX_INFO_LOAD copies a bool into the struct and allocates
// nothing.
static pmix_info_t md_collect;

static pthread_once_t md_collect_once = PTHREAD_ONCE_INIT;

static void md_collect_init(void) {
	bool yes = true;
	PMIX_INFO_LOAD(&md_collect, PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
}

static pmix_status_t md_init(pmix_proc_t *me) {
	// Once: a second Open's fences may already be reading it.
	pthread_once(&md_collect_once, md_collect_init);
	return PMIx_Init(me, NULL, 0);
}

// md_get_u32 reads a number the server holds about (nspace, rank).
static pmix_status_t md_get_u32(const char *nspace, uint32_t rank, const char *key, uint32_t *out) {
	pmix_proc_t p;
	pmix_value_t *v = NULL;
	pmix_status_t rc;

	PMIX_LOAD_PROCID(&p, nspace, rank);
	rc = PMIx_Get(&p, key, NULL, 0, &v);
	if (rc != PMIX_SUCCESS) {
		return rc;
	}
	if (v == NULL) {
		return PMIX_ERR_NOT_FOUND;
	}
	switch (v->type) {
	case PMIX_UINT32: *out = v->data.uint32; break;
	case PMIX_UINT16: *out = v->data.uint16; break;
	case PMIX_UINT64: *out = (uint32_t)v->data.uint64; break;
	case PMIX_SIZE:   *out = (uint32_t)v->data.size; break;
	case PMIX_INT:    *out = (uint32_t)v->data.integer; break;
	case PMIX_UINT:   *out = (uint32_t)v->data.uint; break;
	default:          rc = PMIX_ERR_TYPE_MISMATCH;
	}
	PMIX_VALUE_RELEASE(v);
	return rc;
}

// md_put publishes len bytes at data under key, to every rank. PMIx_Put
// copies the value, so data need live only during the call.
// md_job_size reads PMIX_JOB_SIZE, the number of ranks in nspace.
static pmix_status_t md_job_size(const char *nspace, uint32_t *out) {
	return md_get_u32(nspace, PMIX_RANK_WILDCARD, PMIX_JOB_SIZE, out);
}

// md_node_id reads PMIX_NODEID, the server's number for the node rank runs on.
static pmix_status_t md_node_id(const char *nspace, uint32_t rank, uint32_t *out) {
	return md_get_u32(nspace, rank, PMIX_NODEID, out);
}

static pmix_status_t md_put(const char *key, void *data, size_t len) {
	pmix_value_t v;

	PMIX_VALUE_CONSTRUCT(&v);
	v.type = PMIX_BYTE_OBJECT;
	v.data.bo.bytes = (char *)data;
	v.data.bo.size = len;
	return PMIx_Put(PMIX_GLOBAL, key, &v);
}

static pmix_status_t md_fence(uintptr_t id) {
	return PMIx_Fence_nb(NULL, 0, &md_collect, 1, md_fence_cb, (void *)id);
}

// md_get reads the bytes rank put under key. PMIX_IMMEDIATE keeps it to
// what this process's server already holds: after a collecting fence
// that is every rank's puts, and a key nobody put is PMIX_ERR_NOT_FOUND
// at once, where a plain PMIx_Get would wait for a put that never comes.
// (PMIX_OPTIONAL, the client's own store alone, misses the other ranks'
// puts when the client keeps its store in its own memory, PMIx's "hash"
// store: PMIX_MCA_gds=hash.)
// On success *out holds a copy the caller frees with free(3); *len may be
// 0 with *out NULL.
static pmix_status_t md_get(const char *nspace, uint32_t rank, const char *key, char **out, size_t *len) {
	pmix_proc_t p;
	pmix_info_t info;
	pmix_value_t *v = NULL;
	pmix_status_t rc;
	bool yes = true;

	*out = NULL;
	*len = 0;
	PMIX_LOAD_PROCID(&p, nspace, rank);
	PMIX_INFO_LOAD(&info, PMIX_IMMEDIATE, &yes, PMIX_BOOL);
	rc = PMIx_Get(&p, key, &info, 1, &v);
	PMIX_INFO_DESTRUCT(&info);
	if (rc != PMIX_SUCCESS) {
		return rc;
	}
	if (v == NULL) {
		return PMIX_ERR_NOT_FOUND;
	}
	if (v->type != PMIX_BYTE_OBJECT) {
		rc = PMIX_ERR_TYPE_MISMATCH;
	} else if (v->data.bo.size > 0) {
		*out = malloc(v->data.bo.size);
		if (*out == NULL) {
			rc = PMIX_ERR_NOMEM;
		} else {
			memcpy(*out, v->data.bo.bytes, v->data.bo.size);
			*len = v->data.bo.size;
		}
	}
	PMIX_VALUE_RELEASE(v);
	return rc;
}

static pmix_status_t md_abort(int code, const char *msg) {
	return PMIx_Abort(code, msg, NULL, 0);
}

static pmix_status_t md_finalize(void) {
	return PMIx_Finalize(NULL, 0);
}

// md_has_env reports whether the C environment, the one libpmix and a
// fork from C see, has key.
static int md_has_env(const char *key) {
	return getenv(key) != NULL;
}
*/
import "C"

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/hashicorp/go-hclog"
)

// PMIx status codes the calls here branch on.
const (
	pmixSuccess = C.PMIX_SUCCESS
	pmixDone    = C.PMIX_OPERATION_SUCCEEDED
)

// pmixCallErr turns a status into an error naming the call.
func pmixCallErr(call string, rc C.pmix_status_t) error {
	if rc == pmixSuccess {
		return nil
	}
	return &pmixError{call: call, status: int(rc), text: C.GoString(C.PMIx_Error_string(rc))}
}

// openPMIx joins the job of the PMIx server that started this process:
// PMIx_Init, the job's size and this rank's node, then the job secret
// through the store.
func openPMIx(ctx context.Context, logger hclog.Logger, st *openState) (Bootstrap, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("bootstrap: pmix: %w", err)
	}
	if err := pmixClient.acquire(); err != nil {
		return nil, err
	}
	me, err := pmixClient.init(ctx, st.env)
	if err != nil {
		return nil, err
	}
	j, err := joinPMIx(ctx, logger, me)
	pmixClient.opened(j)
	if err != nil {
		return nil, err
	}
	return j, nil
}

// pmixClient is this process's PMIx client. A PMIx server admits a
// process once, as one rank, and the client library is one per process,
// so Open hands out one pmix Bootstrap at a time: a second Open while the
// first is open, or while an Open is joining, fails with [errPMIxInUse].
// And a process joins a PMIx job once, as it does under mdrun and PMI:
// once a PMIx_Init has succeeded and its client is finalized (Close, an
// Open that failed after PMIx_Init, an abandoned PMIx_Init that
// succeeded late), Open fails with [errPMIxJoinedOnce]. Joining again
// would need the launcher's variables back in the environment for
// PMIx_Init, where a child started meanwhile would inherit them and join
// as a second copy of the rank, and a server that saw the rank leave mid
// fence refuses it anyway (PMIX_ERR_PARTIAL_SUCCESS). A PMIx_Init that
// failed uses the client up too, also one that an Open abandoned: libpmix
// keeps state from it, under which a later PMIx_Init succeeds as rank 0
// of a job of 1, splitting the world without a word; Open then fails with
// [errPMIxJoinedOnce], naming the first failure.
var pmixClient = &pmixClientState{}

// errPMIxInUse is what an Open returns while this process's PMIx client
// belongs to another Open.
var errPMIxInUse = errors.New("bootstrap: pmix: one PMIx client per process")

// errPMIxJoinedOnce is what an Open returns once this process's PMIx
// client was finalized, or a PMIx_Init failed.
var errPMIxJoinedOnce = errors.New("a process joins a PMIx job once")

type pmixClientState struct {
	mu        sync.Mutex
	opening   bool     // an Open holds the client: in PMIx_Init or joining
	abandoned bool     // that Open's ctx ended in PMIx_Init, which still runs
	job       *pmixJob // the job Open returned, until its Close
	// spent is the rank whose client was finalized, "" before: from then
	// on Open fails.
	spent string
	// initErr is the first PMIx_Init that failed, nil before: from then
	// on Open fails.
	initErr error
}

// initFailed records that a PMIx_Init failed with err.
func (c *pmixClientState) initFailed(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.initErr == nil {
		c.initErr = err
	}
}

// finalized records that the client of rank of namespace nspace was
// finalized.
func (c *pmixClientState) finalized(nspace string, rank int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.spent == "" {
		c.spent = fmt.Sprintf("rank %d of namespace %s", rank, nspace)
	}
}

// acquire takes the client for an Open.
func (c *pmixClientState) acquire() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.job != nil:
		how := "not closed"
		c.job.mu.Lock()
		if c.job.aborted {
			how = "aborted"
		}
		c.job.mu.Unlock()
		return fmt.Errorf("%w: this process is already rank %d of namespace %s, through an earlier Open (%s); "+
			"Close that Bootstrap before opening another", errPMIxInUse, c.job.rank, c.job.nspace, how)
	case c.spent != "":
		return fmt.Errorf("bootstrap: pmix: this process was %s and closed its PMIx client; %w", c.spent, errPMIxJoinedOnce)
	case c.initErr != nil:
		// %v: the earlier failure is history, not this Open's cause,
		// and must not make it match ErrClosed.
		return fmt.Errorf("bootstrap: pmix: an earlier Open's PMIx_Init failed (%v), after which libpmix would "+
			"join this process as a job of its own; %w", c.initErr, errPMIxJoinedOnce)
	case c.abandoned:
		return fmt.Errorf("%w: the PMIx_Init of an earlier Open, abandoned when its ctx ended, is still running "+
			"(its server does not answer); it finalizes if it ever succeeds", errPMIxInUse)
	case c.opening:
		return fmt.Errorf("%w: another Open of this process is joining the job", errPMIxInUse)
	}
	c.opening = true
	return nil
}

// opened ends the Open that acquired the client: j is the job it
// returned, nil if it failed.
func (c *pmixClientState) opened(j *pmixJob) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.opening = false
	if j != nil {
		c.job = j
	}
}

// closed gives the client back when j is finalized, for good: Open
// fails from then on.
func (c *pmixClientState) closed(j *pmixJob) {
	c.finalized(j.nspace, j.rank)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.job == j {
		c.job = nil
	}
}

// init runs PMIx_Init for the Open that acquired the client. PMIx_Init
// blocks in C until the server answers, so it runs on a goroutine of its
// own and ctx bounds the wait: when ctx ends first, init returns ctx's
// error, the client stays taken (abandoned) until PMIx_Init returns, and
// a PMIx_Init that then succeeds is finalized at once. On error the
// client is released, unless abandoned; after a PMIx_Init that returned,
// succeeded or not, no later Open gets it (see [pmixClient]).
func (c *pmixClientState) init(ctx context.Context, env lookupFunc) (C.pmix_proc_t, error) {
	// A rank's child ends here.
	if err := pmixChildErr(env); err != nil {
		c.opened(nil)
		return C.pmix_proc_t{}, err
	}
	launchDesc := pmixLaunchDesc(env)
	type result struct {
		me  C.pmix_proc_t
		err error
	}
	res := make(chan result, 1)
	go func() {
		var r result
		r.err = c.runInit(&r.me, launchDesc)
		c.mu.Lock()
		if !c.abandoned {
			res <- r
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		if r.err == nil {
			C.md_finalize()
			c.finalized(C.GoString(&r.me.nspace[0]), int(r.me.rank))
		}
		c.mu.Lock()
		c.abandoned, c.opening = false, false
		c.mu.Unlock()
	}()
	var r result
	select {
	case r = <-res:
	case <-ctx.Done():
		c.mu.Lock()
		select {
		case r = <-res: // PMIx_Init returned as ctx ended: take its answer
		default:
			c.abandoned = true
			c.mu.Unlock()
			return C.pmix_proc_t{}, fmt.Errorf("bootstrap: pmix: PMIx_Init (started with %s): no answer from the server: %w", launchDesc, ctx.Err())
		}
		c.mu.Unlock()
	}
	if r.err != nil {
		c.opened(nil)
		return C.pmix_proc_t{}, r.err
	}
	return r.me, nil
}

// runInit is PMIx_Init. After a PMIx_Init that succeeded the launcher's
// variables are out of the environment, for good, and [EnvPMIxParent] is
// in it: a process this rank starts inherits the environment (os/exec,
// and a fork from C, since under cgo os.Unsetenv clears the C
// environment too), and must not join the job as a second copy of this
// rank, as it cannot under mdrun (the service admits a rank once) or PMI
// (PMI_FD is close-on-exec). A PMI_FD goes too: beside PMIx variables it is
// a stale number the PMI backends stepped aside from, and a child would
// write a handshake into whatever file has it (staleFDError). A PMIx_Init
// that failed leaves them, and uses up the client. Errors say how the
// launcher started the process (launchDesc).
func (c *pmixClientState) runInit(me *C.pmix_proc_t, launchDesc string) error {
	if err := pmixCallErr("PMIx_Init", C.md_init(me)); err != nil {
		err = fmt.Errorf("%w (started with %s)", err, launchDesc)
		c.initFailed(err)
		return err
	}
	// EnvPMIParent: a PMI rank above this one set it, but this process's
	// parent is a PMIx rank.
	err := markRank(EnvPMIxParent, C.GoString(&me.nspace[0])+"."+strconv.FormatUint(uint64(me.rank), 10),
		[]string{EnvPMIParent, EnvPMIFD}, unsetC)
	if err != nil {
		// Joined, but children could join too: leave.
		C.md_finalize()
		c.finalized(C.GoString(&me.nspace[0]), int(me.rank))
		return fmt.Errorf("bootstrap: pmix: %w (started with %s)", err, launchDesc)
	}
	return nil
}

// unsetC removes key from the environment, Go's and C's: under cgo
// os.Unsetenv calls unsetenv(3), which md_has_env checks.
func unsetC(key string) error {
	if err := os.Unsetenv(key); err != nil {
		return fmt.Errorf("unsetting %s: %w", key, err)
	}
	ck := C.CString(key)
	defer C.free(unsafe.Pointer(ck))
	if C.md_has_env(ck) != 0 {
		return fmt.Errorf("%s is still in the C environment after os.Unsetenv", key)
	}
	return nil
}

// joinPMIx is Open after PMIx_Init.
func joinPMIx(ctx context.Context, logger hclog.Logger, me C.pmix_proc_t) (*pmixJob, error) {
	j := &pmixJob{
		nspace: C.GoString(&me.nspace[0]),
		rank:   int(me.rank),
		dead:   make(chan struct{}),
		sent:   map[string]bool{},
	}
	j.logger = logger.With("rank", j.rank)
	fail := func(err error) (*pmixJob, error) {
		j.Close()
		return nil, err
	}
	cns := C.CString(j.nspace)
	defer C.free(unsafe.Pointer(cns))
	var size C.uint32_t
	if err := pmixCallErr("PMIx_Get "+C.PMIX_JOB_SIZE, C.md_job_size(cns, &size)); err != nil {
		return fail(err)
	}
	j.size = int(size)
	if err := checkRankSize(j.rank, j.size, "PMIx_Init"); err != nil {
		return fail(fmt.Errorf("bootstrap: pmix: namespace %s: %w", j.nspace, err))
	}
	hn, err := os.Hostname()
	if err != nil {
		return fail(fmt.Errorf("bootstrap: pmix: host name: %w", err))
	}
	var node C.uint32_t
	nodeErr := pmixCallErr("PMIx_Get "+C.PMIX_NODEID, C.md_node_id(cns, C.uint32_t(j.rank), &node))
	if nodeErr != nil {
		j.logger.Debug("the PMIx server gave no node id; ranks are placed by host name alone", "error", nodeErr)
	}
	j.host = pmixHost(hn, uint32(node), nodeErr == nil)
	if j.jobID = cleanJobID(j.nspace); j.jobID == "" {
		return fail(errors.New("bootstrap: pmix: PMIx_Init named no namespace"))
	}
	// The job secret travels through the server's store, which is as
	// trusted as the server itself: anyone who can read it can also start
	// processes as this user.
	if j.rank == 0 {
		secret := make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			return fail(fmt.Errorf("bootstrap: pmix: job secret: %w", err))
		}
		j.secret = secret
		if err := j.Put(secretKey, secret); err != nil {
			return fail(err)
		}
	}
	if err := j.Fence(ctx); err != nil {
		return fail(err)
	}
	if j.rank != 0 {
		if j.secret, err = j.Get(ctx, 0, secretKey); err != nil {
			return fail(err)
		}
	}
	j.logger.Debug("joined the job", "size", j.size, "host", j.host, "namespace", j.nspace)
	return j, nil
}

// pmixJob is a rank of a job a PMIx server started. It is safe for
// concurrent use.
//
// The PMIx client library is thread-safe and runs its own progress
// thread, so calls go to it directly. A fence is started with
// PMIx_Fence_nb and completes in a callback, so a Fence whose ctx ends
// leaves no thread blocked in C; a Get runs PMIx_Get on a goroutine that
// Close waits for.
type pmixJob struct {
	logger hclog.Logger
	nspace string
	rank   int
	size   int
	host   string
	jobID  string
	secret []byte

	mu      sync.Mutex
	puts    []string        // keys put since the last commit
	sent    map[string]bool // keys committed: published, or to be at the fence under way
	fence   *pmixFence      // the fence under way, nil if none
	closing bool            // Close or Abort was called: new calls fail
	aborted bool            // it was Abort
	dead    chan struct{}   // closed once waiters are to give up: at Close, or when PMIx_Abort returned
	gets    sync.WaitGroup
}

func (j *pmixJob) Rank() int      { return j.rank }
func (j *pmixJob) Size() int      { return j.size }
func (j *pmixJob) Host() string   { return j.host }
func (j *pmixJob) JobID() string  { return j.jobID }
func (j *pmixJob) Secret() []byte { return j.secret }

// Put hands the value to the PMIx client library, which publishes it to
// every rank at the next Fence. As under the PMI backends, a key is
// published once: a client that keeps other ranks' values in its own
// memory (PMIx's "hash" store) goes on returning the first.
func (j *pmixJob) Put(key string, value []byte) error {
	if err := checkPut(key, value); err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closing {
		return fmt.Errorf("bootstrap: put: %w", errPMIxClosed)
	}
	if j.sent[key] {
		return fmt.Errorf("bootstrap: pmix: put %q: published at an earlier fence; under a PMIx launcher a key is published once", key)
	}
	ck := C.CString(pmixKey(key))
	defer C.free(unsafe.Pointer(ck))
	var p unsafe.Pointer
	if len(value) > 0 {
		p = unsafe.Pointer(&value[0])
	}
	if err := pmixCallErr("PMIx_Put", C.md_put(ck, p, C.size_t(len(value)))); err != nil {
		return fmt.Errorf("%w (key %q)", err, key)
	}
	j.puts = append(j.puts, key)
	return nil
}

// Fence commits this rank's puts and joins the barrier of the whole
// namespace, collecting every rank's puts. As with the other backends, a
// Fence whose ctx ended stays under way, and the next Fence call waits for
// that same barrier.
func (j *pmixJob) Fence(ctx context.Context) error {
	j.mu.Lock()
	if j.closing {
		aborting := j.aborted
		j.mu.Unlock()
		return j.closedErr(ctx, aborting, "bootstrap: fence")
	}
	f := j.fence
	if f == nil {
		if err := ctx.Err(); err != nil {
			j.mu.Unlock()
			return fmt.Errorf("bootstrap: fence: %w", err)
		}
		if err := pmixCallErr("PMIx_Commit", C.PMIx_Commit()); err != nil {
			j.mu.Unlock()
			return err
		}
		for _, k := range j.puts {
			j.sent[k] = true
		}
		j.puts = nil
		f = &pmixFence{done: make(chan struct{})}
		id := fences.add(f)
		switch rc := C.md_fence(C.uintptr_t(id)); rc {
		case pmixSuccess:
			// The callback completes f.
		case pmixDone:
			// Completed at once, without a callback.
			fences.complete(id, pmixSuccess)
		default:
			fences.drop(id)
			j.mu.Unlock()
			return pmixCallErr("PMIx_Fence", rc)
		}
		j.fence = f
	}
	j.mu.Unlock()
	select {
	case <-f.done:
	case <-ctx.Done():
		return fmt.Errorf("bootstrap: fence: %w", ctx.Err())
	case <-j.dead:
		return fmt.Errorf("bootstrap: fence: %w", errPMIxClosed)
	}
	j.mu.Lock()
	if j.fence == f {
		j.fence = nil
	}
	j.mu.Unlock()
	return pmixCallErr("PMIx_Fence", C.pmix_status_t(f.status))
}

// Get reads what rank put under key before the last Fence. It asks only
// this process's server, which holds every rank's puts after a Fence, so
// it does not wait for other ranks; when ctx ends first, Get returns ctx's
// error and the PMIx_Get finishes on its own goroutine, which Close waits
// for.
func (j *pmixJob) Get(ctx context.Context, rank int, key string) ([]byte, error) {
	if rank < 0 || rank >= j.size {
		return nil, fmt.Errorf("bootstrap: get %q: rank %d not in [0, %d)", key, rank, j.size)
	}
	if key == "" || len(key) > maxKey {
		return nil, fmt.Errorf("bootstrap: get: key of %d bytes, want 1 to %d", len(key), maxKey)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("bootstrap: get %q of rank %d: %w", key, rank, err)
	}
	j.mu.Lock()
	if j.closing {
		aborting := j.aborted
		j.mu.Unlock()
		return nil, j.closedErr(ctx, aborting, fmt.Sprintf("bootstrap: get %q of rank %d", key, rank))
	}
	type result struct {
		v   []byte
		err error
	}
	res := make(chan result, 1)
	j.gets.Add(1)
	j.mu.Unlock()
	go func() {
		defer j.gets.Done()
		v, err := j.get(rank, key)
		res <- result{v, err}
	}()
	select {
	case r := <-res:
		if r.err != nil {
			return nil, fmt.Errorf("%w (get %q of rank %d)", r.err, key, rank)
		}
		return r.v, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("bootstrap: get %q of rank %d: %w", key, rank, ctx.Err())
	}
}

// get is the PMIx_Get of Get.
func (j *pmixJob) get(rank int, key string) ([]byte, error) {
	cns := C.CString(j.nspace)
	defer C.free(unsafe.Pointer(cns))
	ck := C.CString(pmixKey(key))
	defer C.free(unsafe.Pointer(ck))
	var out *C.char
	var n C.size_t
	if err := pmixCallErr("PMIx_Get", C.md_get(cns, C.uint32_t(rank), ck, &out, &n)); err != nil {
		return nil, err
	}
	if out == nil {
		return []byte{}, nil
	}
	defer C.free(unsafe.Pointer(out))
	return C.GoBytes(unsafe.Pointer(out), C.int(n)), nil
}

// Abort logs the reason (servers do not all print PMIx_Abort's message),
// then asks the server to end the job, and once PMIx_Abort has returned
// ends this process with code, as Open MPI's own MPI_Abort does: it does
// not return then. It returns PMIx_Abort's error, with the job left to
// the caller; after Close, an error wrapping ErrClosed; while another
// Abort runs, it waits for that one.
//
// From its call on, new calls fail with ErrClosed; a Fence or Get,
// whether already waiting or called after Abort began, does not return
// before PMIx_Abort has (or its ctx ended), so that a caller whose Fence
// fails cannot end the process before the abort has reached the server.
// Put, which takes no ctx, fails at once.
func (j *pmixJob) Abort(code int, reason string) error {
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	j.logger.Error("aborting the job", "code", code, "reason", reason)
	if !j.refuse(true) {
		// The first Abort ends the process when PMIx_Abort returns, and
		// releases dead only when it failed.
		var done <-chan struct{}
		j.mu.Lock()
		if j.aborted {
			done = j.dead
		}
		j.mu.Unlock()
		failed := fmt.Errorf("bootstrap: pmix: abort: an Abort before this one failed: %w", errPMIxClosed)
		return lateFinish(opAbort, done, &failed)
	}
	// Servers kill the job as soon as they read the abort, sometimes
	// before forwarding what the rank wrote just before; give the reason
	// logged above a moment to get out.
	time.Sleep(abortGrace)
	msg := C.CString(strings.ToValidUTF8(reason, "?"))
	defer C.free(unsafe.Pointer(msg))
	code = exitCode(code)
	// Open MPI 4.1's mpirun ends the job only once the aborting rank has
	// exited, and its PMIx_Abort now and then never returns.
	backstop := time.AfterFunc(abortExit, func() { os.Exit(code) })
	err := pmixCallErr("PMIx_Abort", C.md_abort(C.int(code), msg))
	if err == nil {
		// Waiting to be killed instead deadlocks Open MPI 4.1's mpirun
		// in PMIx_server_finalize once the job has ended, when the other
		// ranks wait in a Fence: 13 of 70 launches of a C client of
		// libpmix alone hung so, and none of 70 that exit here. Other
		// launchers end the job on the abort, not on this exit.
		os.Exit(code)
	}
	backstop.Stop()
	j.release()
	return err
}

// abortExit is how long a rank waits in PMIx_Abort before it exits
// itself.
const abortExit = time.Second

// Close finalizes with the server. It is idempotent, and does nothing
// after Abort, but during one returns only once PMIx_Abort has (which
// usually ends the process first), as a Fence or Get does: a program
// that exits once Close returned must not end the job with its own
// status before the abort reached the server. A Fence still under way is
// abandoned: its waiters return ErrClosed.
func (j *pmixJob) Close() error {
	if !j.refuse(false) {
		j.mu.Lock()
		aborting := j.aborted
		j.mu.Unlock()
		if aborting {
			<-j.dead
		}
		return nil
	}
	j.release()
	// PMIx_Finalize must not run under a PMIx_Get of this job.
	j.gets.Wait()
	err := pmixCallErr("PMIx_Finalize", C.md_finalize())
	pmixClient.closed(j)
	return err
}

// refuse marks the job closing, so that new calls fail; it reports false
// if the job was already closing.
func (j *pmixJob) refuse(abort bool) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closing {
		return false
	}
	j.closing, j.aborted = true, abort
	return true
}

// release lets the waiters go and drops the fence under way.
func (j *pmixJob) release() {
	j.mu.Lock()
	defer j.mu.Unlock()
	close(j.dead)
	if j.fence != nil {
		fences.forget(j.fence)
		j.fence = nil
	}
}

// closedErr is the error of a Fence or Get (what names it) called once
// the job was closing. When it is aborting, closedErr first waits until
// PMIx_Abort has returned (or ctx ends): a caller that ends the process
// on a failed call must not beat the abort to the server, which would then
// end the job with the process's own status. Abort's grace alone keeps
// PMIx_Abort 200 ms away.
func (j *pmixJob) closedErr(ctx context.Context, aborting bool, what string) error {
	if aborting {
		select {
		case <-j.dead:
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (aborting, and the ctx ended before the abort went out: %w)", what, errPMIxClosed, ctx.Err())
		}
	}
	return fmt.Errorf("%s: %w", what, errPMIxClosed)
}

// errPMIxClosed is what calls on a closed or aborted pmix job return.
var errPMIxClosed = fmt.Errorf("pmix: %w", ErrClosed)

// pmixFence is one PMIx_Fence_nb under way.
type pmixFence struct {
	done   chan struct{} // closed by the callback
	status int
}

// fences maps the ids PMIx_Fence_nb carries to its callback to the fences
// they complete. The callback gets a number, not a Go pointer, which C
// may not keep; a callback for a fence Close dropped finds nothing.
var fences = &fenceTable{m: map[uintptr]*pmixFence{}}

type fenceTable struct {
	mu   sync.Mutex
	next uintptr
	m    map[uintptr]*pmixFence
}

func (t *fenceTable) add(f *pmixFence) uintptr {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	t.m[t.next] = f
	return t.next
}

// complete ends fence id with status; ids not in the table are ignored.
func (t *fenceTable) complete(id uintptr, status int) {
	t.mu.Lock()
	f, ok := t.m[id]
	delete(t.m, id)
	t.mu.Unlock()
	if ok {
		f.status = status
		close(f.done)
	}
}

func (t *fenceTable) drop(id uintptr) {
	t.mu.Lock()
	delete(t.m, id)
	t.mu.Unlock()
}

func (t *fenceTable) forget(f *pmixFence) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, g := range t.m {
		if g == f {
			delete(t.m, id)
		}
	}
}
