/*
 * fakeverbs.c: an in-memory stand-in for libibverbs and librdmacm, for
 * running the verbs provider (and the SDI conformance suite over it) on a
 * machine without RDMA hardware.
 *
 * Build it as one library and let both -libverbs and -lrdmacm find it:
 *
 *	mkdir -p /tmp/fakeverbs
 *	gcc -shared -fPIC -O2 -Wall -Wextra -Wl,-soname,libfakeverbs.so \
 *		-o /tmp/fakeverbs/libfakeverbs.so \
 *		subdevices/verbs/testdata/fakeverbs/fakeverbs.c -lpthread
 *	ln -sf libfakeverbs.so /tmp/fakeverbs/libibverbs.so
 *	ln -sf libfakeverbs.so /tmp/fakeverbs/librdmacm.so
 *	CGO_LDFLAGS=-L/tmp/fakeverbs LD_LIBRARY_PATH=/tmp/fakeverbs \
 *		go test -race -count=3 -tags verbs ./subdevices/verbs/
 *
 * It needs the libibverbs-dev and librdmacm-dev headers (rdma-core 44). The
 * test binary then loads /tmp/fakeverbs/libfakeverbs.so, which the tests
 * recognise in /proc/self/maps: they describe the fake's device to the
 * provider with a sysfs tree in a temporary directory (fakeHost in the
 * tests). A binary linked this way does not run without LD_LIBRARY_PATH.
 *
 * The machine it models: one InfiniBand adapter "fake0", port 1 ACTIVE, the
 * only IP address on the fabric 10.255.0.1 (not loopback, which the
 * provider refuses; no socket is ever opened: addresses are looked up in an
 * in-process table). Every rdma_cm id and queue pair of the process is on
 * it, so ranks in one process reach each other as on one host with one
 * adapter. One lock guards everything; a worker thread plays the wire and
 * the adapter: it carries the connection manager's messages (REQ, REP,
 * RTU, REJ, DREQ, DREP) and executes posted sends and reads, so they
 * complete some time after ibv_post_send returned, as on hardware: a work
 * request executes up to 50 us after it was posted, a CM message arrives
 * up to 250 us after it was sent, at random but in order per QP and per
 * id. FAKEVERBS_JITTER_US=n makes that n us (and 5n for the CM); 0 runs
 * everything as soon as the worker gets to it, large values shake out
 * orderings the default rarely produces.
 *
 * What it models, following rdma-core 44, the kernel's rdma_cm/ib_cm and
 * the IB spec where the provider depends on them:
 *  - librdmacm: event channels whose fd is an eventfd that is readable while
 *    events are queued (so it works in Go's netpoller); rdma_get_cm_event
 *    fails with EAGAIN on a non-blocking fd; ADDR_RESOLVED (or ADDR_ERROR
 *    after the timeout for an address nobody has), ROUTE_RESOLVED,
 *    CONNECT_REQUEST with the private data zero-padded to 56 bytes and
 *    counted against the listener, ESTABLISHED on both sides (the active
 *    side's QP is moved to RTR and RTS inside rdma_get_cm_event, as
 *    librdmacm does), REJECTED with the IB CM reason (8 for a port nobody
 *    listens on, 28 for rdma_reject, 4 for a dialer that gave up),
 *    DISCONNECTED on both sides, TIMEWAIT_EXIT; rdma_accept moves the
 *    passive QP to RTR and RTS; rdma_disconnect moves the QP to ERR before
 *    it sends the DREQ (or answers one); a REJECTED moves the id's QP to
 *    ERR; rdma_destroy_id waits until the id's events are acked, drops its
 *    unread events (and the requests queued on a listener), and rejects or
 *    disconnects what it was connecting or connected to; conn_param depths
 *    and retry counts are negotiated as the CM does (each side's RNR retry
 *    count is the one its peer asked for).
 *  - libibverbs: the context is a struct verbs_context, so the inline
 *    ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq (through
 *    context->ops) and ibv_query_port (through verbs_get_ctx_op) work;
 *    PDs, MRs (lkey and rkey differ; keys of a deregistered MR are never
 *    valid again), CQs, completion channels (eventfd again; an event only
 *    for a completion added after ibv_req_notify_cq; ibv_destroy_cq waits
 *    for the acks), RC QPs with the IB state rules (sends only in RTS;
 *    receives from INIT; ERR flushes every posted request with
 *    IBV_WC_WR_FLUSH_ERR and takes new ones only to flush them), queue
 *    space freed when the completion is polled (as mlx5 does), QP numbers
 *    and freed memory reused as soon as possible, a destroyed QP's
 *    completions purged from its CQs, EBUSY from ibv_dealloc_pd,
 *    ibv_destroy_cq and ibv_destroy_comp_channel while something uses them.
 *    Failed completions carry only wr_id, status and qp_num; the other
 *    fields are garbage on purpose. Asynchronous events: the context's
 *    async_fd is an eventfd (blocking until made non-blocking), readable
 *    while events are queued; ibv_get_async_event fails with EAGAIN on a
 *    non-blocking fd; every event must be acked, ibv_destroy_qp and
 *    ibv_destroy_cq wait for the acks of their object's events read and
 *    drop those not read. The fake raises none by itself.
 *
 * Test-only entry points, which the tests reach through
 * subdevices/verbs/internal/fakectl: fakeverbs_inject_async queues an
 * asynchronous event and does to its QP or CQ what the event says happened
 * (see its comment), fakeverbs_async_counts counts the events queued and
 * not acked, fakeverbs_inject_cm_event queues a connection manager event
 * such as RDMA_CM_EVENT_DEVICE_REMOVAL, and fakeverbs_fail_cm_channel
 * makes rdma_get_cm_event fail for good. rdma_notify is accepted and does
 * nothing.
 *  - The wire: a send needs the peer QP in RTR or RTS and a receive posted
 *    there; with rnr_retry 0 (what the provider asks for) a send that finds
 *    none fails at once with IBV_WC_RNR_RETRY_EXC_ERR and the sender's QP
 *    goes to ERR. A send larger than the receive fails both ends
 *    (IBV_WC_LOC_LEN_ERR, IBV_WC_REM_INV_REQ_ERR). Local keys are checked
 *    when the request executes (valid, same PD, in bounds, local write for
 *    a receive or a read's target): IBV_WC_LOC_PROT_ERR otherwise. RDMA
 *    READ and WRITE check the rkey, the responder's PD, the access flags
 *    and the bounds (IBV_WC_REM_ACCESS_ERR, and the responder's QP goes to
 *    ERR too). A peer QP in ERR, destroyed, or not connected to the sender
 *    drops the packets, so the request fails with IBV_WC_RETRY_EXC_ERR
 *    after (retry_count + 1) ack timeouts of 67 ms. A CQ that overruns
 *    makes ibv_poll_cq fail. An SGE of length 0 is read as 2 GiB, as some
 *    adapters do.
 *
 * Breaches of the rules above that a correct provider never commits (a
 * send without a receive, a receive too small, a bad key or bounds, a zero
 * SGE, a CQ overrun, posting in the wrong QP state or beyond the queue's
 * size, freeing in the wrong order, leaking a QP) are printed to stderr as
 * "fakeverbs: VIOLATION: ..." and appended to the file named by the
 * environment variable FAKEVERBS_LOG, which the tests check.
 *
 * What it does not model: devices other than fake0 and ports other than 1,
 * IPv6, other port spaces than RDMA_PS_TCP and other QP types than RC,
 * shared receive queues, inline data, immediate data, atomics, memory
 * windows, ibv_get_device_list/ibv_open_device, asynchronous events the
 * device raises by itself (only injected ones come), rdma_cm ids without
 * an event channel, rdma_establish, multicast, iWARP or RoCE specifics, packet loss, path MTU (a message is one packet), the limit on
 * RDMA reads in flight (reads execute one at a time), CM timeouts other
 * than address resolution and the DREQ's, and the time things take on
 * hardware. It is what the provider's authors believe the libraries and
 * the kernel do, so tests passing against it show the provider consistent
 * with that belief: run them on real hardware before relying on them.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/eventfd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

/* The header maps these names to inline wrappers; the library defines the
 * real functions behind them. */
#undef ibv_query_port
#undef ibv_reg_mr

#define EXPORT __attribute__((visibility("default")))

/* ---- the adapter ---- */

#define DEV_NAME "fake0"
#define DEV_ADDR "10.255.0.1"
#define DEV_PORT 1
#define MAX_QP_WR 16384
#define MAX_SGE 30
#define MAX_CQE 4194303
#define MAX_RD_ATOM 16
#define MAX_MSG (1u << 30)
#define MAX_QPS 65536
#define QPN_BASE 0x100
#define REQ_PRIVATE 56  /* IB CM REQ private data after the rdma_cm header */
#define REP_PRIVATE 196
#define REJ_PRIVATE 148
#define SGE0_LEN (1ull << 31)

#define MS ((int64_t)1000000)
#define ACK_TIMEOUT (67 * MS) /* 4.096 us << 14 */
#define RNR_DELAY (1 * MS)
#define PEER_POLL (1 * MS)
#define TIMEWAIT (20 * MS)
#define DREQ_TIMEOUT (1000 * MS)
#define US ((int64_t)1000)

enum { M_PD = 0x7d01, M_MR, M_CQ, M_CHAN, M_QP, M_EVCH, M_ID, M_EV };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;  /* callers waiting for events or acks */
static pthread_cond_t wcv; /* the worker */
static int inited;
static struct in_addr dev_addr;
static struct ibv_device dev;
static struct verbs_context vctx;
static uint64_t serials;
static unsigned long nviolations;
/* Latency: a work request executes, and a CM message arrives, a random
 * time up to wr_jitter (cm_jitter) after it was posted (sent), in order per
 * QP (per id). FAKEVERBS_JITTER_US sets wr_jitter; the CM's is 5 times it. */
static int64_t wr_jitter = 50 * US, cm_jitter = 250 * US;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static int64_t jitter(int64_t max) {
	if (max <= 0)
		return 0;
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (int64_t)(rng % (uint64_t)max);
}

static int64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void abstime(int64_t t, struct timespec *ts) {
	ts->tv_sec = t / 1000000000;
	ts->tv_nsec = t % 1000000000;
}

/* violation reports a breach of the rules by the library's user. */
static void violation(const char *fmt, ...) {
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	nviolations++;
	fprintf(stderr, "fakeverbs: VIOLATION: %s\n", buf);
	const char *path = getenv("FAKEVERBS_LOG");
	if (path && *path) {
		FILE *f = fopen(path, "a");
		if (f) {
			fprintf(f, "fakeverbs: VIOLATION: %s\n", buf);
			fclose(f);
		}
	}
}

static int seterr(int e) {
	errno = e;
	return -1;
}

/* ---- objects ---- */

struct fpd {
	struct ibv_pd pd;
	int magic;
	int users; /* MRs and QPs */
};

struct fmr {
	struct ibv_mr mr;
	int magic;
	int access;
	struct fpd *pd;
};

struct fqp;

struct cqe {
	struct ibv_wc wc;
	struct fqp *qp;
	int sq; /* the completion frees a send queue entry, not a receive's */
	int solicited;
};

struct fcq;

struct fchan {
	struct ibv_comp_channel ch;
	int magic;
	struct fcq **ev; /* CQs with an event not yet read */
	int nev, capev;
	int sig; /* the eventfd's counter is not zero */
};

struct fcq {
	struct ibv_cq cq;
	int magic;
	struct fchan *chan;
	struct cqe *q;
	int cap, head, n;
	int armed; /* 0, 1: any completion, 2: solicited only */
	int overrun;
	int dead;             /* an injected IBV_EVENT_CQ_ERR: completions are lost from now on */
	unsigned read, acked; /* events read from the channel and acked */
	unsigned async_read, async_acked; /* its asynchronous events read and acked */
	int users; /* QPs */
	struct fcq *next;
};

struct fwr {
	uint64_t wr_id;
	int op; /* enum ibv_wr_opcode; -1 for a receive */
	int signaled, solicited;
	int nsge;
	struct ibv_sge *sge;
	uint64_t raddr;
	uint32_t rkey;
	int64_t fail_at; /* the peer does not answer: give up then */
	int64_t next_try;
	int rnr_left;
};

struct fq {
	struct fwr *w;
	struct ibv_sge *sg;
	int cap, maxsge;
	int head, n; /* requests not yet executed (or received into) */
	int used;    /* posted and not yet polled */
};

struct fid;

struct fqp {
	struct ibv_qp qp;
	int magic;
	uint64_t serial;
	struct fpd *pd;
	struct fcq *scq, *rcq;
	struct fq sq, rq;
	int sig_all;
	/* the connected peer, from the connection manager */
	struct fqp *remote;
	uint64_t remote_serial;
	int rd_atom, dest_rd_atom, retry_cnt, rnr_retry;
	int64_t last_due; /* of the last send posted: they execute in order */
	struct fid *id;
	unsigned async_read, async_acked; /* its asynchronous events read and acked */
	struct fqp *next;
};

enum {
	CM_IDLE, CM_BOUND, CM_LISTEN, CM_ADDR_QUERY, CM_ADDR_RESOLVED, CM_ROUTE_QUERY, CM_ROUTE_RESOLVED,
	CM_REQ_SENT, CM_REP_RCVD, CM_REQ_RCVD, CM_REP_SENT, CM_ESTABLISHED,
	CM_DREQ_SENT, CM_DREQ_RCVD, CM_TIMEWAIT, CM_DONE,
};

struct fev;

struct fevch {
	struct rdma_event_channel ch;
	int magic;
	struct fev *head, *tail;
	int nids;
	int sig;
	int fail; /* fakeverbs_fail_cm_channel: rdma_get_cm_event fails with this errno */
};

struct fid {
	struct rdma_cm_id id;
	int magic;
	uint64_t serial;
	int state;
	int dying;
	struct fevch *ch;
	struct sockaddr_in src, dst;
	int bound;
	/* the other end of the connection, once known */
	struct fid *peer;
	uint64_t peer_serial;
	int passive;          /* made by a connection request; shares its listener's port */
	int unacked;          /* events read and not acked that count against this id */
	int connect_error, disc_reported;
	/* what this id asked for in rdma_connect or rdma_accept */
	uint8_t resp_res, init_depth, retry, rnr_retry;
	/* what the peer's REQ or REP said */
	uint8_t p_resp_res, p_init_depth, p_retry, p_rnr_retry;
	struct fqp *rqp; /* the peer's QP */
	uint64_t rqp_serial;
	int64_t last_due; /* of the last message sent: they arrive in order */
	struct fid *next;
};

struct fev {
	struct rdma_cm_event ev;
	int magic;
	int internal; /* the REP: processed inside rdma_get_cm_event */
	struct fid *owner;
	uint8_t *priv;
	struct fev *next;
};

enum { MSG_REQ, MSG_REP, MSG_RTU, MSG_REJ, MSG_DREQ, MSG_DREP, T_ADDR, T_ROUTE, T_TIMEWAIT, T_DREQ };

struct msg {
	int kind;
	int64_t due;
	struct fid *from, *to; /* to NULL: the listener at dst (REQ), or whoever's peer from is */
	uint64_t from_serial, to_serial;
	struct sockaddr_in dst;
	int status;
	uint8_t priv[REP_PRIVATE];
	int plen;
	uint8_t resp_res, init_depth, retry, rnr_retry;
	struct fqp *qp;
	uint64_t qp_serial;
	struct msg *next;
};

static struct fid *ids;
static struct fqp *qps;
static struct fcq *cqs;
static struct msg *msgs;
static struct fqp *qpn_table[MAX_QPS];
static struct fmr **mrs;
static uint8_t *mr_gen;
static int nmrs, capmrs;
static uint32_t next_port = 32768;
static uint32_t next_handle = 1;

static void *worker(void *);

static void init_locked(void) {
	if (inited)
		return;
	inited = 1;
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&cv, &ca);
	pthread_cond_init(&wcv, &ca);
	inet_pton(AF_INET, DEV_ADDR, &dev_addr);
	const char *j = getenv("FAKEVERBS_JITTER_US");
	if (j && *j) {
		wr_jitter = atoll(j) * US;
		cm_jitter = 5 * wr_jitter;
	}
	rng ^= (uint64_t)now_ns();
	dev.node_type = IBV_NODE_CA;
	dev.transport_type = IBV_TRANSPORT_IB;
	strcpy(dev.name, DEV_NAME);
	strcpy(dev.dev_name, "uverbs0");
	strcpy(dev.dev_path, "/sys/class/infiniband_verbs/uverbs0");
	strcpy(dev.ibdev_path, "/sys/class/infiniband/" DEV_NAME);
	pthread_t t;
	pthread_create(&t, NULL, worker, NULL);
	pthread_detach(t);
}

static void lock(void) {
	pthread_mutex_lock(&mu);
	init_locked();
}

static void unlock(void) { pthread_mutex_unlock(&mu); }

static void kick(void) { pthread_cond_signal(&wcv); }

/* An eventfd is readable while its counter is not zero: set makes every
 * new event an edge for an edge-triggered poller; clear empties it once
 * nothing is queued. */
static void fd_set_ready(int fd, int *sig) {
	uint64_t one = 1;
	if (write(fd, &one, sizeof one) != sizeof one)
		fprintf(stderr, "fakeverbs: eventfd write: %s\n", strerror(errno));
	*sig = 1;
}

static void fd_clear(int fd, int *sig) {
	uint64_t v;
	if (*sig && read(fd, &v, sizeof v) != sizeof v)
		fprintf(stderr, "fakeverbs: eventfd read: %s\n", strerror(errno));
	*sig = 0;
}

static int nonblocking(int fd) { return (fcntl(fd, F_GETFL) & O_NONBLOCK) != 0; }

/* wait_warn waits on cv, saying once per wait when it takes long: the real
 * libraries wait forever there. */
static void wait_warn(int64_t start, int *warned, const char *what) {
	struct timespec ts;
	abstime(now_ns() + 1000 * MS, &ts);
	pthread_cond_timedwait(&cv, &mu, &ts);
	if (!*warned && now_ns() - start > 1000 * MS) {
		*warned = 1;
		fprintf(stderr, "fakeverbs: %s has waited more than a second (it waits forever, as the real one does)\n", what);
	}
}

/* ---- handle checks ---- */

static struct fpd *PD(struct ibv_pd *p) {
	struct fpd *x = (struct fpd *)p;
	return x && x->magic == M_PD ? x : NULL;
}
static struct fcq *CQ(struct ibv_cq *p) {
	struct fcq *x = (struct fcq *)p;
	return x && x->magic == M_CQ ? x : NULL;
}
static struct fchan *CHAN(struct ibv_comp_channel *p) {
	struct fchan *x = (struct fchan *)p;
	return x && x->magic == M_CHAN ? x : NULL;
}
static struct fqp *QP(struct ibv_qp *p) {
	struct fqp *x = (struct fqp *)p;
	return x && x->magic == M_QP ? x : NULL;
}
static struct fevch *EVCH(struct rdma_event_channel *p) {
	struct fevch *x = (struct fevch *)p;
	return x && x->magic == M_EVCH ? x : NULL;
}
static struct fid *ID(struct rdma_cm_id *p) {
	struct fid *x = (struct fid *)p;
	return x && x->magic == M_ID && !x->dying ? x : NULL;
}

static struct fid *live_id(struct fid *p, uint64_t serial) {
	for (struct fid *x = ids; x; x = x->next)
		if (x == p && x->serial == serial && !x->dying)
			return x;
	return NULL;
}

static struct fqp *live_qp(struct fqp *p, uint64_t serial) {
	for (struct fqp *x = qps; x; x = x->next)
		if (x == p && x->serial == serial)
			return x;
	return NULL;
}

/* ---- completion queues ---- */

static void chan_event(struct fcq *cq) {
	struct fchan *ch = cq->chan;
	if (!ch)
		return;
	if (ch->nev == ch->capev) {
		ch->capev = ch->capev ? 2 * ch->capev : 16;
		ch->ev = realloc(ch->ev, ch->capev * sizeof *ch->ev);
	}
	ch->ev[ch->nev++] = cq;
	fd_set_ready(ch->ch.fd, &ch->sig);
	pthread_cond_broadcast(&cv);
}

static struct fq *queue_of(struct fqp *qp, int sq) { return sq ? &qp->sq : &qp->rq; }

static void cq_push(struct fcq *cq, struct fqp *qp, int sq, struct ibv_wc *wc, int solicited) {
	if (cq->dead) {
		queue_of(qp, sq)->used--;
		return;
	}
	if (cq->n == cq->cap) {
		if (!cq->overrun)
			violation("CQ of %d entries overran: completions lost (the CQ is in error from now on)", cq->cap);
		cq->overrun = 1;
		queue_of(qp, sq)->used--;
		return;
	}
	struct cqe *e = &cq->q[(cq->head + cq->n) % cq->cap];
	e->wc = *wc;
	e->qp = qp;
	e->sq = sq;
	e->solicited = solicited;
	cq->n++;
	if (cq->armed == 1 || (cq->armed == 2 && (solicited || wc->status != IBV_WC_SUCCESS))) {
		cq->armed = 0;
		chan_event(cq);
	}
}

/* complete puts a completion for w into the CQ. A failed completion has
 * only wr_id, status and qp_num right; the rest is garbage. */
static void complete(struct fqp *qp, int sq, struct fwr *w, enum ibv_wc_status st, enum ibv_wc_opcode op, uint32_t len,
		     uint32_t src_qp) {
	struct ibv_wc wc;
	if (st == IBV_WC_SUCCESS) {
		memset(&wc, 0, sizeof wc);
		wc.opcode = op;
		wc.byte_len = len;
		wc.src_qp = src_qp;
	} else {
		memset(&wc, 0xa5, sizeof wc);
		wc.vendor_err = 0x42;
	}
	wc.wr_id = w->wr_id;
	wc.status = st;
	wc.qp_num = qp->qp.qp_num;
	if (sq && st == IBV_WC_SUCCESS && !w->signaled) {
		qp->sq.used--;
		return;
	}
	cq_push(sq ? qp->scq : qp->rcq, qp, sq, &wc, w->solicited);
}

/* purge removes a QP's completions from a CQ, as destroying or resetting
 * the QP does on mlx5. */
static void purge(struct fcq *cq, struct fqp *qp) {
	int k = 0;
	for (int i = 0; i < cq->n; i++) {
		struct cqe e = cq->q[(cq->head + i) % cq->cap];
		if (e.qp == qp)
			continue;
		cq->q[(cq->head + k) % cq->cap] = e;
		k++;
	}
	cq->n = k;
}

/* ---- queue pairs ---- */

static struct fwr *q_head(struct fq *q) { return &q->w[q->head]; }

static void q_pop(struct fq *q) {
	q->head = (q->head + 1) % q->cap;
	q->n--;
}

/* qp_error moves the QP to ERR: everything posted and not executed
 * completes flushed. */
static void qp_error(struct fqp *qp) {
	qp->qp.state = IBV_QPS_ERR;
	while (qp->sq.n > 0) {
		complete(qp, 1, q_head(&qp->sq), IBV_WC_WR_FLUSH_ERR, 0, 0, 0);
		/* a flushed request completes even unsignaled */
		q_pop(&qp->sq);
	}
	while (qp->rq.n > 0) {
		complete(qp, 0, q_head(&qp->rq), IBV_WC_WR_FLUSH_ERR, 0, 0, 0);
		q_pop(&qp->rq);
	}
}

static const char *qps_name(int s) {
	static const char *n[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
	return s >= 0 && s <= IBV_QPS_ERR ? n[s] : "UNKNOWN";
}

/* qp_modify applies a state change, as the kernel checks it. */
static int qp_modify(struct fqp *qp, enum ibv_qp_state to) {
	int from = qp->qp.state;
	int ok = to == IBV_QPS_ERR || to == IBV_QPS_RESET || (from == IBV_QPS_RESET && to == IBV_QPS_INIT) ||
		 (from == IBV_QPS_INIT && (to == IBV_QPS_INIT || to == IBV_QPS_RTR)) ||
		 (from == IBV_QPS_RTR && to == IBV_QPS_RTS) || (from == IBV_QPS_RTS && to == IBV_QPS_RTS);
	if (!ok)
		return EINVAL;
	switch (to) {
	case IBV_QPS_ERR:
		qp_error(qp);
		break;
	case IBV_QPS_RESET:
		qp->sq.head = qp->sq.n = qp->sq.used = 0;
		qp->rq.head = qp->rq.n = qp->rq.used = 0;
		purge(qp->scq, qp);
		purge(qp->rcq, qp);
		qp->remote = NULL;
		qp->qp.state = IBV_QPS_RESET;
		break;
	default:
		qp->qp.state = to;
	}
	return 0;
}

static int q_init(struct fq *q, uint32_t cap, uint32_t maxsge) {
	q->cap = cap ? cap : 1;
	q->maxsge = maxsge ? maxsge : 1;
	q->w = calloc(q->cap, sizeof *q->w);
	q->sg = calloc((size_t)q->cap * q->maxsge, sizeof *q->sg);
	for (int i = 0; i < q->cap; i++)
		q->w[i].sge = q->sg + (size_t)i * q->maxsge;
	return q->w && q->sg ? 0 : ENOMEM;
}

static void q_free(struct fq *q) {
	free(q->w);
	free(q->sg);
}

/* ---- memory regions ---- */

static struct fmr *mr_by_key(uint32_t key, int remote) {
	uint32_t idx = (key & 0x7fffffff) >> 8;
	if ((int)idx >= nmrs || !mrs[idx])
		return NULL;
	struct fmr *m = mrs[idx];
	return (remote ? m->mr.rkey : m->mr.lkey) == key ? m : NULL;
}

/* sge_len is what an adapter makes of an SGE's length. */
static uint64_t sge_len(const struct ibv_sge *s) { return s->length ? s->length : SGE0_LEN; }

/* check_local checks a request's SGEs against the QP's PD; write: the
 * adapter writes into them. */
static int check_local(struct fqp *qp, struct fwr *w, int write, uint64_t *total, const char *what) {
	*total = 0;
	for (int i = 0; i < w->nsge; i++) {
		struct ibv_sge *s = &w->sge[i];
		struct fmr *m = mr_by_key(s->lkey, 0);
		uint64_t len = sge_len(s), base = m ? (uint64_t)(uintptr_t)m->mr.addr : 0;
		if (!m || m->pd != qp->pd || s->addr < base || s->addr + len > base + m->mr.length ||
		    (write && !(m->access & IBV_ACCESS_LOCAL_WRITE))) {
			violation("%s on QP %#x (wr_id %#llx): local protection error: SGE [%#llx, +%llu) lkey %#x %s", what,
				  qp->qp.qp_num, (unsigned long long)w->wr_id, (unsigned long long)s->addr,
				  (unsigned long long)len, s->lkey,
				  !m ? "is no registered MR (deregistered already?)"
				  : m->pd != qp->pd ? "is an MR of another PD"
				  : write && !(m->access & IBV_ACCESS_LOCAL_WRITE) ? "lacks IBV_ACCESS_LOCAL_WRITE"
										  : "is outside its MR");
			return -1;
		}
		*total += len;
	}
	return 0;
}

/* copy_sges moves n bytes between two SGE lists. */
static void copy_sges(struct ibv_sge *dst, int nd, struct ibv_sge *src, int ns, uint64_t n) {
	int di = 0, si = 0;
	uint64_t doff = 0, soff = 0;
	while (n > 0 && di < nd && si < ns) {
		uint64_t k = sge_len(&dst[di]) - doff;
		if (sge_len(&src[si]) - soff < k)
			k = sge_len(&src[si]) - soff;
		if (n < k)
			k = n;
		memmove((void *)(uintptr_t)(dst[di].addr + doff), (void *)(uintptr_t)(src[si].addr + soff), k);
		n -= k;
		doff += k;
		soff += k;
		if (doff == sge_len(&dst[di])) {
			di++;
			doff = 0;
		}
		if (soff == sge_len(&src[si])) {
			si++;
			soff = 0;
		}
	}
}

/* ---- the wire: executing send queues ---- */

enum { DONE, WAIT };

/* peer_of finds the QP a request goes to, if it would answer: alive,
 * connected back to qp, and able to receive. */
static struct fqp *peer_of(struct fqp *qp) {
	struct fqp *r = qp->remote ? live_qp(qp->remote, qp->remote_serial) : NULL;
	if (!r || r->remote != qp || r->remote_serial != qp->serial)
		return NULL;
	if (r->qp.state != IBV_QPS_RTR && r->qp.state != IBV_QPS_RTS && r->qp.state != IBV_QPS_SQD)
		return NULL;
	return r;
}

static int fail_wr(struct fqp *qp, struct fwr *w, enum ibv_wc_status st) {
	complete(qp, 1, w, st, 0, 0, 0);
	q_pop(&qp->sq);
	qp_error(qp);
	return DONE;
}

static int exec_wr(struct fqp *qp, struct fwr *w, int64_t now) {
	uint64_t total;
	int isread = w->op == IBV_WR_RDMA_READ;
	if (check_local(qp, w, isread, &total, isread ? "RDMA read" : w->op == IBV_WR_SEND ? "send" : "RDMA write"))
		return fail_wr(qp, w, IBV_WC_LOC_PROT_ERR);
	if (total > MAX_MSG) {
		violation("QP %#x: a message of %llu bytes exceeds the port's max_msg_sz %u", qp->qp.qp_num,
			  (unsigned long long)total, MAX_MSG);
		return fail_wr(qp, w, IBV_WC_LOC_LEN_ERR);
	}
	struct fqp *r = peer_of(qp);
	if (!r) {
		/* the packets are dropped; the requester retries, then gives up */
		if (!w->fail_at)
			w->fail_at = now + (int64_t)(qp->retry_cnt + 1) * ACK_TIMEOUT;
		if (now >= w->fail_at)
			return fail_wr(qp, w, IBV_WC_RETRY_EXC_ERR);
		w->next_try = now + PEER_POLL < w->fail_at ? now + PEER_POLL : w->fail_at;
		return WAIT;
	}
	w->fail_at = 0;
	if (w->op == IBV_WR_SEND) {
		if (r->rq.n == 0) {
			if (qp->rnr_retry == 7 || w->rnr_left > 0) {
				if (qp->rnr_retry != 7)
					w->rnr_left--;
				w->next_try = now + RNR_DELAY;
				return WAIT;
			}
			violation("send of %llu bytes from QP %#x: no receive posted at QP %#x (RNR, rnr_retry %d): the sender's QP goes to error",
				  (unsigned long long)total, qp->qp.qp_num, r->qp.qp_num, qp->rnr_retry);
			return fail_wr(qp, w, IBV_WC_RNR_RETRY_EXC_ERR);
		}
		struct fwr *rw = q_head(&r->rq);
		uint64_t room;
		if (check_local(r, rw, 1, &room, "receive")) {
			complete(r, 0, rw, IBV_WC_LOC_PROT_ERR, 0, 0, 0);
			q_pop(&r->rq);
			qp_error(r);
			return fail_wr(qp, w, IBV_WC_REM_OP_ERR);
		}
		if (total > room) {
			violation("send of %llu bytes from QP %#x into a receive of %llu bytes at QP %#x: both QPs go to error",
				  (unsigned long long)total, qp->qp.qp_num, (unsigned long long)room, r->qp.qp_num);
			complete(r, 0, rw, IBV_WC_LOC_LEN_ERR, 0, 0, 0);
			q_pop(&r->rq);
			qp_error(r);
			return fail_wr(qp, w, IBV_WC_REM_INV_REQ_ERR);
		}
		copy_sges(rw->sge, rw->nsge, w->sge, w->nsge, total);
		rw->solicited = w->solicited;
		complete(r, 0, rw, IBV_WC_SUCCESS, IBV_WC_RECV, (uint32_t)total, qp->qp.qp_num);
		q_pop(&r->rq);
		complete(qp, 1, w, IBV_WC_SUCCESS, IBV_WC_SEND, (uint32_t)total, 0);
		q_pop(&qp->sq);
		return DONE;
	}
	/* RDMA READ or WRITE */
	if (isread && qp->rd_atom == 0) {
		violation("RDMA read on QP %#x, whose connection allows no reads (initiator depth 0)", qp->qp.qp_num);
		return fail_wr(qp, w, IBV_WC_REM_INV_REQ_ERR);
	}
	int need = isread ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
	struct fmr *m = mr_by_key(w->rkey, 1);
	uint64_t base = m ? (uint64_t)(uintptr_t)m->mr.addr : 0;
	if (!m || m->pd != r->pd || !(m->access & need) || w->raddr < base || w->raddr + total > base + m->mr.length) {
		violation("RDMA %s of %llu bytes at %#llx rkey %#x from QP %#x: remote access error (%s): both QPs go to error",
			  isread ? "read" : "write", (unsigned long long)total, (unsigned long long)w->raddr, w->rkey,
			  qp->qp.qp_num,
			  !m ? "no MR has that rkey (deregistered already?)"
			  : m->pd != r->pd ? "the MR is not in the responder's PD"
			  : !(m->access & need) ? "the MR lacks the remote access flag"
						: "outside the MR");
		qp_error(r);
		return fail_wr(qp, w, IBV_WC_REM_ACCESS_ERR);
	}
	struct ibv_sge rs = {.addr = w->raddr, .length = (uint32_t)total, .lkey = 0};
	if (total == 0) {
		/* nothing moves */
	} else if (isread) {
		copy_sges(w->sge, w->nsge, &rs, 1, total);
	} else {
		copy_sges(&rs, 1, w->sge, w->nsge, total);
	}
	complete(qp, 1, w, IBV_WC_SUCCESS, isread ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE, (uint32_t)total, 0);
	q_pop(&qp->sq);
	return DONE;
}

static void run_qp(struct fqp *qp, int64_t now, int64_t *next) {
	while (qp->sq.n > 0 && (qp->qp.state == IBV_QPS_RTS || qp->qp.state == IBV_QPS_SQD)) {
		struct fwr *w = q_head(&qp->sq);
		if (w->next_try > now || exec_wr(qp, w, now) == WAIT) {
			if (w->next_try < *next)
				*next = w->next_try;
			return;
		}
	}
}

/* ---- the connection manager ---- */

static void post_ev(struct fid *id, int type, int status, struct fid *listen, struct fid *owner, const uint8_t *priv,
		    int plen, int internal) {
	struct fev *e = calloc(1, sizeof *e);
	struct fevch *ch = id->ch;
	e->magic = M_EV;
	e->ev.id = &id->id;
	e->ev.listen_id = listen ? &listen->id : NULL;
	e->ev.event = type;
	e->ev.status = status;
	e->owner = owner ? owner : id;
	e->internal = internal;
	if (plen > 0) {
		e->priv = calloc(1, plen);
		if (priv)
			memcpy(e->priv, priv, plen);
		e->ev.param.conn.private_data = e->priv;
		e->ev.param.conn.private_data_len = plen;
	}
	if (ch->tail)
		ch->tail->next = e;
	else
		ch->head = e;
	ch->tail = e;
	fd_set_ready(ch->ch.fd, &ch->sig);
	pthread_cond_broadcast(&cv);
}

/* send_msg queues a message from a live id (or none) to the id (to,
 * to_serial), which may be gone by the time it arrives. */
static struct msg *send_msg(int kind, struct fid *from, struct fid *to, uint64_t to_serial, int64_t delay) {
	struct msg *m = calloc(1, sizeof *m);
	m->kind = kind;
	m->due = now_ns() + delay + jitter(cm_jitter);
	if (from && kind <= MSG_DREP) {
		if (m->due < from->last_due)
			m->due = from->last_due;
		from->last_due = m->due;
	}
	m->from = from;
	m->from_serial = from ? from->serial : 0;
	m->to = to;
	m->to_serial = to_serial;
	if (from && (kind == MSG_REQ || kind == MSG_REP)) {
		m->resp_res = from->resp_res;
		m->init_depth = from->init_depth;
		m->retry = from->retry;
		m->rnr_retry = from->rnr_retry;
		m->dst = from->dst;
		struct fqp *q = from->id.qp ? QP(from->id.qp) : NULL;
		m->qp = q;
		m->qp_serial = q ? q->serial : 0;
	}
	struct msg **pp = &msgs;
	while (*pp && (*pp)->due <= m->due)
		pp = &(*pp)->next;
	m->next = *pp;
	*pp = m;
	kick();
	return m;
}

static void set_priv(struct msg *m, const void *priv, int len) {
	m->plen = len;
	if (priv && len)
		memcpy(m->priv, priv, len);
}

/* to_peer addresses a message to the other end of id's connection. */
static struct msg *to_peer(int kind, struct fid *id, int status) {
	struct msg *m = send_msg(kind, id, id->peer, id->peer_serial, 0);
	m->status = status;
	return m;
}

static void enter_timewait(struct fid *id) {
	id->state = CM_TIMEWAIT;
	send_msg(T_TIMEWAIT, id, id, id->serial, TIMEWAIT);
}

static void report_disconnect(struct fid *id, int status) {
	if (id->disc_reported)
		return;
	id->disc_reported = 1;
	post_ev(id, RDMA_CM_EVENT_DISCONNECTED, status, NULL, NULL, NULL, 0, 0);
}

static struct fid *listener_at(struct sockaddr_in *a) {
	for (struct fid *x = ids; x; x = x->next)
		if (!x->dying && x->state == CM_LISTEN && x->src.sin_port == a->sin_port &&
		    (x->src.sin_addr.s_addr == INADDR_ANY || x->src.sin_addr.s_addr == a->sin_addr.s_addr))
			return x;
	return NULL;
}

static uint8_t clamp_depth(uint8_t v) { return v > MAX_RD_ATOM ? MAX_RD_ATOM : v; }

static struct fid *new_id(struct fevch *ch, void *ctx, enum rdma_port_space ps) {
	struct fid *x = calloc(1, sizeof *x);
	x->magic = M_ID;
	x->serial = ++serials;
	x->ch = ch;
	x->id.channel = &ch->ch;
	x->id.context = ctx;
	x->id.ps = ps;
	x->id.qp_type = IBV_QPT_RC;
	x->next = ids;
	ids = x;
	ch->nids++;
	return x;
}

static void handle_req(struct msg *m) {
	struct fid *a = live_id(m->from, m->from_serial);
	if (!a || a->state != CM_REQ_SENT)
		return;
	struct fid *l = listener_at(&m->dst);
	if (!l) {
		/* the remote CM knows no such service: IB_CM_REJ_INVALID_SERVICE_ID */
		send_msg(MSG_REJ, NULL, a, a->serial, 0)->status = 8;
		return;
	}
	struct fid *c = new_id(l->ch, l->id.context, l->id.ps);
	c->state = CM_REQ_RCVD;
	c->passive = 1;
	c->peer = a;
	c->peer_serial = a->serial;
	c->src = m->dst;
	c->dst = a->src;
	c->bound = 1;
	c->id.verbs = &vctx.context;
	c->id.port_num = DEV_PORT;
	c->id.route.addr.src_sin = c->src;
	c->id.route.addr.dst_sin = c->dst;
	c->p_resp_res = m->resp_res;
	c->p_init_depth = m->init_depth;
	c->p_retry = m->retry;
	c->p_rnr_retry = m->rnr_retry;
	c->rqp = m->qp;
	c->rqp_serial = m->qp_serial;
	/* on IB the passive side sees all 56 bytes of the REQ's private data */
	uint8_t priv[REQ_PRIVATE];
	memset(priv, 0, sizeof priv);
	memcpy(priv, m->priv, m->plen);
	post_ev(c, RDMA_CM_EVENT_CONNECT_REQUEST, 0, l, l, priv, REQ_PRIVATE, 0);
	struct fev *e = c->ch->tail;
	e->ev.param.conn.responder_resources = clamp_depth(m->init_depth);
	e->ev.param.conn.initiator_depth = clamp_depth(m->resp_res);
	e->ev.param.conn.retry_count = m->retry;
	e->ev.param.conn.rnr_retry_count = m->rnr_retry;
	e->ev.param.conn.qp_num = m->qp ? m->qp->qp.qp_num : 0;
}

static void handle_msg(struct msg *m) {
	if (m->kind == MSG_REQ) {
		handle_req(m);
		return;
	}
	struct fid *to = NULL;
	if (m->to) {
		to = live_id(m->to, m->to_serial);
	} else if (m->from) {
		/* the sender does not know the other end's id: the one whose
		 * peer it is */
		for (struct fid *x = ids; x; x = x->next)
			if (!x->dying && x->peer == m->from && x->peer_serial == m->from_serial)
				to = x;
	}
	switch (m->kind) {
	case T_ADDR:
		if (!to || to->state != CM_ADDR_QUERY)
			return;
		if (m->status) {
			to->state = CM_BOUND;
			post_ev(to, RDMA_CM_EVENT_ADDR_ERROR, m->status, NULL, NULL, NULL, 0, 0);
		} else {
			to->state = CM_ADDR_RESOLVED;
			post_ev(to, RDMA_CM_EVENT_ADDR_RESOLVED, 0, NULL, NULL, NULL, 0, 0);
		}
		return;
	case T_ROUTE:
		if (to && to->state == CM_ROUTE_QUERY) {
			to->state = CM_ROUTE_RESOLVED;
			post_ev(to, RDMA_CM_EVENT_ROUTE_RESOLVED, 0, NULL, NULL, NULL, 0, 0);
		}
		return;
	case T_TIMEWAIT:
		if (to && to->state == CM_TIMEWAIT) {
			to->state = CM_DONE;
			post_ev(to, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0, NULL, NULL, NULL, 0, 0);
		}
		return;
	case T_DREQ:
		if (to && to->state == CM_DREQ_SENT) {
			enter_timewait(to);
			report_disconnect(to, -ETIMEDOUT);
		}
		return;
	case MSG_REP:
		if (!to || to->state != CM_REQ_SENT)
			return;
		to->state = CM_REP_RCVD;
		to->peer = m->from;
		to->peer_serial = m->from_serial;
		to->p_resp_res = m->resp_res;
		to->p_init_depth = m->init_depth;
		to->p_rnr_retry = m->rnr_retry;
		to->rqp = m->qp;
		to->rqp_serial = m->qp_serial;
		{
			uint8_t priv[REP_PRIVATE];
			memset(priv, 0, sizeof priv);
			memcpy(priv, m->priv, m->plen);
			post_ev(to, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, NULL, NULL, priv, REP_PRIVATE, 1);
		}
		return;
	case MSG_RTU:
		if (to && to->state == CM_REP_SENT) {
			to->state = CM_ESTABLISHED;
			post_ev(to, RDMA_CM_EVENT_ESTABLISHED, 0, NULL, NULL, NULL, 0, 0);
		}
		return;
	case MSG_REJ:
		if (to && (to->state == CM_REQ_SENT || to->state == CM_REP_RCVD || to->state == CM_REQ_RCVD ||
			   to->state == CM_REP_SENT)) {
			uint8_t priv[REJ_PRIVATE];
			memset(priv, 0, sizeof priv);
			memcpy(priv, m->priv, m->plen < REJ_PRIVATE ? m->plen : REJ_PRIVATE);
			to->state = CM_DONE;
			post_ev(to, RDMA_CM_EVENT_REJECTED, m->status, NULL, NULL, priv, REJ_PRIVATE, 0);
		}
		return;
	case MSG_DREQ:
		if (!to) {
			/* the remote CM answers a DREQ for an id it no longer has */
			struct fid *from = live_id(m->from, m->from_serial);
			if (from)
				send_msg(MSG_DREP, NULL, from, from->serial, 0);
			return;
		}
		if (to->state == CM_ESTABLISHED || to->state == CM_REP_SENT || to->state == CM_DREQ_SENT) {
			to->state = CM_DREQ_RCVD;
			report_disconnect(to, 0);
		}
		return;
	case MSG_DREP:
		if (to && to->state == CM_DREQ_SENT) {
			enter_timewait(to);
			report_disconnect(to, 0);
		}
		return;
	}
}

static void *worker(void *arg) {
	(void)arg;
	pthread_mutex_lock(&mu);
	for (;;) {
		int64_t now = now_ns(), next = INT64_MAX;
		while (msgs && msgs->due <= now) {
			struct msg *m = msgs;
			msgs = m->next;
			handle_msg(m);
			free(m);
		}
		for (struct fqp *qp = qps; qp; qp = qp->next)
			run_qp(qp, now, &next);
		if (msgs && msgs->due < next)
			next = msgs->due;
		if (next <= now_ns())
			continue;
		if (next == INT64_MAX) {
			pthread_cond_wait(&wcv, &mu);
		} else {
			struct timespec ts;
			abstime(next, &ts);
			pthread_cond_timedwait(&wcv, &mu, &ts);
		}
	}
	return NULL;
}

/* ======================== libibverbs ======================== */

static int fake_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a, size_t len);
static int fake_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int fake_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
static int fake_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
static int fake_req_notify_cq(struct ibv_cq *cq, int solicited);

/* the context librdmacm opens on the device, made once */
static struct ibv_context *context_locked(void) {
	if (vctx.context.device)
		return &vctx.context;
	vctx.sz = sizeof vctx;
	vctx.query_port = fake_query_port;
	vctx.context.device = &dev;
	vctx.context.ops.post_send = fake_post_send;
	vctx.context.ops.post_recv = fake_post_recv;
	vctx.context.ops.poll_cq = fake_poll_cq;
	vctx.context.ops.req_notify_cq = fake_req_notify_cq;
	vctx.context.cmd_fd = -1;
	/* readable while asynchronous events are queued; blocking, as the
	 * real one is until its user makes it non-blocking */
	vctx.context.async_fd = eventfd(0, EFD_CLOEXEC);
	vctx.context.num_comp_vectors = 1;
	pthread_mutex_init(&vctx.context.mutex, NULL);
	vctx.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
	return &vctx.context;
}

static int is_ctx(struct ibv_context *c) { return c && c == &vctx.context; }

/* ---- asynchronous events ---- */

/* The context's asynchronous events, queued by fakeverbs_inject_async: the
 * async_fd (an eventfd) is readable while one is queued. As in libibverbs,
 * an event read and not yet acked holds up the destruction of its QP or CQ
 * (ibv_destroy_qp and ibv_destroy_cq wait for the acks), and destroying the
 * object drops its events not yet read. */
struct fasync {
	struct ibv_async_event ev;
	struct fasync *next;
};

static struct fasync *aq_head, *aq_tail;
static int aq_sig;
static unsigned ctx_async_read, ctx_async_acked; /* events of no QP or CQ */

static int async_on_qp(int type) {
	switch (type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		return 1;
	}
	return 0;
}

/* drop_async removes the unread events of a QP or CQ being destroyed. */
static void drop_async(void *obj) {
	struct fasync **pp = &aq_head, *last = NULL;
	while (*pp) {
		struct fasync *a = *pp;
		void *el = async_on_qp(a->ev.event_type) ? (void *)a->ev.element.qp
			   : a->ev.event_type == IBV_EVENT_CQ_ERR ? (void *)a->ev.element.cq
								 : NULL;
		if (el != obj) {
			last = a;
			pp = &a->next;
			continue;
		}
		*pp = a->next;
		free(a);
	}
	aq_tail = last;
	if (!aq_head)
		fd_clear(vctx.context.async_fd, &aq_sig);
}

/* wait_async_acks waits, as ibv_destroy_qp and ibv_destroy_cq do, until
 * every event of the object that was read has been acked. */
static void wait_async_acks(unsigned *read, unsigned *acked, const char *what) {
	int64_t start = now_ns();
	int warned = 0;
	while (*acked < *read)
		wait_warn(start, &warned, what);
}

EXPORT int ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *event) {
	lock();
	if (!is_ctx(ctx) || !event) {
		unlock();
		return seterr(EINVAL);
	}
	while (!aq_head) {
		if (nonblocking(ctx->async_fd)) {
			unlock();
			return seterr(EAGAIN);
		}
		pthread_cond_wait(&cv, &mu);
	}
	struct fasync *a = aq_head;
	aq_head = a->next;
	if (!aq_head) {
		aq_tail = NULL;
		fd_clear(ctx->async_fd, &aq_sig);
	}
	*event = a->ev;
	free(a);
	if (async_on_qp(event->event_type))
		QP(event->element.qp)->async_read++;
	else if (event->event_type == IBV_EVENT_CQ_ERR)
		CQ(event->element.cq)->async_read++;
	else
		ctx_async_read++;
	unlock();
	return 0;
}

EXPORT void ibv_ack_async_event(struct ibv_async_event *event) {
	lock();
	unsigned *read = &ctx_async_read, *acked = &ctx_async_acked;
	if (async_on_qp(event->event_type)) {
		struct fqp *q = QP(event->element.qp);
		if (!q) {
			violation("ibv_ack_async_event: %s for a QP that is gone", ibv_event_type_str(event->event_type));
			unlock();
			return;
		}
		read = &q->async_read;
		acked = &q->async_acked;
	} else if (event->event_type == IBV_EVENT_CQ_ERR) {
		struct fcq *c = CQ(event->element.cq);
		if (!c) {
			violation("ibv_ack_async_event: IBV_EVENT_CQ_ERR for a CQ that is gone");
			unlock();
			return;
		}
		read = &c->async_read;
		acked = &c->async_acked;
	}
	if (*acked >= *read)
		violation("ibv_ack_async_event: %s acked more often than it was read", ibv_event_type_str(event->event_type));
	else
		(*acked)++;
	pthread_cond_broadcast(&cv);
	unlock();
}

/* fakeverbs_inject_async queues an asynchronous event on ctx, for tests:
 * element is the QP of a QP event or the CQ of IBV_EVENT_CQ_ERR, port the
 * port of a port event (and of IBV_EVENT_DEVICE_FATAL, as the kernel sets
 * it). What the event says happens to the object: a QP of QP_FATAL,
 * QP_REQ_ERR or QP_ACCESS_ERR goes to ERR without flushing its work, and
 * packets to it are dropped (the flush comes when its user moves it to ERR
 * or destroys it); a CQ of CQ_ERR takes no completion from now on (they are
 * lost, and no completion event comes), though ibv_poll_cq still returns
 * those it held. The device itself keeps working after DEVICE_FATAL and
 * the port after PORT_ERR: the event is what is modeled. Returns 0 or an
 * errno. */
EXPORT int fakeverbs_inject_async(struct ibv_context *ctx, int type, void *element, int port) {
	lock();
	struct ibv_async_event ev;
	memset(&ev, 0, sizeof ev);
	ev.event_type = type;
	if (!is_ctx(ctx)) {
		unlock();
		return EINVAL;
	}
	if (async_on_qp(type)) {
		struct fqp *q = QP(element);
		if (!q) {
			unlock();
			return EINVAL;
		}
		if (type == IBV_EVENT_QP_FATAL || type == IBV_EVENT_QP_REQ_ERR || type == IBV_EVENT_QP_ACCESS_ERR)
			q->qp.state = IBV_QPS_ERR;
		ev.element.qp = &q->qp;
	} else if (type == IBV_EVENT_CQ_ERR) {
		struct fcq *c = CQ(element);
		if (!c) {
			unlock();
			return EINVAL;
		}
		c->dead = 1;
		ev.element.cq = &c->cq;
	} else {
		ev.element.port_num = port;
	}
	struct fasync *a = calloc(1, sizeof *a);
	a->ev = ev;
	if (aq_tail)
		aq_tail->next = a;
	else
		aq_head = a;
	aq_tail = a;
	fd_set_ready(ctx->async_fd, &aq_sig);
	pthread_cond_broadcast(&cv);
	unlock();
	return 0;
}

/* fakeverbs_async_counts reports, for tests, the asynchronous events
 * queued and not read, and those read and not acked. */
EXPORT void fakeverbs_async_counts(struct ibv_context *ctx, int *queued, int *unacked) {
	lock();
	int n = 0;
	for (struct fasync *a = aq_head; a; a = a->next)
		n++;
	unsigned u = ctx_async_read - ctx_async_acked;
	for (struct fqp *q = qps; q; q = q->next)
		u += q->async_read - q->async_acked;
	for (struct fcq *c = cqs; c; c = c->next)
		u += c->async_read - c->async_acked;
	(void)ctx;
	*queued = n;
	*unacked = (int)u;
	unlock();
}

EXPORT const char *ibv_get_device_name(struct ibv_device *d) { return d ? d->name : NULL; }

EXPORT int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *a) {
	if (!is_ctx(ctx))
		return EINVAL;
	memset(a, 0, sizeof *a);
	strcpy(a->fw_ver, "0.0.0 fakeverbs");
	a->node_guid = htobe64(0x0002c90300fa4e00ull);
	a->sys_image_guid = a->node_guid;
	a->max_mr_size = ~0ull;
	a->page_size_cap = 0xfffff000;
	a->vendor_id = 0x02c9;
	a->max_qp = MAX_QPS - QPN_BASE;
	a->max_qp_wr = MAX_QP_WR;
	a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT;
	a->max_sge = MAX_SGE;
	a->max_sge_rd = MAX_SGE;
	a->max_cq = 1 << 16;
	a->max_cqe = MAX_CQE;
	a->max_mr = 1 << 23;
	a->max_pd = 1 << 16;
	a->max_qp_rd_atom = MAX_RD_ATOM;
	a->max_qp_init_rd_atom = MAX_RD_ATOM;
	a->max_res_rd_atom = MAX_RD_ATOM * (MAX_QPS - QPN_BASE);
	a->atomic_cap = IBV_ATOMIC_NONE;
	a->max_pkeys = 128;
	a->phys_port_cnt = 1;
	return 0;
}

static void port_attr(struct ibv_port_attr *a) {
	a->state = IBV_PORT_ACTIVE;
	a->max_mtu = IBV_MTU_4096;
	a->active_mtu = IBV_MTU_4096;
	a->gid_tbl_len = 128;
	a->max_msg_sz = MAX_MSG;
	a->pkey_tbl_len = 128;
	a->lid = 1;
	a->sm_lid = 1;
	a->max_vl_num = 4;
	a->subnet_timeout = 18;
	a->active_width = 2;
	a->active_speed = 32;
	a->phys_state = 5;
	a->link_layer = IBV_LINK_LAYER_INFINIBAND;
}

static int fake_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a, size_t len) {
	if (!is_ctx(ctx) || port != DEV_PORT || len < sizeof *a)
		return EINVAL;
	memset(a, 0, sizeof *a);
	port_attr(a);
	return 0;
}

/* The exported ibv_query_port is what the inline calls for a context
 * without verbs_context ops; it fills the old, shorter struct. */
EXPORT int ibv_query_port(struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *compat) {
	struct ibv_port_attr a;
	if (!is_ctx(ctx) || port != DEV_PORT)
		return EINVAL;
	memset(&a, 0, sizeof a);
	port_attr(&a);
	memcpy(compat, &a, offsetof(struct ibv_port_attr, flags));
	return 0;
}

EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx) {
	if (!is_ctx(ctx)) {
		errno = EINVAL;
		return NULL;
	}
	struct fpd *p = calloc(1, sizeof *p);
	lock();
	p->magic = M_PD;
	p->pd.context = ctx;
	p->pd.handle = next_handle++;
	unlock();
	return &p->pd;
}

EXPORT int ibv_dealloc_pd(struct ibv_pd *pd) {
	lock();
	struct fpd *p = PD(pd);
	if (!p) {
		unlock();
		return EINVAL;
	}
	if (p->users) {
		violation("ibv_dealloc_pd: %d MRs and QPs still use the PD (EBUSY)", p->users);
		unlock();
		return EBUSY;
	}
	p->magic = 0;
	unlock();
	free(p);
	return 0;
}

static struct ibv_mr *reg_mr(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, unsigned access) {
	lock();
	struct fpd *p = PD(pd);
	int err = 0;
	if (!p || !addr || len == 0)
		err = EINVAL;
	else if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE))
		err = EINVAL; /* the verbs spec: remote write needs local write */
	else if (iova != (uint64_t)(uintptr_t)addr)
		err = EOPNOTSUPP; /* iova other than the address: not modeled */
	if (err) {
		unlock();
		errno = err;
		return NULL;
	}
	int idx = -1;
	for (int i = 0; i < nmrs; i++)
		if (!mrs[i]) {
			idx = i;
			break;
		}
	if (idx < 0) {
		if (nmrs == capmrs) {
			capmrs = capmrs ? 2 * capmrs : 64;
			mrs = realloc(mrs, capmrs * sizeof *mrs);
			mr_gen = realloc(mr_gen, capmrs);
		}
		idx = nmrs++;
		mr_gen[idx] = 0;
	}
	if (idx >= (1 << 23)) {
		unlock();
		errno = ENOMEM;
		return NULL;
	}
	struct fmr *m = calloc(1, sizeof *m);
	m->magic = M_MR;
	m->access = access;
	m->pd = p;
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = addr;
	m->mr.length = len;
	m->mr.handle = next_handle++;
	/* keys carry a generation, so a deregistered MR's keys stay invalid;
	 * lkey and rkey differ, which some adapters do */
	m->mr.lkey = ((uint32_t)idx << 8) | ++mr_gen[idx];
	m->mr.rkey = m->mr.lkey | 0x80000000u;
	mrs[idx] = m;
	p->users++;
	unlock();
	return &m->mr;
}

EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
	return reg_mr(pd, addr, len, (uint64_t)(uintptr_t)addr, (unsigned)access);
}

EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, unsigned access) {
	return reg_mr(pd, addr, len, iova, access);
}

EXPORT int ibv_dereg_mr(struct ibv_mr *mr) {
	lock();
	struct fmr *m = (struct fmr *)mr;
	if (!m || m->magic != M_MR) {
		unlock();
		return EINVAL;
	}
	/* Requests in flight that name it fail with a protection error when
	 * they execute, as on an adapter. */
	mrs[(m->mr.lkey & 0x7fffffff) >> 8] = NULL;
	m->pd->users--;
	m->magic = 0;
	unlock();
	free(m);
	return 0;
}

EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ctx) {
	if (!is_ctx(ctx)) {
		errno = EINVAL;
		return NULL;
	}
	int fd = eventfd(0, EFD_CLOEXEC);
	if (fd < 0)
		return NULL;
	struct fchan *c = calloc(1, sizeof *c);
	lock();
	c->magic = M_CHAN;
	c->ch.context = ctx;
	c->ch.fd = fd;
	unlock();
	return &c->ch;
}

EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *channel) {
	lock();
	struct fchan *c = CHAN(channel);
	if (!c) {
		unlock();
		return EINVAL;
	}
	if (c->ch.refcnt) {
		violation("ibv_destroy_comp_channel: %d CQs still use the channel (EBUSY)", c->ch.refcnt);
		unlock();
		return EBUSY;
	}
	c->magic = 0;
	close(c->ch.fd);
	unlock();
	free(c->ev);
	free(c);
	return 0;
}

EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context, struct ibv_comp_channel *channel,
				    int comp_vector) {
	lock();
	struct fchan *ch = channel ? CHAN(channel) : NULL;
	if (!is_ctx(ctx) || cqe < 1 || cqe > MAX_CQE || comp_vector < 0 || comp_vector >= ctx->num_comp_vectors ||
	    (channel && !ch)) {
		unlock();
		errno = EINVAL;
		return NULL;
	}
	struct fcq *q = calloc(1, sizeof *q);
	q->q = calloc(cqe, sizeof *q->q);
	if (!q->q) {
		unlock();
		free(q);
		errno = ENOMEM;
		return NULL;
	}
	q->magic = M_CQ;
	q->cap = cqe;
	q->chan = ch;
	q->cq.context = ctx;
	q->cq.channel = channel;
	q->cq.cq_context = cq_context;
	q->cq.handle = next_handle++;
	q->cq.cqe = cqe;
	pthread_mutex_init(&q->cq.mutex, NULL);
	pthread_cond_init(&q->cq.cond, NULL);
	if (ch)
		ch->ch.refcnt++;
	q->next = cqs;
	cqs = q;
	unlock();
	return &q->cq;
}

EXPORT int ibv_destroy_cq(struct ibv_cq *cq) {
	lock();
	struct fcq *q = CQ(cq);
	if (!q) {
		unlock();
		return EINVAL;
	}
	if (q->users) {
		violation("ibv_destroy_cq: %d QPs still use the CQ (EBUSY)", q->users);
		unlock();
		return EBUSY;
	}
	drop_async(q);
	wait_async_acks(&q->async_read, &q->async_acked, "ibv_destroy_cq (waiting for ibv_ack_async_event)");
	struct fchan *ch = q->chan;
	if (ch) {
		/* events not yet read go with the CQ; those read must be acked */
		int k = 0;
		for (int i = 0; i < ch->nev; i++)
			if (ch->ev[i] != q)
				ch->ev[k++] = ch->ev[i];
		ch->nev = k;
		if (!k)
			fd_clear(ch->ch.fd, &ch->sig);
		int64_t start = now_ns();
		int warned = 0;
		while (q->acked < q->read)
			wait_warn(start, &warned, "ibv_destroy_cq (waiting for ibv_ack_cq_events)");
		ch->ch.refcnt--;
	}
	q->magic = 0;
	for (struct fcq **pp = &cqs; *pp; pp = &(*pp)->next)
		if (*pp == q) {
			*pp = q->next;
			break;
		}
	unlock();
	free(q->q);
	free(q);
	return 0;
}

static int fake_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
	lock();
	struct fcq *q = CQ(cq);
	if (!q || n < 0) {
		unlock();
		return -EINVAL;
	}
	if (q->overrun) {
		unlock();
		return -EIO;
	}
	int k = 0;
	while (k < n && q->n > 0) {
		struct cqe *e = &q->q[q->head];
		wc[k++] = e->wc;
		/* the queue entry is free once its completion is polled */
		queue_of(e->qp, e->sq)->used--;
		q->head = (q->head + 1) % q->cap;
		q->n--;
	}
	unlock();
	return k;
}

static int fake_req_notify_cq(struct ibv_cq *cq, int solicited) {
	lock();
	struct fcq *q = CQ(cq);
	if (!q || !q->chan) {
		unlock();
		return EINVAL;
	}
	if (q->armed != 1)
		q->armed = solicited ? 2 : 1;
	unlock();
	return 0;
}

EXPORT int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context) {
	lock();
	struct fchan *c = CHAN(channel);
	if (!c) {
		unlock();
		return seterr(EINVAL);
	}
	while (c->nev == 0) {
		if (nonblocking(c->ch.fd)) {
			unlock();
			return seterr(EAGAIN);
		}
		pthread_cond_wait(&cv, &mu);
	}
	struct fcq *q = c->ev[0];
	memmove(c->ev, c->ev + 1, (c->nev - 1) * sizeof *c->ev);
	c->nev--;
	if (!c->nev)
		fd_clear(c->ch.fd, &c->sig);
	q->read++;
	*cq = &q->cq;
	*cq_context = q->cq.cq_context;
	unlock();
	return 0;
}

EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents) {
	lock();
	struct fcq *q = CQ(cq);
	if (q) {
		if (q->acked + nevents > q->read)
			violation("ibv_ack_cq_events: %u acks for %u unacked events", nevents, q->read - q->acked);
		q->acked += nevents;
		pthread_cond_broadcast(&cv);
	}
	unlock();
}

EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask) {
	lock();
	struct fqp *q = QP(qp);
	int rc = EINVAL;
	if (q && attr && (mask & IBV_QP_STATE)) {
		if (attr->qp_state == IBV_QPS_ERR || attr->qp_state == IBV_QPS_RESET)
			rc = qp_modify(q, attr->qp_state);
		else
			fprintf(stderr, "fakeverbs: ibv_modify_qp to %s: only ERR and RESET are modeled; the rdma_cm moves QPs to INIT, RTR and RTS\n",
				qps_name(attr->qp_state));
	}
	unlock();
	return rc;
}

static int post_ok(struct fqp *q, int send) {
	int s = q->qp.state;
	if (send)
		return s == IBV_QPS_RTS || s == IBV_QPS_SQD || s == IBV_QPS_SQE || s == IBV_QPS_ERR;
	return s != IBV_QPS_RESET;
}

/* enqueue copies a request into q; in ERR it completes flushed at once. */
static int enqueue(struct fqp *qp, int send, uint64_t wr_id, int op, unsigned flags, struct ibv_sge *sg, int nsge,
		   uint64_t raddr, uint32_t rkey) {
	struct fq *q = send ? &qp->sq : &qp->rq;
	const char *what = send ? "ibv_post_send" : "ibv_post_recv";
	if (!post_ok(qp, send)) {
		violation("%s on QP %#x in state %s (EINVAL)", what, qp->qp.qp_num, qps_name(qp->qp.state));
		return EINVAL;
	}
	if (nsge < 0 || nsge > q->maxsge)
		return EINVAL;
	if (q->used >= q->cap) {
		violation("%s on QP %#x: %d requests posted and not polled fill the queue (ENOMEM)", what, qp->qp.qp_num, q->used);
		return ENOMEM;
	}
	for (int i = 0; i < nsge; i++)
		if (sg[i].length == 0)
			violation("%s on QP %#x: an SGE of length 0, which some adapters read as 2 GiB", what, qp->qp.qp_num);
	struct fwr *w = &q->w[(q->head + q->n) % q->cap];
	struct ibv_sge *keep = w->sge;
	memset(w, 0, sizeof *w);
	w->sge = keep;
	w->wr_id = wr_id;
	w->op = op;
	w->signaled = !send || qp->sig_all || (flags & IBV_SEND_SIGNALED);
	w->solicited = (flags & IBV_SEND_SOLICITED) != 0;
	w->nsge = nsge;
	if (nsge)
		memcpy(w->sge, sg, nsge * sizeof *sg);
	w->raddr = raddr;
	w->rkey = rkey;
	w->rnr_left = qp->rnr_retry;
	if (send) {
		w->next_try = now_ns() + jitter(wr_jitter);
		if (w->next_try < qp->last_due)
			w->next_try = qp->last_due;
		qp->last_due = w->next_try;
	}
	q->used++;
	if (qp->qp.state == IBV_QPS_ERR) {
		complete(qp, send, w, IBV_WC_WR_FLUSH_ERR, 0, 0, 0);
		return 0;
	}
	q->n++;
	if (send)
		kick();
	return 0;
}

static int fake_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
	lock();
	struct fqp *q = QP(qp);
	int rc = 0;
	for (; wr; wr = wr->next) {
		rc = EINVAL;
		if (!q)
			break;
		if (wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_RDMA_READ && wr->opcode != IBV_WR_RDMA_WRITE) {
			fprintf(stderr, "fakeverbs: ibv_post_send: opcode %d is not modeled\n", wr->opcode);
			break;
		}
		if (wr->send_flags & IBV_SEND_INLINE) {
			fprintf(stderr, "fakeverbs: ibv_post_send: inline data is not modeled\n");
			break;
		}
		rc = enqueue(q, 1, wr->wr_id, wr->opcode, wr->send_flags, wr->sg_list, wr->num_sge, wr->wr.rdma.remote_addr,
			     wr->wr.rdma.rkey);
		if (rc)
			break;
	}
	if (rc)
		*bad = wr;
	unlock();
	return rc;
}

static int fake_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
	lock();
	struct fqp *q = QP(qp);
	int rc = 0;
	for (; wr; wr = wr->next) {
		rc = q ? enqueue(q, 0, wr->wr_id, -1, 0, wr->sg_list, wr->num_sge, 0, 0) : EINVAL;
		if (rc)
			break;
	}
	if (rc)
		*bad = wr;
	unlock();
	return rc;
}

static void destroy_qp_locked(struct fqp *q) {
	drop_async(q);
	wait_async_acks(&q->async_read, &q->async_acked, "ibv_destroy_qp (waiting for ibv_ack_async_event)");
	purge(q->scq, q);
	if (q->rcq != q->scq)
		purge(q->rcq, q);
	q->scq->users--;
	if (q->rcq != q->scq)
		q->rcq->users--;
	q->pd->users--;
	if (q->id)
		q->id->id.qp = NULL;
	qpn_table[q->qp.qp_num - QPN_BASE] = NULL;
	for (struct fqp **pp = &qps; *pp; pp = &(*pp)->next)
		if (*pp == q) {
			*pp = q->next;
			break;
		}
	q->magic = 0;
	q_free(&q->sq);
	q_free(&q->rq);
	free(q);
}

EXPORT int ibv_destroy_qp(struct ibv_qp *qp) {
	lock();
	struct fqp *q = QP(qp);
	if (!q) {
		unlock();
		return EINVAL;
	}
	destroy_qp_locked(q);
	unlock();
	return 0;
}

EXPORT const char *ibv_wc_status_str(enum ibv_wc_status status) {
	static const char *const s[] = {
		[IBV_WC_SUCCESS] = "success",
		[IBV_WC_LOC_LEN_ERR] = "local length error",
		[IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
		[IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
		[IBV_WC_LOC_PROT_ERR] = "local protection error",
		[IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
		[IBV_WC_MW_BIND_ERR] = "memory management operation error",
		[IBV_WC_BAD_RESP_ERR] = "bad response error",
		[IBV_WC_LOC_ACCESS_ERR] = "local access error",
		[IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
		[IBV_WC_REM_ACCESS_ERR] = "remote access error",
		[IBV_WC_REM_OP_ERR] = "remote operation error",
		[IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
		[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
		[IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
		[IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
		[IBV_WC_REM_ABORT_ERR] = "aborted error",
		[IBV_WC_INV_EECN_ERR] = "invalid EE context number",
		[IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
		[IBV_WC_FATAL_ERR] = "fatal error",
		[IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
		[IBV_WC_GENERAL_ERR] = "general error",
	};
	if ((unsigned)status < sizeof s / sizeof s[0] && s[status])
		return s[status];
	return "unknown";
}

EXPORT const char *ibv_event_type_str(enum ibv_event_type event) {
	static const char *const s[] = {
		[IBV_EVENT_CQ_ERR] = "CQ error",
		[IBV_EVENT_QP_FATAL] = "local work queue catastrophic error",
		[IBV_EVENT_QP_REQ_ERR] = "invalid request local work queue error",
		[IBV_EVENT_QP_ACCESS_ERR] = "local access violation work queue error",
		[IBV_EVENT_COMM_EST] = "communication established",
		[IBV_EVENT_SQ_DRAINED] = "send queue drained",
		[IBV_EVENT_PATH_MIG] = "path migrated",
		[IBV_EVENT_PATH_MIG_ERR] = "path migration request error",
		[IBV_EVENT_DEVICE_FATAL] = "local catastrophic error",
		[IBV_EVENT_PORT_ACTIVE] = "port active",
		[IBV_EVENT_PORT_ERR] = "port error",
		[IBV_EVENT_LID_CHANGE] = "LID change",
		[IBV_EVENT_PKEY_CHANGE] = "P_Key change",
		[IBV_EVENT_SM_CHANGE] = "SM change",
		[IBV_EVENT_SRQ_ERR] = "SRQ catastrophic error",
		[IBV_EVENT_SRQ_LIMIT_REACHED] = "SRQ limit reached",
		[IBV_EVENT_QP_LAST_WQE_REACHED] = "last WQE reached",
		[IBV_EVENT_CLIENT_REREGISTER] = "client reregistration",
		[IBV_EVENT_GID_CHANGE] = "GID table change",
		[IBV_EVENT_WQ_FATAL] = "WQ fatal",
	};
	if ((unsigned)event < sizeof s / sizeof s[0] && s[event])
		return s[event];
	return "unknown";
}

/* ======================== librdmacm ======================== */

EXPORT struct rdma_event_channel *rdma_create_event_channel(void) {
	int fd = eventfd(0, EFD_CLOEXEC);
	if (fd < 0)
		return NULL;
	struct fevch *c = calloc(1, sizeof *c);
	lock();
	context_locked();
	c->magic = M_EVCH;
	c->ch.fd = fd;
	unlock();
	return &c->ch;
}

EXPORT void rdma_destroy_event_channel(struct rdma_event_channel *channel) {
	lock();
	struct fevch *c = EVCH(channel);
	if (!c) {
		unlock();
		return;
	}
	if (c->nids || c->head)
		violation("rdma_destroy_event_channel: %d ids still use the channel", c->nids);
	c->magic = 0;
	close(c->ch.fd);
	unlock();
	/* the ids and events still on it leak, as with the real library */
}

EXPORT int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context,
			  enum rdma_port_space ps) {
	lock();
	struct fevch *c = EVCH(channel);
	if (!c || ps != RDMA_PS_TCP) {
		if (!channel)
			fprintf(stderr, "fakeverbs: rdma_create_id without an event channel is not modeled\n");
		unlock();
		return seterr(EINVAL);
	}
	struct fid *x = new_id(c, context, ps);
	*id = &x->id;
	unlock();
	return 0;
}

/* bind_locked binds id to a (an address of the adapter, or any); port 0
 * takes a free ephemeral port. */
static int bind_locked(struct fid *x, const struct sockaddr *sa) {
	if (x->bound)
		return EINVAL;
	if (!sa || sa->sa_family != AF_INET)
		return sa && sa->sa_family == AF_INET6 ? EADDRNOTAVAIL : EAFNOSUPPORT;
	struct sockaddr_in a = *(const struct sockaddr_in *)sa;
	if (a.sin_addr.s_addr != INADDR_ANY && a.sin_addr.s_addr != dev_addr.s_addr)
		return ENODEV; /* no RDMA device has the address */
	uint16_t port = ntohs(a.sin_port);
	for (int tries = 0; port == 0 && tries < 28232; tries++) {
		uint16_t p = (uint16_t)next_port;
		next_port = next_port >= 60999 ? 32768 : next_port + 1;
		int used = 0;
		for (struct fid *y = ids; y; y = y->next)
			if (y->bound && ntohs(y->src.sin_port) == p)
				used = 1;
		if (!used)
			port = p;
	}
	if (port == 0)
		return EADDRINUSE;
	for (struct fid *y = ids; y; y = y->next)
		if (y != x && y->bound && !y->passive && ntohs(y->src.sin_port) == port &&
		    (y->src.sin_addr.s_addr == a.sin_addr.s_addr || y->src.sin_addr.s_addr == INADDR_ANY ||
		     a.sin_addr.s_addr == INADDR_ANY))
			return EADDRINUSE;
	a.sin_port = htons(port);
	x->src = a;
	x->bound = 1;
	x->state = CM_BOUND;
	x->id.route.addr.src_sin = a;
	if (a.sin_addr.s_addr != INADDR_ANY) {
		x->id.verbs = context_locked();
		x->id.port_num = DEV_PORT;
	}
	return 0;
}

EXPORT int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr) {
	lock();
	struct fid *x = ID(id);
	int rc = x ? bind_locked(x, addr) : EINVAL;
	unlock();
	return rc ? seterr(rc) : 0;
}

EXPORT int rdma_listen(struct rdma_cm_id *id, int backlog) {
	(void)backlog; /* the IB CM does not limit pending requests */
	lock();
	struct fid *x = ID(id);
	int rc = 0;
	if (!x) {
		rc = EINVAL;
	} else if (x->state == CM_IDLE) {
		struct sockaddr_in any = {.sin_family = AF_INET};
		rc = bind_locked(x, (struct sockaddr *)&any);
	} else if (x->state != CM_BOUND && x->state != CM_LISTEN) {
		rc = EINVAL;
	}
	if (!rc)
		x->state = CM_LISTEN;
	unlock();
	return rc ? seterr(rc) : 0;
}

EXPORT __be16 rdma_get_src_port(struct rdma_cm_id *id) { return id->route.addr.src_sin.sin_port; }

EXPORT __be16 rdma_get_dst_port(struct rdma_cm_id *id) { return id->route.addr.dst_sin.sin_port; }

EXPORT int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src, struct sockaddr *dst, int timeout_ms) {
	lock();
	struct fid *x = ID(id);
	int rc = 0;
	if (!x || !dst || (x->state != CM_IDLE && x->state != CM_BOUND)) {
		rc = EINVAL;
	} else if (dst->sa_family != AF_INET) {
		rc = EAFNOSUPPORT;
	} else if (!x->bound) {
		struct sockaddr_in any = {.sin_family = AF_INET};
		if (src && src->sa_family != AF_UNSPEC && src->sa_family != dst->sa_family)
			rc = EINVAL;
		else
			rc = bind_locked(x, src && src->sa_family ? src : (struct sockaddr *)&any);
	}
	if (!rc) {
		x->dst = *(struct sockaddr_in *)dst;
		x->id.route.addr.dst_sin = x->dst;
		x->state = CM_ADDR_QUERY;
		int known = x->dst.sin_addr.s_addr == dev_addr.s_addr;
		if (known && !x->id.verbs) {
			/* bound to any: the route picks the adapter */
			x->id.verbs = context_locked();
			x->id.port_num = DEV_PORT;
			x->src.sin_addr = dev_addr;
			x->id.route.addr.src_sin.sin_addr = dev_addr;
		}
		/* no neighbour answers for an unknown address: ADDR_ERROR after
		 * the timeout */
		send_msg(T_ADDR, x, x, x->serial, known ? 0 : (int64_t)timeout_ms * MS)->status = known ? 0 : -ETIMEDOUT;
	}
	unlock();
	return rc ? seterr(rc) : 0;
}

EXPORT int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms) {
	(void)timeout_ms;
	lock();
	struct fid *x = ID(id);
	int rc = 0;
	if (!x || x->state != CM_ADDR_RESOLVED)
		rc = EINVAL;
	else {
		x->state = CM_ROUTE_QUERY;
		send_msg(T_ROUTE, x, x, x->serial, 0);
	}
	unlock();
	return rc ? seterr(rc) : 0;
}

EXPORT int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *a) {
	lock();
	struct fid *x = ID(id);
	struct fpd *p = PD(pd);
	struct fcq *scq = a ? CQ(a->send_cq) : NULL, *rcq = a ? CQ(a->recv_cq) : NULL;
	int rc = 0;
	if (!x || !p || !a || !scq || !rcq || !x->id.verbs || pd->context != x->id.verbs)
		rc = EINVAL;
	else if (x->id.qp) {
		violation("rdma_create_qp: the id has a QP already");
		rc = EINVAL;
	} else if (a->qp_type != IBV_QPT_RC || a->srq) {
		fprintf(stderr, "fakeverbs: rdma_create_qp: only RC QPs without an SRQ are modeled\n");
		rc = EINVAL;
	} else if (a->cap.max_send_wr > MAX_QP_WR || a->cap.max_recv_wr > MAX_QP_WR || a->cap.max_send_sge > MAX_SGE ||
		   a->cap.max_recv_sge > MAX_SGE || a->cap.max_inline_data > 0) {
		rc = EINVAL;
	}
	int idx = -1;
	for (int i = 0; !rc && i < MAX_QPS - QPN_BASE; i++)
		if (!qpn_table[i]) {
			idx = i;
			break;
		}
	if (!rc && idx < 0)
		rc = ENOMEM;
	if (rc) {
		unlock();
		return seterr(rc);
	}
	struct fqp *q = calloc(1, sizeof *q);
	if (q_init(&q->sq, a->cap.max_send_wr, a->cap.max_send_sge) ||
	    q_init(&q->rq, a->cap.max_recv_wr, a->cap.max_recv_sge)) {
		q_free(&q->sq);
		q_free(&q->rq);
		free(q);
		unlock();
		return seterr(ENOMEM);
	}
	/* a queue of 0 takes nothing */
	q->sq.cap = a->cap.max_send_wr;
	q->rq.cap = a->cap.max_recv_wr;
	q->magic = M_QP;
	q->serial = ++serials;
	q->pd = p;
	q->scq = scq;
	q->rcq = rcq;
	q->sig_all = a->sq_sig_all;
	q->id = x;
	q->qp.context = x->id.verbs;
	q->qp.qp_context = a->qp_context;
	q->qp.pd = pd;
	q->qp.send_cq = a->send_cq;
	q->qp.recv_cq = a->recv_cq;
	q->qp.handle = next_handle++;
	q->qp.qp_num = QPN_BASE + idx;
	q->qp.qp_type = IBV_QPT_RC;
	q->qp.state = IBV_QPS_RESET;
	pthread_mutex_init(&q->qp.mutex, NULL);
	pthread_cond_init(&q->qp.cond, NULL);
	qpn_table[idx] = q;
	p->users++;
	scq->users++;
	if (rcq != scq)
		rcq->users++;
	q->next = qps;
	qps = q;
	/* librdmacm moves a new QP to INIT, where receives may be posted */
	qp_modify(q, IBV_QPS_INIT);
	x->id.qp = &q->qp;
	unlock();
	return 0;
}

EXPORT void rdma_destroy_qp(struct rdma_cm_id *id) {
	lock();
	struct fqp *q = id ? QP(id->qp) : NULL;
	if (q)
		destroy_qp_locked(q);
	else if (id)
		id->qp = NULL;
	unlock();
}

/* conn_depths checks and resolves the depths as librdmacm does: 0xFF means
 * the device's maximum, anything above it is refused. */
static int conn_depths(struct rdma_conn_param *p, uint8_t *resp, uint8_t *init) {
	if ((p->responder_resources != RDMA_MAX_RESP_RES && p->responder_resources > MAX_RD_ATOM) ||
	    (p->initiator_depth != RDMA_MAX_INIT_DEPTH && p->initiator_depth > MAX_RD_ATOM))
		return EINVAL;
	*resp = p->responder_resources == RDMA_MAX_RESP_RES ? MAX_RD_ATOM : p->responder_resources;
	*init = p->initiator_depth == RDMA_MAX_INIT_DEPTH ? MAX_RD_ATOM : p->initiator_depth;
	return 0;
}

/* connect_qp moves a QP to RTR and RTS towards the peer's QP, as the CM's
 * attributes say. */
static int connect_qp(struct fid *x, uint8_t rd_atom, uint8_t dest_rd_atom, uint8_t retry, uint8_t rnr_retry) {
	struct fqp *q = x->id.qp ? QP(x->id.qp) : NULL;
	if (!q)
		return 0;
	int rc = qp_modify(q, IBV_QPS_RTR);
	if (!rc)
		rc = qp_modify(q, IBV_QPS_RTS);
	if (rc)
		return rc;
	q->remote = x->rqp;
	q->remote_serial = x->rqp_serial;
	q->rd_atom = rd_atom;
	q->dest_rd_atom = dest_rd_atom;
	q->retry_cnt = retry & 7;
	q->rnr_retry = rnr_retry & 7;
	kick();
	return 0;
}

EXPORT int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *p) {
	lock();
	struct fid *x = ID(id);
	int rc = 0;
	uint8_t resp = 0, init = 0;
	if (!x || !p || x->state != CM_ROUTE_RESOLVED || p->private_data_len > REQ_PRIVATE ||
	    (p->private_data_len && !p->private_data))
		rc = EINVAL;
	else
		rc = conn_depths(p, &resp, &init);
	if (!rc) {
		x->resp_res = resp;
		x->init_depth = init;
		x->retry = p->retry_count & 7;
		x->rnr_retry = p->rnr_retry_count & 7;
		x->state = CM_REQ_SENT;
		set_priv(send_msg(MSG_REQ, x, NULL, 0, 0), p->private_data, p->private_data_len);
	}
	unlock();
	return rc ? seterr(rc) : 0;
}

EXPORT int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *p) {
	lock();
	struct fid *x = ID(id);
	int rc = 0;
	uint8_t resp = MAX_RD_ATOM, init = MAX_RD_ATOM;
	if (!x || x->state != CM_REQ_RCVD || (p && p->private_data_len > REP_PRIVATE))
		rc = EINVAL;
	else if (p)
		rc = conn_depths(p, &resp, &init);
	if (!rc) {
		/* the REQ bounds what this side may take */
		if (resp > x->p_init_depth)
			resp = x->p_init_depth;
		if (init > x->p_resp_res)
			init = x->p_resp_res;
		x->resp_res = resp;
		x->init_depth = init;
		x->rnr_retry = p ? p->rnr_retry_count & 7 : 7;
		/* the passive side's QP retries as the REQ asked */
		rc = connect_qp(x, init, resp, x->p_retry, x->p_rnr_retry);
	}
	if (!rc) {
		x->state = CM_REP_SENT;
		set_priv(to_peer(MSG_REP, x, 0), p ? p->private_data : NULL, p ? p->private_data_len : 0);
	}
	unlock();
	return rc ? seterr(rc) : 0;
}

EXPORT int rdma_reject(struct rdma_cm_id *id, const void *priv, uint8_t len) {
	lock();
	struct fid *x = ID(id);
	int rc = 0;
	if (!x || len > REJ_PRIVATE)
		rc = EINVAL;
	else if (x->state == CM_REQ_RCVD || x->state == CM_REP_SENT || x->state == CM_REP_RCVD) {
		x->state = CM_DONE;
		set_priv(to_peer(MSG_REJ, x, 28), priv, len); /* IB_CM_REJ_CONSUMER_DEFINED */
	} else {
		rc = EINVAL;
	}
	unlock();
	return rc ? seterr(rc) : 0;
}

EXPORT int rdma_disconnect(struct rdma_cm_id *id) {
	lock();
	struct fid *x = ID(id);
	int rc = 0;
	if (!x || !x->id.verbs) {
		rc = EINVAL;
	} else {
		/* librdmacm moves the QP to ERR first, on IB */
		struct fqp *q = x->id.qp ? QP(x->id.qp) : NULL;
		if (q)
			qp_error(q);
		switch (x->state) {
		case CM_ESTABLISHED:
			x->state = CM_DREQ_SENT;
			to_peer(MSG_DREQ, x, 0);
			send_msg(T_DREQ, x, x, x->serial, DREQ_TIMEOUT);
			break;
		case CM_DREQ_RCVD:
			to_peer(MSG_DREP, x, 0);
			enter_timewait(x);
			break;
		case CM_IDLE:
		case CM_BOUND:
		case CM_LISTEN:
		case CM_ADDR_QUERY:
		case CM_ADDR_RESOLVED:
		case CM_ROUTE_QUERY:
		case CM_ROUTE_RESOLVED:
			rc = EINVAL; /* no IB CM id yet */
			break;
		default:
			/* the kernel's DREQ and DREP both fail in other states,
			 * and it returns 0 anyway */
			break;
		}
	}
	unlock();
	return rc ? seterr(rc) : 0;
}

static void free_ev(struct fev *e) {
	if (e->priv) {
		memset(e->priv, 0x5a, e->ev.param.conn.private_data_len);
		free(e->priv);
	}
	e->magic = 0;
	free(e);
}

static void destroy_id_locked(struct fid *x, int wait);

/* drop_events removes the unread events of x from its channel; for a
 * listener, the requests queued on it too, whose ids go with them. */
static void drop_events(struct fid *x) {
	struct fevch *c = x->ch;
	struct fev **pp = &c->head, *last = NULL;
	struct fid *orphans[64];
	int norph = 0;
	while (*pp) {
		struct fev *e = *pp;
		int mine = e->ev.id == &x->id || e->ev.listen_id == &x->id;
		if (!mine) {
			last = e;
			pp = &e->next;
			continue;
		}
		*pp = e->next;
		if (e->ev.listen_id == &x->id && e->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST && norph < 64)
			orphans[norph++] = (struct fid *)e->ev.id;
		free_ev(e);
	}
	c->tail = last;
	if (!c->head)
		fd_clear(c->ch.fd, &c->sig);
	for (int i = 0; i < norph; i++)
		if (orphans[i]->magic == M_ID && !orphans[i]->dying)
			destroy_id_locked(orphans[i], 0);
}

static void destroy_id_locked(struct fid *x, int wait) {
	x->dying = 1;
	drop_events(x);
	switch (x->state) {
	case CM_REQ_SENT:
		send_msg(MSG_REJ, x, NULL, 0, 0)->status = 4; /* IB_CM_REJ_TIMEOUT, to whoever got the REQ */
		break;
	case CM_REQ_RCVD:
	case CM_REP_SENT:
	case CM_REP_RCVD:
		to_peer(MSG_REJ, x, 28);
		break;
	case CM_ESTABLISHED:
		to_peer(MSG_DREQ, x, 0);
		break;
	case CM_DREQ_RCVD:
		to_peer(MSG_DREP, x, 0);
		break;
	}
	struct fqp *q = x->id.qp ? QP(x->id.qp) : NULL;
	if (q) {
		violation("rdma_destroy_id: the id's QP %#x was not destroyed first, and leaks", q->qp.qp_num);
		q->id = NULL;
	}
	int64_t start = now_ns();
	int warned = 0;
	while (wait && x->unacked > 0)
		wait_warn(start, &warned, "rdma_destroy_id (waiting for rdma_ack_cm_event)");
	for (struct fid **pp = &ids; *pp; pp = &(*pp)->next)
		if (*pp == x) {
			*pp = x->next;
			break;
		}
	x->ch->nids--;
	x->magic = 0;
	free(x);
}

EXPORT int rdma_destroy_id(struct rdma_cm_id *id) {
	lock();
	struct fid *x = ID(id);
	if (!x) {
		unlock();
		return seterr(EINVAL);
	}
	destroy_id_locked(x, 1);
	unlock();
	return 0;
}

EXPORT int rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event) {
	lock();
	struct fevch *c = EVCH(channel);
	if (!c || !event) {
		unlock();
		return seterr(EINVAL);
	}
	if (c->fail) {
		unlock();
		return seterr(c->fail);
	}
	for (;;) {
		if (!c->head) {
			if (nonblocking(c->ch.fd)) {
				unlock();
				return seterr(EAGAIN);
			}
			pthread_cond_wait(&cv, &mu);
			continue;
		}
		struct fev *e = c->head;
		c->head = e->next;
		if (!c->head) {
			c->tail = NULL;
			fd_clear(c->ch.fd, &c->sig);
		}
		e->next = NULL;
		struct fid *x = (struct fid *)e->ev.id;
		if (e->internal) {
			/* the REP: librdmacm moves the QP to RTR and RTS, sends the
			 * RTU and reports ESTABLISHED; if it cannot, it moves the QP
			 * to ERR and reports CONNECT_ERROR, and sends nothing: the
			 * peer hears of it when the id is destroyed (REJ) */
			struct fqp *q = x->id.qp ? QP(x->id.qp) : NULL;
			int rc = x->state == CM_REP_RCVD ? 0 : EINVAL;
			if (!rc && q) {
				uint8_t rd = x->init_depth < x->p_resp_res ? x->init_depth : x->p_resp_res;
				rc = connect_qp(x, rd, x->p_init_depth, x->retry, x->p_rnr_retry);
			}
			if (!q && !rc) {
				e->ev.event = RDMA_CM_EVENT_CONNECT_RESPONSE; /* rdma_establish is not modeled */
			} else if (rc) {
				if (q)
					qp_error(q);
				x->connect_error = 1;
				e->ev.event = RDMA_CM_EVENT_CONNECT_ERROR;
				e->ev.status = -rc;
			} else {
				x->state = CM_ESTABLISHED;
				to_peer(MSG_RTU, x, 0);
				e->ev.event = RDMA_CM_EVENT_ESTABLISHED;
			}
		} else if ((e->ev.event == RDMA_CM_EVENT_REJECTED || e->ev.event == RDMA_CM_EVENT_DISCONNECTED) &&
			   x->connect_error) {
			/* librdmacm swallows these after a CONNECT_ERROR */
			free_ev(e);
			continue;
		} else if (e->ev.event == RDMA_CM_EVENT_REJECTED) {
			struct fqp *q = x->id.qp ? QP(x->id.qp) : NULL;
			if (q)
				qp_error(q);
		}
		e->owner->unacked++;
		*event = &e->ev;
		unlock();
		return 0;
	}
}

EXPORT int rdma_ack_cm_event(struct rdma_cm_event *event) {
	lock();
	struct fev *e = (struct fev *)event;
	if (!e || e->magic != M_EV) {
		unlock();
		return seterr(EINVAL);
	}
	e->owner->unacked--;
	free_ev(e);
	pthread_cond_broadcast(&cv);
	unlock();
	return 0;
}

EXPORT const char *rdma_event_str(enum rdma_cm_event_type event) {
	static const char *const s[] = {
		[RDMA_CM_EVENT_ADDR_RESOLVED] = "RDMA_CM_EVENT_ADDR_RESOLVED",
		[RDMA_CM_EVENT_ADDR_ERROR] = "RDMA_CM_EVENT_ADDR_ERROR",
		[RDMA_CM_EVENT_ROUTE_RESOLVED] = "RDMA_CM_EVENT_ROUTE_RESOLVED",
		[RDMA_CM_EVENT_ROUTE_ERROR] = "RDMA_CM_EVENT_ROUTE_ERROR",
		[RDMA_CM_EVENT_CONNECT_REQUEST] = "RDMA_CM_EVENT_CONNECT_REQUEST",
		[RDMA_CM_EVENT_CONNECT_RESPONSE] = "RDMA_CM_EVENT_CONNECT_RESPONSE",
		[RDMA_CM_EVENT_CONNECT_ERROR] = "RDMA_CM_EVENT_CONNECT_ERROR",
		[RDMA_CM_EVENT_UNREACHABLE] = "RDMA_CM_EVENT_UNREACHABLE",
		[RDMA_CM_EVENT_REJECTED] = "RDMA_CM_EVENT_REJECTED",
		[RDMA_CM_EVENT_ESTABLISHED] = "RDMA_CM_EVENT_ESTABLISHED",
		[RDMA_CM_EVENT_DISCONNECTED] = "RDMA_CM_EVENT_DISCONNECTED",
		[RDMA_CM_EVENT_DEVICE_REMOVAL] = "RDMA_CM_EVENT_DEVICE_REMOVAL",
		[RDMA_CM_EVENT_MULTICAST_JOIN] = "RDMA_CM_EVENT_MULTICAST_JOIN",
		[RDMA_CM_EVENT_MULTICAST_ERROR] = "RDMA_CM_EVENT_MULTICAST_ERROR",
		[RDMA_CM_EVENT_ADDR_CHANGE] = "RDMA_CM_EVENT_ADDR_CHANGE",
		[RDMA_CM_EVENT_TIMEWAIT_EXIT] = "RDMA_CM_EVENT_TIMEWAIT_EXIT",
	};
	if ((unsigned)event < sizeof s / sizeof s[0] && s[event])
		return s[event];
	return "UNKNOWN EVENT";
}

/* rdma_notify is accepted and has no effect: a QP receives here only once
 * both ends are connected, so COMM_EST never comes before ESTABLISHED. */
EXPORT int rdma_notify(struct rdma_cm_id *id, enum ibv_event_type event) {
	lock();
	struct fid *x = ID(id);
	int rc = !x ? EINVAL : event != IBV_EVENT_COMM_EST ? EINVAL : x->state == CM_ESTABLISHED ? EISCONN : 0;
	unlock();
	return rc ? seterr(rc) : 0;
}

/* fakeverbs_inject_cm_event queues a connection manager event with no
 * parameters (such as RDMA_CM_EVENT_DEVICE_REMOVAL) on id, for tests.
 * Returns 0 or an errno. */
EXPORT int fakeverbs_inject_cm_event(struct rdma_cm_id *id, int event) {
	lock();
	struct fid *x = ID(id);
	if (!x) {
		unlock();
		return EINVAL;
	}
	post_ev(x, event, 0, NULL, x, NULL, 0, 0);
	unlock();
	return 0;
}

/* fakeverbs_fail_cm_channel makes every later rdma_get_cm_event on ch fail
 * with err, and the channel's fd readable so a poller sees it, for tests.
 * Returns 0 or an errno. */
EXPORT int fakeverbs_fail_cm_channel(struct rdma_event_channel *ch, int err) {
	lock();
	struct fevch *c = EVCH(ch);
	if (!c || err <= 0) {
		unlock();
		return EINVAL;
	}
	c->fail = err;
	fd_set_ready(c->ch.fd, &c->sig);
	pthread_cond_broadcast(&cv);
	unlock();
	return 0;
}
