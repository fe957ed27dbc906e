package plugin

import (
	"context"
	"errors"
	"testing"

	"github.com/hpc-multidevice/multidevice/sdi"
)

type plainSub struct{ sdi.SubDevice }

type fullSub struct{ sdi.SubDevice }

func (fullSub) SetJobCards(context.Context, [][]byte) error { return nil }
func (fullSub) Poll() int                                   { return 0 }

func TestFlagsImplemented(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sd    sdi.SubDevice
		flags sdi.Flag
		ok    bool
	}{
		{"no optional flags", plainSub{}, sdi.FlagReliable, true},
		{"job cards missing", plainSub{}, sdi.FlagJobCards, false},
		{"poll missing", plainSub{}, sdi.FlagPoll, false},
		{"both present", fullSub{}, sdi.FlagJobCards | sdi.FlagPoll, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := flagsImplemented(tc.sd, tc.flags)
			if (err == nil) != tc.ok {
				t.Fatalf("flagsImplemented = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, sdi.ErrUnsupported) {
				t.Errorf("error %v does not wrap sdi.ErrUnsupported", err)
			}
		})
	}
}
