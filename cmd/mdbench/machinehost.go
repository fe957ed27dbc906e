package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/multidevice"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// Pretend hosts and tcp. The multidevice routes by the host names the
// launcher gives (shm only between ranks of one name, tcp between the
// others), and so do ranks on pretend hosts. But the tcp subdevice also
// judges its peers' addresses by host name (package
// subdevices/tcp/addrsel): it uses loopback only between ranks of one
// host, and refuses an address that two hosts both publish, taking it
// for a local bridge such as docker0. Pretend hosts on one machine
// publish the same interfaces, so every pair of addresses between them
// would be refused. A tcp subdevice of a rank on a pretend host is
// therefore opened under the machine's real host name: it then connects
// over loopback, as between any two ranks of this machine, while the
// multidevice above it still sees the pretend hosts.

// machineHostFactories returns, for a rank on a pretend host, factories
// that open every built-in tcp subdevice of plugins under this machine's
// real host name (see machineHost). plugins nil means the default ones.
func machineHostFactories(plugins *multidevice.PluginsConfig) ([]adi.Option, error) {
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("host name: %w", err)
	}
	if plugins == nil {
		if plugins, err = multidevice.LoadPlugins(os.Getenv("MD_PLUGINS")); err != nil {
			return nil, err
		}
	}
	var opts []adi.Option
	for i := range plugins.SubDevices {
		spec := &plugins.SubDevices[i]
		if spec.External() || spec.BuiltinName() != "tcp" {
			continue
		}
		f, err := sdi.Lookup("tcp")
		if err != nil {
			return nil, err
		}
		opts = append(opts, adi.WithSubDevice(spec.Name, machineHostFactory(f, host)))
	}
	return opts, nil
}

// machineHostFactory makes f's subdevices open under host.
func machineHostFactory(f sdi.Factory, host string) sdi.Factory {
	return func(logger hclog.Logger) sdi.SubDevice {
		sd := f(logger)
		m := &machineHost{SubDevice: sd, host: host}
		m.poller, _ = sd.(sdi.Poller)
		m.idler, _ = sd.(sdi.Idler)
		m.cards, _ = sd.(sdi.JobCards)
		return m
	}
}

// machineHost is a subdevice opened under another host name than its
// rank's: the real one of this machine. It passes on the optional
// interfaces of the SDI that the multidevice reaches by type assertion
// (Poller, Idler, JobCards); Open refuses a subdevice whose flags ask
// for one it lacks, or for Matcher. It is safe for concurrent use as far
// as the subdevice it wraps is.
type machineHost struct {
	sdi.SubDevice
	host   string
	poller sdi.Poller
	idler  sdi.Idler
	cards  sdi.JobCards
}

// errNotPassedOn reports a subdevice whose flags ask for an interface
// machineHost cannot pass on.
var errNotPassedOn = errors.New("mdbench: pretend hosts: subdevice's flags ask for an interface mdbench does not pass on")

// Open opens the subdevice with p.Host replaced by the machine's.
func (m *machineHost) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	p.Host = m.host
	local, err := m.SubDevice.Open(ctx, p)
	if err != nil {
		return local, err
	}
	f := local.Caps.Flags
	for _, c := range []struct {
		flag sdi.Flag
		ok   bool
		name string
	}{
		{sdi.FlagPoll, m.poller != nil, "Poller"},
		{sdi.FlagIdle, m.idler != nil, "Idler"},
		{sdi.FlagJobCards, m.cards != nil, "JobCards"},
		{sdi.FlagMatching, false, "Matcher"},
	} {
		if f.Has(c.flag) && !c.ok {
			return sdi.Local{}, errors.Join(fmt.Errorf("%w: %s", errNotPassedOn, c.name), m.SubDevice.Close(ctx))
		}
	}
	return local, nil
}

// Poll passes on to the subdevice's; it is called only with FlagPoll,
// which Open checked the subdevice backs.
func (m *machineHost) Poll() int {
	if m.poller == nil {
		return 0
	}
	return m.poller.Poll()
}

// Idle passes on to the subdevice's, as Poll does.
func (m *machineHost) Idle() {
	if m.idler != nil {
		m.idler.Idle()
	}
}

// SetJobCards passes on to the subdevice's, as Poll does.
func (m *machineHost) SetJobCards(ctx context.Context, cards [][]byte) error {
	if m.cards == nil {
		return sdi.ErrUnsupported
	}
	return m.cards.SetJobCards(ctx, cards)
}
