//go:build !(udapl && cgo)

package udapl

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
	"github.com/hpc-multidevice/multidevice/sdi"
)

func TestOpenWithoutUDAPL(t *testing.T) {
	p, _, err := open(context.Background(), sdi.OpenParams{Logger: hclog.NewNullLogger()})
	if err == nil {
		p.Close()
		t.Fatal("open succeeded in a build without uDAPL")
	}
	if !errors.Is(err, rdma.ErrNoDevice) {
		t.Fatalf("open error %v does not wrap rdma.ErrNoDevice", err)
	}
	const want = "this binary was built without uDAPL support; rebuild with `-tags udapl` (needs libdapl-dev)"
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("open error %q, want it to say %q", err, want)
	}
}

func TestOpenWithoutUDAPLChecksConfig(t *testing.T) {
	_, _, err := open(context.Background(), sdi.OpenParams{Config: []byte(`{"prot": 7000}`), Logger: hclog.NewNullLogger()})
	if err == nil || errors.Is(err, rdma.ErrNoDevice) || !strings.Contains(err.Error(), `unknown field "prot"`) {
		t.Fatalf("open with a bad config: %v, want the config error", err)
	}
}
