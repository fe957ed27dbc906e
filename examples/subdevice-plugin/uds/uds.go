// Package uds is an example subdevice for the multidevice: it carries
// frames between ranks on one host over Unix-domain stream sockets. It is
// small on purpose, to show what a subdevice must do, and it passes the SDI
// conformance suite (sdi/sditest), in process and as a plugin binary.
//
// Each rank listens on a socket in a directory (config key "dir", default
// os.TempDir()) and publishes its path in its business card. Connect dials
// the peer and introduces itself with its rank and a token derived from the
// job secret; a listener drops connections that cannot show the token. One
// connection carries one direction, so per-peer order is the socket's.
// Frames travel with the wire header of package sdi (sdi.WireHeader), which
// every receiver checks before it trusts a length.
//
// Config (JSON, from the subdevice's config block in plugins.hcl):
//
//	{"dir": "/run/md", "queue_bytes": 4194304}
package uds

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Version is this subdevice's own version.
const Version = "0.1.0"

const (
	maxHeader    = 256
	maxEager     = 64 << 10
	maxFrame     = 1 << 20
	defaultQueue = 4 << 20
	maxPathLen   = 100 // sun_path holds 108 bytes
	helloLen     = 4 + sha256.Size
	helloTimeout = 5 * time.Second
)

type config struct {
	Dir        string `json:"dir"`
	QueueBytes int    `json:"queue_bytes"`
}

func parseConfig(b []byte) (config, error) {
	c := config{Dir: os.TempDir(), QueueBytes: defaultQueue}
	if len(bytes.TrimSpace(b)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			return config{}, fmt.Errorf("uds: config: %w (known keys: dir, queue_bytes)", err)
		}
	}
	if c.QueueBytes < maxFrame {
		return config{}, fmt.Errorf("uds: config: queue_bytes %d must be at least %d", c.QueueBytes, maxFrame)
	}
	return c, nil
}

// subDevice implements sdi.SubDevice. It is safe for concurrent use.
type subDevice struct {
	mu     sync.Mutex
	opened bool
	closed atomic.Bool
	wg     sync.WaitGroup

	// Set by Open.
	log   hclog.Logger
	h     sdi.Handler
	rank  sdi.Rank
	host  string
	job   string
	token [sha256.Size]byte
	queue int
	path  string
	ln    *net.UnixListener
	peers []atomic.Pointer[peer] // outbound connections by rank

	inbound map[net.Conn]struct{} // guarded by mu
}

// New returns an unopened uds subdevice.
func New(logger hclog.Logger) sdi.SubDevice {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &subDevice{log: logger, inbound: make(map[net.Conn]struct{})}
}

func (sd *subDevice) Info(context.Context) (sdi.Info, error) {
	return sdi.Info{Name: "uds", Version: Version, APIVersions: []string{sdi.APIVersion}}, nil
}

func (sd *subDevice) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	sd.mu.Lock()
	defer sd.mu.Unlock()
	switch {
	case sd.closed.Load():
		return sdi.Local{}, fmt.Errorf("uds: open: %w", sdi.ErrClosed)
	case sd.opened:
		return sdi.Local{}, errors.New("uds: open: already open")
	case p.Handler == nil || p.Size <= 0 || p.Rank < 0 || int(p.Rank) >= p.Size:
		return sdi.Local{}, fmt.Errorf("uds: open: rank %d of %d, handler %v", p.Rank, p.Size, p.Handler != nil)
	}
	cfg, err := parseConfig(p.Config)
	if err != nil {
		return sdi.Local{}, err
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	path := filepath.Join(cfg.Dir, "mdsdi-uds-"+hex.EncodeToString(rnd[:])+".sock")
	if len(path) > maxPathLen {
		return sdi.Local{}, fmt.Errorf("uds: open: socket path %q is longer than %d bytes; set a shorter dir", path, maxPathLen)
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "unix", path)
	if err != nil {
		return sdi.Local{}, fmt.Errorf("uds: open: %w", err)
	}
	os.Chmod(path, 0o600) // only this user may even try the token
	c, err := card{Version: cardVersion, Host: p.Host, Job: p.JobID, Rank: p.Rank, Path: path}.encode()
	if err != nil {
		l.Close()
		return sdi.Local{}, fmt.Errorf("uds: open: %w", err)
	}
	if p.Logger != nil {
		sd.log = p.Logger
	}
	sd.opened = true
	sd.h, sd.rank, sd.host, sd.job, sd.queue, sd.path = p.Handler, p.Rank, p.Host, p.JobID, cfg.QueueBytes, path
	sd.token = sha256.Sum256(append([]byte(p.JobID+"\x00"), p.Secret...))
	sd.ln = l.(*net.UnixListener)
	sd.peers = make([]atomic.Pointer[peer], p.Size)
	sd.wg.Add(1)
	go sd.accept()
	return sdi.Local{Addr: c, Caps: sdi.Caps{
		MaxHeader:   maxHeader,
		MaxEager:    maxEager,
		MaxFrame:    maxFrame,
		Exclusivity: 20, // above the network, below shared memory
		Latency:     5 * time.Microsecond,
		Bandwidth:   4_000_000_000,
		Reach:       sdi.ReachHost,
		Flags:       sdi.FlagReliable | sdi.FlagOrdered,
	}}, nil
}

// Connect dials peer's socket and introduces this rank.
func (sd *subDevice) Connect(ctx context.Context, peer sdi.Rank, addr []byte) error {
	if sd.closed.Load() {
		return fmt.Errorf("uds: connect: %w", sdi.ErrClosed)
	}
	if !sd.isOpen() || int(peer) < 0 || int(peer) >= len(sd.peers) {
		return fmt.Errorf("uds: connect to rank %d: %w: not open or rank out of range", peer, sdi.ErrPeerUnreachable)
	}
	c, err := decodeCard(addr)
	if err != nil {
		return err
	}
	switch {
	case c.Host != sd.host:
		return fmt.Errorf("uds: connect to rank %d: %w: it is on host %q, this is %q", peer, sdi.ErrPeerUnreachable, c.Host, sd.host)
	case c.Job != sd.job || c.Rank != peer:
		return fmt.Errorf("uds: connect to rank %d: %w: the card is rank %d of job %q", peer, sdi.ErrPeerUnreachable, c.Rank, c.Job)
	}
	if sd.peers[peer].Load() != nil {
		return nil
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.Path)
	if err != nil {
		return fmt.Errorf("uds: connect to rank %d: %w: %v", peer, sdi.ErrPeerUnreachable, err)
	}
	var hello [helloLen]byte
	binary.LittleEndian.PutUint32(hello[:], uint32(sd.rank))
	copy(hello[4:], sd.token[:])
	conn.SetWriteDeadline(time.Now().Add(helloTimeout))
	if _, err := conn.Write(hello[:]); err != nil {
		conn.Close()
		return fmt.Errorf("uds: connect to rank %d: %w: hello: %v", peer, sdi.ErrPeerUnreachable, err)
	}
	conn.SetWriteDeadline(time.Time{})
	p := newPeer(sd, peer, conn)
	sd.mu.Lock()
	defer sd.mu.Unlock()
	if sd.closed.Load() || !sd.peers[peer].CompareAndSwap(nil, p) {
		conn.Close()
		if sd.closed.Load() {
			return fmt.Errorf("uds: connect: %w", sdi.ErrClosed)
		}
		return nil // another Connect won
	}
	sd.wg.Add(1)
	go p.write()
	return nil
}

func (sd *subDevice) isOpen() bool {
	sd.mu.Lock()
	defer sd.mu.Unlock()
	return sd.opened
}

func (sd *subDevice) Send(f *sdi.Frame) (bool, error) {
	if sd.closed.Load() {
		return false, fmt.Errorf("uds: send: %w", sdi.ErrClosed)
	}
	if len(f.Header) > maxHeader || len(f.Payload) > maxFrame {
		return false, fmt.Errorf("uds: send %d+%d bytes: %w", len(f.Header), len(f.Payload), sdi.ErrTooLarge)
	}
	if int(f.Peer) < 0 || int(f.Peer) >= len(sd.peers) {
		return false, fmt.Errorf("uds: send to rank %d: %w", f.Peer, sdi.ErrNotConnected)
	}
	p := sd.peers[f.Peer].Load()
	if p == nil {
		return false, fmt.Errorf("uds: send to rank %d: %w", f.Peer, sdi.ErrNotConnected)
	}
	return false, p.enqueue(f)
}

func (sd *subDevice) Flush(ctx context.Context, peer sdi.Rank) error {
	if sd.closed.Load() {
		return fmt.Errorf("uds: flush: %w", sdi.ErrClosed)
	}
	if int(peer) < 0 || int(peer) >= len(sd.peers) {
		return nil
	}
	if p := sd.peers[peer].Load(); p != nil {
		return p.flush(ctx)
	}
	return nil
}

func (sd *subDevice) Disconnect(ctx context.Context, peer sdi.Rank) error {
	if sd.closed.Load() {
		return fmt.Errorf("uds: disconnect: %w", sdi.ErrClosed)
	}
	if int(peer) < 0 || int(peer) >= len(sd.peers) {
		return nil
	}
	p := sd.peers[peer].Swap(nil)
	if p == nil {
		return nil
	}
	err := p.flush(ctx)
	p.shut(sdi.ErrClosed)
	return err
}

// Close closes every connection, fails what is queued with ErrClosed and
// waits for its goroutines.
func (sd *subDevice) Close(context.Context) error {
	sd.mu.Lock()
	if sd.closed.Swap(true) {
		sd.mu.Unlock()
		return nil
	}
	if sd.ln != nil {
		sd.ln.Close()
	}
	for i := range sd.peers {
		if p := sd.peers[i].Load(); p != nil {
			p.shut(sdi.ErrClosed)
		}
	}
	for c := range sd.inbound {
		c.Close()
	}
	sd.mu.Unlock()
	sd.wg.Wait()
	if sd.path != "" {
		os.Remove(sd.path)
	}
	return nil
}

func (sd *subDevice) accept() {
	defer sd.wg.Done()
	for {
		conn, err := sd.ln.Accept()
		if err != nil {
			if !sd.closed.Load() {
				sd.log.Error("accept failed; no more peers can connect", "error", err)
			}
			return
		}
		sd.mu.Lock()
		if sd.closed.Load() {
			sd.mu.Unlock()
			conn.Close()
			return
		}
		sd.inbound[conn] = struct{}{}
		sd.wg.Add(1)
		sd.mu.Unlock()
		go sd.read(conn)
	}
}

// read checks a newcomer's hello, then delivers its frames until the
// connection ends.
func (sd *subDevice) read(conn net.Conn) {
	defer sd.wg.Done()
	defer func() {
		sd.mu.Lock()
		delete(sd.inbound, conn)
		sd.mu.Unlock()
		conn.Close()
	}()
	var hello [helloLen]byte
	conn.SetReadDeadline(time.Now().Add(helloTimeout))
	if _, err := io.ReadFull(conn, hello[:]); err != nil {
		sd.log.Debug("dropping a connection without a hello", "error", err)
		return
	}
	from := sdi.Rank(int32(binary.LittleEndian.Uint32(hello[:])))
	if int(from) < 0 || int(from) >= len(sd.peers) || subtle.ConstantTimeCompare(hello[4:], sd.token[:]) != 1 {
		sd.log.Warn("dropping a connection that cannot show the job's token", "claimed_rank", from)
		return
	}
	conn.SetReadDeadline(time.Time{})
	var wh [sdi.WireHeaderSize]byte
	var buf []byte
	for {
		_, err := io.ReadFull(conn, wh[:])
		var h sdi.WireHeader
		if err == nil {
			h, err = sdi.DecodeWireHeader(wh[:], maxHeader, maxFrame)
		}
		if err == nil {
			n := int(h.HeaderLen) + int(h.PayloadLen)
			if cap(buf) < n {
				buf = make([]byte, n)
			}
			buf = buf[:n]
			_, err = io.ReadFull(conn, buf)
		}
		if err != nil {
			if !sd.closed.Load() {
				sd.h.PeerDown(from, fmt.Errorf("uds: connection from rank %d: %w", from, err))
			}
			return
		}
		sd.h.Deliver(from, buf[:h.HeaderLen], buf[h.HeaderLen:])
	}
}

// peer is the outbound side of one connection: a bounded queue and the
// goroutine that writes it.
type peer struct {
	sd   *subDevice
	rank sdi.Rank
	conn net.Conn

	mu      sync.Mutex
	cond    *sync.Cond // queue or state changed
	queue   []*sdi.Frame
	queued  int // payload bytes queued or being written
	writing int // frames taken by the writer, not yet completed
	err     error
}

func newPeer(sd *subDevice, rank sdi.Rank, conn net.Conn) *peer {
	p := &peer{sd: sd, rank: rank, conn: conn}
	p.cond = sync.NewCond(&p.mu)
	return p
}

func (p *peer) enqueue(f *sdi.Frame) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.err != nil:
		return fmt.Errorf("uds: send to rank %d: %w: %w", p.rank, sdi.ErrPeerUnreachable, p.err)
	case p.queued > 0 && p.queued+len(f.Payload) > p.sd.queue:
		return sdi.ErrWouldBlock
	}
	p.queue = append(p.queue, f)
	p.queued += len(f.Payload)
	p.cond.Broadcast()
	return nil
}

// write sends queued frames in batches, one writev each, and completes
// them.
func (p *peer) write() {
	defer p.sd.wg.Done()
	var hdrs []byte
	for {
		p.mu.Lock()
		for len(p.queue) == 0 && p.err == nil {
			p.cond.Wait()
		}
		if p.err != nil {
			rest := p.queue
			p.queue = nil
			err := p.err
			p.mu.Unlock()
			p.conn.Close()
			for _, f := range rest {
				p.sd.h.SendDone(f.Token, err)
			}
			return
		}
		batch := p.queue
		p.queue = nil
		p.writing = len(batch)
		p.mu.Unlock()

		hdrs = hdrs[:0]
		for _, f := range batch {
			var wh [sdi.WireHeaderSize]byte
			sdi.WireHeader{HeaderLen: uint16(len(f.Header)), PayloadLen: uint32(len(f.Payload))}.Put(wh[:])
			hdrs = append(hdrs, wh[:]...)
		}
		bufs := make(net.Buffers, 0, 3*len(batch))
		size := 0
		for i, f := range batch {
			bufs = append(bufs, hdrs[i*sdi.WireHeaderSize:(i+1)*sdi.WireHeaderSize], f.Header, f.Payload)
			size += len(f.Payload)
		}
		_, err := bufs.WriteTo(p.conn)
		if err != nil && !p.sd.closed.Load() {
			err = fmt.Errorf("uds: write to rank %d: %w", p.rank, err)
			p.sd.h.PeerDown(p.rank, err)
		} else if err != nil {
			err = fmt.Errorf("uds: write to rank %d: %w", p.rank, sdi.ErrClosed)
		}
		for _, f := range batch {
			p.sd.h.SendDone(f.Token, err)
		}
		p.mu.Lock()
		p.queued -= size
		p.writing = 0
		if err != nil && p.err == nil {
			p.err = err
		}
		p.cond.Broadcast()
		p.mu.Unlock()
	}
}

// flush waits until everything queued has been written or failed.
func (p *peer) flush(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	for (len(p.queue) > 0 || p.writing > 0) && p.err == nil {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("uds: flush rank %d: %w", p.rank, err)
		}
		p.cond.Wait()
	}
	return nil
}

// shut stops the peer: the writer fails what is queued with err and
// closes the connection; a write in progress fails at once.
func (p *peer) shut(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	p.conn.Close()
}
