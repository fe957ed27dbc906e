// Helpers for the cgo files of package verbs (build tag "verbs").
//
// The verbs API passes work requests and completions as structs with unions
// and calls its data path through static inline functions (ibv_post_send,
// ibv_poll_cq, ibv_req_notify_cq, ibv_query_port, ibv_reg_mr). Go cannot
// call those or build those unions, so these helpers take plain scalars,
// fill plain structs and return 0 or -errno. Everything here is static: each
// cgo file that includes this header gets its own copy.

#ifndef MDV_CVERBS_H
#define MDV_CVERBS_H

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

// mdv_wc is the part of struct ibv_wc the provider reads.
struct mdv_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t vendor_err;
	uint32_t byte_len;
	uint32_t qp_num;
};

// mdv_cm_event is a copy of the struct rdma_cm_event fields the provider
// reads, so the Go side never reads library-owned event memory.
struct mdv_cm_event {
	struct rdma_cm_id *id;
	struct rdma_cm_id *listen_id;
	int event;
	int status;
	uint8_t private_len;
	uint8_t private_data[56];
};

// mdv_limits are the device and port attributes the provider sizes by.
struct mdv_limits {
	int max_qp_wr;
	int max_cqe;
	int max_sge;
	uint64_t max_mr_size;
	uint32_t max_msg_sz;
	int port_state;
};

// mdv_sockaddr builds a sockaddr from an address in network order (4 or 16
// bytes by family) and a port in host order.
static socklen_t mdv_sockaddr(struct sockaddr_storage *ss, int family, const uint8_t *ip, uint16_t port) {
	memset(ss, 0, sizeof *ss);
	if (family == 4) {
		struct sockaddr_in *sin = (struct sockaddr_in *)ss;
		sin->sin_family = AF_INET;
		sin->sin_port = htons(port);
		memcpy(&sin->sin_addr, ip, 4);
		return sizeof *sin;
	}
	struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)ss;
	sin6->sin6_family = AF_INET6;
	sin6->sin6_port = htons(port);
	memcpy(&sin6->sin6_addr, ip, 16);
	return sizeof *sin6;
}

static int mdv_create_id(struct rdma_event_channel *ch, struct rdma_cm_id **id) {
	if (rdma_create_id(ch, id, NULL, RDMA_PS_TCP))
		return -errno;
	return 0;
}

static int mdv_bind(struct rdma_cm_id *id, int family, const uint8_t *ip, uint16_t port) {
	struct sockaddr_storage ss;
	mdv_sockaddr(&ss, family, ip, port);
	if (rdma_bind_addr(id, (struct sockaddr *)&ss))
		return -errno;
	return 0;
}

static int mdv_listen(struct rdma_cm_id *id, int backlog) {
	if (rdma_listen(id, backlog))
		return -errno;
	return 0;
}

// mdv_local_addr reports the address and port a bound id listens on; family
// is 4, 6 or 0 for anything else.
static void mdv_local_addr(struct rdma_cm_id *id, int *family, uint8_t *ip, uint16_t *port) {
	struct sockaddr *sa = rdma_get_local_addr(id);
	*port = ntohs(rdma_get_src_port(id));
	*family = 0;
	if (sa->sa_family == AF_INET) {
		*family = 4;
		memcpy(ip, &((struct sockaddr_in *)sa)->sin_addr, 4);
	} else if (sa->sa_family == AF_INET6) {
		*family = 6;
		memcpy(ip, &((struct sockaddr_in6 *)sa)->sin6_addr, 16);
	}
}

static const char *mdv_device_name(struct rdma_cm_id *id) {
	return ibv_get_device_name(id->verbs->device);
}

static int mdv_query(struct ibv_context *ctx, uint8_t port, struct mdv_limits *out) {
	struct ibv_device_attr da;
	struct ibv_port_attr pa;
	int ret = ibv_query_device(ctx, &da);
	if (ret)
		return -ret;
	ret = ibv_query_port(ctx, port, &pa);
	if (ret)
		return -ret;
	out->max_qp_wr = da.max_qp_wr;
	out->max_cqe = da.max_cqe;
	out->max_sge = da.max_sge;
	out->max_mr_size = da.max_mr_size;
	out->max_msg_sz = pa.max_msg_sz;
	out->port_state = pa.state;
	return 0;
}

static int mdv_resolve_addr(struct rdma_cm_id *id, int family, const uint8_t *src, const uint8_t *dst, uint16_t dport, int timeout_ms) {
	struct sockaddr_storage s, d;
	mdv_sockaddr(&s, family, src, 0);
	mdv_sockaddr(&d, family, dst, dport);
	if (rdma_resolve_addr(id, (struct sockaddr *)&s, (struct sockaddr *)&d, timeout_ms))
		return -errno;
	return 0;
}

static int mdv_resolve_route(struct rdma_cm_id *id, int timeout_ms) {
	if (rdma_resolve_route(id, timeout_ms))
		return -errno;
	return 0;
}

// mdv_create_qp makes the id's RC queue pair on the shared PD and CQ. Every
// send is signaled: the engine wants a completion for each work request.
static int mdv_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_cq *cq, uint32_t send_wr, uint32_t recv_wr) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = 1;
	a.cap.max_send_wr = send_wr;
	a.cap.max_recv_wr = recv_wr;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	if (rdma_create_qp(id, pd, &a))
		return -errno;
	return 0;
}

// mdv_conn_param fills what rdma_connect and rdma_accept share. RDMA read
// depths are left to librdmacm (0xFF: the device's maximum, negotiated down
// to the peer's on accept). rnr_retry_count 0 makes a send that finds no
// receive posted fail the connection at once, as the rdma.Endpoint contract
// says, instead of retrying forever.
static void mdv_conn_param(struct rdma_conn_param *p, const void *priv, uint8_t priv_len) {
	memset(p, 0, sizeof *p);
	p->private_data = priv;
	p->private_data_len = priv_len;
	p->responder_resources = RDMA_MAX_RESP_RES;
	p->initiator_depth = RDMA_MAX_INIT_DEPTH;
	p->retry_count = 7;
	p->rnr_retry_count = 0;
}

static int mdv_connect(struct rdma_cm_id *id, const void *priv, uint8_t priv_len) {
	struct rdma_conn_param p;
	mdv_conn_param(&p, priv, priv_len);
	if (rdma_connect(id, &p))
		return -errno;
	return 0;
}

static int mdv_accept(struct rdma_cm_id *id) {
	struct rdma_conn_param p;
	mdv_conn_param(&p, NULL, 0);
	if (rdma_accept(id, &p))
		return -errno;
	return 0;
}

static int mdv_reject(struct rdma_cm_id *id) {
	if (rdma_reject(id, NULL, 0))
		return -errno;
	return 0;
}

static int mdv_disconnect(struct rdma_cm_id *id) {
	if (rdma_disconnect(id))
		return -errno;
	return 0;
}

static int mdv_destroy_id(struct rdma_cm_id *id) {
	if (rdma_destroy_id(id))
		return -errno;
	return 0;
}

static struct ibv_qp *mdv_qp(struct rdma_cm_id *id) { return id->qp; }
static struct ibv_context *mdv_verbs(struct rdma_cm_id *id) { return id->verbs; }
static uint8_t mdv_port_num(struct rdma_cm_id *id) { return id->port_num; }

// mdv_qp_error moves a QP to the error state, which flushes its posted work
// into the CQ.
static int mdv_qp_error(struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_ERR;
	return -ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

// mdv_get_cm_event takes one event off a non-blocking channel and copies
// it; the caller acks *ev once it has looked the id up. rdma_destroy_id
// waits for the acks of its id's events, so an id cannot be freed, and its
// address reused by a new id, between taking its event and that lookup.
static int mdv_get_cm_event(struct rdma_event_channel *ch, struct mdv_cm_event *out, struct rdma_cm_event **ev) {
	if (rdma_get_cm_event(ch, ev))
		return -errno;
	memset(out, 0, sizeof *out);
	out->id = (*ev)->id;
	out->listen_id = (*ev)->listen_id;
	out->event = (*ev)->event;
	out->status = (*ev)->status;
	if ((*ev)->event == RDMA_CM_EVENT_CONNECT_REQUEST && (*ev)->param.conn.private_data) {
		uint8_t n = (*ev)->param.conn.private_data_len;
		if (n > sizeof out->private_data)
			n = sizeof out->private_data;
		memcpy(out->private_data, (*ev)->param.conn.private_data, n);
		out->private_len = n;
	}
	return 0;
}

static struct ibv_mr *mdv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int *err) {
	/* Peers only read; remote write would let any holder of an rkey
	 * write into any registered buffer. */
	struct ibv_mr *mr = ibv_reg_mr(pd, addr, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	*err = mr ? 0 : errno;
	return mr;
}

// The post helpers return 0 or the errno the provider's post returned. A
// zero-length transfer posts no scatter/gather entry: some adapters read a
// zero SGE length as 2 GiB.

static int mdv_post_recv(struct ibv_qp *qp, uint64_t wr_id, uint64_t addr, uint32_t len, uint32_t lkey) {
	struct ibv_sge sge = {.addr = addr, .length = len, .lkey = lkey};
	struct ibv_recv_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = len ? 1 : 0;
	return ibv_post_recv(qp, &wr, &bad);
}

static int mdv_post_send(struct ibv_qp *qp, uint64_t wr_id, uint64_t addr, uint32_t len, uint32_t lkey) {
	struct ibv_sge sge = {.addr = addr, .length = len, .lkey = lkey};
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = len ? 1 : 0;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(qp, &wr, &bad);
}

static int mdv_post_read(struct ibv_qp *qp, uint64_t wr_id, uint64_t addr, uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey) {
	struct ibv_sge sge = {.addr = addr, .length = len, .lkey = lkey};
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = len ? 1 : 0;
	wr.opcode = IBV_WR_RDMA_READ;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

// mdv_poll moves up to n completions into out and returns how many, or the
// provider's negative poll result when the CQ failed.
static int mdv_poll(struct ibv_cq *cq, struct mdv_wc *out, int n) {
	struct ibv_wc wc[32];
	int total = 0;
	while (total < n) {
		int want = n - total;
		if (want > 32)
			want = 32;
		int got = ibv_poll_cq(cq, want, wc);
		if (got < 0)
			return got;
		for (int i = 0; i < got; i++) {
			out[total + i].wr_id = wc[i].wr_id;
			out[total + i].status = wc[i].status;
			out[total + i].vendor_err = wc[i].vendor_err;
			out[total + i].byte_len = wc[i].byte_len;
			out[total + i].qp_num = wc[i].qp_num;
		}
		total += got;
		if (got < want)
			break;
	}
	return total;
}

static int mdv_req_notify(struct ibv_cq *cq) {
	return -ibv_req_notify_cq(cq, 0);
}

// mdv_get_cq_events drains the non-blocking completion channel and acks what
// it took; it returns how many events there were, or -errno.
static int mdv_get_cq_events(struct ibv_comp_channel *ch) {
	struct ibv_cq *cq;
	void *ctx;
	int n = 0;
	for (;;) {
		if (ibv_get_cq_event(ch, &cq, &ctx)) {
			if (errno == EAGAIN || errno == EWOULDBLOCK || n > 0)
				return n;
			return -errno;
		}
		ibv_ack_cq_events(cq, 1);
		n++;
	}
}

// mdv_async_event is the part of an asynchronous event the provider reads.
// The element union is read by event type, as ibv_get_async_event(3) says:
// a QP for the QP events, the CQ for IBV_EVENT_CQ_ERR, the port number for
// the port events and IBV_EVENT_DEVICE_FATAL, an SRQ or WQ (never made
// here) for their own events.
struct mdv_async_event {
	int event_type;
	struct ibv_qp *qp;
	uint32_t qp_num;
	struct ibv_cq *cq;
	int port;
};

static int mdv_async_fd(struct ibv_context *ctx) { return ctx->async_fd; }

// mdv_get_async_event takes one event off the context's non-blocking async
// fd and copies it; the caller acks *raw with ibv_ack_async_event once it
// has looked the element up: ibv_destroy_qp and ibv_destroy_cq wait for the
// acks of their object's events, so a QP cannot be freed, and its number
// reused, between taking its event and that lookup.
static int mdv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *raw, struct mdv_async_event *out) {
	if (ibv_get_async_event(ctx, raw))
		return -errno;
	memset(out, 0, sizeof *out);
	out->event_type = raw->event_type;
	switch (raw->event_type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		out->qp = raw->element.qp;
		out->qp_num = raw->element.qp->qp_num;
		break;
	case IBV_EVENT_CQ_ERR:
		out->cq = raw->element.cq;
		break;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
	case IBV_EVENT_WQ_FATAL:
		break;
	default:
		out->port = raw->element.port_num;
	}
	return 0;
}

// mdv_notify_comm_est tells librdmacm that data came on the id's QP before
// the connection was established (IBV_EVENT_COMM_EST), so that it
// completes the connection; EISCONN means it had already.
static int mdv_notify_comm_est(struct rdma_cm_id *id) {
	if (rdma_notify(id, IBV_EVENT_COMM_EST))
		return -errno;
	return 0;
}

#endif
