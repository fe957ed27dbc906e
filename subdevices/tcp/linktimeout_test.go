package tcp

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sockOpts reads what bounds a dead link on socket fd: TCP_USER_TIMEOUT
// in milliseconds, SO_KEEPALIVE and TCP_KEEPIDLE in seconds.
func sockOpts(t *testing.T, fd int) (userTimeout, keepalive, idle int) {
	t.Helper()
	var errs [3]error
	userTimeout, errs[0] = unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
	keepalive, errs[1] = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE)
	idle, errs[2] = unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return userTimeout, keepalive, idle
}

// TestLinkTimeout: the connections a rank dials and those it accepts both
// carry link_timeout as TCP_USER_TIMEOUT, with keepalive probes starting
// after a third of it; "0s" leaves the system's retransmission limit and
// Go's keepalive.
func TestLinkTimeout(t *testing.T) {
	tests := []struct {
		setting         string // "" leaves the key out
		userMS, idleSec int
	}{
		{"", 30000, 10},
		{"6s", 6000, 2},
		{"0s", 0, 15},
	}
	for _, tt := range tests {
		t.Run("link_timeout="+tt.setting, func(t *testing.T) {
			nodes := newJob(t, 2, jobOpts{config: loopbackConfig("link_timeout", tt.setting)})
			raw, err := nodes[0].sd.(*subDevice).peers[1].Load().lanes[0].conn.(*net.TCPConn).SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			dialed := -1
			raw.Control(func(fd uintptr) { dialed = int(fd) })
			// The reader's own descriptor of the accepted socket.
			in := inboundOf(t, nodes[1])
			in.mu.Lock()
			accepted := in.rx.fd
			in.mu.Unlock()
			for name, fd := range map[string]int{"dialed": dialed, "accepted": accepted} {
				user, ka, idle := sockOpts(t, fd)
				if user != tt.userMS || ka != 1 || idle != tt.idleSec {
					t.Errorf("%s connection: TCP_USER_TIMEOUT %d ms, SO_KEEPALIVE %d, TCP_KEEPIDLE %d s; want %d ms, 1, %d s",
						name, user, ka, idle, tt.userMS, tt.idleSec)
				}
			}
		})
	}
}

func TestKeepAliveSchedule(t *testing.T) {
	if got := keepAlive(0); got != (net.KeepAliveConfig{}) {
		t.Errorf("keepAlive(0) = %+v, want Go's defaults", got)
	}
	if got := keepAlive(30 * time.Second); got != (net.KeepAliveConfig{Enable: true, Idle: 10 * time.Second, Interval: 5 * time.Second, Count: 3}) {
		t.Errorf("keepAlive(30s) = %+v", got)
	}
	if got := keepAlive(time.Second); got.Idle != time.Second || got.Interval != time.Second {
		t.Errorf("keepAlive(1s) = %+v, want probes no more often than every second", got)
	}
}
