package udapl

import "fmt"

// datStatus is a DAT_RETURN: class bits 31-30, type bits 29-16, subtype
// bits 15-0 (dat_error.h). It is an error so that a failed call can be
// wrapped as it is: fmt.Errorf("udapl: dat_pz_create: %w", st). The values
// below are those of the DAT 2.0 headers; the cgo build checks the ones
// the code branches on against the installed dat_error.h at compile time.
type datStatus uint32

const (
	datTypeMask    = 0x3fff0000
	datSubtypeMask = 0x0000ffff

	datSuccess            datStatus = 0
	datConnQualInUse      datStatus = 0x00020000
	datInsufficientRes    datStatus = 0x00030000
	datInvalidState       datStatus = 0x00070000
	datProviderNotFound   datStatus = 0x000a0000
	datQueueEmpty         datStatus = 0x000d0000
	datTimeoutExpired     datStatus = 0x000f0000
	datInterruptedCall    datStatus = 0x00130000
	datPortInUse          datStatus = 0x00160000
	datExtensionBase      datStatus = 0x10000000
	datNotImplemented     datStatus = 0x3fff0000
	datTypeShift                    = 16
	datLastContiguousType           = 0x17 // DAT_COMM_NOT_SUPPORTED
)

// typ is DAT_GET_TYPE: the return type without class and subtype.
func (s datStatus) typ() datStatus { return s & datTypeMask }

// ok reports success. Providers are not consistent about the class bits
// (dapl returns a bare DAT_INTERNAL_ERROR from dat_ia_open), so only the
// type decides.
func (s datStatus) ok() bool { return s.typ() == datSuccess }

// memlockHint names the likely cause of DAT_INSUFFICIENT_RESOURCES from a
// call that pins memory (a memory region, an endpoint's queues, an EVD):
// dapl reports the kernel's refusal to pin past the locked-memory limit
// so, which containers and older systems keep at 64 KiB. verbs gives the
// same hint for the same refusal.
func (s datStatus) memlockHint() string {
	if s.typ() == datInsufficientRes {
		return " (is the locked-memory limit, ulimit -l, too low?)"
	}
	return ""
}

// idle reports the outcomes of a timed wait that found nothing: the timeout
// expired, or a signal cut the wait short.
func (s datStatus) idle() bool {
	return s.typ() == datTimeoutExpired || s.typ() == datInterruptedCall
}

func (s datStatus) Error() string {
	name := s.typeName()
	if sub := s & datSubtypeMask; sub != 0 {
		if int(sub) < len(datSubtypeNames) {
			name += "/" + datSubtypeNames[sub]
		} else {
			name += fmt.Sprintf("/subtype %d", sub)
		}
	}
	return fmt.Sprintf("%s (0x%08x)", name, uint32(s))
}

func (s datStatus) typeName() string {
	t := s.typ()
	switch {
	case t == datNotImplemented:
		return "DAT_NOT_IMPLEMENTED"
	case t >= datExtensionBase:
		return fmt.Sprintf("DAT_EXTENSION_BASE+%#x", uint32(t-datExtensionBase)>>datTypeShift)
	case int(t>>datTypeShift) < len(datTypeNames):
		return datTypeNames[t>>datTypeShift]
	}
	return fmt.Sprintf("DAT type %#x", uint32(t)>>datTypeShift)
}

// datTypeNames is indexed by the type bits shifted down; the types from
// DAT_SUCCESS to DAT_COMM_NOT_SUPPORTED are contiguous.
var datTypeNames = [datLastContiguousType + 1]string{
	"DAT_SUCCESS", "DAT_ABORT", "DAT_CONN_QUAL_IN_USE", "DAT_INSUFFICIENT_RESOURCES",
	"DAT_INTERNAL_ERROR", "DAT_INVALID_HANDLE", "DAT_INVALID_PARAMETER", "DAT_INVALID_STATE",
	"DAT_LENGTH_ERROR", "DAT_MODEL_NOT_SUPPORTED", "DAT_PROVIDER_NOT_FOUND", "DAT_PRIVILEGES_VIOLATION",
	"DAT_PROTECTION_VIOLATION", "DAT_QUEUE_EMPTY", "DAT_QUEUE_FULL", "DAT_TIMEOUT_EXPIRED",
	"DAT_PROVIDER_ALREADY_REGISTERED", "DAT_PROVIDER_IN_USE", "DAT_INVALID_ADDRESS", "DAT_INTERRUPTED_CALL",
	"DAT_CONN_QUAL_UNAVAILABLE", "DAT_RESERVED_LMR", "DAT_PORT_IN_USE", "DAT_COMM_NOT_SUPPORTED",
}

// datSubtypeNames is the DAT_RETURN_SUBTYPE enum in order: its values run
// from 0 without gaps.
var datSubtypeNames = [...]string{
	"DAT_NO_SUBTYPE", "DAT_SUB_INTERRUPTED",
	"DAT_RESOURCE_MEMORY", "DAT_RESOURCE_DEVICE", "DAT_RESOURCE_TEP", "DAT_RESOURCE_TEVD",
	"DAT_RESOURCE_PROTECTION_DOMAIN", "DAT_RESOURCE_MEMORY_REGION", "DAT_RESOURCE_ERROR_HANDLER",
	"DAT_RESOURCE_CREDITS", "DAT_RESOURCE_SRQ",
	"DAT_INVALID_HANDLE_IA", "DAT_INVALID_HANDLE_EP", "DAT_INVALID_HANDLE_LMR", "DAT_INVALID_HANDLE_RMR",
	"DAT_INVALID_HANDLE_PZ", "DAT_INVALID_HANDLE_PSP", "DAT_INVALID_HANDLE_RSP", "DAT_INVALID_HANDLE_CR",
	"DAT_INVALID_HANDLE_CNO", "DAT_INVALID_HANDLE_EVD_CR", "DAT_INVALID_HANDLE_EVD_REQUEST",
	"DAT_INVALID_HANDLE_EVD_RECV", "DAT_INVALID_HANDLE_EVD_CONN", "DAT_INVALID_HANDLE_EVD_ASYNC",
	"DAT_INVALID_HANDLE_SRQ", "DAT_INVALID_HANDLE_CSP",
	"DAT_INVALID_HANDLE1", "DAT_INVALID_HANDLE2", "DAT_INVALID_HANDLE3", "DAT_INVALID_HANDLE4",
	"DAT_INVALID_HANDLE5", "DAT_INVALID_HANDLE6", "DAT_INVALID_HANDLE7", "DAT_INVALID_HANDLE8",
	"DAT_INVALID_HANDLE9", "DAT_INVALID_HANDLE10",
	"DAT_INVALID_ARG1", "DAT_INVALID_ARG2", "DAT_INVALID_ARG3", "DAT_INVALID_ARG4", "DAT_INVALID_ARG5",
	"DAT_INVALID_ARG6", "DAT_INVALID_ARG7", "DAT_INVALID_ARG8", "DAT_INVALID_ARG9", "DAT_INVALID_ARG10",
	"DAT_INVALID_STATE_EP_UNCONNECTED", "DAT_INVALID_STATE_EP_ACTCONNPENDING",
	"DAT_INVALID_STATE_EP_PASSCONNPENDING", "DAT_INVALID_STATE_EP_TENTCONNPENDING",
	"DAT_INVALID_STATE_EP_CONNECTED", "DAT_INVALID_STATE_EP_DISCONNECTED", "DAT_INVALID_STATE_EP_RESERVED",
	"DAT_INVALID_STATE_EP_COMPLPENDING", "DAT_INVALID_STATE_EP_DISCPENDING",
	"DAT_INVALID_STATE_EP_PROVIDERCONTROL", "DAT_INVALID_STATE_EP_NOTREADY",
	"DAT_INVALID_STATE_EP_RECV_WATERMARK", "DAT_INVALID_STATE_EP_PZ", "DAT_INVALID_STATE_EP_EVD_REQUEST",
	"DAT_INVALID_STATE_EP_EVD_RECV", "DAT_INVALID_STATE_EP_EVD_CONNECT", "DAT_INVALID_STATE_EP_UNCONFIGURED",
	"DAT_INVALID_STATE_EP_UNCONFRESERVED", "DAT_INVALID_STATE_EP_UNCONFPASSIVE",
	"DAT_INVALID_STATE_EP_UNCONFTENTATIVE", "DAT_INVALID_STATE_CNO_IN_USE", "DAT_INVALID_STATE_CNO_DEAD",
	"DAT_INVALID_STATE_EVD_OPEN", "DAT_INVALID_STATE_EVD_ENABLED", "DAT_INVALID_STATE_EVD_DISABLED",
	"DAT_INVALID_STATE_EVD_WAITABLE", "DAT_INVALID_STATE_EVD_UNWAITABLE", "DAT_INVALID_STATE_EVD_IN_USE",
	"DAT_INVALID_STATE_EVD_CONFIG_NOTIFY", "DAT_INVALID_STATE_EVD_CONFIG_SOLICITED",
	"DAT_INVALID_STATE_EVD_CONFIG_THRESHOLD", "DAT_INVALID_STATE_EVD_WAITER", "DAT_INVALID_STATE_EVD_ASYNC",
	"DAT_INVALID_STATE_IA_IN_USE", "DAT_INVALID_STATE_LMR_IN_USE", "DAT_INVALID_STATE_LMR_FREE",
	"DAT_INVALID_STATE_PZ_IN_USE", "DAT_INVALID_STATE_PZ_FREE",
	"DAT_INVALID_STATE_SRQ_OPERATIONAL", "DAT_INVALID_STATE_SRQ_ERROR", "DAT_INVALID_STATE_SRQ_IN_USE",
	"DAT_INVALID_STATE_SRQ_SHUTDOWN",
	"DAT_PRIVILEGES_READ", "DAT_PRIVILEGES_WRITE", "DAT_PRIVILEGES_RDMA_READ", "DAT_PRIVILEGES_RDMA_WRITE",
	"DAT_PROTECTION_READ", "DAT_PROTECTION_WRITE", "DAT_PROTECTION_RDMA_READ", "DAT_PROTECTION_RDMA_WRITE",
	"DAT_INVALID_ADDRESS_UNSUPPORTED", "DAT_INVALID_ADDRESS_UNREACHABLE", "DAT_INVALID_ADDRESS_MALFORMED",
	"DAT_NAME_NOT_REGISTERED", "DAT_MAJOR_NOT_FOUND", "DAT_MINOR_NOT_FOUND", "DAT_THREAD_SAFETY_NOT_FOUND",
}

// dtoStatus is a DAT_DTO_COMPLETION_STATUS, the outcome of one work request.
type dtoStatus uint32

const (
	dtoSuccess dtoStatus = 0
	dtoFlushed dtoStatus = 1
)

var dtoStatusNames = [...]string{
	"DAT_DTO_SUCCESS", "DAT_DTO_ERR_FLUSHED", "DAT_DTO_ERR_LOCAL_LENGTH", "DAT_DTO_ERR_LOCAL_EP",
	"DAT_DTO_ERR_LOCAL_PROTECTION", "DAT_DTO_ERR_BAD_RESPONSE", "DAT_DTO_ERR_REMOTE_ACCESS",
	"DAT_DTO_ERR_REMOTE_RESPONDER", "DAT_DTO_ERR_TRANSPORT", "DAT_DTO_ERR_RECEIVER_NOT_READY",
	"DAT_DTO_ERR_PARTIAL_PACKET", "DAT_RMR_OPERATION_FAILED", "DAT_DTO_ERR_LOCAL_MM_ERROR",
}

func (s dtoStatus) String() string {
	if int(s) < len(dtoStatusNames) {
		return dtoStatusNames[s]
	}
	return fmt.Sprintf("DTO status %d", uint32(s))
}

// datEPStateDisconnected is DAT_EP_STATE_DISCONNECTED, which DAT 2.0 also
// names DAT_EP_STATE_ERROR: the state dapl leaves an endpoint whose queue
// pair broke in.
const datEPStateDisconnected = 11

// datEvent is a DAT_EVENT_NUMBER.
type datEvent uint32

// The events the provider handles.
const (
	evDTOCompletion        datEvent = 0x00001
	evConnectionRequest    datEvent = 0x02001
	evEstablished          datEvent = 0x04001
	evPeerRejected         datEvent = 0x04002
	evNonPeerRejected      datEvent = 0x04003
	evAcceptCompletionErr  datEvent = 0x04004
	evDisconnected         datEvent = 0x04005
	evBroken               datEvent = 0x04006
	evTimedOut             datEvent = 0x04007
	evUnreachable          datEvent = 0x04008
	evAsyncEVDOverflow     datEvent = 0x08001
	evAsyncIACatastrophic  datEvent = 0x08002
	evAsyncEPBroken        datEvent = 0x08003
	evAsyncTimedOut        datEvent = 0x08004
	evAsyncProviderFailure datEvent = 0x08005
)

func (e datEvent) String() string {
	switch e {
	case evDTOCompletion:
		return "DAT_DTO_COMPLETION_EVENT"
	case evConnectionRequest:
		return "DAT_CONNECTION_REQUEST_EVENT"
	case evEstablished:
		return "DAT_CONNECTION_EVENT_ESTABLISHED"
	case evPeerRejected:
		return "DAT_CONNECTION_EVENT_PEER_REJECTED"
	case evNonPeerRejected:
		return "DAT_CONNECTION_EVENT_NON_PEER_REJECTED"
	case evAcceptCompletionErr:
		return "DAT_CONNECTION_EVENT_ACCEPT_COMPLETION_ERROR"
	case evDisconnected:
		return "DAT_CONNECTION_EVENT_DISCONNECTED"
	case evBroken:
		return "DAT_CONNECTION_EVENT_BROKEN"
	case evTimedOut:
		return "DAT_CONNECTION_EVENT_TIMED_OUT"
	case evUnreachable:
		return "DAT_CONNECTION_EVENT_UNREACHABLE"
	case evAsyncEVDOverflow:
		return "DAT_ASYNC_ERROR_EVD_OVERFLOW"
	case evAsyncIACatastrophic:
		return "DAT_ASYNC_ERROR_IA_CATASTROPHIC"
	case evAsyncEPBroken:
		return "DAT_ASYNC_ERROR_EP_BROKEN"
	case evAsyncTimedOut:
		return "DAT_ASYNC_ERROR_TIMED_OUT"
	case evAsyncProviderFailure:
		return "DAT_ASYNC_ERROR_PROVIDER_INTERNAL_ERROR"
	}
	return fmt.Sprintf("DAT event %#x", uint32(e))
}
