package udapl

import (
	"context"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/sdi"
)

func TestRegistered(t *testing.T) {
	f, err := sdi.Lookup("udapl")
	if err != nil {
		t.Fatal(err)
	}
	info, err := f(hclog.NewNullLogger()).Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "udapl" || len(info.APIVersions) == 0 || info.APIVersions[0] != sdi.APIVersion {
		t.Fatalf("Info = %+v", info)
	}
}
