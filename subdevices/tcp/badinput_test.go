package tcp

import (
	"cmp"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// dialRaw connects to n's listener like any process on this host could.
func dialRaw(t *testing.T, n *node) net.Conn {
	t.Helper()
	c, err := decodeCard(n.local.Addr)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", netip4(c))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// netip4 is the address a card from a listener on 127.0.0.1 publishes.
func netip4(c card) string {
	return netip.AddrPortFrom(c.Ifaces[0].Addrs[0].Addr(), c.Port).String()
}

// awaitDrop reads until the server closes the connection and fails unless
// it was closed (EOF, or a reset when bytes were left unread).
func awaitDrop(t *testing.T, conn net.Conn) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(watchdog))
	_, err := io.Copy(io.Discard, conn)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("connection not dropped: %v", err)
	}
}

func wireHeader(mutate func(b []byte)) []byte {
	b := make([]byte, sdi.WireHeaderSize)
	sdi.WireHeader{HeaderLen: 4, PayloadLen: 4}.Put(b)
	mutate(b)
	return b
}

// TestStrangers writes bad input to a listening port and checks that each
// connection is dropped with the reason logged, and that the job's own
// traffic is untouched afterwards.
//
// Strangers that send something are refused because of what they send, so
// the job uses a connect_timeout that load cannot trip. It also bounds the
// job's own handshakes and the valid ones the strangers make. Silent
// strangers can only be dropped by the deadline, which is what their rows
// check, so they go to quiet, an instance of their own with a short
// connect_timeout on which nothing has to beat the clock.
func TestStrangers(t *testing.T) {
	nodes := newJob(t, 2, jobOpts{size: 3, config: loopbackConfig("connect_timeout", patientTimeout.String())})
	a, b := nodes[0], nodes[1]
	quiet := openNode(t, 2, jobOpts{size: 3, config: loopbackConfig("connect_timeout", "300ms")})
	jobID := "job-" + t.Name()
	valid := auth{secret: []byte(testSecret), jobID: jobID, rank: 2, size: 3}
	handshake := func(au auth) func(t *testing.T, c net.Conn) {
		return func(t *testing.T, c net.Conn) {
			c.SetDeadline(time.Now().Add(watchdog))
			if err := au.connect(c, b.rank, laneID{}); err != nil {
				t.Fatalf("valid handshake failed: %v", err)
			}
		}
	}
	then := func(first func(*testing.T, net.Conn), data []byte) func(*testing.T, net.Conn) {
		return func(t *testing.T, c net.Conn) {
			first(t, c)
			if _, err := c.Write(data); err != nil {
				t.Fatal(err)
			}
		}
	}
	write := func(data string) func(*testing.T, net.Conn) {
		return func(t *testing.T, c net.Conn) {
			if _, err := c.Write([]byte(data)); err != nil {
				t.Fatal(err)
			}
		}
	}
	refused := func(au auth) func(t *testing.T, c net.Conn) {
		return func(t *testing.T, c net.Conn) {
			c.SetDeadline(time.Now().Add(watchdog))
			if err := au.connect(c, b.rank, laneID{}); err == nil {
				t.Fatalf("handshake with %+v succeeded", au)
			}
		}
	}
	wrongSecret, wrongJob, badRank, negRank := valid, valid, valid, valid
	wrongSecret.secret = []byte("guess")
	wrongJob.jobID = "another job"
	badRank.rank = 3
	negRank.rank = -1

	silent := func(*testing.T, net.Conn) {}
	truncated := func(first func(*testing.T, net.Conn)) func(*testing.T, net.Conn) {
		return func(t *testing.T, c net.Conn) {
			first(t, c)
			if err := c.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
		}
	}

	tests := []struct {
		name    string
		act     func(t *testing.T, c net.Conn)
		wantLog string
		to      *node // the instance the stranger connects to; nil means b
	}{
		{"garbage", write(strings.Repeat("\xab", replyLen)), "bad reply magic", nil},
		{"http request", write("GET / HTTP/1.1\r\nHost: x\r\nUser-Agent: probe/1.0\r\nAccept: */*\r\nConnection: close\r\n\r\n"), "bad reply magic", nil},
		{"silent", silent, "i/o timeout", quiet},
		{"short reply then silent", write("mdth\x02rank"), "i/o timeout", quiet},
		{"short reply", truncated(write("mdth\x02rank")), "reading reply: unexpected EOF", nil},
		{"old version", write("mdth\x01rank"), "reply version 1, this build speaks 2", nil},
		{"wrong secret", refused(wrongSecret), "authentication failed for claimed rank 2", nil},
		{"wrong job", refused(wrongJob), "authentication failed for claimed rank 2", nil},
		{"rank beyond job", refused(badRank), "claimed rank 3 out of range [0,3)", nil},
		{"negative rank", refused(negRank), "claimed rank -1 out of range", nil},
		{"wrong magic", then(handshake(valid), wireHeader(func(b []byte) { b[0] ^= 0xff })), "bad magic", nil},
		{"wrong version", then(handshake(valid), wireHeader(func(b []byte) { b[2] = 9 })), "wire version 9", nil},
		{"reserved bits", then(handshake(valid), wireHeader(func(b []byte) { b[6] = 1 })), "reserved field", nil},
		{"flags", then(handshake(valid), wireHeader(func(b []byte) { b[3] = 0x80 })), "flags 0x80", nil},
		{"oversized payload", then(handshake(valid), wireHeader(func(b []byte) { copy(b[8:], "\xff\xff\xff\xff") })), "payload length 4294967295 exceeds limit", nil},
		{"oversized header", then(handshake(valid), wireHeader(func(b []byte) { copy(b[4:], "\xff\xff") })), "header length 65535 exceeds limit 256", nil},
		{"truncated frame", truncated(then(handshake(valid), append(wireHeader(func([]byte) {}), 1, 2, 3))), "stream ended inside a 8-byte frame", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			to := cmp.Or(tt.to, b)
			c := dialRaw(t, to)
			tt.act(t, c)
			awaitDrop(t, c)
			var line string
			for _, l := range strings.Split(to.log.String(), "\n") {
				if strings.Contains(l, "remote_addr="+c.LocalAddr().String()) && strings.Contains(l, "[WARN]") {
					line = l
				}
			}
			if !strings.Contains(line, tt.wantLog) {
				t.Fatalf("no Warn for %s naming %q; got %q", c.LocalAddr(), tt.wantLog, line)
			}
		})
	}

	const n = 100
	for i := range n {
		send(t, a, &sdi.Frame{Peer: b.rank, Header: []byte{byte(i)}, Payload: pattern(i*100, byte(i)), Token: uint64(i)})
		send(t, b, &sdi.Frame{Peer: a.rank, Header: []byte{byte(i)}, Payload: pattern(i*100, byte(i)), Token: uint64(i)})
	}
	for _, pair := range [][2]*node{{a, b}, {b, a}} {
		from, to := pair[0], pair[1]
		to.rec.waitFor(t, "the job's own frames", func() bool { return len(to.rec.delivered[from.rank]) == n })
		for i, d := range to.rec.frames(from.rank) {
			if d.header[0] != byte(i) || string(d.payload) != string(pattern(i*100, byte(i))) {
				t.Fatalf("%d->%d: frame %d corrupted", from.rank, to.rank, i)
			}
		}
		if err := from.rec.down(to.rank); err != nil {
			t.Fatalf("%d reported %d down: %v", from.rank, to.rank, err)
		}
	}
}

// TestHandshakeFlood checks that connections beyond the handshake limit are
// dropped at once, and that the slots come back when the strangers leave.
func TestHandshakeFlood(t *testing.T) {
	nodes := newJob(t, 2, jobOpts{size: 3})
	a, b := nodes[0], nodes[1]
	var conns []net.Conn
	for range maxHandshakes {
		c := dialRaw(t, b)
		// Reading the hello proves the listener took this one into a slot.
		if _, err := io.ReadFull(c, make([]byte, helloLen)); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	extra := dialRaw(t, b)
	awaitDrop(t, extra)
	if !strings.Contains(b.log.String(), "too many handshakes in progress") {
		t.Fatalf("dropping a connection beyond the limit was not logged")
	}
	for _, c := range conns {
		c.Close()
	}
	// A rank reconnecting needs a free slot; it gets one once the server has
	// seen the strangers leave.
	if err := a.sd.Disconnect(t.Context(), b.rank); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(watchdog)
	for {
		err := a.sd.Connect(t.Context(), b.rank, b.local.Addr)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("handshake slots never came back: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	send(t, a, &sdi.Frame{Peer: b.rank, Payload: []byte("after the flood")})
	b.rec.waitFor(t, "delivery", func() bool { return len(b.rec.delivered[a.rank]) == 1 })
}
