package verbs

import (
	"fmt"
	"syscall"
	"testing"
)

func TestMemlockHint(t *testing.T) {
	for _, tc := range []struct {
		err  error
		hint bool
	}{
		{syscall.ENOMEM, true},
		{fmt.Errorf("rdma_create_qp: %w", syscall.EPERM), true},
		{syscall.EINVAL, false},
		{nil, false},
	} {
		if got := memlockHint(tc.err) != ""; got != tc.hint {
			t.Errorf("memlockHint(%v) gives a hint: %v, want %v", tc.err, got, tc.hint)
		}
	}
}
