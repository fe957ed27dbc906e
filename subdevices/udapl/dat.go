//go:build udapl && cgo

package udapl

// This file is the only one that speaks C. The helpers in the preamble take
// and return plain scalars and flat structs of scalars, so Go never builds
// or reads a DAT union or attribute struct, and every DAT call the provider
// makes has a Go wrapper here returning a datStatus.

/*
#cgo CFLAGS: -I/usr/include/dat2
#cgo LDFLAGS: -ldat2
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <dat2/udat.h>

// ud_first_provider copies the IA name of the registry's first entry into
// name (DAT_NAME_MAX_LENGTH bytes) and sets *found.
static DAT_RETURN ud_first_provider(char *name, int *found) {
	DAT_PROVIDER_INFO info;
	DAT_PROVIDER_INFO *list[1] = { &info };
	DAT_COUNT n = 0;
	DAT_RETURN rc;

	*found = 0;
	memset(&info, 0, sizeof info);
	rc = dat_registry_list_providers(1, &n, list);
	if (rc == DAT_SUCCESS && n > 0) {
		memcpy(name, info.ia_name, DAT_NAME_MAX_LENGTH);
		name[DAT_NAME_MAX_LENGTH - 1] = 0;
		*found = 1;
	}
	return rc;
}

static DAT_RETURN ud_ia_open(const char *name, DAT_COUNT async_qlen, DAT_HANDLE *ia, DAT_HANDLE *async_evd) {
	DAT_IA_HANDLE h = DAT_HANDLE_NULL;
	DAT_EVD_HANDLE a = DAT_HANDLE_NULL; // NULL: the provider creates the async EVD and frees it with the IA
	DAT_RETURN rc = dat_ia_open((const DAT_NAME_PTR)name, async_qlen, &a, &h);
	*ia = h;
	*async_evd = a;
	return rc;
}

// ud_ia_info is what the provider needs from dat_ia_query.
typedef struct {
	int family;                 // AF_INET, AF_INET6 or what the provider reports
	uint8_t addr[16];           // the IA address, network order
	uint32_t flowinfo;          // sin6_flowinfo: non-zero where a provider packs non-IP data into the sockaddr
	DAT_COUNT max_dto_per_ep;
	DAT_COUNT max_rdma_read_in;
	DAT_COUNT max_rdma_read_out;
	DAT_COUNT max_evd_qlen;
	uint32_t max_message_size;
	uint32_t max_rdma_size;
	DAT_COUNT max_private;      // the provider's max_private_data_size
} ud_ia_info;

static DAT_RETURN ud_ia_query(DAT_HANDLE ia, ud_ia_info *out) {
	DAT_EVD_HANDLE async;
	DAT_IA_ATTR a;
	DAT_PROVIDER_ATTR p;
	DAT_RETURN rc;

	memset(&a, 0, sizeof a);
	memset(&p, 0, sizeof p);
	memset(out, 0, sizeof *out);
	rc = dat_ia_query(ia, &async,
		DAT_IA_FIELD_IA_ADDRESS_PTR | DAT_IA_FIELD_IA_MAX_DTO_PER_EP |
		DAT_IA_FIELD_IA_MAX_RDMA_READ_PER_EP_IN | DAT_IA_FIELD_IA_MAX_RDMA_READ_PER_EP_OUT |
		DAT_IA_FIELD_IA_MAX_EVD_QLEN | DAT_IA_FIELD_IA_MAX_MESSAGE_SIZE | DAT_IA_FIELD_IA_MAX_RDMA_SIZE,
		&a, DAT_PROVIDER_FIELD_MAX_PRIVATE_DATA_SIZE, &p);
	if (rc != DAT_SUCCESS)
		return rc;
	if (a.ia_address_ptr != NULL) {
		out->family = a.ia_address_ptr->sa_family;
		if (out->family == AF_INET) {
			memcpy(out->addr, &((struct sockaddr_in *)a.ia_address_ptr)->sin_addr, 4);
		} else if (out->family == AF_INET6) {
			struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)a.ia_address_ptr;
			memcpy(out->addr, &s6->sin6_addr, 16);
			out->flowinfo = s6->sin6_flowinfo;
		}
	}
	out->max_dto_per_ep = a.max_dto_per_ep;
	out->max_rdma_read_in = a.max_rdma_read_per_ep_in;
	out->max_rdma_read_out = a.max_rdma_read_per_ep_out;
	out->max_evd_qlen = a.max_evd_qlen;
	out->max_message_size = a.max_message_size;
	out->max_rdma_size = a.max_rdma_size;
	out->max_private = p.max_private_data_size;
	return rc;
}

static DAT_RETURN ud_ia_close(DAT_HANDLE ia) { return dat_ia_close(ia, DAT_CLOSE_ABRUPT_FLAG); }

static DAT_RETURN ud_pz_create(DAT_HANDLE ia, DAT_HANDLE *pz) {
	DAT_PZ_HANDLE h = DAT_HANDLE_NULL;
	DAT_RETURN rc = dat_pz_create(ia, &h);
	*pz = h;
	return rc;
}

static DAT_RETURN ud_pz_free(DAT_HANDLE pz) { return dat_pz_free(pz); }

static DAT_RETURN ud_evd_create(DAT_HANDLE ia, DAT_COUNT qlen, int flags, DAT_HANDLE *evd) {
	DAT_EVD_HANDLE h = DAT_HANDLE_NULL;
	DAT_RETURN rc = dat_evd_create(ia, qlen, DAT_HANDLE_NULL, (DAT_EVD_FLAGS)flags, &h);
	*evd = h;
	return rc;
}

static DAT_RETURN ud_evd_free(DAT_HANDLE evd) { return dat_evd_free(evd); }

static DAT_RETURN ud_psp_create(DAT_HANDLE ia, uint64_t qual, DAT_HANDLE evd, DAT_HANDLE *psp) {
	DAT_PSP_HANDLE h = DAT_HANDLE_NULL;
	DAT_RETURN rc = dat_psp_create(ia, (DAT_CONN_QUAL)qual, evd, DAT_PSP_CONSUMER_FLAG, &h);
	*psp = h;
	return rc;
}

static DAT_RETURN ud_psp_free(DAT_HANDLE psp) { return dat_psp_free(psp); }

// ud_ep_create makes an RC endpoint whose sends, receives and reads all
// complete on dto and whose connection events go to conn.
static DAT_RETURN ud_ep_create(DAT_HANDLE ia, DAT_HANDLE pz, DAT_HANDLE dto, DAT_HANDLE conn,
		DAT_COUNT max_recv, DAT_COUNT max_send, uint32_t max_msg,
		DAT_COUNT rd_in, DAT_COUNT rd_out, DAT_HANDLE *ep) {
	DAT_EP_ATTR a;
	DAT_EP_HANDLE h = DAT_HANDLE_NULL;
	DAT_RETURN rc;

	memset(&a, 0, sizeof a);
	a.service_type = DAT_SERVICE_TYPE_RC;
	a.max_message_size = max_msg;
	a.max_rdma_size = max_msg;
	a.qos = DAT_QOS_BEST_EFFORT;
	a.recv_completion_flags = DAT_COMPLETION_DEFAULT_FLAG;
	a.request_completion_flags = DAT_COMPLETION_DEFAULT_FLAG;
	a.max_recv_dtos = max_recv;
	a.max_request_dtos = max_send;
	a.max_recv_iov = 1;
	a.max_request_iov = 1;
	a.max_rdma_read_in = rd_in;
	a.max_rdma_read_out = rd_out;
	a.srq_soft_hw = DAT_HW_DEFAULT;
	a.max_rdma_read_iov = 1;
	a.max_rdma_write_iov = 1;
	rc = dat_ep_create(ia, pz, dto, dto, conn, &a, &h);
	*ep = h;
	return rc;
}

static DAT_RETURN ud_ep_free(DAT_HANDLE ep) { return dat_ep_free(ep); }

// ud_ep_state reports the endpoint's DAT_EP_STATE.
static DAT_RETURN ud_ep_state(DAT_HANDLE ep, uint32_t *state) {
	DAT_EP_STATE s = 0;
	DAT_BOOLEAN in_idle, out_idle;
	DAT_RETURN rc = dat_ep_get_status(ep, &s, &in_idle, &out_idle);
	*state = (uint32_t)s;
	return rc;
}

static DAT_RETURN ud_ep_disconnect(DAT_HANDLE ep) { return dat_ep_disconnect(ep, DAT_CLOSE_ABRUPT_FLAG); }

// ud_ep_connect dials addr (4 or 16 bytes, network order) at qualifier
// qual. The provider copies the address and the private data before it
// returns.
static DAT_RETURN ud_ep_connect(DAT_HANDLE ep, const uint8_t *addr, int addr_len, uint64_t qual,
		DAT_TIMEOUT timeout, const void *pd, DAT_COUNT pd_len) {
	struct sockaddr_storage ss;

	memset(&ss, 0, sizeof ss);
	if (addr_len == 4) {
		struct sockaddr_in *s = (struct sockaddr_in *)&ss;
		s->sin_family = AF_INET;
		s->sin_port = htons((uint16_t)qual);
		memcpy(&s->sin_addr, addr, 4);
	} else {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)&ss;
		s->sin6_family = AF_INET6;
		s->sin6_port = htons((uint16_t)qual);
		memcpy(&s->sin6_addr, addr, 16);
	}
	return dat_ep_connect(ep, (DAT_IA_ADDRESS_PTR)&ss, (DAT_CONN_QUAL)qual, timeout,
		pd_len, (const DAT_PVOID)pd, DAT_QOS_BEST_EFFORT, DAT_CONNECT_DEFAULT_FLAG);
}

static DAT_RETURN ud_cr_accept(DAT_HANDLE cr, DAT_HANDLE ep) { return dat_cr_accept(cr, ep, 0, NULL); }

static DAT_RETURN ud_cr_reject(DAT_HANDLE cr) { return dat_cr_reject(cr, 0, NULL); }

// ud_cr_private copies up to cap bytes of the request's private data into
// buf and sets *len to the size the provider reports.
static DAT_RETURN ud_cr_private(DAT_HANDLE cr, void *buf, int cap, int *len) {
	DAT_CR_PARAM p;
	DAT_RETURN rc;
	int n;

	memset(&p, 0, sizeof p);
	*len = 0;
	rc = dat_cr_query(cr, DAT_CR_FIELD_PRIVATE_DATA_SIZE | DAT_CR_FIELD_PRIVATE_DATA, &p);
	if (rc != DAT_SUCCESS)
		return rc;
	n = p.private_data_size;
	if (n < 0 || p.private_data == NULL)
		n = 0;
	if (n > cap)
		n = cap;
	memcpy(buf, p.private_data, n);
	*len = p.private_data_size < 0 ? 0 : p.private_data_size;
	return rc;
}

// ud_lmr is what dat_lmr_create returns.
typedef struct {
	DAT_HANDLE lmr;
	DAT_LMR_CONTEXT lmr_context;
	DAT_RMR_CONTEXT rmr_context;
	DAT_VLEN registered_size;
	DAT_VADDR registered_address;
} ud_lmr;

// ud_lmr_create registers [addr, addr+len) of the caller's (pinned) memory
// for local access and remote reads and writes.
static DAT_RETURN ud_lmr_create(DAT_HANDLE ia, DAT_HANDLE pz, uintptr_t addr, uint64_t len, ud_lmr *out) {
	DAT_REGION_DESCRIPTION d;
	DAT_LMR_HANDLE h = DAT_HANDLE_NULL;
	DAT_RETURN rc;

	memset(out, 0, sizeof *out);
	memset(&d, 0, sizeof d);
	d.for_va = (DAT_PVOID)addr;
	rc = dat_lmr_create(ia, DAT_MEM_TYPE_VIRTUAL, d, (DAT_VLEN)len, pz,
		DAT_MEM_PRIV_LOCAL_READ_FLAG | DAT_MEM_PRIV_LOCAL_WRITE_FLAG | DAT_MEM_PRIV_REMOTE_READ_FLAG,
		DAT_VA_TYPE_VA, &h, &out->lmr_context, &out->rmr_context,
		&out->registered_size, &out->registered_address);
	out->lmr = h;
	return rc;
}

static DAT_RETURN ud_lmr_free(DAT_HANDLE lmr) { return dat_lmr_free(lmr); }

static DAT_RETURN ud_post_recv(DAT_HANDLE ep, uint64_t va, uint32_t len, uint32_t lmr_context, uint64_t cookie) {
	DAT_LMR_TRIPLET iov;
	DAT_DTO_COOKIE c;

	iov.virtual_address = va;
	iov.segment_length = len;
	iov.lmr_context = lmr_context;
	c.as_64 = cookie;
	return dat_ep_post_recv(ep, 1, &iov, c, DAT_COMPLETION_DEFAULT_FLAG);
}

static DAT_RETURN ud_post_send(DAT_HANDLE ep, uint64_t va, uint32_t len, uint32_t lmr_context, uint64_t cookie) {
	DAT_LMR_TRIPLET iov;
	DAT_DTO_COOKIE c;

	iov.virtual_address = va;
	iov.segment_length = len;
	iov.lmr_context = lmr_context;
	c.as_64 = cookie;
	return dat_ep_post_send(ep, 1, &iov, c, DAT_COMPLETION_DEFAULT_FLAG);
}

static DAT_RETURN ud_post_read(DAT_HANDLE ep, uint64_t va, uint32_t len, uint32_t lmr_context, uint64_t cookie,
		uint64_t raddr, uint32_t rkey) {
	DAT_LMR_TRIPLET iov;
	DAT_RMR_TRIPLET r;
	DAT_DTO_COOKIE c;

	iov.virtual_address = va;
	iov.segment_length = len;
	iov.lmr_context = lmr_context;
	r.virtual_address = raddr;
	r.segment_length = len;
	r.rmr_context = rkey;
	c.as_64 = cookie;
	return dat_ep_post_rdma_read(ep, 1, &iov, c, &r, DAT_COMPLETION_DEFAULT_FLAG);
}

// ud_dto is one event of the DTO EVD, flattened.
typedef struct {
	uint64_t cookie;
	uint32_t number;  // DAT_EVENT_NUMBER
	uint32_t status;  // DAT_DTO_COMPLETION_STATUS
	uint32_t length;  // transfered_length
	uint32_t pad;
} ud_dto;

static void ud_flatten_dto(const DAT_EVENT *ev, ud_dto *out) {
	out->number = ev->event_number;
	out->cookie = 0;
	out->status = 0;
	out->length = 0;
	if (ev->event_number == DAT_DTO_COMPLETION_EVENT) {
		out->cookie = ev->event_data.dto_completion_event_data.user_cookie.as_64;
		out->status = ev->event_data.dto_completion_event_data.status;
		out->length = ev->event_data.dto_completion_event_data.transfered_length;
	}
}

// ud_dto_dequeue moves up to max events into out without blocking and sets
// *n. An empty queue is not an error.
static DAT_RETURN ud_dto_dequeue(DAT_HANDLE evd, ud_dto *out, int max, int *n) {
	DAT_EVENT ev;
	DAT_RETURN rc = DAT_SUCCESS;
	int i;

	for (i = 0; i < max; i++) {
		rc = dat_evd_dequeue(evd, &ev);
		if (rc != DAT_SUCCESS)
			break;
		ud_flatten_dto(&ev, &out[i]);
	}
	*n = i;
	if (DAT_GET_TYPE(rc) == DAT_QUEUE_EMPTY)
		rc = DAT_SUCCESS;
	return rc;
}

// ud_dto_wait waits up to timeout microseconds for one event.
static DAT_RETURN ud_dto_wait(DAT_HANDLE evd, DAT_TIMEOUT timeout, ud_dto *out) {
	DAT_EVENT ev;
	DAT_COUNT nmore = 0;
	DAT_RETURN rc = dat_evd_wait(evd, timeout, 1, &ev, &nmore);
	if (rc == DAT_SUCCESS)
		ud_flatten_dto(&ev, out);
	return rc;
}

// ud_cm is one event of a CR, connection or async EVD, flattened: the
// event number and the handle it is about (the CR, the EP, or for async
// errors the object that failed) and the async error's reason.
typedef struct {
	DAT_HANDLE handle;
	uint32_t number;
	int32_t reason;
} ud_cm;

static void ud_flatten_cm(const DAT_EVENT *ev, ud_cm *out) {
	out->number = ev->event_number;
	out->handle = DAT_HANDLE_NULL;
	out->reason = 0;
	switch (ev->event_number) {
	case DAT_CONNECTION_REQUEST_EVENT:
		out->handle = ev->event_data.cr_arrival_event_data.cr_handle;
		break;
	case DAT_CONNECTION_EVENT_ESTABLISHED:
	case DAT_CONNECTION_EVENT_PEER_REJECTED:
	case DAT_CONNECTION_EVENT_NON_PEER_REJECTED:
	case DAT_CONNECTION_EVENT_ACCEPT_COMPLETION_ERROR:
	case DAT_CONNECTION_EVENT_DISCONNECTED:
	case DAT_CONNECTION_EVENT_BROKEN:
	case DAT_CONNECTION_EVENT_TIMED_OUT:
	case DAT_CONNECTION_EVENT_UNREACHABLE:
		out->handle = ev->event_data.connect_event_data.ep_handle;
		break;
	case DAT_ASYNC_ERROR_EVD_OVERFLOW:
	case DAT_ASYNC_ERROR_IA_CATASTROPHIC:
	case DAT_ASYNC_ERROR_EP_BROKEN:
	case DAT_ASYNC_ERROR_TIMED_OUT:
	case DAT_ASYNC_ERROR_PROVIDER_INTERNAL_ERROR:
		out->handle = ev->event_data.asynch_error_event_data.dat_handle;
		out->reason = ev->event_data.asynch_error_event_data.reason;
		break;
	default:
		break;
	}
}

static DAT_RETURN ud_cm_wait(DAT_HANDLE evd, DAT_TIMEOUT timeout, ud_cm *out) {
	DAT_EVENT ev;
	DAT_COUNT nmore = 0;
	DAT_RETURN rc = dat_evd_wait(evd, timeout, 1, &ev, &nmore);
	if (rc == DAT_SUCCESS)
		ud_flatten_cm(&ev, out);
	return rc;
}

static DAT_RETURN ud_cm_dequeue(DAT_HANDLE evd, ud_cm *out) {
	DAT_EVENT ev;
	DAT_RETURN rc = dat_evd_dequeue(evd, &ev);
	if (rc == DAT_SUCCESS)
		ud_flatten_cm(&ev, out);
	return rc;
}
*/
import "C"

import (
	"net/netip"
	"unsafe"
)

// The Go mirrors of the DAT constants the code branches on must equal the
// installed headers': each index below is 0 only if they do, and any other
// value fails the build.
var (
	_ = [1]int{int(C.DAT_NAME_MAX_LENGTH) - 1 - maxIANameLen: 0}
	_ = [1]int{int(C.DAT_CONN_QUAL_IN_USE) - int(datConnQualInUse): 0}
	_ = [1]int{int(C.DAT_INSUFFICIENT_RESOURCES) - int(datInsufficientRes): 0}
	_ = [1]int{int(C.DAT_INVALID_STATE) - int(datInvalidState): 0}
	_ = [1]int{int(C.DAT_PROVIDER_NOT_FOUND) - int(datProviderNotFound): 0}
	_ = [1]int{int(C.DAT_TIMEOUT_EXPIRED) - int(datTimeoutExpired): 0}
	_ = [1]int{int(C.DAT_QUEUE_EMPTY) - int(datQueueEmpty): 0}
	_ = [1]int{int(C.DAT_INTERRUPTED_CALL) - int(datInterruptedCall): 0}
	_ = [1]int{int(C.DAT_PORT_IN_USE) - int(datPortInUse): 0}
	_ = [1]int{int(C.DAT_NOT_IMPLEMENTED) - int(datNotImplemented): 0}
	_ = [1]int{int(C.DAT_COMM_NOT_SUPPORTED) - int(datLastContiguousType<<datTypeShift): 0}
	_ = [1]int{int(C.DAT_THREAD_SAFETY_NOT_FOUND) - (len(datSubtypeNames) - 1): 0}
	_ = [1]int{int(C.DAT_EP_STATE_ERROR) - datEPStateDisconnected: 0}
	_ = [1]int{int(C.DAT_EP_STATE_DISCONNECTED) - datEPStateDisconnected: 0}
	_ = [1]int{int(C.DAT_DTO_SUCCESS) - int(dtoSuccess): 0}
	_ = [1]int{int(C.DAT_DTO_ERR_FLUSHED) - int(dtoFlushed): 0}
	_ = [1]int{int(C.DAT_DTO_ERR_LOCAL_MM_ERROR) - (len(dtoStatusNames) - 1): 0}
	_ = [1]int{int(C.DAT_DTO_COMPLETION_EVENT) - int(evDTOCompletion): 0}
	_ = [1]int{int(C.DAT_CONNECTION_REQUEST_EVENT) - int(evConnectionRequest): 0}
	_ = [1]int{int(C.DAT_CONNECTION_EVENT_ESTABLISHED) - int(evEstablished): 0}
	_ = [1]int{int(C.DAT_CONNECTION_EVENT_PEER_REJECTED) - int(evPeerRejected): 0}
	_ = [1]int{int(C.DAT_CONNECTION_EVENT_NON_PEER_REJECTED) - int(evNonPeerRejected): 0}
	_ = [1]int{int(C.DAT_CONNECTION_EVENT_ACCEPT_COMPLETION_ERROR) - int(evAcceptCompletionErr): 0}
	_ = [1]int{int(C.DAT_CONNECTION_EVENT_DISCONNECTED) - int(evDisconnected): 0}
	_ = [1]int{int(C.DAT_CONNECTION_EVENT_BROKEN) - int(evBroken): 0}
	_ = [1]int{int(C.DAT_CONNECTION_EVENT_TIMED_OUT) - int(evTimedOut): 0}
	_ = [1]int{int(C.DAT_CONNECTION_EVENT_UNREACHABLE) - int(evUnreachable): 0}
	_ = [1]int{int(C.DAT_ASYNC_ERROR_EVD_OVERFLOW) - int(evAsyncEVDOverflow): 0}
	_ = [1]int{int(C.DAT_ASYNC_ERROR_IA_CATASTROPHIC) - int(evAsyncIACatastrophic): 0}
	_ = [1]int{int(C.DAT_ASYNC_ERROR_EP_BROKEN) - int(evAsyncEPBroken): 0}
	_ = [1]int{int(C.DAT_ASYNC_ERROR_TIMED_OUT) - int(evAsyncTimedOut): 0}
	_ = [1]int{int(C.DAT_ASYNC_ERROR_PROVIDER_INTERNAL_ERROR) - int(evAsyncProviderFailure): 0}
)

// datHandle is any DAT handle; they are all DAT_HANDLE (void *) in C.
type datHandle = C.DAT_HANDLE

// dtoEvent is one flattened event of the DTO EVD.
type dtoEvent C.ud_dto

func (e *dtoEvent) fields() (number datEvent, cookie uint64, status dtoStatus, length int) {
	return datEvent(e.number), uint64(e.cookie), dtoStatus(e.status), int(e.length)
}

// cmEvent is one flattened event of a CR, connection or async EVD.
type cmEvent struct {
	number datEvent
	handle datHandle
	reason int32
}

func toCM(c *C.ud_cm) cmEvent {
	return cmEvent{number: datEvent(c.number), handle: c.handle, reason: int32(c.reason)}
}

// Flags of dat_evd_create.
const (
	evdCR         = C.DAT_EVD_CR_FLAG
	evdDTO        = C.DAT_EVD_DTO_FLAG
	evdConnection = C.DAT_EVD_CONNECTION_FLAG
)

// datTimeoutInfinite is DAT_TIMEOUT_INFINITE, in microseconds like every
// DAT_TIMEOUT.
const datTimeoutInfinite = uint32(C.DAT_TIMEOUT_INFINITE)

func firstProvider() (string, bool) {
	var name [C.DAT_NAME_MAX_LENGTH]C.char
	var found C.int
	C.ud_first_provider(&name[0], &found)
	if found == 0 {
		return "", false
	}
	return C.GoString(&name[0]), true
}

func iaOpen(name string, asyncQlen int) (ia, async datHandle, st datStatus) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	st = datStatus(C.ud_ia_open(cname, C.DAT_COUNT(asyncQlen), &ia, &async))
	return ia, async, st
}

// iaInfo is what the provider uses of dat_ia_query.
type iaInfo struct {
	family         int
	addr           [16]byte
	flowinfo       uint32
	maxDTOPerEP    int
	maxReadIn      int
	maxReadOut     int
	maxEVDQlen     int
	maxMessageSize uint32
	maxRDMASize    uint32
	maxPrivate     int
}

// afINET and afINET6 are the address families of the IA addresses the card
// can carry.
const (
	afINET  = C.AF_INET
	afINET6 = C.AF_INET6
)

func iaQuery(ia datHandle) (iaInfo, datStatus) {
	var c C.ud_ia_info
	st := datStatus(C.ud_ia_query(ia, &c))
	in := iaInfo{
		family:         int(c.family),
		flowinfo:       uint32(c.flowinfo),
		maxDTOPerEP:    int(c.max_dto_per_ep),
		maxReadIn:      int(c.max_rdma_read_in),
		maxReadOut:     int(c.max_rdma_read_out),
		maxEVDQlen:     int(c.max_evd_qlen),
		maxMessageSize: uint32(c.max_message_size),
		maxRDMASize:    uint32(c.max_rdma_size),
		maxPrivate:     int(c.max_private),
	}
	for i := range in.addr {
		in.addr[i] = byte(c.addr[i])
	}
	return in, st
}

// ipAddr is the IA address as netip sees it, or false for a family the card
// cannot carry.
func (in iaInfo) ipAddr() (netip.Addr, bool) {
	switch in.family {
	case afINET:
		return netip.AddrFrom4([4]byte(in.addr[:4])), true
	case afINET6:
		return netip.AddrFrom16(in.addr), true
	}
	return netip.Addr{}, false
}

func iaClose(ia datHandle) datStatus { return datStatus(C.ud_ia_close(ia)) }

func pzCreate(ia datHandle) (pz datHandle, st datStatus) {
	st = datStatus(C.ud_pz_create(ia, &pz))
	return pz, st
}

func pzFree(pz datHandle) datStatus { return datStatus(C.ud_pz_free(pz)) }

func evdCreate(ia datHandle, qlen int, flags int) (evd datHandle, st datStatus) {
	st = datStatus(C.ud_evd_create(ia, C.DAT_COUNT(qlen), C.int(flags), &evd))
	return evd, st
}

func evdFree(evd datHandle) datStatus { return datStatus(C.ud_evd_free(evd)) }

func pspCreate(ia datHandle, qual uint16, evd datHandle) (psp datHandle, st datStatus) {
	st = datStatus(C.ud_psp_create(ia, C.uint64_t(qual), evd, &psp))
	return psp, st
}

func pspFree(psp datHandle) datStatus { return datStatus(C.ud_psp_free(psp)) }

// epAttrs are the queue sizes every endpoint is made with.
type epAttrs struct {
	maxRecv, maxSend int
	maxMsg           uint32
	readIn, readOut  int
}

func epCreate(ia, pz, dto, conn datHandle, a epAttrs) (ep datHandle, st datStatus) {
	st = datStatus(C.ud_ep_create(ia, pz, dto, conn, C.DAT_COUNT(a.maxRecv), C.DAT_COUNT(a.maxSend),
		C.uint32_t(a.maxMsg), C.DAT_COUNT(a.readIn), C.DAT_COUNT(a.readOut), &ep))
	return ep, st
}

func epFree(ep datHandle) datStatus { return datStatus(C.ud_ep_free(ep)) }

// epDATState is the endpoint's DAT_EP_STATE, as dat_ep_get_status reports it.
func epDATState(ep datHandle) (uint32, datStatus) {
	var s C.uint32_t
	st := datStatus(C.ud_ep_state(ep, &s))
	return uint32(s), st
}

func epDisconnect(ep datHandle) datStatus { return datStatus(C.ud_ep_disconnect(ep)) }

// epConnect dials ap's address at ap's port as connection qualifier.
// private is read only during the call.
func epConnect(ep datHandle, ap netip.AddrPort, timeoutUS uint32, private []byte) datStatus {
	var addr []byte
	if a := ap.Addr(); a.Is4() {
		a4 := a.As4()
		addr = a4[:]
	} else {
		a16 := a.As16()
		addr = a16[:]
	}
	var pd unsafe.Pointer
	if len(private) > 0 {
		pd = unsafe.Pointer(&private[0])
	}
	return datStatus(C.ud_ep_connect(ep, (*C.uint8_t)(unsafe.Pointer(&addr[0])), C.int(len(addr)),
		C.uint64_t(ap.Port()), C.DAT_TIMEOUT(timeoutUS), pd, C.DAT_COUNT(len(private))))
}

func crAccept(cr, ep datHandle) datStatus { return datStatus(C.ud_cr_accept(cr, ep)) }
func crReject(cr datHandle) datStatus     { return datStatus(C.ud_cr_reject(cr)) }

// crPrivate copies the request's private data into buf and returns how
// many bytes the provider says it holds, which may exceed len(buf).
func crPrivate(cr datHandle, buf []byte) (int, datStatus) {
	var n C.int
	st := datStatus(C.ud_cr_private(cr, unsafe.Pointer(&buf[0]), C.int(len(buf)), &n))
	return int(n), st
}

// lmr is a registration as dat_lmr_create returns it.
type lmr struct {
	h                      datHandle
	lmrContext, rmrContext uint32
}

// lmrCreate registers n bytes at addr, which the caller has pinned.
func lmrCreate(ia, pz datHandle, addr uintptr, n int) (lmr, datStatus) {
	var c C.ud_lmr
	st := datStatus(C.ud_lmr_create(ia, pz, C.uintptr_t(addr), C.uint64_t(n), &c))
	return lmr{h: c.lmr, lmrContext: uint32(c.lmr_context), rmrContext: uint32(c.rmr_context)}, st
}

func lmrFree(h datHandle) datStatus { return datStatus(C.ud_lmr_free(h)) }

func postRecv(ep datHandle, va uint64, n int, lmrContext uint32, cookie uint64) datStatus {
	return datStatus(C.ud_post_recv(ep, C.uint64_t(va), C.uint32_t(n), C.uint32_t(lmrContext), C.uint64_t(cookie)))
}

func postSend(ep datHandle, va uint64, n int, lmrContext uint32, cookie uint64) datStatus {
	return datStatus(C.ud_post_send(ep, C.uint64_t(va), C.uint32_t(n), C.uint32_t(lmrContext), C.uint64_t(cookie)))
}

func postRead(ep datHandle, va uint64, n int, lmrContext uint32, cookie, raddr uint64, rkey uint32) datStatus {
	return datStatus(C.ud_post_read(ep, C.uint64_t(va), C.uint32_t(n), C.uint32_t(lmrContext), C.uint64_t(cookie),
		C.uint64_t(raddr), C.uint32_t(rkey)))
}

// dtoDequeue moves events into out without blocking and returns how many.
func dtoDequeue(evd datHandle, out []dtoEvent) (int, datStatus) {
	var n C.int
	st := datStatus(C.ud_dto_dequeue(evd, (*C.ud_dto)(&out[0]), C.int(len(out)), &n))
	return int(n), st
}

// dtoWait waits up to timeoutUS microseconds for one event and stores it
// in out.
func dtoWait(evd datHandle, timeoutUS uint32, out *dtoEvent) datStatus {
	return datStatus(C.ud_dto_wait(evd, C.DAT_TIMEOUT(timeoutUS), (*C.ud_dto)(out)))
}

func cmWait(evd datHandle, timeoutUS uint32) (cmEvent, datStatus) {
	var c C.ud_cm
	st := datStatus(C.ud_cm_wait(evd, C.DAT_TIMEOUT(timeoutUS), &c))
	return toCM(&c), st
}

func cmDequeue(evd datHandle) (cmEvent, datStatus) {
	var c C.ud_cm
	st := datStatus(C.ud_cm_dequeue(evd, &c))
	return toCM(&c), st
}
