package verbs

import (
	"errors"
	"fmt"
	"math"
	"net/netip"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
)

// defaultExclusivity puts verbs above tcp (10) and below shm (50), so a
// peer both reach is served over RDMA and a peer on the same host over
// shared memory.
const defaultExclusivity = 20

// maxDeviceName is IB_DEVICE_NAME_MAX, the kernel's bound on device names.
const maxDeviceName = 64

// config is the decoded and validated plugins.hcl block.
type config struct {
	// device is the RDMA device ("mlx5_0"); empty picks the first one with
	// an ACTIVE port.
	device string
	// port is the device port; 0 picks the first ACTIVE one.
	port int
	// address is the IP address to listen on; invalid picks one of the
	// network interface that belongs to the device's port.
	address netip.Addr
	// settings are the engine's keys, validated.
	settings rdma.Settings
}

// rawConfig mirrors the JSON keys exactly, so unknown keys are rejected by
// the decoder and every value can be checked with its key name.
type rawConfig struct {
	Device  *string `json:"device"`
	Port    *int64  `json:"port"`
	Address *string `json:"address"`
	rdma.Keys
}

// parseConfig decodes the subdevice's config block. An empty block means all
// defaults. Errors name the key and say what is accepted.
func parseConfig(b []byte) (config, error) {
	var raw rawConfig
	if err := rdma.DecodeConfig(b, &raw); err != nil {
		return config{}, fmt.Errorf("verbs: config: %w (known keys: device, port, address, %s)", err, rdma.KeyNames)
	}
	var c config
	if raw.Device != nil {
		if err := checkDeviceName(*raw.Device); err != nil {
			return config{}, fmt.Errorf("verbs: config: device %q: %w", *raw.Device, err)
		}
		c.device = *raw.Device
	}
	if raw.Port != nil {
		// Port numbers are a uint8 in the verbs API and start at 1.
		if *raw.Port < 1 || *raw.Port > math.MaxUint8 {
			return config{}, fmt.Errorf("verbs: config: port %d must be in [1, %d]", *raw.Port, math.MaxUint8)
		}
		c.port = int(*raw.Port)
	}
	if raw.Address != nil {
		a, err := netip.ParseAddr(*raw.Address)
		if err != nil {
			return config{}, fmt.Errorf("verbs: config: address %q: want an IP address such as \"10.1.0.7\" or \"fd00::7\": %w", *raw.Address, err)
		}
		if err := checkListenAddr(a); err != nil {
			return config{}, fmt.Errorf("verbs: config: address %q: %w", *raw.Address, err)
		}
		c.address = a.Unmap()
	}
	var err error
	if c.settings, err = raw.Settings(defaultExclusivity); err != nil {
		return config{}, fmt.Errorf("verbs: config: %w", err)
	}
	return c, nil
}

// checkDeviceName accepts what the kernel names RDMA devices; the name is
// joined into sysfs paths, so separators and dot names are refused.
func checkDeviceName(name string) error {
	if name == "" || len(name) > maxDeviceName {
		return fmt.Errorf("want 1 to %d characters, e.g. \"mlx5_0\"", maxDeviceName)
	}
	if name == "." || name == ".." {
		return errors.New("not a device name")
	}
	for _, r := range name {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.'
		if !ok {
			return fmt.Errorf("character %q is not allowed in a device name (letters, digits, '_', '-', '.')", r)
		}
	}
	return nil
}

// checkListenAddr refuses addresses the connection manager cannot listen on
// for peers or a business card cannot carry: a zone (and so an IPv6
// link-local address, which needs one) means nothing on another host.
func checkListenAddr(a netip.Addr) error {
	a = a.Unmap()
	switch {
	case a.Zone() != "":
		return errors.New("zones are not allowed: the address goes on the business card")
	case a.IsUnspecified():
		return errors.New("the unspecified address names no device: give the address of the device's interface")
	case a.IsMulticast():
		return errors.New("a multicast address cannot be listened on")
	case a.IsLoopback():
		return errors.New("loopback is not on an RDMA device")
	case a.Is6() && a.IsLinkLocalUnicast():
		return errors.New("an IPv6 link-local address needs a zone, which peers cannot use")
	}
	return nil
}
