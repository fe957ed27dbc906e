/*
 * fakedat.c: an in-memory stand-in for libdat2, for running the udapl
 * provider's data-path tests on a machine without RDMA hardware.
 *
 *	mkdir -p /tmp/fakedat
 *	gcc -shared -fPIC -I/usr/include/dat2 -o /tmp/fakedat/libdat2.so \
 *		subdevices/udapl/testdata/fakedat/fakedat.c -lpthread
 *	CGO_LDFLAGS=-L/tmp/fakedat LD_LIBRARY_PATH=/tmp/fakedat \
 *		go test -race -tags udapl ./subdevices/udapl/
 *
 * It implements only the DAT calls the provider makes, in one process
 * (endpoints of any IA opened here connect to each other), under one lock.
 * It follows dapl where the provider depends on dapl's behaviour:
 * dat_evd_dequeue fails while another thread waits on the EVD; a
 * connection request reports 56 bytes of private data, zero-padded as on
 * InfiniBand; a peer's disconnect is an event, and its queue pair flushes
 * only when disconnected locally; a failed read puts the queue pair in
 * error without ending the connection; dat_ep_free drops the completions
 * not yet made and frees the memory, so its address comes back; and
 * dat_ep_free refuses an endpoint in PASSIVE_CONNECTION_PENDING.
 *
 * Asynchronous errors, which no DAT call provokes, are injected by the
 * test-only fakedat_* functions at the end of this file (the tests reach
 * them through internal/fakectl). They follow dapl 2.1 too: a broken
 * queue pair is reported on the IA's async EVD naming the IA, not the
 * endpoint (dapl_evd_qp_async_error_callback), and leaves the endpoint
 * in DAT_EP_STATE_ERROR, which DAT 2.0 defines as DISCONNECTED; there
 * dat_ep_disconnect does nothing, and only dat_ep_free (destroying the
 * connected CM id) tells the peer. The broken queue pair does not flush
 * the work posted on it here: a device may, and may not report it, so
 * the provider flushes it itself. An overflowed EVD fails every wait and
 * dequeue, as dapl's does.
 *
 * It is what the provider's authors believe DAT and dapl do, so tests
 * passing against it show the provider consistent with that belief, not
 * with a device: run them on real hardware before relying on them.
 * Every IA name opens, except those containing "no-such"; the registry's
 * first entry is the first entry of /etc/dat.conf.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <dat2/udat.h>

#define ERR(t, s) ((DAT_RETURN)(DAT_CLASS_ERROR | (t) | (s)))
enum { T_IA = 0x1a1a, T_PZ, T_EVD, T_PSP, T_EP, T_CR, T_LMR };
enum { S_UNCONN, S_ACTIVE, S_PASSIVE, S_CONN, S_DISC, S_ERR };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

struct evd { int type; int flags; int qlen; DAT_EVENT *q; int head, count; int waiting; int overflow; DAT_RETURN fail; };
struct rv { uint64_t cookie; uint64_t va; uint32_t len; };
struct ia;
struct ep { int type; struct ia *ia; struct evd *dto, *conn; int state; struct ep *peer; struct rv *rq; int nr, maxr; int maxs; int qperr; };
struct psp { int type; uint64_t qual; struct evd *evd; struct psp *next; };
struct cr { int type; struct ep *active; uint8_t pd[56]; };
struct lmr { int type; uint64_t addr, len; uint32_t ctx; struct lmr *next; };
struct ia { int type; struct evd *async; };

static struct psp *psps;
static struct lmr *lmrs;
static uint32_t nextctx = 100;
static struct sockaddr_in iaaddr;

static int post(struct evd *e, DAT_EVENT *ev) {
	if (e->count == e->qlen) { e->overflow = 1; return -1; }
	ev->evd_handle = e;
	e->q[(e->head + e->count) % e->qlen] = *ev;
	e->count++;
	pthread_cond_broadcast(&cv);
	return 0;
}
static void post_conn(struct ep *ep, DAT_EVENT_NUMBER n) {
	DAT_EVENT ev; memset(&ev, 0, sizeof ev);
	ev.event_number = n; ev.event_data.connect_event_data.ep_handle = ep;
	post(ep->conn, &ev);
}
static void post_dto(struct ep *ep, uint64_t cookie, DAT_DTO_COMPLETION_STATUS st, uint32_t len, DAT_DTOS op) {
	DAT_EVENT ev; memset(&ev, 0, sizeof ev);
	ev.event_number = DAT_DTO_COMPLETION_EVENT;
	ev.event_data.dto_completion_event_data.ep_handle = ep;
	ev.event_data.dto_completion_event_data.user_cookie.as_64 = cookie;
	ev.event_data.dto_completion_event_data.status = st;
	ev.event_data.dto_completion_event_data.transfered_length = len;
	ev.event_data.dto_completion_event_data.operation = op;
	post(ep->dto, &ev);
}
static void flush_recvs(struct ep *ep) {
	for (int i = 0; i < ep->nr; i++) post_dto(ep, ep->rq[i].cookie, DAT_DTO_ERR_FLUSHED, 0, DAT_DTO_RECEIVE);
	ep->nr = 0;
}
/* the QP goes to error: its receives flush, the peer hears of it */
static void break_ep(struct ep *ep, int tell_peer) {
	if (ep->state == S_DISC) return;
	int was = ep->state;
	ep->state = S_DISC;
	flush_recvs(ep);
	if (was == S_CONN || was == S_ACTIVE || was == S_PASSIVE) post_conn(ep, DAT_CONNECTION_EVENT_DISCONNECTED);
	if (tell_peer && ep->peer && ep->peer->state == S_CONN) {
		/* like the IB CM: the peer gets DISCONNECTED; its QP is not
		 * flushed until its consumer (or dapl) disconnects it */
		post_conn(ep->peer, DAT_CONNECTION_EVENT_DISCONNECTED);
		ep->peer->peer = NULL;
	}
	ep->peer = NULL;
}

DAT_RETURN dat_registry_list_providers(DAT_COUNT max, DAT_COUNT *n, DAT_PROVIDER_INFO *list[]) {
	char line[1024], name[DAT_NAME_MAX_LENGTH];
	FILE *f = fopen("/etc/dat.conf", "r");
	*n = 0;
	if (f == NULL || max < 1) {
		if (f) fclose(f);
		return DAT_SUCCESS;
	}
	while (fgets(line, sizeof line, f)) {
		if (sscanf(line, " %255s", name) == 1 && name[0] != '#') {
			memset(list[0], 0, sizeof *list[0]);
			strcpy(list[0]->ia_name, name);
			*n = 1;
			break;
		}
	}
	fclose(f);
	return DAT_SUCCESS;
}

DAT_RETURN dat_evd_create(DAT_IA_HANDLE ia, DAT_COUNT qlen, DAT_CNO_HANDLE cno, DAT_EVD_FLAGS flags, DAT_EVD_HANDLE *out) {
	struct evd *e = calloc(1, sizeof *e);
	e->type = T_EVD; e->flags = flags; e->qlen = qlen; e->q = calloc(qlen, sizeof(DAT_EVENT));
	*out = e;
	return DAT_SUCCESS;
}

DAT_RETURN dat_ia_openv(const DAT_NAME_PTR name, DAT_COUNT qlen, DAT_EVD_HANDLE *async, DAT_IA_HANDLE *out,
		DAT_UINT32 maj, DAT_UINT32 min, DAT_BOOLEAN ts) {
	if (strstr(name, "no-such") != NULL) return ERR(DAT_PROVIDER_NOT_FOUND, DAT_NAME_NOT_REGISTERED);
	struct ia *ia = calloc(1, sizeof *ia);
	ia->type = T_IA;
	dat_evd_create(ia, qlen, NULL, DAT_EVD_ASYNC_FLAG, (DAT_EVD_HANDLE *)&ia->async);
	*async = ia->async; *out = ia;
	iaaddr.sin_family = AF_INET; inet_pton(AF_INET, "10.9.8.7", &iaaddr.sin_addr);
	return DAT_SUCCESS;
}

DAT_RETURN dat_ia_query(DAT_IA_HANDLE h, DAT_EVD_HANDLE *async, DAT_IA_ATTR_MASK m, DAT_IA_ATTR *a, DAT_PROVIDER_ATTR_MASK pm, DAT_PROVIDER_ATTR *p) {
	struct ia *ia = h;
	if (!ia || ia->type != T_IA) return ERR(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_IA);
	*async = ia->async;
	a->ia_address_ptr = (DAT_IA_ADDRESS_PTR)&iaaddr;
	a->max_dto_per_ep = 1024; a->max_rdma_read_per_ep_in = 16; a->max_rdma_read_per_ep_out = 16;
	a->max_evd_qlen = 1 << 16; a->max_message_size = 1 << 30; a->max_rdma_size = 1 << 30;
	p->max_private_data_size = 64;
	return DAT_SUCCESS;
}

DAT_RETURN dat_ia_close(DAT_IA_HANDLE h, DAT_CLOSE_FLAGS f) {
	struct ia *ia = h;
	if (!ia || ia->type != T_IA) return ERR(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_IA);
	ia->type = 0;
	return DAT_SUCCESS;
}

DAT_RETURN dat_pz_create(DAT_IA_HANDLE ia, DAT_PZ_HANDLE *out) { int *p = malloc(sizeof *p); *p = T_PZ; *out = p; return DAT_SUCCESS; }
DAT_RETURN dat_pz_free(DAT_PZ_HANDLE h) { if (*(int *)h != T_PZ) return ERR(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_PZ); *(int *)h = 0; free(h); return DAT_SUCCESS; }

DAT_RETURN dat_evd_free(DAT_EVD_HANDLE h) {
	struct evd *e = h;
	if (!e || e->type != T_EVD) return ERR(DAT_INVALID_HANDLE, 0);
	pthread_mutex_lock(&mu);
	if (e->waiting) { pthread_mutex_unlock(&mu); return ERR(DAT_INVALID_STATE, DAT_INVALID_STATE_EVD_IN_USE); }
	e->type = 0;
	pthread_mutex_unlock(&mu);
	return DAT_SUCCESS;
}

static DAT_RETURN pop(struct evd *e, DAT_EVENT *ev) {
	if (e->count == 0) return ERR(DAT_QUEUE_EMPTY, 0);
	*ev = e->q[e->head]; e->head = (e->head + 1) % e->qlen; e->count--;
	return DAT_SUCCESS;
}

DAT_RETURN dat_evd_dequeue(DAT_EVD_HANDLE h, DAT_EVENT *ev) {
	struct evd *e = h;
	if (!e || e->type != T_EVD) return ERR(DAT_INVALID_HANDLE, 0);
	pthread_mutex_lock(&mu);
	DAT_RETURN rc;
	if (e->fail) rc = e->fail;
	else if (e->waiting || e->overflow) rc = ERR(DAT_INVALID_STATE, 0); /* dapl's rule */
	else rc = pop(e, ev);
	pthread_mutex_unlock(&mu);
	return rc;
}

DAT_RETURN dat_evd_wait(DAT_EVD_HANDLE h, DAT_TIMEOUT us, DAT_COUNT thr, DAT_EVENT *ev, DAT_COUNT *nmore) {
	struct evd *e = h;
	if (!e || e->type != T_EVD) return ERR(DAT_INVALID_HANDLE, 0);
	if (thr != 1) return ERR(DAT_INVALID_PARAMETER, DAT_INVALID_ARG3);
	struct timespec dl; clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += us / 1000000; dl.tv_nsec += (long)(us % 1000000) * 1000;
	if (dl.tv_nsec >= 1000000000) { dl.tv_sec++; dl.tv_nsec -= 1000000000; }
	pthread_mutex_lock(&mu);
	if (e->fail) { DAT_RETURN rc = e->fail; pthread_mutex_unlock(&mu); return rc; }
	if (e->waiting || e->overflow) { pthread_mutex_unlock(&mu); return ERR(DAT_INVALID_STATE, 0); }
	e->waiting = 1;
	DAT_RETURN rc = DAT_SUCCESS;
	while (e->count == 0 && !e->fail && !e->overflow) {
		if (pthread_cond_timedwait(&cv, &mu, &dl) == ETIMEDOUT) { rc = ERR(DAT_TIMEOUT_EXPIRED, 0); break; }
	}
	if (rc == DAT_SUCCESS && e->fail) rc = e->fail;
	else if (rc == DAT_SUCCESS && e->overflow) rc = ERR(DAT_INVALID_STATE, 0);
	if (rc == DAT_SUCCESS) pop(e, ev);
	*nmore = e->count;
	e->waiting = 0;
	pthread_mutex_unlock(&mu);
	return rc;
}

DAT_RETURN dat_psp_create(DAT_IA_HANDLE ia, DAT_CONN_QUAL q, DAT_EVD_HANDLE evd, DAT_PSP_FLAGS f, DAT_PSP_HANDLE *out) {
	pthread_mutex_lock(&mu);
	for (struct psp *p = psps; p; p = p->next)
		if (p->qual == q) { pthread_mutex_unlock(&mu); return ERR(DAT_CONN_QUAL_IN_USE, 0); }
	struct psp *p = calloc(1, sizeof *p);
	p->type = T_PSP; p->qual = q; p->evd = evd; p->next = psps; psps = p;
	*out = p;
	pthread_mutex_unlock(&mu);
	return DAT_SUCCESS;
}

DAT_RETURN dat_psp_free(DAT_PSP_HANDLE h) {
	pthread_mutex_lock(&mu);
	for (struct psp **pp = &psps; *pp; pp = &(*pp)->next)
		if (*pp == h) { *pp = (*pp)->next; ((struct psp *)h)->type = 0; free(h); pthread_mutex_unlock(&mu); return DAT_SUCCESS; }
	pthread_mutex_unlock(&mu);
	return ERR(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_PSP);
}

DAT_RETURN dat_ep_create(DAT_IA_HANDLE ia, DAT_PZ_HANDLE pz, DAT_EVD_HANDLE recv, DAT_EVD_HANDLE req, DAT_EVD_HANDLE conn,
		const DAT_EP_ATTR *a, DAT_EP_HANDLE *out) {
	if (!a || a->max_recv_dtos > 1024 || a->max_request_dtos > 1024 || recv != req) return ERR(DAT_INVALID_PARAMETER, DAT_INVALID_ARG6);
	struct ep *ep = calloc(1, sizeof *ep);
	ep->type = T_EP; ep->ia = ia; ep->dto = recv; ep->conn = conn; ep->maxr = a->max_recv_dtos; ep->maxs = a->max_request_dtos;
	ep->rq = calloc(ep->maxr, sizeof *ep->rq);
	*out = ep;
	return DAT_SUCCESS;
}

DAT_RETURN dat_ep_connect(DAT_EP_HANDLE h, DAT_IA_ADDRESS_PTR addr, DAT_CONN_QUAL q, DAT_TIMEOUT t, DAT_COUNT pdlen,
		const DAT_PVOID pd, DAT_QOS qos, DAT_CONNECT_FLAGS fl) {
	struct ep *ep = h;
	if (pdlen > 56) return ERR(DAT_INVALID_PARAMETER, DAT_INVALID_ARG5);
	pthread_mutex_lock(&mu);
	if (ep->state != S_UNCONN) { pthread_mutex_unlock(&mu); return ERR(DAT_INVALID_STATE, DAT_INVALID_STATE_EP_CONNECTED); }
	ep->state = S_ACTIVE;
	struct psp *p = NULL;
	if (addr->sa_family == AF_INET && ((struct sockaddr_in *)addr)->sin_addr.s_addr == iaaddr.sin_addr.s_addr)
		for (p = psps; p && p->qual != q; p = p->next) ;
	if (!p) {
		ep->state = S_DISC;
		post_conn(ep, DAT_CONNECTION_EVENT_NON_PEER_REJECTED);
	} else {
		struct cr *cr = calloc(1, sizeof *cr);
		cr->type = T_CR; cr->active = ep;
		memcpy(cr->pd, pd, pdlen); /* the rest stays zero: IB pads to 56 */
		DAT_EVENT ev; memset(&ev, 0, sizeof ev);
		ev.event_number = DAT_CONNECTION_REQUEST_EVENT;
		ev.event_data.cr_arrival_event_data.cr_handle = cr;
		ev.event_data.cr_arrival_event_data.conn_qual = q;
		post(p->evd, &ev);
	}
	pthread_mutex_unlock(&mu);
	return DAT_SUCCESS;
}

DAT_RETURN dat_cr_query(DAT_CR_HANDLE h, DAT_CR_PARAM_MASK m, DAT_CR_PARAM *p) {
	struct cr *cr = h;
	if (!cr || cr->type != T_CR) return ERR(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_CR);
	p->private_data_size = 56;
	p->private_data = cr->pd;
	return DAT_SUCCESS;
}

#define MAXPENDING 256
static struct ep *pending[MAXPENDING]; /* passive endpoints waiting for the RTU */

static void *rtu(void *arg) {
	struct timespec d = { 0, 2000000 };
	nanosleep(&d, NULL);
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAXPENDING; i++) {
		struct ep *ep = pending[i];
		if (ep == NULL) continue;
		pending[i] = NULL;
		if (ep->state == S_PASSIVE) { ep->state = S_CONN; post_conn(ep, DAT_CONNECTION_EVENT_ESTABLISHED); }
	}
	pthread_mutex_unlock(&mu);
	return NULL;
}

DAT_RETURN dat_cr_accept(DAT_CR_HANDLE h, DAT_EP_HANDLE eh, DAT_COUNT n, const DAT_PVOID pd) {
	struct cr *cr = h; struct ep *ep = eh;
	if (!cr || cr->type != T_CR) return ERR(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_CR);
	pthread_mutex_lock(&mu);
	struct ep *a = cr->active;
	cr->type = 0; free(cr);
	if (a->state != S_ACTIVE) { /* the dialer gave up */
		pthread_mutex_unlock(&mu);
		return ERR(DAT_INVALID_STATE, 0);
	}
	/* the active side is established at once; the passive side when the
	 * RTU arrives, a little later */
	ep->state = S_PASSIVE; a->state = S_CONN;
	ep->peer = a; a->peer = ep;
	post_conn(a, DAT_CONNECTION_EVENT_ESTABLISHED);
	for (int i = 0; i < MAXPENDING; i++)
		if (pending[i] == NULL) { pending[i] = ep; break; }
	pthread_t t;
	pthread_create(&t, NULL, rtu, NULL);
	pthread_detach(t);
	pthread_mutex_unlock(&mu);
	return DAT_SUCCESS;
}

DAT_RETURN dat_cr_reject(DAT_CR_HANDLE h, DAT_COUNT n, const DAT_PVOID pd) {
	struct cr *cr = h;
	if (!cr || cr->type != T_CR) return ERR(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_CR);
	pthread_mutex_lock(&mu);
	struct ep *a = cr->active;
	cr->type = 0; free(cr);
	if (a->state == S_ACTIVE) { a->state = S_DISC; post_conn(a, DAT_CONNECTION_EVENT_PEER_REJECTED); }
	pthread_mutex_unlock(&mu);
	return DAT_SUCCESS;
}

DAT_RETURN dat_ep_disconnect(DAT_EP_HANDLE h, DAT_CLOSE_FLAGS f) {
	struct ep *ep = h;
	if (!ep || ep->type != T_EP) return ERR(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_EP);
	pthread_mutex_lock(&mu);
	if (ep->state == S_CONN || ep->state == S_ACTIVE || ep->state == S_PASSIVE) break_ep(ep, 1);
	else if (ep->state == S_DISC) flush_recvs(ep); /* the QP to error, again: dapl leaves it so */
	pthread_mutex_unlock(&mu);
	return DAT_SUCCESS;
}

DAT_RETURN dat_ep_free(DAT_EP_HANDLE h) {
	struct ep *ep = h;
	if (!ep || ep->type != T_EP) return ERR(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_EP);
	pthread_mutex_lock(&mu);
	if (ep->state == S_PASSIVE) { pthread_mutex_unlock(&mu); return ERR(DAT_INVALID_STATE, DAT_INVALID_STATE_EP_PASSCONNPENDING); }
	if (ep->state == S_CONN) break_ep(ep, 1);
	if (ep->state == S_ERR && ep->peer && ep->peer->state == S_CONN) {
		/* destroying the connected CM id sends the peer a DREQ */
		post_conn(ep->peer, DAT_CONNECTION_EVENT_DISCONNECTED);
		ep->peer->peer = NULL;
	}
	if (ep->peer && ep->peer->peer == ep) ep->peer->peer = NULL;
	for (int i = 0; i < MAXPENDING; i++)
		if (pending[i] == ep) pending[i] = NULL;
	/* receives never flushed are dropped, as a device that cleans the
	 * CQ of a destroyed QP does */
	ep->nr = 0;
	ep->type = 0;
	free(ep->rq);
	free(ep); /* the next dat_ep_create may get this address back */
	pthread_mutex_unlock(&mu);
	return DAT_SUCCESS;
}

DAT_RETURN dat_lmr_create(DAT_IA_HANDLE ia, DAT_MEM_TYPE t, DAT_REGION_DESCRIPTION d, DAT_VLEN len, DAT_PZ_HANDLE pz,
		DAT_MEM_PRIV_FLAGS priv, DAT_VA_TYPE va, DAT_LMR_HANDLE *out, DAT_LMR_CONTEXT *lc, DAT_RMR_CONTEXT *rc,
		DAT_VLEN *rl, DAT_VADDR *ra) {
	if (t != DAT_MEM_TYPE_VIRTUAL || len == 0) return ERR(DAT_INVALID_PARAMETER, DAT_INVALID_ARG2);
	pthread_mutex_lock(&mu);
	struct lmr *l = calloc(1, sizeof *l);
	l->type = T_LMR; l->addr = (uint64_t)(uintptr_t)d.for_va; l->len = len; l->ctx = nextctx++;
	l->next = lmrs; lmrs = l;
	*out = l; *lc = l->ctx; *rc = l->ctx; *rl = len; *ra = l->addr;
	pthread_mutex_unlock(&mu);
	return DAT_SUCCESS;
}

DAT_RETURN dat_lmr_free(DAT_LMR_HANDLE h) {
	pthread_mutex_lock(&mu);
	for (struct lmr **pp = &lmrs; *pp; pp = &(*pp)->next)
		if (*pp == h) { *pp = (*pp)->next; free(h); pthread_mutex_unlock(&mu); return DAT_SUCCESS; }
	pthread_mutex_unlock(&mu);
	return ERR(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_LMR);
}

static struct lmr *find(uint32_t ctx, uint64_t va, uint32_t len) {
	for (struct lmr *l = lmrs; l; l = l->next)
		if (l->ctx == ctx && va >= l->addr && va + len <= l->addr + l->len) return l;
	return NULL;
}

DAT_RETURN dat_ep_post_recv(DAT_EP_HANDLE h, DAT_COUNT n, DAT_LMR_TRIPLET *iov, DAT_DTO_COOKIE c, DAT_COMPLETION_FLAGS f) {
	struct ep *ep = h;
	if (!ep || ep->type != T_EP) return ERR(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_EP);
	pthread_mutex_lock(&mu);
	if (!find(iov->lmr_context, iov->virtual_address, iov->segment_length)) { pthread_mutex_unlock(&mu); return ERR(DAT_PROTECTION_VIOLATION, 0); }
	if (ep->nr == ep->maxr) { pthread_mutex_unlock(&mu); return ERR(DAT_INSUFFICIENT_RESOURCES, DAT_RESOURCE_TEP); }
	if (ep->state == S_DISC || ep->qperr) post_dto(ep, c.as_64, DAT_DTO_ERR_FLUSHED, 0, DAT_DTO_RECEIVE);
	else ep->rq[ep->nr++] = (struct rv){ c.as_64, iov->virtual_address, iov->segment_length };
	pthread_mutex_unlock(&mu);
	return DAT_SUCCESS;
}

DAT_RETURN dat_ep_post_send(DAT_EP_HANDLE h, DAT_COUNT n, DAT_LMR_TRIPLET *iov, DAT_DTO_COOKIE c, DAT_COMPLETION_FLAGS f) {
	struct ep *ep = h;
	if (!ep || ep->type != T_EP) return ERR(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_EP);
	pthread_mutex_lock(&mu);
	DAT_RETURN rc = DAT_SUCCESS;
	if (!find(iov->lmr_context, iov->virtual_address, iov->segment_length)) rc = ERR(DAT_PROTECTION_VIOLATION, 0);
	else if (ep->state != S_CONN) rc = ERR(DAT_INVALID_STATE, DAT_INVALID_STATE_EP_DISCONNECTED);
	else if (ep->qperr) post_dto(ep, c.as_64, DAT_DTO_ERR_FLUSHED, 0, DAT_DTO_SEND);
	else if (ep->peer && ep->peer->state == S_ERR) {
		/* the peer's QP is in error: the send's retries run out */
		post_dto(ep, c.as_64, DAT_DTO_ERR_TRANSPORT, 0, DAT_DTO_SEND);
		break_ep(ep, 1);
	} else if (!ep->peer || ep->peer->nr == 0 || ep->peer->rq[0].len < iov->segment_length) {
		post_dto(ep, c.as_64, DAT_DTO_ERR_RECEIVER_NOT_READY, 0, DAT_DTO_SEND);
		break_ep(ep, 1);
	} else {
		struct ep *q = ep->peer;
		struct rv r = q->rq[0];
		memmove(q->rq, q->rq + 1, (q->nr - 1) * sizeof *q->rq); q->nr--;
		memcpy((void *)(uintptr_t)r.va, (void *)(uintptr_t)iov->virtual_address, iov->segment_length);
		post_dto(q, r.cookie, DAT_DTO_SUCCESS, iov->segment_length, DAT_DTO_RECEIVE);
		post_dto(ep, c.as_64, DAT_DTO_SUCCESS, iov->segment_length, DAT_DTO_SEND);
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

DAT_RETURN dat_ep_post_rdma_read(DAT_EP_HANDLE h, DAT_COUNT n, DAT_LMR_TRIPLET *iov, DAT_DTO_COOKIE c,
		const DAT_RMR_TRIPLET *r, DAT_COMPLETION_FLAGS f) {
	struct ep *ep = h;
	if (!ep || ep->type != T_EP) return ERR(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_EP);
	pthread_mutex_lock(&mu);
	DAT_RETURN rc = DAT_SUCCESS;
	if (!find(iov->lmr_context, iov->virtual_address, iov->segment_length)) rc = ERR(DAT_PROTECTION_VIOLATION, 0);
	else if (ep->state != S_CONN) rc = ERR(DAT_INVALID_STATE, DAT_INVALID_STATE_EP_DISCONNECTED);
	else if (ep->qperr) post_dto(ep, c.as_64, DAT_DTO_ERR_FLUSHED, 0, DAT_DTO_RDMA_READ);
	else if (!find(r->rmr_context, r->virtual_address, r->segment_length) || r->segment_length != iov->segment_length) {
		/* the local QP goes to error; the connection stays up until
		 * someone disconnects it */
		post_dto(ep, c.as_64, DAT_DTO_ERR_REMOTE_ACCESS, 0, DAT_DTO_RDMA_READ);
		ep->qperr = 1;
		flush_recvs(ep);
	} else {
		memcpy((void *)(uintptr_t)iov->virtual_address, (void *)(uintptr_t)r->virtual_address, iov->segment_length);
		post_dto(ep, c.as_64, DAT_DTO_SUCCESS, iov->segment_length, DAT_DTO_RDMA_READ);
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

DAT_RETURN dat_ep_get_status(DAT_EP_HANDLE h, DAT_EP_STATE *st, DAT_BOOLEAN *in_idle, DAT_BOOLEAN *out_idle) {
	struct ep *ep = h;
	if (!ep || ep->type != T_EP) return ERR(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_EP);
	pthread_mutex_lock(&mu);
	switch (ep->state) {
	case S_UNCONN: *st = DAT_EP_STATE_UNCONNECTED; break;
	case S_ACTIVE: *st = DAT_EP_STATE_ACTIVE_CONNECTION_PENDING; break;
	case S_PASSIVE: *st = DAT_EP_STATE_PASSIVE_CONNECTION_PENDING; break;
	case S_CONN: *st = DAT_EP_STATE_CONNECTED; break;
	case S_ERR: *st = DAT_EP_STATE_ERROR; break;
	default: *st = DAT_EP_STATE_DISCONNECTED; break;
	}
	if (in_idle) *in_idle = ep->nr == 0;
	if (out_idle) *out_idle = DAT_TRUE;
	pthread_mutex_unlock(&mu);
	return DAT_SUCCESS;
}

/*
 * Test-only entry points. None is part of DAT; the provider never calls
 * them. Each returns 0, or an errno value for a handle of the wrong kind.
 */

static void post_async(struct ia *ia, DAT_EVENT_NUMBER n, DAT_HANDLE about, DAT_COUNT reason) {
	DAT_EVENT ev; memset(&ev, 0, sizeof ev);
	ev.event_number = n;
	ev.event_data.asynch_error_event_data.dat_handle = about;
	ev.event_data.asynch_error_event_data.reason = reason;
	post(ia->async, &ev);
}

/* fakedat_break_ep breaks the queue pair of a connected endpoint as a
 * device's QP_FATAL does (see the header), and reports n
 * (DAT_ASYNC_ERROR_EP_BROKEN or _TIMED_OUT) on its IA's async EVD naming
 * the IA, as dapl does, or the endpoint, as the DAT spec reads. */
int fakedat_break_ep(DAT_EP_HANDLE h, DAT_EVENT_NUMBER n, int name_ep) {
	struct ep *ep = h;
	if (!ep || ep->type != T_EP) return EINVAL;
	pthread_mutex_lock(&mu);
	if (ep->state != S_CONN) { pthread_mutex_unlock(&mu); return EAGAIN; }
	ep->state = S_ERR;
	ep->qperr = 1;
	post_async(ep->ia, n, name_ep ? (DAT_HANDLE)ep : (DAT_HANDLE)ep->ia, 0);
	pthread_mutex_unlock(&mu);
	return 0;
}

/* fakedat_inject_async posts asynchronous error n about the handle about
 * on the IA's async EVD, and does nothing else. */
int fakedat_inject_async(DAT_IA_HANDLE h, DAT_EVENT_NUMBER n, DAT_HANDLE about) {
	struct ia *ia = h;
	if (!ia || ia->type != T_IA) return EINVAL;
	pthread_mutex_lock(&mu);
	post_async(ia, n, about, 0);
	pthread_mutex_unlock(&mu);
	return 0;
}

/* fakedat_overflow_evd overflows the EVD as a full completion queue does:
 * every later wait and dequeue on it fails, and the IA's async EVD gets
 * DAT_ASYNC_ERROR_EVD_OVERFLOW naming the IA (dapl's
 * dapl_evd_cq_async_error_callback does) or, with name_evd, the EVD. */
int fakedat_overflow_evd(DAT_IA_HANDLE h, DAT_EVD_HANDLE eh, int name_evd) {
	struct ia *ia = h; struct evd *e = eh;
	if (!ia || ia->type != T_IA || !e || e->type != T_EVD) return EINVAL;
	pthread_mutex_lock(&mu);
	e->overflow = 1;
	post_async(ia, DAT_ASYNC_ERROR_EVD_OVERFLOW, name_evd ? (DAT_HANDLE)e : (DAT_HANDLE)ia, 0);
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	return 0;
}

/* fakedat_fail_evd makes every later wait and dequeue on the EVD return
 * rc, and reports nothing. */
int fakedat_fail_evd(DAT_EVD_HANDLE eh, DAT_RETURN rc) {
	struct evd *e = eh;
	if (!e || e->type != T_EVD || rc == DAT_SUCCESS) return EINVAL;
	pthread_mutex_lock(&mu);
	e->fail = rc;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	return 0;
}

/* fakedat_conn_event posts connection event n for the endpoint on its
 * connection EVD, as the CM reports a connection that broke or timed out;
 * the endpoint's state is left to the provider's dat_ep_disconnect. */
int fakedat_conn_event(DAT_EP_HANDLE h, DAT_EVENT_NUMBER n) {
	struct ep *ep = h;
	if (!ep || ep->type != T_EP) return EINVAL;
	pthread_mutex_lock(&mu);
	post_conn(ep, n);
	pthread_mutex_unlock(&mu);
	return 0;
}

/* fakedat_queued reports the events queued on the EVD and not yet
 * dequeued. */
int fakedat_queued(DAT_EVD_HANDLE eh, int *n) {
	struct evd *e = eh;
	if (!e || e->type != T_EVD) return EINVAL;
	pthread_mutex_lock(&mu);
	*n = e->count;
	pthread_mutex_unlock(&mu);
	return 0;
}
