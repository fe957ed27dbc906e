package verbs

import (
	"context"
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/sdi"
)

func TestRegistered(t *testing.T) {
	f, err := sdi.Lookup("verbs")
	if err != nil {
		t.Fatal(err)
	}
	info, err := f(hclog.NewNullLogger()).Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "verbs" || !slices.Contains(info.APIVersions, sdi.APIVersion) {
		t.Fatalf("Info = %+v, want name verbs speaking %s", info, sdi.APIVersion)
	}
}
