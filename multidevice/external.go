package multidevice

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/plugin"
)

// External subdevices: a plugin binary named by plugins.hcl, started with
// sdi/plugin and then used like a built-in subdevice. A plugin that cannot
// be started, fails its handshake or checksum, or fails to answer or to
// open is skipped with a warning naming it: routes are derived without it.
// Only a connection table that routes over it turns that into an error,
// which then says why the plugin is missing.

// openExternal starts and opens the plugin spec names, or records in
// d.skipped why it could not.
func (d *Device) openExternal(ctx context.Context, spec SubDeviceSpec) {
	log := d.log.Named(spec.Name)
	skip := func(sd sdi.SubDevice, err error) {
		log.Warn("skipping subdevice plugin", "subdevice", spec.Name, "command", spec.Path, "where", spec.Where, "error", err)
		if sd != nil {
			sd.Close(ctx)
		}
		if d.skipped == nil {
			d.skipped = make(map[string]error)
		}
		d.skipped[spec.Name] = err
	}
	sd, err := plugin.Start(ctx, plugin.Config{
		Name:     spec.Name,
		Path:     spec.Path,
		Args:     spec.Args,
		Checksum: spec.ChecksumBytes(),
		Timeout:  spec.Timeout,
		Stream:   !spec.SharedMemory,
		Logger:   log,
	})
	if err != nil {
		skip(nil, err)
		return
	}
	info, err := sd.Info(ctx)
	if err != nil {
		skip(sd, err)
		return
	}
	if !speaks(info.APIVersions, sdi.APIVersion) {
		skip(sd, fmt.Errorf("plugin %q speaks SDI %v, this build needs %s", spec.Name, info.APIVersions, sdi.APIVersion))
		return
	}
	n := len(d.subs)
	if err := d.addSub(ctx, spec.Name, sd, spec.Config, sdi.APIVersion); err != nil {
		if len(d.subs) > n {
			d.subs = d.subs[:n]
		}
		skip(sd, err)
		return
	}
	d.subs[n].external = true
}

// missingSubDevice is the error for a table that routes over a subdevice
// that is not loaded, saying why when it was a skipped plugin.
func (d *Device) missingSubDevice(peer int, host, name string) error {
	if name == selfName {
		return fmt.Errorf("%w: the table routes rank %d (host %q) over %q, the path to this rank itself, which reaches no other (loaded: %s)",
			ErrNoRoute, peer, host, name, d.subNames())
	}
	if why := d.skipped[name]; why != nil {
		return fmt.Errorf("%w: the table routes rank %d (host %q) over subdevice %q, whose plugin was skipped: %v",
			ErrNoRoute, peer, host, name, why)
	}
	return fmt.Errorf("%w: the table routes rank %d (host %q) over subdevice %q, which is not loaded (loaded: %s)",
		ErrNoRoute, peer, host, name, d.subNames())
}

// skippedWhy lists the skipped plugins with their reasons, in name order.
func (d *Device) skippedWhy() string {
	var why []string
	for _, name := range slices.Sorted(maps.Keys(d.skipped)) {
		why = append(why, fmt.Sprintf("%q: %v", name, d.skipped[name]))
	}
	return strings.Join(why, "; ")
}
