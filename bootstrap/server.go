package bootstrap

import (
	"context"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// The reasons a rank that finalized or aborted left, as [Departure] gives
// them.
const (
	reasonFinalized = "finalized"
	reasonAborted   = "aborted"
)

// helloTimeout is how long a new connection may take to say hello; a
// stranger that connects and stays silent is dropped.
const helloTimeout = 10 * time.Second

// writeTimeout bounds one reply, so a rank that stopped reading cannot hold
// up the replies to the others.
const writeTimeout = 10 * time.Second

// AbortError reports that a rank called [Bootstrap.Abort].
type AbortError struct {
	Rank   int
	Code   int
	Reason string
}

func (e *AbortError) Error() string {
	return fmt.Sprintf("rank %d aborted with code %d: %s", e.Rank, e.Code, e.Reason)
}

// Departure reports that a rank that had joined the job (said hello) left
// the service: it said goodbye or aborted, or the service read the end of
// its connection.
type Departure struct {
	Rank int
	// Reason is why, as the others' failing fences name it: "finalized",
	// "aborted", "disconnected", ...
	Reason string
	// Finalized says the rank said goodbye (Close) first: it is done.
	// Aborted says it called Abort: [Server.Aborts] has its report.
	// Otherwise the rank was lost: its process or connection ended.
	Finalized, Aborted bool
	// Lost is the ranks this one lost before it left, in the order it
	// did, each once: those it reported lost ([LostReporter]) and those
	// whose leaving failed a fence of it. A rank that fails after losing
	// another most likely fails because of it.
	Lost []Loss
}

// Loss is one rank a departing rank lost, and why.
type Loss struct {
	Rank   int
	Reason string
}

// Server is the rendezvous service of one job on one host: it checks each
// rank's secret, collects Puts, runs Fences and answers Gets. mdrun runs one;
// tests run one in-process. Its methods are safe for concurrent use.
type Server struct {
	logger  hclog.Logger
	size    int
	ln      net.Listener
	addr    string
	sockDir string // removed on Close; empty when the caller owns the listener
	host    string
	jobID   string
	secret  []byte
	aborts  chan *AbortError

	closeOnce   sync.Once
	reportsOnce sync.Once // closes aborts and departures
	wg          sync.WaitGroup

	mu        sync.Mutex
	serving   bool
	closed    bool
	conns     map[net.Conn]struct{}
	ranks     []rankState
	arrived   []*fenceWaiter // per rank: nil until it reaches the running fence
	narrived  int
	pending   []map[string][]byte // per rank: puts of the running fence
	published []map[string][]byte // per rank: puts of completed fences
	left      string              // why fences can no longer complete; "" while they can
	leftRank  int                 // the rank whose leaving left says, once it is set
	lost      [][]Loss            // per rank: the ranks it lost (see Departure.Lost)
	// departures is sent to, under mu, until reportsClosed: Exited may
	// run after Serve returned.
	departures    chan Departure
	reportsClosed bool
}

// rankState is where a rank is in its life.
type rankState int

const (
	rankWaiting   rankState = iota // not connected yet
	rankConnected                  // said hello
	rankExited                     // said hello, and its process ended (Exited); its connection is not read to its end yet
	rankLeft                       // finalized, aborted or disconnected
)

// NewServer starts listening on a unix socket in a new private directory for
// a job of size ranks. Ranks can connect once [Server.Serve] runs. A nil
// logger logs nothing.
func NewServer(size int, logger hclog.Logger) (*Server, error) {
	if size < 1 {
		return nil, fmt.Errorf("bootstrap: server: size %d, want at least 1", size)
	}
	dir, err := os.MkdirTemp("", "mdrun-")
	if err != nil {
		return nil, fmt.Errorf("bootstrap: server: %w", err)
	}
	// MkdirTemp makes the directory 0700, so only this user can reach the
	// socket; the secret guards against the user's other jobs.
	ln, err := net.Listen("unix", filepath.Join(dir, "rendezvous.sock"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("bootstrap: server: %w", err)
	}
	s, err := NewServerListener(ln, size, logger)
	if err != nil {
		ln.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	s.sockDir = dir
	return s, nil
}

// NewServerListener is [NewServer] on a listener the caller made, such as
// loopback TCP. The server closes ln when it is closed.
func NewServerListener(ln net.Listener, size int, logger hclog.Logger) (*Server, error) {
	if size < 1 {
		return nil, fmt.Errorf("bootstrap: server: size %d, want at least 1", size)
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("bootstrap: server: host name: %w", err)
	}
	jobID, secret, err := newJobIdentity()
	if err != nil {
		return nil, fmt.Errorf("bootstrap: server: %w", err)
	}
	s := &Server{
		logger: logger,
		size:   size,
		ln:     ln,
		addr:   ln.Addr().Network() + ":" + ln.Addr().String(),
		host:   host,
		jobID:  jobID,
		secret: secret,
		aborts: make(chan *AbortError, size), // a rank aborts at most once, so sends never block
		// A rank leaves at most once, so sends never block either.
		departures: make(chan Departure, size),
		conns:      map[net.Conn]struct{}{},
		ranks:      make([]rankState, size),
		lost:       make([][]Loss, size),
		arrived:    make([]*fenceWaiter, size),
		pending:    make([]map[string][]byte, size),
		published:  make([]map[string][]byte, size),
	}
	for r := range size {
		s.pending[r] = map[string][]byte{}
		s.published[r] = map[string][]byte{}
	}
	return s, nil
}

// Addr is the service's address in the MDRUN_ADDR form.
func (s *Server) Addr() string { return s.addr }

// JobID is the job's identifier.
func (s *Server) JobID() string { return s.jobID }

// Env returns the MDRUN_* variables for rank as "KEY=value" strings, to be
// appended to the rank's environment.
func (s *Server) Env(rank int) []string {
	return formatEnv(mdrunEnv{addr: s.addr, rank: rank, size: s.size, jobID: s.jobID, secret: s.secret, host: s.host})
}

// HostEnv is [Server.Env] for a rank on the named host (MDRUN_HOST=host):
// ranks with the same host name share memory.
func (s *Server) HostEnv(rank int, host string) []string {
	return formatEnv(mdrunEnv{addr: s.addr, rank: rank, size: s.size, jobID: s.jobID, secret: s.secret, host: host})
}

// RemoteEnv is [Server.HostEnv] for a rank that a remote-exec command (ssh)
// starts: the rank also ends itself if its connection to the service
// breaks before it finished (see EnvExitWithService), because a signal to
// the local ssh does not reach it.
//
// The secret is not in it: MDRUN_SECRET is [SecretFromStdin], and the
// rank's standard input must start with [Server.SecretLine], since the
// remote-exec command line is visible to every user of both hosts.
func (s *Server) RemoteEnv(rank int, host string) []string {
	return formatEnv(mdrunEnv{addr: s.addr, rank: rank, size: s.size, jobID: s.jobID, host: host,
		secretOnStdin: true, exitWithService: true})
}

// SecretLine is what a rank started with [Server.RemoteEnv] reads from its
// standard input: the job's secret and a newline.
func (s *Server) SecretLine() []byte { return []byte(hex.EncodeToString(s.secret) + "\n") }

// Aborts delivers one [AbortError] per rank that called Abort. It is closed
// when Serve returns. Nobody has to receive from it: it has room for every
// rank.
func (s *Server) Aborts() <-chan *AbortError { return s.aborts }

// Departures delivers one [Departure] per rank that joined the job, in the
// order the service saw them leave: a launcher that sees several ranks
// fail together can tell which ranks each had lost ([Departure.Lost]),
// the likely cause of its failure. A rank's departure is queued once the
// service has read everything the rank sent, so it holds every loss the
// rank reported; it is queued before any rank is told of it (a fence
// failing because of it) and, if the rank finalized, before its Close
// returns. The order of departures is the order the service read the
// ends of connections in, which need not be the order the processes died
// in: a dying process may close its connection to the service after those
// to the other ranks, and they may fail and exit before the service sees
// it go. It is closed when Serve returns. Nobody has to receive from it:
// it has room for every rank.
func (s *Server) Departures() <-chan Departure { return s.departures }

// closeReports closes Aborts and Departures once no rank can abort any
// more.
func (s *Server) closeReports() {
	s.reportsOnce.Do(func() {
		close(s.aborts)
		s.mu.Lock()
		s.reportsClosed = true
		close(s.departures)
		s.mu.Unlock()
	})
}

// Serve accepts and serves ranks until ctx ends or Close is called, then
// closes every connection, waits for its goroutines and returns nil. It
// returns an error if accepting fails otherwise or if it was called before.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	if s.serving {
		s.mu.Unlock()
		return errors.New("bootstrap: server: Serve called twice")
	}
	s.serving = true
	s.mu.Unlock()
	defer s.closeReports()
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()

	var err error
	for {
		conn, aerr := s.ln.Accept()
		if aerr != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if !closed {
				err = fmt.Errorf("bootstrap: server: accept: %w", aerr)
			}
			break
		}
		if !s.track(conn) {
			conn.Close()
			break
		}
		s.wg.Add(1)
		go s.handle(conn)
	}
	s.Close()
	s.wg.Wait()
	return err
}

// Close stops the service: the listener and every connection are closed, so
// ranks see ErrClosed. It is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		for c := range s.conns {
			c.Close()
		}
		serving := s.serving
		s.mu.Unlock()
		s.ln.Close()
		if s.sockDir != "" {
			os.RemoveAll(s.sockDir)
		}
		if !serving {
			s.closeReports()
		}
	})
	return nil
}

// track records conn so Close can end it; it reports false once closed.
func (s *Server) track(conn net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[conn] = struct{}{}
	return true
}

// serverConn is one rank's connection; replies may come from the goroutine
// of another rank (the last to reach a fence), hence the lock.
type serverConn struct {
	conn net.Conn
	mu   sync.Mutex
}

func (sc *serverConn) reply(m *message) error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	if err := writeMessage(sc.conn, m); err != nil {
		sc.conn.Close() // its reader sees the close and the rank leaves
		return err
	}
	return nil
}

func errorReply(id uint64, code, reason string) *message {
	return &message{Op: opError, ID: id, ErrCode: code, Reason: reason}
}

// handle serves one connection from hello to goodbye.
func (s *Server) handle(conn net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, conn)
		s.mu.Unlock()
		conn.Close()
	}()
	logger := s.logger.With("remote", conn.RemoteAddr().String())
	sc := &serverConn{conn: conn}

	conn.SetReadDeadline(time.Now().Add(helloTimeout))
	// Anyone who can connect gets this far, so the hello is read with a
	// limit of its own: strangers must not make the service hold a
	// maximal message each.
	m, err := readMessage(conn, maxHello)
	if err != nil {
		logger.Warn("dropping connection before hello", "error", err)
		return
	}
	rank, err := s.hello(m)
	if err != nil {
		logger.Warn("refusing connection", "error", err)
		sc.reply(errorReply(m.ID, errCodeRefused, err.Error()))
		return
	}
	conn.SetReadDeadline(time.Time{})
	logger = s.logger.With("rank", rank)
	if err := sc.reply(&message{Op: opOK, ID: m.ID, Ops: []string{opLost}}); err != nil {
		s.leave(rank, "its connection failed")
		logger.Warn("dropping rank", "error", err)
		return
	}
	logger.Debug("rank connected")

	for {
		m, err := readMessage(conn, maxMessage)
		if err != nil {
			s.leave(rank, "disconnected")
			logger.Debug("rank disconnected", "error", err)
			return
		}
		switch m.Op {
		case opFence:
			if err := s.fence(rank, sc, m); err != nil {
				s.leave(rank, "broke the protocol")
				logger.Warn("dropping rank", "error", err)
				return
			}
		case opGet:
			s.get(rank, sc, m)
		case opLost:
			s.reportLost(rank, m)
		case opAbort:
			s.abort(rank, m)
			sc.reply(&message{Op: opOK, ID: m.ID})
			return
		case opFinalize:
			s.leave(rank, reasonFinalized)
			sc.reply(&message{Op: opOK, ID: m.ID})
			logger.Debug("rank finalized")
			return
		default:
			s.leave(rank, "broke the protocol")
			logger.Warn("dropping rank", "error", fmt.Errorf("%w: unexpected %q after hello", errBadMessage, m.Op))
			return
		}
	}
}

// hello checks a connection's first message and claims its rank.
func (s *Server) hello(m *message) (int, error) {
	if m.Op != opHello {
		return 0, fmt.Errorf("%w: first message is %q, want hello", errBadMessage, m.Op)
	}
	if m.Version != protocolVersion {
		return 0, fmt.Errorf("protocol version %d, this mdrun speaks %d", m.Version, protocolVersion)
	}
	secret, err := hex.DecodeString(m.Secret)
	if err != nil || subtle.ConstantTimeCompare(secret, s.secret) != 1 {
		return 0, errors.New("wrong job secret")
	}
	// The job's identity is checked here, before the rank is claimed, so a
	// rank with a stale environment cannot lock out the right one.
	if m.JobID != s.jobID {
		return 0, fmt.Errorf("%s=%q, but this service runs job %q", EnvJobID, m.JobID, s.jobID)
	}
	if m.Size != s.size {
		return 0, fmt.Errorf("%s=%d, but this service runs a job of %d ranks", EnvSize, m.Size, s.size)
	}
	if m.Rank >= s.size {
		return 0, fmt.Errorf("rank %d not in a job of %d ranks", m.Rank, s.size)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ranks[m.Rank] != rankWaiting {
		return 0, fmt.Errorf("rank %d connected before", m.Rank)
	}
	s.ranks[m.Rank] = rankConnected
	return m.Rank, nil
}

// fence records rank's arrival and puts; the last rank to arrive publishes
// everything and releases all.
func (s *Server) fence(rank int, sc *serverConn, m *message) error {
	s.mu.Lock()
	if s.arrived[rank] != nil {
		s.mu.Unlock()
		return fmt.Errorf("%w: rank %d sent a second fence before the first completed", errBadMessage, rank)
	}
	if s.left != "" {
		reason := s.left
		s.addLossLocked(rank, s.leftRank, reason)
		s.mu.Unlock()
		sc.reply(errorReply(m.ID, errCodeFence, reason))
		return nil
	}
	s.arrived[rank] = &fenceWaiter{sc: sc, id: m.ID}
	s.narrived++
	for _, p := range m.Puts {
		s.pending[rank][string(p.Key)] = p.Value
	}
	if s.narrived < s.size {
		s.mu.Unlock()
		return nil
	}
	for r := range s.size {
		for k, v := range s.pending[r] {
			s.published[r][k] = v
		}
		clear(s.pending[r])
	}
	waiters := s.takeArrivalsLocked()
	s.mu.Unlock()
	s.logger.Debug("fence complete")
	for _, w := range waiters {
		w.sc.reply(&message{Op: opOK, ID: w.id})
	}
	return nil
}

// fenceWaiter is a rank waiting in a fence: where and under which request
// id its reply goes.
type fenceWaiter struct {
	sc *serverConn
	id uint64
}

// takeArrivalsLocked empties the fence and returns who waited in it.
func (s *Server) takeArrivalsLocked() []*fenceWaiter {
	waiters := make([]*fenceWaiter, 0, s.narrived)
	for _, w := range s.arrived {
		if w != nil {
			waiters = append(waiters, w)
		}
	}
	clear(s.arrived)
	s.narrived = 0
	return waiters
}

func (s *Server) get(rank int, sc *serverConn, m *message) {
	if m.Rank >= s.size {
		sc.reply(errorReply(m.ID, errCodeBadRequest, fmt.Sprintf("rank %d not in a job of %d ranks", m.Rank, s.size)))
		return
	}
	s.mu.Lock()
	v, ok := s.published[m.Rank][string(m.Key)]
	s.mu.Unlock()
	if !ok {
		sc.reply(errorReply(m.ID, errCodeNotFound, fmt.Sprintf("rank %d published no key %q", m.Rank, m.Key)))
		return
	}
	sc.reply(&message{Op: opOK, ID: m.ID, Value: v})
}

// reportLost records that rank lost the rank m names, a report without a
// reply. A report of a rank not in the job, or of itself, means nothing:
// it is logged and ignored rather than dropping a rank that broke only
// this.
func (s *Server) reportLost(rank int, m *message) {
	if m.Rank >= s.size || m.Rank == rank {
		s.logger.Warn("ignoring a report of a lost rank", "rank", rank, "lost", m.Rank, "size", s.size)
		return
	}
	reason := m.Reason
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	s.logger.Debug("rank lost another", "rank", rank, "lost", m.Rank, "reason", reason)
	s.mu.Lock()
	s.addLossLocked(rank, m.Rank, reason)
	s.mu.Unlock()
}

// addLossLocked records that rank lost the rank lost, unless it did
// before: a rank has at most one loss per rank of the job, and none of
// itself (a rank in a fence that then exits).
func (s *Server) addLossLocked(rank, lost int, reason string) {
	if lost == rank {
		return
	}
	for _, l := range s.lost[rank] {
		if l.Rank == lost {
			return
		}
	}
	s.lost[rank] = append(s.lost[rank], Loss{Rank: lost, Reason: reason})
}

func (s *Server) abort(rank int, m *message) {
	reason := m.Reason
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	s.logger.Debug("rank aborted", "rank", rank, "code", m.Code, "reason", reason)
	// Each rank reaches this once (its connection ends after it), and the
	// channel has room for every rank. The report goes out before the other
	// ranks' fences fail, so a launcher sees the cause before the effects.
	s.aborts <- &AbortError{Rank: rank, Code: m.Code, Reason: reason}
	s.leave(rank, reasonAborted)
}

// Exited tells the service that rank's process has ended, and reports
// whether the rank had joined the job (said hello): its departure, if not
// queued yet, is queued once the service reads the end of its connection,
// which may be later (see [Server.Departures]). One that ended without saying
// hello (a program that never called Open, or that exited before it)
// never will, so fences fail now, naming it, instead of waiting for it
// until the launcher's timeout. So do they for one still connected: it
// has left without finalizing.
func (s *Server) Exited(rank int) (joined bool) {
	if rank < 0 || rank >= s.size {
		return false
	}
	s.mu.Lock()
	switch s.ranks[rank] {
	case rankWaiting:
		s.mu.Unlock()
		s.leave(rank, "exited without joining the job (did it call Init?)")
		return false
	case rankConnected:
		s.ranks[rank] = rankExited
		reason, waiters := s.stopFencesLocked(rank, "exited")
		s.mu.Unlock()
		failFences(reason, waiters)
		return true
	}
	s.mu.Unlock()
	return true
}

// leave marks rank gone, and queues its departure if it had joined. No
// fence can complete without it, so the running fence and every later
// one fail with the reason instead of hanging.
func (s *Server) leave(rank int, why string) {
	s.mu.Lock()
	switch s.ranks[rank] {
	case rankLeft:
		s.mu.Unlock()
		return
	case rankConnected, rankExited:
		if !s.reportsClosed {
			s.departures <- Departure{Rank: rank, Reason: why, Finalized: why == reasonFinalized, Aborted: why == reasonAborted, Lost: slices.Clone(s.lost[rank])}
		}
	}
	s.ranks[rank] = rankLeft
	reason, waiters := s.stopFencesLocked(rank, why)
	s.mu.Unlock()
	failFences(reason, waiters)
}

// stopFencesLocked makes the running fence and every later one fail, the
// first time because rank left (why), and returns the reason and the
// ranks waiting in the running fence, to be told once mu is released
// (failFences). Each of them lost the rank the reason names.
func (s *Server) stopFencesLocked(rank int, why string) (string, []*fenceWaiter) {
	if s.left == "" {
		s.left = fmt.Sprintf("rank %d %s; the fence cannot complete", rank, why)
		s.leftRank = rank
	}
	for r, w := range s.arrived {
		if w != nil {
			s.addLossLocked(r, s.leftRank, s.left)
		}
	}
	return s.left, s.takeArrivalsLocked()
}

// failFences tells the ranks waiting in a fence that it failed.
func failFences(reason string, waiters []*fenceWaiter) {
	for _, w := range waiters {
		w.sc.reply(errorReply(w.id, errCodeFence, reason))
	}
}
