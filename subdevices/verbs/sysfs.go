package verbs

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
)

// sysfs reads the kernel's view of the RDMA devices. Its value is where sysfs
// is mounted; tests point it at a fake tree. Reading sysfs rather than asking
// libibverbs keeps the choice of device, port and address in pure Go, where
// it is tested without hardware.
type sysfs string

func (s sysfs) ibDir() string { return filepath.Join(string(s), "class", "infiniband") }

// devices lists the RDMA devices, sorted by name. A machine without any
// gives an error wrapping rdma.ErrNoDevice.
func (s sysfs) devices() ([]string, error) {
	dir := s.ibDir()
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("verbs: no RDMA device: %s does not exist (no RDMA driver is loaded%s): %w", dir, noDeviceNext, rdma.ErrNoDevice)
	}
	if err != nil {
		return nil, fmt.Errorf("verbs: list RDMA devices: %w", err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("verbs: no RDMA device: %s is empty (%s): %w", dir, noDeviceNext[2:], rdma.ErrNoDevice)
	}
	return names, nil
}

// noDeviceNext says what a user can do on a host without an RDMA device.
const noDeviceNext = `; load the adapter's driver (modprobe mlx5_ib, say), or leave verbs out of plugins.hcl, or run it as a plugin (command = "sdi-verbs"), which a host without the device skips`

// portState is one port of a device as sysfs shows it.
type portState struct {
	num   int
	state string // "ACTIVE", "DOWN", "INIT", ...; "unknown" if unreadable
}

// ports lists a device's ports in number order.
func (s sysfs) ports(dev string) ([]portState, error) {
	dir := filepath.Join(s.ibDir(), dev, "ports")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("verbs: ports of %s: %w", dev, err)
	}
	var ps []portState
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil || n < 1 {
			continue
		}
		ps = append(ps, portState{num: n, state: s.portStateName(dev, n)})
	}
	slices.SortFunc(ps, func(a, b portState) int { return a.num - b.num })
	return ps, nil
}

// portStateName reads ports/<n>/state, which holds e.g. "4: ACTIVE".
func (s sysfs) portStateName(dev string, port int) string {
	b, err := os.ReadFile(filepath.Join(s.ibDir(), dev, "ports", strconv.Itoa(port), "state"))
	if err != nil {
		return "unknown"
	}
	v := strings.TrimSpace(string(b))
	if _, name, ok := strings.Cut(v, ":"); ok {
		v = strings.TrimSpace(name)
	}
	if v == "" {
		return "unknown"
	}
	return v
}

// choosePort picks the configured device and port, filling in what is not
// configured with the first ACTIVE port of the first device that has one.
func (s sysfs) choosePort(devs []string, device string, port int) (string, int, error) {
	cands := devs
	if device != "" {
		if !slices.Contains(devs, device) {
			return "", 0, fmt.Errorf("verbs: config: device %q: not found (devices: %s)", device, strings.Join(devs, ", "))
		}
		cands = []string{device}
	}
	var seen []string
	for _, d := range cands {
		ps, err := s.ports(d)
		if err != nil {
			if device != "" {
				return "", 0, err
			}
			seen = append(seen, fmt.Sprintf("%s: %v", d, err))
			continue
		}
		if port != 0 && device != "" && !slices.ContainsFunc(ps, func(p portState) bool { return p.num == port }) {
			return "", 0, fmt.Errorf("verbs: config: port %d: device %s has ports %s", port, d, portList(ps))
		}
		for _, p := range ps {
			if port != 0 && p.num != port {
				continue
			}
			if p.state == "ACTIVE" {
				return d, p.num, nil
			}
			seen = append(seen, fmt.Sprintf("%s port %d %s", d, p.num, p.state))
		}
	}
	if len(seen) == 0 {
		if port != 0 {
			return "", 0, fmt.Errorf("verbs: no device has a port %d (devices: %s): %w", port, strings.Join(cands, ", "), rdma.ErrNoDevice)
		}
		return "", 0, fmt.Errorf("verbs: no device has a port (devices: %s): %w", strings.Join(cands, ", "), rdma.ErrNoDevice)
	}
	return "", 0, fmt.Errorf("verbs: no ACTIVE port (%s): %w", strings.Join(seen, ", "), rdma.ErrNoDevice)
}

func portList(ps []portState) string {
	if len(ps) == 0 {
		return "none"
	}
	var b strings.Builder
	for i, p := range ps {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Itoa(p.num))
	}
	return b.String()
}

// netdevs names the network interfaces that carry a device port's IP
// traffic, which is what the connection manager addresses. On RoCE the GID
// table names them; on InfiniBand they are the IPoIB interfaces of the
// adapter, where dev_port (port-1) tells the ports of a multi-port adapter
// apart.
func (s sysfs) netdevs(dev string, port int) []string {
	portDir := filepath.Join(s.ibDir(), dev, "ports", strconv.Itoa(port))
	var names []string
	ents, _ := os.ReadDir(filepath.Join(portDir, "gid_attrs", "ndevs"))
	slices.SortFunc(ents, func(a, b fs.DirEntry) int { return numericOrder(a.Name(), b.Name()) })
	for _, e := range ents {
		// Unused GID entries, and every entry of an InfiniBand port, fail to
		// read.
		b, err := os.ReadFile(filepath.Join(portDir, "gid_attrs", "ndevs", e.Name()))
		if name := strings.TrimSpace(string(b)); err == nil && name != "" && !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	if len(names) > 0 {
		return names
	}
	netDir := filepath.Join(s.ibDir(), dev, "device", "net")
	ents, _ = os.ReadDir(netDir)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(netDir, e.Name(), "dev_port"))
		if err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n != port-1 {
				continue
			}
		}
		names = append(names, e.Name())
	}
	return names
}

// numericOrder sorts GID indexes as numbers ("2" before "10").
func numericOrder(a, b string) int {
	na, errA := strconv.Atoi(a)
	nb, errB := strconv.Atoi(b)
	if errA == nil && errB == nil {
		return na - nb
	}
	return strings.Compare(a, b)
}

// addrsFunc lists a network interface's addresses; interfaceAddrs in
// production, a fake in tests.
type addrsFunc func(ifname string) ([]netip.Addr, error)

func interfaceAddrs(name string) ([]netip.Addr, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return nil, err
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return nil, fmt.Errorf("addresses of %s: %w", name, err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ad, ok := netip.AddrFromSlice(ipn.IP); ok {
				out = append(out, ad.Unmap())
			}
		}
	}
	return out, nil
}

// pickAddress takes the first IPv4 address of the interfaces, in their
// order, else the first IPv6 address a peer can dial (not link-local). It
// returns an invalid address, and what went wrong reading interfaces, when
// there is none.
func pickAddress(ifaces []string, addrsOf addrsFunc) (netip.Addr, error) {
	var v6 netip.Addr
	var errs []error
	for _, name := range ifaces {
		addrs, err := addrsOf(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, a := range addrs {
			a = a.Unmap()
			if checkListenAddr(a) != nil {
				continue
			}
			if a.Is4() {
				return a, nil
			}
			if !v6.IsValid() {
				v6 = a
			}
		}
	}
	if v6.IsValid() {
		return v6, nil
	}
	return netip.Addr{}, errors.Join(errs...)
}

// host is what Open learns about the machine outside librdmacm: the sysfs
// tree that lists RDMA devices, and the addresses of network interfaces.
// realHost is the machine itself; tests describe other machines with a fake
// tree and fake addresses (see fakeHost in the tests). A host is a value and
// is never changed after it is made.
type host struct {
	sys   sysfs
	addrs addrsFunc
}

// realHost reads the real sysfs and the kernel's interface addresses.
var realHost = host{sys: "/sys", addrs: interfaceAddrs}

// target is where the provider listens: an address and the device and port
// it is expected on. device and port are empty when the address was
// configured without them; the connection manager's bind decides then.
type target struct {
	addr   netip.Addr
	device string
	port   int
}

// findTarget applies the config to the machine's devices. Errors wrap
// rdma.ErrNoDevice when the machine has no usable device, and name the key
// when the config asks for something that is not there.
func findTarget(s sysfs, c config, addrsOf addrsFunc) (target, error) {
	devs, err := s.devices()
	if err != nil {
		return target{}, err
	}
	if c.address.IsValid() {
		if c.device != "" && !slices.Contains(devs, c.device) {
			return target{}, fmt.Errorf("verbs: config: device %q: not found (devices: %s)", c.device, strings.Join(devs, ", "))
		}
		return target{addr: c.address, device: c.device, port: c.port}, nil
	}
	dev, port, err := s.choosePort(devs, c.device, c.port)
	if err != nil {
		return target{}, err
	}
	ifaces := s.netdevs(dev, port)
	if len(ifaces) == 0 {
		return target{}, fmt.Errorf("verbs: %s port %d has no network interface, and the RDMA connection manager addresses ports by IP (set \"address\"): %w", dev, port, rdma.ErrNoDevice)
	}
	a, err := pickAddress(ifaces, addrsOf)
	if !a.IsValid() {
		if err != nil {
			return target{}, fmt.Errorf("verbs: %s port %d: no usable IP address on %s (set \"address\"): %w: %w", dev, port, strings.Join(ifaces, ", "), rdma.ErrNoDevice, err)
		}
		return target{}, fmt.Errorf("verbs: %s port %d: no usable IP address on %s (set \"address\"): %w", dev, port, strings.Join(ifaces, ", "), rdma.ErrNoDevice)
	}
	return target{addr: a, device: dev, port: port}, nil
}
