//go:build !(verbs && cgo)

package verbs

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/sdi"
)

func TestOpenWithoutVerbs(t *testing.T) {
	_, _, err := realHost.open(context.Background(), sdi.OpenParams{Logger: hclog.NewNullLogger()})
	if !errors.Is(err, rdma.ErrNoDevice) {
		t.Fatalf("open = %v, want ErrNoDevice", err)
	}
	const want = "verbs: this binary was built without verbs support; rebuild with `-tags verbs` (needs libibverbs-dev and librdmacm-dev)"
	if !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("open error %q, want it to start with %q", err, want)
	}
	_, _, err = realHost.open(context.Background(), sdi.OpenParams{Config: []byte(`{"prot": 1}`), Logger: hclog.NewNullLogger()})
	if err == nil || errors.Is(err, rdma.ErrNoDevice) || !strings.Contains(err.Error(), `unknown field "prot"`) {
		t.Fatalf("open with a bad config = %v, want the config error", err)
	}
}
