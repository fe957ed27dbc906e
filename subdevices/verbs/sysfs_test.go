package verbs

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hpc-multidevice/multidevice/internal/rdma"
)

// fakeSys builds a sysfs tree from path -> content; a path ending in "/" is
// an empty directory.
func fakeSys(t *testing.T, files map[string]string) sysfs {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if strings.HasSuffix(p, "/") {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return sysfs(root)
}

const ib = "class/infiniband/"

// twoDevices: mlx5_0 is a dual-port InfiniBand adapter with only port 2
// up (IPoIB ib0 on port 1, ib1 on port 2); mlx5_1 is a RoCE port on eth2.
func twoDevices(t *testing.T) sysfs {
	return fakeSys(t, map[string]string{
		ib + "mlx5_0/ports/1/state":                 "1: DOWN\n",
		ib + "mlx5_0/ports/2/state":                 "4: ACTIVE\n",
		ib + "mlx5_0/ports/2/gid_attrs/ndevs/0":     "", // IB ports have no ndev; real sysfs fails the read
		ib + "mlx5_0/device/net/ib0/dev_port":       "0\n",
		ib + "mlx5_0/device/net/ib1/dev_port":       "1\n",
		ib + "mlx5_1/ports/1/state":                 "4: ACTIVE\n",
		ib + "mlx5_1/ports/1/gid_attrs/ndevs/0":     "eth2\n",
		ib + "mlx5_1/ports/1/gid_attrs/ndevs/1":     "eth2\n",
		ib + "mlx5_1/ports/1/gid_attrs/ndevs/10":    "eth2.100\n",
		ib + "mlx5_1/ports/1/gid_attrs/ndevs/2":     "vlan7\n",
		ib + "mlx5_1/device/net/eth2/dev_port":      "0\n",
		ib + "mlx5_1/ports/1/gid_attrs/ndevs/3/":    "",
		ib + "mlx5_1/ports/not-a-port/":             "",
		ib + "mlx5_0/ports/2/gid_attrs/ndevs/junk/": "",
	})
}

func fakeAddrs(m map[string][]string) addrsFunc {
	return func(name string) ([]netip.Addr, error) {
		ss, ok := m[name]
		if !ok {
			return nil, errors.New("no such interface " + name)
		}
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out, nil
	}
}

func TestNoDevice(t *testing.T) {
	for name, s := range map[string]sysfs{
		"no infiniband class": fakeSys(t, map[string]string{"class/net/": ""}),
		"empty class":         fakeSys(t, map[string]string{ib: ""}),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := findTarget(s, config{}, fakeAddrs(nil))
			if !errors.Is(err, rdma.ErrNoDevice) || !strings.Contains(err.Error(), "class/infiniband") {
				t.Fatalf("findTarget = %v, want ErrNoDevice naming /sys/class/infiniband", err)
			}
			// And what to do about it: a job that names verbs on a host
			// without the hardware stops here.
			for _, next := range []string{"modprobe", "plugins.hcl", `command = "sdi-verbs"`} {
				if !strings.Contains(err.Error(), next) {
					t.Errorf("findTarget = %v: no next step mentions %s", err, next)
				}
			}
		})
	}
}

func TestChoosePort(t *testing.T) {
	s := twoDevices(t)
	devs, err := s.devices()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		device   string
		port     int
		wantDev  string
		wantPort int
		wantErr  string
		noDevice bool // the error wraps rdma.ErrNoDevice
	}{
		{"", 0, "mlx5_0", 2, "", false},
		{"", 1, "mlx5_1", 1, "", false},
		{"", 2, "mlx5_0", 2, "", false},
		{"mlx5_1", 0, "mlx5_1", 1, "", false},
		{"mlx5_0", 2, "mlx5_0", 2, "", false},
		{"mlx5_0", 1, "", 0, "no ACTIVE port (mlx5_0 port 1 DOWN)", true},
		{"mlx5_9", 0, "", 0, `device "mlx5_9": not found (devices: mlx5_0, mlx5_1)`, false},
		{"mlx5_1", 2, "", 0, "port 2: device mlx5_1 has ports 1", false},
		{"", 3, "", 0, "no device has a port 3", true},
	}
	for _, tt := range tests {
		dev, port, err := s.choosePort(devs, tt.device, tt.port)
		if tt.wantErr == "" {
			if err != nil || dev != tt.wantDev || port != tt.wantPort {
				t.Errorf("choosePort(%q, %d) = %s, %d, %v; want %s, %d", tt.device, tt.port, dev, port, err, tt.wantDev, tt.wantPort)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) || errors.Is(err, rdma.ErrNoDevice) != tt.noDevice {
			t.Errorf("choosePort(%q, %d) error %v, want one saying %q (ErrNoDevice: %v)", tt.device, tt.port, err, tt.wantErr, tt.noDevice)
		}
	}
}

func TestNetdevs(t *testing.T) {
	s := twoDevices(t)
	// The fake IB port's ndevs/0 is empty, as an unreadable entry would be.
	if got := s.netdevs("mlx5_0", 2); strings.Join(got, ",") != "ib1" {
		t.Errorf("netdevs(mlx5_0, 2) = %v, want [ib1] (dev_port 1)", got)
	}
	if got := s.netdevs("mlx5_0", 1); strings.Join(got, ",") != "ib0" {
		t.Errorf("netdevs(mlx5_0, 1) = %v, want [ib0]", got)
	}
	if got := s.netdevs("mlx5_1", 1); strings.Join(got, ",") != "eth2,vlan7,eth2.100" {
		t.Errorf("netdevs(mlx5_1, 1) = %v, want GID order [eth2 vlan7 eth2.100]", got)
	}
	noPortInfo := fakeSys(t, map[string]string{ib + "rxe0/ports/1/state": "4: ACTIVE", ib + "rxe0/device/net/enp1s0/": ""})
	if got := noPortInfo.netdevs("rxe0", 1); strings.Join(got, ",") != "enp1s0" {
		t.Errorf("netdevs without dev_port = %v, want [enp1s0]", got)
	}
}

func TestPickAddress(t *testing.T) {
	addrs := fakeAddrs(map[string][]string{
		"ib0":   {"fe80::1", "fd00::10", "10.1.0.7"},
		"ib1":   {"10.2.0.7"},
		"v6":    {"fe80::2", "2001:db8::7", "fd00::8"},
		"local": {"fe80::3"},
	})
	tests := []struct {
		ifaces []string
		want   string
	}{
		{[]string{"ib0"}, "10.1.0.7"},
		{[]string{"v6", "ib1"}, "10.2.0.7"}, // any IPv4 before IPv6
		{[]string{"v6"}, "2001:db8::7"},
		{[]string{"missing", "ib1"}, "10.2.0.7"},
	}
	for _, tt := range tests {
		got, err := pickAddress(tt.ifaces, addrs)
		if err != nil || got != netip.MustParseAddr(tt.want) {
			t.Errorf("pickAddress(%v) = %v, %v; want %s", tt.ifaces, got, err, tt.want)
		}
	}
	if got, _ := pickAddress([]string{"local"}, addrs); got.IsValid() {
		t.Errorf("pickAddress([local]) = %v, want none (link-local only)", got)
	}
	if got, err := pickAddress([]string{"missing"}, addrs); got.IsValid() || err == nil {
		t.Errorf("pickAddress([missing]) = %v, %v; want no address and the lookup error", got, err)
	}
}

func TestFindTarget(t *testing.T) {
	s := twoDevices(t)
	addrs := fakeAddrs(map[string][]string{"ib1": {"10.2.0.7"}, "eth2": {"192.168.5.1"}, "vlan7": {}, "eth2.100": {}})
	tests := []struct {
		name     string
		c        config
		want     target
		wantErr  string
		noDevice bool
	}{
		{"defaults", config{}, target{netip.MustParseAddr("10.2.0.7"), "mlx5_0", 2}, "", false},
		{"roce device", config{device: "mlx5_1"}, target{netip.MustParseAddr("192.168.5.1"), "mlx5_1", 1}, "", false},
		{"address given", config{address: netip.MustParseAddr("10.9.9.9")}, target{netip.MustParseAddr("10.9.9.9"), "", 0}, "", false},
		{"address and device", config{address: netip.MustParseAddr("10.9.9.9"), device: "mlx5_1", port: 1},
			target{netip.MustParseAddr("10.9.9.9"), "mlx5_1", 1}, "", false},
		{"address and unknown device", config{address: netip.MustParseAddr("10.9.9.9"), device: "hfi1_0"}, target{},
			`device "hfi1_0": not found`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := findTarget(s, tt.c, addrs)
			if tt.wantErr == "" {
				if err != nil || got != tt.want {
					t.Fatalf("findTarget(%+v) = %+v, %v; want %+v", tt.c, got, err, tt.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || errors.Is(err, rdma.ErrNoDevice) != tt.noDevice {
				t.Fatalf("findTarget(%+v) error %v, want one saying %q", tt.c, err, tt.wantErr)
			}
		})
	}

	noAddr := fakeAddrs(map[string][]string{"ib1": {"fe80::1"}})
	_, err := findTarget(s, config{}, noAddr)
	if !errors.Is(err, rdma.ErrNoDevice) || !strings.Contains(err.Error(), `no usable IP address on ib1 (set "address")`) {
		t.Errorf("findTarget without an address = %v, want ErrNoDevice asking for \"address\"", err)
	}
	noNet := fakeSys(t, map[string]string{ib + "qib0/ports/1/state": "4: ACTIVE"})
	_, err = findTarget(noNet, config{}, addrs)
	if !errors.Is(err, rdma.ErrNoDevice) || !strings.Contains(err.Error(), "qib0 port 1 has no network interface") {
		t.Errorf("findTarget without a netdev = %v, want ErrNoDevice naming qib0 port 1", err)
	}
}

func TestInterfaceAddrs(t *testing.T) {
	addrs, err := interfaceAddrs("lo")
	if err != nil {
		t.Skipf("no loopback interface here: %v", err)
	}
	if !slices.Contains(addrs, netip.MustParseAddr("127.0.0.1")) {
		t.Fatalf("interfaceAddrs(lo) = %v, want 127.0.0.1 among them", addrs)
	}
	if _, err := interfaceAddrs("no-such-interface0"); err == nil {
		t.Fatal("interfaceAddrs of a missing interface succeeded")
	}
}
