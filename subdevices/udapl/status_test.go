package udapl

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestDatStatus(t *testing.T) {
	tests := []struct {
		st       datStatus
		ok, idle bool
		text     string
	}{
		{0, true, false, "DAT_SUCCESS (0x00000000)"},
		// What dapl's dat_ia_open returns where there is no device: no class bit.
		{0x00040000, false, false, "DAT_INTERNAL_ERROR (0x00040000)"},
		// What the registry returns for a name /etc/dat.conf does not list.
		{0x800a0064, false, false, "DAT_PROVIDER_NOT_FOUND/DAT_NAME_NOT_REGISTERED (0x800a0064)"},
		{0x8007002f, false, false, "DAT_INVALID_STATE/DAT_INVALID_STATE_EP_UNCONNECTED (0x8007002f)"},
		{0x80030002, false, false, "DAT_INSUFFICIENT_RESOURCES/DAT_RESOURCE_MEMORY (0x80030002)"},
		{0x800f0000, false, true, "DAT_TIMEOUT_EXPIRED (0x800f0000)"},
		{0x80130000, false, true, "DAT_INTERRUPTED_CALL (0x80130000)"},
		{0x800d0000, false, false, "DAT_QUEUE_EMPTY (0x800d0000)"},
		{0xbfff0000, false, false, "DAT_NOT_IMPLEMENTED (0xbfff0000)"},
		{0x90020000, false, false, "DAT_EXTENSION_BASE+0x2 (0x90020000)"},
		{0x80200000, false, false, "DAT type 0x20 (0x80200000)"},
		{0x80060fff, false, false, "DAT_INVALID_PARAMETER/subtype 4095 (0x80060fff)"},
	}
	for _, tt := range tests {
		if got := tt.st.ok(); got != tt.ok {
			t.Errorf("%#x.ok() = %v, want %v", uint32(tt.st), got, tt.ok)
		}
		if got := tt.st.idle(); got != tt.idle {
			t.Errorf("%#x.idle() = %v, want %v", uint32(tt.st), got, tt.idle)
		}
		if got := tt.st.Error(); got != tt.text {
			t.Errorf("%#x.Error() = %q, want %q", uint32(tt.st), got, tt.text)
		}
	}
}

func TestDatStatusWraps(t *testing.T) {
	err := fmt.Errorf("udapl: dat_pz_create: %w", datStatus(0x80030002))
	var st datStatus
	if !errors.As(err, &st) || st.typ() != 0x00030000 {
		t.Fatalf("errors.As(%v) = %#x, want the status back", err, uint32(st))
	}
}

// TestMemlockHint: dapl reports the kernel's refusal to pin memory past
// RLIMIT_MEMLOCK as DAT_INSUFFICIENT_RESOURCES (with any class or
// subtype); the error then names the limit, as verbs' does.
func TestMemlockHint(t *testing.T) {
	for _, tc := range []struct {
		st   datStatus
		hint bool
	}{
		{0x00030002, true}, // DAT_RESOURCE_MEMORY, from dat_lmr_create
		{0x80030000, true},
		{0x00030004, true},
		{0x00040000, false},
		{datSuccess, false},
	} {
		if got := strings.Contains(tc.st.memlockHint(), "ulimit -l"); got != tc.hint {
			t.Errorf("%v: hint %v, want %v", tc.st, got, tc.hint)
		}
	}
}

func TestDTOStatusAndEventNames(t *testing.T) {
	for st, want := range map[dtoStatus]string{
		dtoSuccess: "DAT_DTO_SUCCESS", dtoFlushed: "DAT_DTO_ERR_FLUSHED", 6: "DAT_DTO_ERR_REMOTE_ACCESS",
		12: "DAT_DTO_ERR_LOCAL_MM_ERROR", 13: "DTO status 13",
	} {
		if got := st.String(); got != want {
			t.Errorf("dtoStatus(%d) = %q, want %q", uint32(st), got, want)
		}
	}
	for ev, want := range map[datEvent]string{
		evEstablished: "DAT_CONNECTION_EVENT_ESTABLISHED", evNonPeerRejected: "DAT_CONNECTION_EVENT_NON_PEER_REJECTED",
		evAsyncEPBroken: "DAT_ASYNC_ERROR_EP_BROKEN", 0x10001: "DAT event 0x10001",
	} {
		if got := ev.String(); got != want {
			t.Errorf("datEvent(%#x) = %q, want %q", uint32(ev), got, want)
		}
	}
}
