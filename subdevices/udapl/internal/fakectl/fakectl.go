//go:build udapl && cgo

package fakectl

/*
#cgo CFLAGS: -I/usr/include/dat2
#include <dat2/udat.h>

// The fake's test-only entry points, weak: NULL against the real libdat2.
extern int fakedat_break_ep(DAT_EP_HANDLE ep, DAT_EVENT_NUMBER n, int name_ep) __attribute__((weak));
extern int fakedat_inject_async(DAT_IA_HANDLE ia, DAT_EVENT_NUMBER n, DAT_HANDLE about) __attribute__((weak));
extern int fakedat_overflow_evd(DAT_IA_HANDLE ia, DAT_EVD_HANDLE evd, int name_evd) __attribute__((weak));
extern int fakedat_fail_evd(DAT_EVD_HANDLE evd, DAT_RETURN rc) __attribute__((weak));
extern int fakedat_conn_event(DAT_EP_HANDLE ep, DAT_EVENT_NUMBER n) __attribute__((weak));
extern int fakedat_queued(DAT_EVD_HANDLE evd, int *n) __attribute__((weak));

static int fc_loaded(void) {
	return fakedat_break_ep && fakedat_inject_async && fakedat_overflow_evd &&
		fakedat_fail_evd && fakedat_conn_event && fakedat_queued;
}
static int fc_break_ep(void *ep, int n, int name_ep) { return fakedat_break_ep(ep, (DAT_EVENT_NUMBER)n, name_ep); }
static int fc_inject_async(void *ia, int n, void *about) { return fakedat_inject_async(ia, (DAT_EVENT_NUMBER)n, about); }
static int fc_overflow_evd(void *ia, void *evd, int name_evd) { return fakedat_overflow_evd(ia, evd, name_evd); }
static int fc_fail_evd(void *evd, unsigned rc) { return fakedat_fail_evd(evd, (DAT_RETURN)rc); }
static int fc_conn_event(void *ep, int n) { return fakedat_conn_event(ep, (DAT_EVENT_NUMBER)n); }
static int fc_queued(void *evd, int *n) { return fakedat_queued(evd, n); }
*/
import "C"

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"
)

// ErrNotFake is returned when libdat2 is not the fakedat stand-in.
var ErrNotFake = errors.New("fakectl: libdat2 is not the fakedat stand-in")

// DAT event numbers the tests inject.
const (
	AsyncEVDOverflow     = int(C.DAT_ASYNC_ERROR_EVD_OVERFLOW)
	AsyncIACatastrophic  = int(C.DAT_ASYNC_ERROR_IA_CATASTROPHIC)
	AsyncEPBroken        = int(C.DAT_ASYNC_ERROR_EP_BROKEN)
	AsyncTimedOut        = int(C.DAT_ASYNC_ERROR_TIMED_OUT)
	AsyncProviderFailure = int(C.DAT_ASYNC_ERROR_PROVIDER_INTERNAL_ERROR)
	ConnBroken           = int(C.DAT_CONNECTION_EVENT_BROKEN)
	ConnTimedOut         = int(C.DAT_CONNECTION_EVENT_TIMED_OUT)
)

// InternalError is DAT_INTERNAL_ERROR, a return code for FailEVD.
const InternalError = uint32(C.DAT_CLASS_ERROR | C.DAT_INTERNAL_ERROR)

// Loaded reports whether the fake's entry points are there.
func Loaded() bool { return C.fc_loaded() != 0 }

func check(what string, r C.int) error {
	if r != 0 {
		return fmt.Errorf("%s: %w", what, syscall.Errno(r))
	}
	return nil
}

// BreakEP breaks the queue pair of the connected endpoint ep (a
// DAT_EP_HANDLE) and reports event (AsyncEPBroken or AsyncTimedOut) on
// its IA's async EVD, naming the IA as dapl does or, with nameEP, the
// endpoint.
func BreakEP(ep unsafe.Pointer, event int, nameEP bool) error {
	if !Loaded() {
		return ErrNotFake
	}
	return check("fakedat_break_ep", C.fc_break_ep(ep, C.int(event), cbool(nameEP)))
}

// InjectAsync posts the asynchronous error event about the handle about
// on the async EVD of ia (a DAT_IA_HANDLE), and does nothing else.
func InjectAsync(ia unsafe.Pointer, event int, about unsafe.Pointer) error {
	if !Loaded() {
		return ErrNotFake
	}
	return check("fakedat_inject_async", C.fc_inject_async(ia, C.int(event), about))
}

// OverflowEVD overflows the EVD evd of ia: every later wait and dequeue
// on it fails, and ia's async EVD reports AsyncEVDOverflow naming ia or,
// with nameEVD, evd.
func OverflowEVD(ia, evd unsafe.Pointer, nameEVD bool) error {
	if !Loaded() {
		return ErrNotFake
	}
	return check("fakedat_overflow_evd", C.fc_overflow_evd(ia, evd, cbool(nameEVD)))
}

// FailEVD makes every later wait and dequeue on evd return the DAT
// return code rc.
func FailEVD(evd unsafe.Pointer, rc uint32) error {
	if !Loaded() {
		return ErrNotFake
	}
	return check("fakedat_fail_evd", C.fc_fail_evd(evd, C.unsigned(rc)))
}

// ConnEvent posts the connection event (ConnBroken, ConnTimedOut) for
// the endpoint ep on its connection EVD.
func ConnEvent(ep unsafe.Pointer, event int) error {
	if !Loaded() {
		return ErrNotFake
	}
	return check("fakedat_conn_event", C.fc_conn_event(ep, C.int(event)))
}

// Queued reports how many events evd holds, not yet dequeued.
func Queued(evd unsafe.Pointer) (int, error) {
	if !Loaded() {
		return 0, ErrNotFake
	}
	var n C.int
	if err := check("fakedat_queued", C.fc_queued(evd, &n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}
