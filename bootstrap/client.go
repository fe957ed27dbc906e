package bootstrap

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
)

// ackTimeout bounds how long Abort and Close, which take no context, wait
// for the service to answer. The service answers at once unless it is
// wedged, and then the launcher is about to kill the rank anyway.
const ackTimeout = 10 * time.Second

// maxReason bounds an abort reason, so that it fits any message.
const maxReason = 4 << 10

// reportWait bounds how long ReportLost waits for its report to be
// written. It runs where the device learns of the loss, which must not
// stall; the writer is idle but for a fence or a request, written in
// microseconds unless the service is wedged.
const reportWait = 200 * time.Millisecond

// client is the mdrun backend: one rank's connection to the rendezvous
// service. It is safe for concurrent use.
//
// A reader goroutine matches replies to requests by id and a writer
// goroutine sends requests, so that a caller whose context ends simply stops
// waiting and the stream stays in step.
type client struct {
	logger hclog.Logger
	env    mdrunEnv
	conn   net.Conn

	out chan *message // requests for the writer goroutine
	// reports is for the writer goroutine too: ReportLost's messages,
	// which have no reply, each with a channel the writer closes once
	// it is written.
	reports chan lostReport
	dead    chan struct{} // closed, with err set, when the connection is unusable
	wg      sync.WaitGroup

	mu      sync.Mutex
	err     error // why dead is closed; wraps ErrClosed
	nextID  uint64
	calls   map[uint64]*call // requests waiting for a reply
	puts    map[string][]byte
	putSize int
	fence   *call // the fence sent and not yet answered
	closing bool  // Close or Abort was called
	// abortDone is made when the closing call is an Abort, and closed
	// once abortErr holds its outcome (see lateFinish).
	abortDone chan struct{}
	abortErr  error
	// leashOff: the rank finished (Close) or never joined, so losing the
	// service does not end the process. Abort leaves the leash on: the
	// job is ending, this rank with it.
	leashOff bool
	// takesLost says the service takes lost reports (its hello reply
	// lists opLost); reported is the ranks reported lost.
	takesLost bool
	reported  map[int]bool
}

// lostReport is a message of ReportLost for the writer goroutine.
type lostReport struct {
	m       *message
	written chan struct{}
}

// call is one request waiting for its reply.
type call struct {
	id   uint64
	done chan struct{} // closed when resp or err is set
	resp *message
	err  error
}

// remoteError is an error reply of the service.
type remoteError struct {
	code, reason string
}

func (e *remoteError) Error() string { return e.reason }

// Is lets callers test a reply with errors.Is(err, ErrNotFound).
func (e *remoteError) Is(target error) bool {
	return target == ErrNotFound && e.code == errCodeNotFound
}

func openMdrun(ctx context.Context, logger hclog.Logger, st *openState) (Bootstrap, error) {
	e, err := parseMdrunEnv(st.env, st.stdin)
	if err != nil {
		return nil, err
	}
	network, address, err := splitAddr(e.addr)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: %s=%q: %w", EnvAddr, e.addr, err)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: cannot reach the mdrun service at %s=%s: %w", EnvAddr, e.addr, err)
	}
	c := newClient(logger.With("rank", e.rank), e, conn)
	resp, err := c.roundTrip(ctx, &message{
		Op:      opHello,
		Version: protocolVersion,
		Rank:    e.rank,
		Size:    e.size,
		JobID:   e.jobID,
		Secret:  hex.EncodeToString(e.secret),
	})
	if err != nil {
		c.unleash()
		c.shutdown()
		return nil, fmt.Errorf("bootstrap: hello to the mdrun service at %s=%s: %w", EnvAddr, e.addr, err)
	}
	c.mu.Lock()
	c.takesLost = slices.Contains(resp.Ops, opLost)
	c.mu.Unlock()
	c.logger.Debug("connected to the mdrun service", "addr", e.addr)
	return c, nil
}

// splitAddr splits an MDRUN_ADDR into the arguments of net.Dial.
func splitAddr(addr string) (network, address string, err error) {
	network, address, ok := strings.Cut(addr, ":")
	if !ok || address == "" || (network != "unix" && network != "tcp") {
		return "", "", errors.New(`want "unix:/path" or "tcp:host:port"`)
	}
	return network, address, nil
}

func newClient(logger hclog.Logger, e mdrunEnv, conn net.Conn) *client {
	c := &client{
		logger:   logger,
		env:      e,
		conn:     conn,
		out:      make(chan *message),
		reports:  make(chan lostReport),
		dead:     make(chan struct{}),
		calls:    map[uint64]*call{},
		puts:     map[string][]byte{},
		reported: map[int]bool{},
	}
	c.wg.Add(2)
	go c.readLoop()
	go c.writeLoop()
	return c
}

func (c *client) Rank() int      { return c.env.rank }
func (c *client) Size() int      { return c.env.size }
func (c *client) Host() string   { return c.env.host }
func (c *client) JobID() string  { return c.env.jobID }
func (c *client) Secret() []byte { return c.env.secret }

// Put only records the key; the next Fence carries it to the service, so
// Put never blocks.
func (c *client) Put(key string, value []byte) error {
	if err := checkPut(key, value); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing || c.err != nil {
		return fmt.Errorf("bootstrap: put: %w", ErrClosed)
	}
	size := c.putSize + putWireSize(len(key), len(value))
	if old, ok := c.puts[key]; ok {
		size -= putWireSize(len(key), len(old))
	}
	if size > maxPuts {
		return fmt.Errorf("bootstrap: put %q: the puts of one fence would take more than %d bytes on the wire", key, maxPuts)
	}
	c.puts[key] = append([]byte(nil), value...)
	c.putSize = size
	return nil
}

// Fence sends this rank's puts and waits until every rank has arrived.
//
// If ctx ends first, Fence returns ctx's error but this rank's arrival stays
// counted; the next Fence call waits for that same barrier instead of
// starting a new one, so a retry keeps the ranks in step. Overlapping Fence
// calls of one rank join the same barrier.
func (c *client) Fence(ctx context.Context) error {
	c.mu.Lock()
	cl := c.fence
	if cl == nil {
		if c.err != nil {
			c.mu.Unlock()
			return fmt.Errorf("bootstrap: fence: %w", c.err)
		}
		puts, putSize := c.puts, c.putSize
		c.puts, c.putSize = map[string][]byte{}, 0
		cl = c.newCallLocked()
		c.fence = cl
		c.mu.Unlock()
		if err := c.send(ctx, &message{Op: opFence, ID: cl.id, Puts: wirePuts(puts)}); err != nil {
			c.unsendFence(cl, puts, putSize, err)
			return fmt.Errorf("bootstrap: fence: %w", err)
		}
	} else {
		c.mu.Unlock()
	}
	_, err := c.wait(ctx, cl)
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return fmt.Errorf("bootstrap: fence: %w", err)
	}
	c.mu.Lock()
	if c.fence == cl {
		c.fence = nil
	}
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("bootstrap: fence: %w", err)
	}
	return nil
}

// wirePuts lists puts for a fence message.
func wirePuts(puts map[string][]byte) []wirePut {
	out := make([]wirePut, 0, len(puts))
	for k, v := range puts {
		out = append(out, wirePut{Key: []byte(k), Value: v})
	}
	return out
}

// unsendFence undoes a fence that never reached the writer: its puts go back
// (behind any made since) and callers that joined it are released.
func (c *client) unsendFence(cl *call, puts map[string][]byte, putSize int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fence = nil
	delete(c.calls, cl.id)
	for k, v := range c.puts {
		if old, ok := puts[k]; ok {
			putSize -= putWireSize(len(k), len(old))
		}
		puts[k] = v
		putSize += putWireSize(len(k), len(v))
	}
	c.puts, c.putSize = puts, putSize
	cl.err = err
	close(cl.done)
}

func (c *client) Get(ctx context.Context, rank int, key string) ([]byte, error) {
	if rank < 0 || rank >= c.env.size {
		return nil, fmt.Errorf("bootstrap: get %q: rank %d not in [0, %d)", key, rank, c.env.size)
	}
	// A key the service would refuse must fail this Get alone: the service
	// drops a rank that sends one.
	if err := checkKey("get", key); err != nil {
		return nil, err
	}
	resp, err := c.roundTrip(ctx, &message{Op: opGet, Rank: rank, Key: []byte(key)})
	if err != nil {
		return nil, fmt.Errorf("bootstrap: get %q of rank %d: %w", key, rank, err)
	}
	return resp.Value, nil
}

// ReportLost tells the service that this rank lost rank (see
// [LostReporter]). The report has no reply: the service reads it before
// the end of the connection, which is all mdrun needs. It waits until
// the writer has written it, at most reportWait, so that it is out before
// the caller fails requests for the loss and the application can exit.
// A service that does not take reports (an older mdrun) is sent none.
func (c *client) ReportLost(rank int, why string) {
	if len(why) > maxReason {
		why = why[:maxReason]
	}
	c.mu.Lock()
	skip := !c.takesLost || c.closing || c.err != nil || rank < 0 || rank >= c.env.size || rank == c.env.rank || c.reported[rank]
	if !skip {
		c.reported[rank] = true
	}
	c.mu.Unlock()
	if skip {
		return
	}
	r := lostReport{m: &message{Op: opLost, Rank: rank, Reason: why}, written: make(chan struct{})}
	t := time.NewTimer(reportWait)
	defer t.Stop()
	select {
	case c.reports <- r:
	case <-c.dead:
		return
	case <-t.C:
		c.logger.Debug("gave up reporting a lost rank: the writer is busy", "lost", rank)
		return
	}
	select {
	case <-r.written:
	case <-c.dead:
	case <-t.C:
		c.logger.Debug("a report of a lost rank is slow to go out", "lost", rank)
	}
}

// Abort tells the service, waits for it to acknowledge (at most ackTimeout)
// and closes the connection: the launcher is ending the job.
func (c *client) Abort(code int, reason string) error {
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	return c.finish(opAbort, &message{Op: opAbort, Code: exitCode(code), Reason: reason})
}

// Close says goodbye to the service and releases the connection. It is
// idempotent; only the first call reports an error. A Close during an
// Abort (from another goroutine) returns once the abort is out (see
// lateFinish), and leaves the leash on: the rank is still ending with the
// job.
func (c *client) Close() error {
	return c.finish(opFinalize, &message{Op: opFinalize})
}

// unleash marks the end of the connection as this rank's own doing.
func (c *client) unleash() {
	c.mu.Lock()
	c.leashOff = true
	c.mu.Unlock()
}

func (c *client) finish(op string, m *message) error {
	c.mu.Lock()
	if c.closing {
		done := c.abortDone
		c.mu.Unlock()
		return lateFinish(op, done, &c.abortErr)
	}
	c.closing = true
	if op == opAbort {
		c.abortDone = make(chan struct{})
	} else {
		// Before the goodbye: the service may end the connection as soon
		// as it has it.
		c.leashOff = true
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
	defer cancel()
	_, err := c.roundTrip(ctx, m)
	if err != nil {
		err = fmt.Errorf("bootstrap: %s: %w", op, err)
	}
	if op == opAbort {
		c.abortErr = err
		close(c.abortDone)
	}
	c.shutdown()
	return err
}

// lateFinish is a Close or Abort (op) after an earlier one; done is the
// earlier one's if it was an Abort (nil for a Close), closed once *abortErr
// holds its outcome, which the close publishes. A Close after a Close
// does nothing. An Abort after Close fails: the launcher was not told.
// Either while an Abort runs waits for it, so that a caller who exits on
// its return does not end the job with its own status before the abort
// is out; an Abort returns its outcome, a Close nil (the abort was not
// its to report), or an error once it gave up after closeAbortWait.
func lateFinish(op string, done <-chan struct{}, abortErr *error) error {
	switch {
	case done == nil && op == opAbort:
		return fmt.Errorf("bootstrap: abort after Close: %w", ErrClosed)
	case done == nil:
		return nil
	case op == opAbort:
		<-done
		return *abortErr
	}
	t := time.NewTimer(closeAbortWait)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		return fmt.Errorf("bootstrap: close: the Abort under way did not finish within %v", closeAbortWait)
	}
}

// closeAbortWait bounds how long a Close waits for an Abort under way:
// longer than an Abort takes (the PMI backend's pause before it writes
// the abort; the mdrun service's acknowledgement, awaited at most
// ackTimeout), so that only a stuck one is left behind, and the program
// that is closing still gets to exit.
const closeAbortWait = abortGrace + ackTimeout + time.Second

// shutdown closes the connection and waits for the goroutines.
func (c *client) shutdown() {
	c.fail(ErrClosed)
	c.wg.Wait()
}

// fail marks the connection unusable with err (which wraps ErrClosed) and
// releases every waiter. The first reason wins.
func (c *client) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
		close(c.dead)
	}
	c.mu.Unlock()
	c.conn.Close()
}

func (c *client) newCallLocked() *call {
	c.nextID++
	cl := &call{id: c.nextID, done: make(chan struct{})}
	c.calls[cl.id] = cl
	return cl
}

// roundTrip sends m as a new request and waits for its reply.
func (c *client) roundTrip(ctx context.Context, m *message) (*message, error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, c.err
	}
	cl := c.newCallLocked()
	c.mu.Unlock()
	m.ID = cl.id
	if err := c.send(ctx, m); err != nil {
		c.forget(cl)
		return nil, err
	}
	return c.wait(ctx, cl)
}

// send hands m to the writer goroutine.
func (c *client) send(ctx context.Context, m *message) error {
	select {
	case c.out <- m:
		return nil
	case <-c.dead:
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wait returns cl's reply; an error reply becomes a *remoteError.
func (c *client) wait(ctx context.Context, cl *call) (*message, error) {
	select {
	case <-cl.done:
	case <-c.dead:
		// A reply read just before the connection ended (a refusal, an
		// answer to finalize) says more than the end does.
		select {
		case <-cl.done:
		default:
			return nil, c.err
		}
	case <-ctx.Done():
		if cl != c.currentFence() {
			c.forget(cl)
		}
		return nil, ctx.Err()
	}
	if cl.err != nil {
		return nil, cl.err
	}
	if cl.resp.Op == opError {
		return nil, &remoteError{code: cl.resp.ErrCode, reason: cl.resp.Reason}
	}
	return cl.resp, nil
}

func (c *client) currentFence() *call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fence
}

// forget drops a request whose caller stopped waiting; its reply, if one
// comes, is discarded.
func (c *client) forget(cl *call) {
	c.mu.Lock()
	delete(c.calls, cl.id)
	c.mu.Unlock()
}

func (c *client) readLoop() {
	defer c.wg.Done()
	for {
		m, err := readMessage(c.conn, maxMessage)
		if err == nil && m.Op != opOK && m.Op != opError {
			err = fmt.Errorf("%w: unexpected %q from the service", errBadMessage, m.Op)
		}
		if err != nil {
			c.fail(fmt.Errorf("connection to the mdrun service at %s ended (%v): %w", c.env.addr, err, ErrClosed))
			c.leash()
			return
		}
		c.mu.Lock()
		cl := c.calls[m.ID]
		delete(c.calls, m.ID)
		c.mu.Unlock()
		if cl == nil {
			continue // its caller gave up
		}
		cl.resp = m
		close(cl.done)
	}
}

// leash ends the process when the service went away under a rank that
// mdrun started on another host and that had not finished, or that
// aborted: mdrun is ending the job, and nothing else would reach the rank.
func (c *client) leash() {
	c.mu.Lock()
	off := c.leashOff
	c.mu.Unlock()
	if !c.env.exitWithService || off {
		return
	}
	c.logger.Error("lost the mdrun service; ending this rank", "addr", c.env.addr)
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
}

func (c *client) writeLoop() {
	defer c.wg.Done()
	for {
		select {
		case m := <-c.out:
			if !c.write(m) {
				return
			}
		case r := <-c.reports:
			if !c.write(r.m) {
				return
			}
			close(r.written)
		case <-c.dead:
			return
		}
	}
}

// write writes m for the writer goroutine; on failure it marks the
// connection unusable and reports false.
func (c *client) write(m *message) bool {
	if err := writeMessage(c.conn, m); err != nil {
		c.fail(fmt.Errorf("connection to the mdrun service at %s ended (%v): %w", c.env.addr, err, ErrClosed))
		return false
	}
	return true
}
