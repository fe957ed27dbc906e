package plugin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/hpc-multidevice/multidevice/internal/shmem"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/proto/sdiv1"
)

// Client is a subdevice served by a plugin process, as the host sees it:
// an sdi.SubDevice that the multidevice uses like a built-in one. It is safe
// for concurrent use.
//
// It also implements sdi.Poller, sdi.Idler and sdi.JobCards. Its Caps
// carry FlagPoll and FlagIdle with the shared-memory data plane (a waiting
// rank drains the ring itself, and the plugin polls its subdevice for as
// long as the rank polls), and FlagJobCards only when the plugin's
// subdevice has it; SetJobCards returns sdi.ErrUnsupported otherwise. A subdevice with
// FlagMatching is refused at Open: protocol 1 does not carry matching.
//
// Send copies the frame into the data plane and reports it complete at
// once (done=true). Should the plugin's subdevice later refuse it, the
// peer is reported down, as a reliable subdevice must. When the plugin
// exits, crashes or stops answering, every connected peer is reported
// down and every later call fails with an error wrapping ErrPluginExited.
type Client struct {
	cfg     Config
	log     hclog.Logger
	pc      *goplugin.Client
	sockDir string   // the plugin's socket directory; removed once it has ended
	hostEnd *os.File // closed once the plugin has ended; see envHostFD
	// release ends exec's watch of Start's abort context (start.go), once
	// the plugin has ended and there is nothing left for it to kill.
	release context.CancelFunc
	rpc     sdiv1.SubDeviceClient
	exit    context.Context // done when the plugin process has exited

	life   context.Context // done at Close or when the plugin is taken out
	cancel context.CancelFunc

	mu     sync.Mutex // serializes Open and Close
	opened bool
	// abortMu guards closing and abortOpen, with which Close cuts short an
	// Open it would otherwise wait for on mu, up to Open's whole timeout.
	abortMu   sync.Mutex
	closing   bool
	abortOpen context.CancelCauseFunc
	st        atomic.Pointer[openState]
	closed    atomic.Bool
	dead      atomic.Pointer[error] // why the plugin was taken out
	wg        sync.WaitGroup        // the watcher and heartbeat goroutines
	once      sync.Once

	pinging  atomic.Bool
	nameOnce sync.Once // logs a subdevice name other than cfg.Name
}

// openState is fixed by Open.
type openState struct {
	h         sdi.Handler
	caps      sdi.Caps // what the host publishes: the plugin's, fitted to the plane
	connected []atomic.Bool
	plane     hostPlane
	records   atomic.Uint64 // frame records written to the plane
	sendMu    sync.Mutex    // orders the count with the plane's order
}

func newClient(c Config, pc *goplugin.Client, d *dispensed, sockDir string, hostEnd *os.File, release context.CancelFunc) *Client {
	cl := &Client{cfg: c, log: c.Logger, pc: pc, rpc: d.rpc, exit: d.done, sockDir: sockDir, hostEnd: hostEnd, release: release}
	cl.life, cl.cancel = context.WithCancel(context.Background())
	cl.wg.Add(1)
	go cl.watch()
	return cl
}

// call bounds a control call by the configured timeout and the plugin's
// life, and turns its error into one that names the plugin. A call that
// times out takes the plugin out: it hangs.
func (c *Client) call(ctx context.Context, op string, fn func(ctx context.Context) error) error {
	if c.closed.Load() {
		return fmt.Errorf("sdi/plugin: %q: %s: %w", c.cfg.Name, op, sdi.ErrClosed)
	}
	if e := c.dead.Load(); e != nil {
		return fmt.Errorf("sdi/plugin: %q: %s: %w", c.cfg.Name, op, *e)
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	stop := context.AfterFunc(c.life, cancel)
	defer stop()
	err := fromStatus(op, fn(cctx))
	if err == nil {
		return nil
	}
	if e := c.dead.Load(); e != nil {
		return fmt.Errorf("sdi/plugin: %q: %s: %w", c.cfg.Name, op, *e)
	}
	if errors.Is(err, context.DeadlineExceeded) && expired(cctx) && !expired(ctx) {
		// Our timeout fired, not the caller's: the plugin hangs. A
		// deadline error while ours still ran is the subdevice's own (one
		// peer's handshake bounded, say): that call fails, nothing more.
		c.takeOut(fmt.Errorf("%w: %s did not answer within %v", ErrPluginExited, op, c.cfg.Timeout))
		return fmt.Errorf("sdi/plugin: %q: %w", c.cfg.Name, *c.dead.Load())
	}
	if errors.Is(err, ErrPluginExited) {
		c.takeOut(err)
	}
	return fmt.Errorf("sdi/plugin: %q: %w", c.cfg.Name, err)
}

// expired reports whether ctx is done or its deadline has passed: gRPC
// reports a deadline exceeded as soon as it has passed, which may be before
// ctx's own timer has fired.
func expired(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// Info returns the plugin's subdevice's identity.
func (c *Client) Info(ctx context.Context) (sdi.Info, error) {
	var resp *sdiv1.GetInfo_Response
	err := c.call(ctx, "info", func(ctx context.Context) (err error) {
		resp, err = c.rpc.GetInfo(ctx, &sdiv1.GetInfo_Request{})
		return err
	})
	if err != nil {
		return sdi.Info{}, err
	}
	if name := resp.GetName(); name != c.cfg.Name {
		// Legitimate (one plugin binary may serve several blocks, as a
		// built-in may run under another name), but a typo in
		// plugins.hcl or the wrong command looks the same.
		c.nameOnce.Do(func() {
			c.log.Info("the plugin's subdevice calls itself by another name; the plugins.hcl block's name is used",
				"plugin", c.cfg.Name, "path", c.cfg.Path, "subdevice", name)
		})
	}
	return sdi.Info{Name: resp.GetName(), Version: resp.GetVersion(), APIVersions: resp.GetApiVersions()}, nil
}

// Open opens the plugin's subdevice and attaches the data plane: shared
// memory where possible, the gRPC stream otherwise.
func (c *Client) Open(ctx context.Context, p sdi.OpenParams) (sdi.Local, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed.Load():
		return sdi.Local{}, fmt.Errorf("sdi/plugin: %q: open: %w", c.cfg.Name, sdi.ErrClosed)
	case c.opened:
		return sdi.Local{}, fmt.Errorf("sdi/plugin: %q: open: already open", c.cfg.Name)
	case p.Handler == nil:
		return sdi.Local{}, fmt.Errorf("sdi/plugin: %q: open: nil Handler", c.cfg.Name)
	case p.Size <= 0:
		return sdi.Local{}, fmt.Errorf("sdi/plugin: %q: open: job size %d must be positive", c.cfg.Name, p.Size)
	}
	octx, abort := context.WithCancelCause(ctx)
	defer abort(nil)
	c.abortMu.Lock()
	closing := c.closing
	if !closing {
		c.abortOpen = abort
	}
	c.abortMu.Unlock()
	if closing {
		return sdi.Local{}, fmt.Errorf("sdi/plugin: %q: open: %w", c.cfg.Name, sdi.ErrClosed)
	}
	var resp *sdiv1.Open_Response
	err := c.call(octx, "open", func(ctx context.Context) (err error) {
		resp, err = c.rpc.Open(ctx, &sdiv1.Open_Request{
			Rank: int32(p.Rank), Size: int64(p.Size), Host: p.Host, Site: p.Site, JobId: p.JobID, Secret: p.Secret,
			ApiVersion: p.APIVersion, Config: p.Config,
		})
		return err
	})
	c.abortMu.Lock()
	c.abortOpen = nil
	c.abortMu.Unlock()
	if err != nil {
		if errors.Is(context.Cause(octx), sdi.ErrClosed) {
			return sdi.Local{}, fmt.Errorf("sdi/plugin: %q: open: cut short by Close: %w", c.cfg.Name, sdi.ErrClosed)
		}
		return sdi.Local{}, err
	}
	c.opened = true
	caps := capsFromProto(resp.GetCaps())
	if err := caps.Validate(); err != nil {
		return sdi.Local{}, fmt.Errorf("sdi/plugin: %q: open: %w", c.cfg.Name, err)
	}
	if caps.Flags.Has(sdi.FlagMatching) {
		return sdi.Local{}, fmt.Errorf("sdi/plugin: %q: open: the subdevice matches messages itself (FlagMatching), which plugin protocol %d does not carry; run it built in: %w",
			c.cfg.Name, ProtocolVersion, sdi.ErrUnsupported)
	}
	own := caps.MaxFrame
	bytes, caps := planeBytes(caps)
	st := &openState{h: p.Handler, caps: caps, connected: make([]atomic.Bool, p.Size)}
	lim := limits{maxHeader: caps.MaxHeader, maxPayload: caps.MaxFrame, maxPlaced: inboundMax(own, caps.MaxFrame), size: p.Size}
	plane, err := c.attach(ctx, st, lim, bytes)
	if err != nil {
		return sdi.Local{}, fmt.Errorf("sdi/plugin: %q: attach the data plane: %w", c.cfg.Name, err)
	}
	st.plane = plane
	// A waiting rank polls the ring plane itself, whatever the plugin's
	// subdevice does: the plugin polls that one meanwhile (ringplane.go).
	if _, ok := plane.(*hostRing); ok {
		caps.Flags |= sdi.FlagPoll | sdi.FlagIdle
	} else {
		caps.Flags &^= sdi.FlagPoll | sdi.FlagIdle
	}
	st.caps = caps
	c.st.Store(st)
	return sdi.Local{Addr: resp.GetAddr(), Caps: caps}, nil
}

// attach opens the Transfer stream and proposes a shared segment; the
// plugin answers whether it could map it.
func (c *Client) attach(ctx context.Context, st *openState, lim limits, bytes int) (hostPlane, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	stream, err := c.rpc.Transfer(c.life)
	if err != nil {
		return nil, fromStatus("transfer", err)
	}
	var seg, aseg *shmem.Segment
	att := &sdiv1.Transfer_Attach{Window: uint64(bytes)}
	if !c.cfg.Stream {
		// Those of hosts that died without Close (killed ranks).
		if n, err := shmem.RemoveStale(segmentPrefix); err != nil {
			c.log.Warn("removing stale data-plane segments", "error", err)
		} else if n > 0 {
			c.log.Debug("removed stale data-plane segments", "count", n)
		}
		name := segmentName()
		if seg, err = shmem.CreateReserved(name, segmentSize(bytes, bytes)); err != nil {
			c.log.Warn("no shared memory for the data plane, using the stream", "error", err)
		} else {
			initSegment(seg.Bytes(), bytes, bytes)
			att.Segment, att.OutBytes, att.InBytes = name, uint64(bytes), uint64(bytes)
			aseg = c.createPlaceArea(seg, lim)
		}
	}
	closeSeg := func() {
		if seg != nil {
			seg.Close()
		}
		if aseg != nil {
			aseg.Close()
		}
	}
	type reply struct {
		a   *sdiv1.Transfer_Attached
		err error
	}
	ch := make(chan reply, 1)
	go func() {
		if err := stream.Send(&sdiv1.Transfer_Outbound{Msg: &sdiv1.Transfer_Outbound_Attach{Attach: att}}); err != nil {
			ch <- reply{err: err}
			return
		}
		in, err := stream.Recv()
		ch <- reply{a: in.GetAttached(), err: err}
	}()
	var r reply
	select {
	case r = <-ch:
	case <-ctx.Done():
		c.takeOut(fmt.Errorf("%w: attach did not answer: %w", ErrPluginExited, ctx.Err()))
		<-ch // the stream ends with the plugin's life
		closeSeg()
		return nil, ctx.Err()
	}
	if r.err == nil && r.a == nil {
		r.err = fmt.Errorf("%w: the plugin's first message is not attached", ErrProtocol)
	}
	if r.err != nil {
		closeSeg()
		c.takeOut(fromStatus("attach", r.err))
		return nil, r.err
	}
	if seg != nil {
		// Both sides have it mapped now (or the plugin failed to):
		// the name is not needed any more, and nothing is left behind
		// in /dev/shm whatever happens next.
		seg.Unlink()
	}
	if aseg != nil {
		aseg.Unlink()
	}
	if r.a.GetRing() {
		c.log.Debug("data plane attached", "plane", "shared memory", "ring_bytes", bytes)
		p := newHostRing(seg, aseg, st.h, lim, c.takeOut)
		c.wg.Add(1)
		go func() { // the ring carries everything; the stream only reports the plugin's end
			defer c.wg.Done()
			_, err := stream.Recv()
			if err == nil {
				err = fmt.Errorf("%w: a message on the stream of a ring data plane", ErrProtocol)
			}
			c.takeOut(fmt.Errorf("%w: transfer stream: %v", ErrPluginExited, err))
		}()
		return p, nil
	}
	closeSeg()
	if att.Segment != "" {
		c.log.Warn("the plugin cannot use shared memory; using the stream", "reason", r.a.GetReason())
	}
	c.log.Debug("data plane attached", "plane", "stream", "window", bytes)
	return newHostStream(stream, st.h, lim, bytes, c.takeOut), nil
}

// createPlaceArea creates the place area (place.go) next to the ring
// segment and announces it there, or returns nil when frames are too small
// for it or it cannot be made; the plugin then never places.
func (c *Client) createPlaceArea(seg *shmem.Segment, lim limits) *shmem.Segment {
	slotBytes := placeSlotBytes(max(lim.maxPayload, lim.maxPlaced))
	if slotBytes == 0 {
		return nil
	}
	// Only the header's memory now: the plugin reserves a slot's when
	// it first fills it (placer.place), as a frame that large comes.
	aseg, err := shmem.Create(placeName(seg.Name()), placeAreaSize(placeSlots, slotBytes))
	if err == nil {
		if err = aseg.Reserve(0, placeDataOffset); err != nil {
			aseg.Close()
		}
	}
	if err != nil {
		c.log.Warn("no place area for large payloads; they take a copy more", "error", err)
		return nil
	}
	initPlaceArea(aseg.Bytes(), placeSlots, slotBytes)
	announcePlace(seg.Bytes(), placeSlots, slotBytes, lim.maxPlaced)
	return aseg
}

// segmentName is unique per process and attachment.
func segmentName() string {
	var b [8]byte
	rand.Read(b[:])
	return fmt.Sprintf("%s%d.%s", segmentPrefix, os.Getpid(), hex.EncodeToString(b[:]))
}

// segmentPrefix starts the name of every data-plane segment.
const segmentPrefix = "mdsdi."

// SetJobCards forwards every rank's card to a plugin with FlagJobCards.
func (c *Client) SetJobCards(ctx context.Context, cards [][]byte) error {
	st := c.st.Load()
	if st == nil || !st.caps.Flags.Has(sdi.FlagJobCards) {
		return fmt.Errorf("sdi/plugin: %q: job cards: %w", c.cfg.Name, sdi.ErrUnsupported)
	}
	req := &sdiv1.SetJobCards_Request{Cards: make([]*sdiv1.SetJobCards_Card, len(cards))}
	for i, card := range cards {
		req.Cards[i] = &sdiv1.SetJobCards_Card{Present: card != nil, Addr: card}
	}
	return c.call(ctx, "job cards", func(ctx context.Context) error {
		_, err := c.rpc.SetJobCards(ctx, req)
		return err
	})
}

// Connect connects the plugin's subdevice to peer.
func (c *Client) Connect(ctx context.Context, peer sdi.Rank, addr []byte) error {
	st := c.st.Load()
	if st == nil && !c.closed.Load() {
		return fmt.Errorf("sdi/plugin: %q: connect: not open: %w", c.cfg.Name, sdi.ErrPeerUnreachable)
	}
	err := c.call(ctx, "connect", func(ctx context.Context) error {
		_, err := c.rpc.Connect(ctx, &sdiv1.Connect_Request{Peer: int32(peer), Addr: addr})
		return err
	})
	if err != nil {
		return err
	}
	if int(peer) >= 0 && int(peer) < len(st.connected) {
		st.connected[peer].Store(true)
	}
	return nil
}

// Disconnect hands the frames sent so far to the plugin's subdevice, then
// disconnects it from peer.
func (c *Client) Disconnect(ctx context.Context, peer sdi.Rank) error {
	st := c.st.Load()
	var n uint64
	if st != nil {
		if int(peer) >= 0 && int(peer) < len(st.connected) {
			st.connected[peer].Store(false)
		}
		n = st.records.Load()
	}
	return c.call(ctx, "disconnect", func(ctx context.Context) error {
		_, err := c.rpc.Disconnect(ctx, &sdiv1.Disconnect_Request{Peer: int32(peer), Records: n})
		return err
	})
}

// Flush returns once the plugin's subdevice has been handed every frame
// sent so far and has flushed those for peer.
func (c *Client) Flush(ctx context.Context, peer sdi.Rank) error {
	var n uint64
	if st := c.st.Load(); st != nil {
		n = st.records.Load()
	}
	return c.call(ctx, "flush", func(ctx context.Context) error {
		_, err := c.rpc.Flush(ctx, &sdiv1.Flush_Request{Peer: int32(peer), Records: n})
		return err
	})
}

// Send copies f into the data plane. It never blocks.
func (c *Client) Send(f *sdi.Frame) (bool, error) {
	if c.closed.Load() {
		return false, fmt.Errorf("sdi/plugin: %q: send: %w", c.cfg.Name, sdi.ErrClosed)
	}
	if e := c.dead.Load(); e != nil {
		return false, fmt.Errorf("sdi/plugin: %q: send to rank %d: %w: %w", c.cfg.Name, f.Peer, sdi.ErrPeerUnreachable, *e)
	}
	st := c.st.Load()
	if st == nil || int(f.Peer) < 0 || int(f.Peer) >= len(st.connected) || !st.connected[f.Peer].Load() {
		return false, fmt.Errorf("sdi/plugin: %q: send to rank %d: %w", c.cfg.Name, f.Peer, sdi.ErrNotConnected)
	}
	if len(f.Header) > st.caps.MaxHeader || len(f.Payload) > st.caps.MaxFrame {
		return false, fmt.Errorf("sdi/plugin: %q: send %d+%d bytes (limits %d+%d): %w",
			c.cfg.Name, len(f.Header), len(f.Payload), st.caps.MaxHeader, st.caps.MaxFrame, sdi.ErrTooLarge)
	}
	// The count must never run ahead of the plane, or a Flush could wait
	// for a frame that is not there yet.
	st.sendMu.Lock()
	err := st.plane.send(f.Peer, f.Header, f.Payload)
	if err == nil {
		st.records.Add(1)
	}
	st.sendMu.Unlock()
	if err != nil {
		if e := c.dead.Load(); e != nil && !errors.Is(err, sdi.ErrWouldBlock) {
			return false, fmt.Errorf("sdi/plugin: %q: send to rank %d: %w: %w", c.cfg.Name, f.Peer, sdi.ErrPeerUnreachable, *e)
		}
		return false, err
	}
	return true, nil
}

// Poll hands arrived frames to the Handler on the calling goroutine. With
// the shared-memory plane (FlagPoll) it also keeps the plugin polling its
// own subdevice until Idle, or until Poll calls stop for a while.
func (c *Client) Poll() int {
	st := c.st.Load()
	if st == nil || !st.caps.Flags.Has(sdi.FlagPoll) || c.closed.Load() {
		return 0
	}
	return st.plane.poll()
}

// Idle tells the plane that the polling rank parks: the host's consumer
// goroutine takes over and the plugin stops polling its subdevice.
func (c *Client) Idle() {
	if st := c.st.Load(); st != nil && st.caps.Flags.Has(sdi.FlagIdle) {
		st.plane.idle()
	}
}

// Close closes the plugin's subdevice, stops the data plane and ends the
// plugin process. An Open in flight is cut short and fails with
// sdi.ErrClosed. It is idempotent.
func (c *Client) Close(ctx context.Context) error {
	var err error
	c.once.Do(func() {
		// An Open in flight holds mu for as long as the plugin's subdevice
		// takes, up to the timeout: it ends now instead.
		c.abortMu.Lock()
		c.closing = true
		if c.abortOpen != nil {
			c.abortOpen(sdi.ErrClosed)
		}
		c.abortMu.Unlock()
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.opened && c.dead.Load() == nil {
			err = c.call(ctx, "close", func(ctx context.Context) error {
				_, err := c.rpc.Close(ctx, &sdiv1.Close_Request{})
				return err
			})
		}
		c.closed.Store(true)
		c.cancel()
		if st := c.st.Load(); st != nil {
			st.plane.stop()
		}
		c.wg.Wait()
		c.kill(c.dead.Load() != nil)
		if errors.Is(err, ErrPluginExited) {
			err = nil // it is gone either way
		}
	})
	return err
}

// takeOut marks the plugin dead for err, once; the watcher reports it.
// After Close has begun, the ends it causes (the stream breaking) are not
// the plugin's fault.
func (c *Client) takeOut(err error) {
	if c.closed.Load() {
		return
	}
	if c.dead.CompareAndSwap(nil, &err) {
		c.cancel()
	}
}

// watch waits for the end of the plugin's life: Close, or its process
// exiting, or takeOut. Unless it was Close, it reports every connected
// peer down and kills the process.
func (c *Client) watch() {
	defer c.wg.Done()
	hb := time.NewTicker(heartbeat(c.cfg.Timeout))
	defer hb.Stop()
	for {
		select {
		case <-c.life.Done():
		case <-c.exit.Done():
			c.takeOut(fmt.Errorf("%w: the process ended", ErrPluginExited))
		case <-hb.C:
			if c.pinging.CompareAndSwap(false, true) {
				c.wg.Add(1)
				go c.ping()
			}
			continue
		}
		break
	}
	if c.closed.Load() {
		return
	}
	why := *c.dead.Load()
	c.log.Error("subdevice plugin taken out", "plugin", c.cfg.Name, "path", c.cfg.Path, "error", why)
	// The peers first: ending the process may take a while, and nothing
	// is to wait for it.
	if st := c.st.Load(); st != nil {
		st.plane.stop()
		for peer := range st.connected {
			if st.connected[peer].Load() {
				st.h.PeerDown(sdi.Rank(peer), fmt.Errorf("sdi/plugin: %q: %w", c.cfg.Name, why))
			}
		}
	}
	c.kill(true)
}

// kill ends the plugin process. go-plugin's Kill asks the plugin to shut
// down and waits for that without a deadline, which a hung plugin never
// answers, and then for the plugin's output to close, which a process the
// plugin started may keep open; so a plugin that was taken out has its
// process group killed outright first, any other gets killGrace to exit
// gracefully, and the wait after a kill is bounded too. After a graceful
// exit the group is killed as well: a process a wrapper script started
// that does not hold the plugin's output open, which go-plugin would wait
// for, outlives the shell otherwise.
func (c *Client) kill(force bool) {
	defer c.release()
	defer c.hostEnd.Close()
	defer os.RemoveAll(c.sockDir)
	pid := 0
	if rc := c.pc.ReattachConfig(); rc != nil {
		pid = rc.Pid
	}
	hardKill := func() {
		// Only while go-plugin has not seen the process exit, so the
		// group cannot be gone and its id reused.
		if c.exit.Err() == nil {
			killGroup(pid)
		}
	}
	if force {
		hardKill()
	}
	// A leader go-plugin had reaped before this call may have ended long
	// ago, its group with it, and the group's id may be another's now.
	reaped := c.exit.Err() != nil
	done := make(chan struct{})
	go func() {
		c.pc.Kill()
		close(done)
	}()
	select {
	case <-done:
		if !reaped {
			// go-plugin reaped the leader just now. A group's id is
			// not reused while any member lives, and an empty group's
			// only once the kernel's pids come round, which they do
			// not in these moments.
			killGroup(pid)
		}
		return
	case <-time.After(killGrace):
	}
	c.log.Warn("plugin did not exit when asked; killing it", "plugin", c.cfg.Name, "pid", pid)
	hardKill()
	select {
	case <-done:
	case <-time.After(killGrace):
		c.log.Warn("plugin still holds its output open after it was killed; not waiting for it", "plugin", c.cfg.Name, "pid", pid)
	}
}

// killGrace is how long a plugin has to exit when closed.
const killGrace = 5 * time.Second

// ping checks that the plugin still answers; one that does not within the
// timeout is taken out, so a stopped or wedged plugin cannot hang the job.
func (c *Client) ping() {
	defer c.wg.Done()
	defer c.pinging.Store(false)
	c.call(c.life, "liveness check", func(ctx context.Context) error {
		_, err := c.rpc.GetInfo(ctx, &sdiv1.GetInfo_Request{})
		return err
	})
}

// heartbeat is how often the watcher checks a plugin answers.
func heartbeat(timeout time.Duration) time.Duration {
	return min(max(timeout/4, 100*time.Millisecond), time.Second)
}
