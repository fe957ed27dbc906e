//go:build verbs && cgo

package fakectl

/*
#include <errno.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

// The fake's test-only entry points, weak: NULL against the real libraries.
extern int fakeverbs_inject_async(struct ibv_context *ctx, int type, void *element, int port) __attribute__((weak));
extern void fakeverbs_async_counts(struct ibv_context *ctx, int *queued, int *unacked) __attribute__((weak));
extern int fakeverbs_inject_cm_event(struct rdma_cm_id *id, int event) __attribute__((weak));
extern int fakeverbs_fail_cm_channel(struct rdma_event_channel *ch, int err) __attribute__((weak));

static int fc_loaded(void) {
	return fakeverbs_inject_async && fakeverbs_async_counts && fakeverbs_inject_cm_event && fakeverbs_fail_cm_channel;
}
static int fc_inject_async(void *ctx, int type, void *element, int port) {
	return fakeverbs_inject_async(ctx, type, element, port);
}
static void fc_async_counts(void *ctx, int *queued, int *unacked) {
	fakeverbs_async_counts(ctx, queued, unacked);
}
static int fc_inject_cm_event(void *id, int event) { return fakeverbs_inject_cm_event(id, event); }
static int fc_fail_cm_channel(void *ch, int err) { return fakeverbs_fail_cm_channel(ch, err); }
*/
import "C"

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"
)

// ErrNotFake is returned when libibverbs and librdmacm are not the fake.
var ErrNotFake = errors.New("fakectl: libibverbs and librdmacm are not the fakeverbs stand-in")

// Asynchronous event types (enum ibv_event_type) and connection manager
// events (enum rdma_cm_event_type) the tests inject.
const (
	EventCQErr           = int(C.IBV_EVENT_CQ_ERR)
	EventQPFatal         = int(C.IBV_EVENT_QP_FATAL)
	EventQPReqErr        = int(C.IBV_EVENT_QP_REQ_ERR)
	EventQPAccessErr     = int(C.IBV_EVENT_QP_ACCESS_ERR)
	EventCommEst         = int(C.IBV_EVENT_COMM_EST)
	EventDeviceFatal     = int(C.IBV_EVENT_DEVICE_FATAL)
	EventPortActive      = int(C.IBV_EVENT_PORT_ACTIVE)
	EventPortErr         = int(C.IBV_EVENT_PORT_ERR)
	EventLIDChange       = int(C.IBV_EVENT_LID_CHANGE)
	CMEventDeviceRemoval = int(C.RDMA_CM_EVENT_DEVICE_REMOVAL)
)

// Loaded reports whether the fake's entry points are there.
func Loaded() bool { return C.fc_loaded() != 0 }

// InjectAsync queues an asynchronous event of typ on the device context
// ctx (a struct ibv_context *): element is the struct ibv_qp * of a QP
// event or the struct ibv_cq * of EventCQErr, port the port of a port
// event. What the fake does to the object is in its header.
func InjectAsync(ctx unsafe.Pointer, typ int, element unsafe.Pointer, port int) error {
	if !Loaded() {
		return ErrNotFake
	}
	if r := C.fc_inject_async(ctx, C.int(typ), element, C.int(port)); r != 0 {
		return fmt.Errorf("fakeverbs_inject_async: %w", syscall.Errno(r))
	}
	return nil
}

// AsyncCounts reports the asynchronous events of the device queued and
// not read, and read and not acked.
func AsyncCounts(ctx unsafe.Pointer) (queued, unacked int, err error) {
	if !Loaded() {
		return 0, 0, ErrNotFake
	}
	var q, u C.int
	C.fc_async_counts(ctx, &q, &u)
	return int(q), int(u), nil
}

// InjectCMEvent queues a connection manager event without parameters on
// the rdma_cm id (a struct rdma_cm_id *).
func InjectCMEvent(id unsafe.Pointer, event int) error {
	if !Loaded() {
		return ErrNotFake
	}
	if r := C.fc_inject_cm_event(id, C.int(event)); r != 0 {
		return fmt.Errorf("fakeverbs_inject_cm_event: %w", syscall.Errno(r))
	}
	return nil
}

// FailCMChannel makes every later rdma_get_cm_event on the event channel
// ch (a struct rdma_event_channel *) fail with err.
func FailCMChannel(ch unsafe.Pointer, err syscall.Errno) error {
	if !Loaded() {
		return ErrNotFake
	}
	if r := C.fc_fail_cm_channel(ch, C.int(err)); r != 0 {
		return fmt.Errorf("fakeverbs_fail_cm_channel: %w", syscall.Errno(r))
	}
	return nil
}
