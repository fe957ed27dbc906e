package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// fakeSub is a subdevice that records the host it was opened under and
// reports the flags it is given; it is a Poller, not a JobCards.
type fakeSub struct {
	sdi.SubDevice // nil: methods not overridden are not called
	flags         sdi.Flag
	host          string
	polls, closes int
}

func (f *fakeSub) Open(_ context.Context, p sdi.OpenParams) (sdi.Local, error) {
	f.host = p.Host
	return sdi.Local{Caps: sdi.Caps{Flags: f.flags}}, nil
}
func (f *fakeSub) Close(context.Context) error { f.closes++; return nil }
func (f *fakeSub) Poll() int                   { f.polls++; return 1 }

// TestMachineHost: a tcp of a rank on a pretend host is opened under the
// machine's host name, passes Poll on, and is refused (and closed) when
// its flags ask for an interface it lacks or one mdbench does not pass
// on.
func TestMachineHost(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		flags sdi.Flag
		err   string
	}{
		{sdi.FlagReliable | sdi.FlagPoll, ""},
		{sdi.FlagPoll | sdi.FlagJobCards, "JobCards"},
		{sdi.FlagMatching, "Matcher"},
	} {
		inner := &fakeSub{flags: tc.flags}
		sd := machineHostFactory(func(hclog.Logger) sdi.SubDevice { return inner }, "realhost")(hclog.NewNullLogger())
		_, err := sd.Open(ctx, sdi.OpenParams{Host: "mdbench-h1"})
		if inner.host != "realhost" {
			t.Errorf("flags %v: opened under host %q, want realhost", tc.flags, inner.host)
		}
		if tc.err != "" {
			if !errors.Is(err, errNotPassedOn) || !strings.Contains(err.Error(), tc.err) || inner.closes != 1 {
				t.Errorf("flags %v: Open error %v after %d closes, want errNotPassedOn naming %s after one", tc.flags, err, inner.closes, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("flags %v: %v", tc.flags, err)
		}
		p, ok := sd.(sdi.Poller)
		if !ok || p.Poll() != 1 || inner.polls != 1 {
			t.Errorf("flags %v: Poll not passed on (%d polls)", tc.flags, inner.polls)
		}
		if jc, ok := sd.(sdi.JobCards); !ok || !errors.Is(jc.SetJobCards(ctx, nil), sdi.ErrUnsupported) {
			t.Errorf("flags %v: SetJobCards of a subdevice without it does not say unsupported", tc.flags)
		}
	}
}
